"""A file of another kind where Profile tables are expected is named as what it is, and is never written over."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from recserve.cli import main
from recserve.errors import ProfileError
from recserve.profiles import ProfileSet, ProfileTable

PLAN = {"version": 1, "kind": "colocate", "planner": "hera", "inputs": {}, "summary": {}}


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    return path


def test_a_plan_read_as_profiles_is_named_a_plan(plan_file):
    with pytest.raises(ProfileError, match=r"plan\.json: a colocate plan, not a profile"):
        ProfileSet.load(plan_file)


def test_a_file_without_tables_is_not_an_empty_profile_set(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 1, "meta": {}}))
    with pytest.raises(ProfileError, match="no 'tables' list"):
        ProfileSet.load(path)


def test_a_planner_given_a_plan_for_profiles_says_so(plan_file, tmp_path):
    traffic = tmp_path / "t.yaml"
    traffic.write_text("hera-ncf: 100\n")
    rc, err = run(["plan", "colocate", "--server", "hera-xeon", "--traffic", str(traffic), "--profiles",
                   str(plan_file)])
    assert rc == 2 and "a colocate plan, not a profile" in err and err.count("\n") == 1


def test_simulate_colocate_never_writes_its_cache_over_a_plan(plan_file):
    before = plan_file.read_text()
    rc, err = run(["simulate", "colocate", "--reference", "kairos", "--duration", "10",
                   "--node-profiles", str(plan_file)])
    assert rc == 2 and "a colocate plan, not a profile" in err
    assert plan_file.read_text() == before


def test_simulate_colocate_never_writes_its_cache_over_measured_profiles(tmp_path):
    path = ProfileSet([ProfileTable("m", "this-host", "footprint", ("workers", "mem_gb"), [[1, 0.1]])],
                      {"server": "this-host"}).save(tmp_path / "this-host.json")
    before = path.read_text()
    rc, err = run(["simulate", "colocate", "--reference", "kairos", "--duration", "10",
                   "--node-profiles", str(path)])
    assert rc == 2 and "not made by `simulate colocate`" in err and err.count("\n") == 1
    assert path.read_text() == before


def test_profile_host_checks_the_file_it_merges_into_before_measuring(plan_file, monkeypatch):
    import recserve.measure.profiler as profiler

    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured before checking --out"))
    before = plan_file.read_text()
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--out", str(plan_file), "--merge"])
    assert rc == 2 and "a colocate plan, not a profile" in err
    assert plan_file.read_text() == before


def test_profile_host_checks_device_workers_before_measuring(tmp_path, monkeypatch):
    import recserve.measure.profiler as profiler

    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured before checking"))
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--out", str(tmp_path / "p.json"),
                   "--device", "cpu", "--device-workers", "0"])
    assert rc == 2 and "argument --device-workers: must be comma-separated integers >= 1" in err


def _other_hosts_profiles(tmp_path):
    import os

    rows = [[b, 0.5 + 0.3 * b, 0.5 + 0.3 * b, 0.6 + 0.4 * b] for b in (1, 32, 128, 256, 512, 1024)]
    table = ProfileTable("hera-ncf", "this-host", "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows)
    cores = len(os.sched_getaffinity(0)) + 14
    return ProfileSet([table], {"host": {"cores": cores}}).save(tmp_path / "there.json"), cores


def test_this_host_tables_from_a_host_of_another_core_count_are_refused(tmp_path):
    path, cores = _other_hosts_profiles(tmp_path)
    for argv in (["plan", "pool", "--profiles", str(path), "--models", "hera-ncf", "--servers", "this-host",
                  "--price", "this-host=1", "--budget", "3"],
                 ["simulate", "dispatch", "--profiles", str(path), "--model", "hera-ncf", "--pool", "this-host=2",
                  "--qos-ms", "500", "--queries", "100"]):
        rc, err = run(argv)
        assert rc == 2 and f"its this-host tables were measured on a {cores}-core host" in err, argv
        assert err.count("\n") == 1


def _simulate_measured(tmp_path, out):
    def latency(model: str) -> ProfileTable:
        rows = [[b, 20 + 0.05 * b, 20 + 0.05 * b, 25 + 0.06 * b] for b in (1, 32, 128, 256, 512, 1024)]
        return ProfileTable(model, "x", "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows)

    path = ProfileSet([latency("hera-dlrm-b"), latency("hera-din")]).save(tmp_path / "measured.json")
    rc, err = run(["simulate", "colocate", "--profiles", str(path), "--models", "hera-dlrm-b,hera-din", "--server",
                   "x", "--duration", "6", "--cores", "4", "--profile-queries", "200", "--controllers", "static",
                   "--node-profiles", str(tmp_path / "cache.json"), "--json-out", str(out)])
    assert rc == 0, err
    return err


def test_simulate_colocate_says_which_controller_it_simulates(tmp_path):
    err = _simulate_measured(tmp_path, tmp_path / "sim.json")
    assert "simulating static: " in err and " queries over 6 s" in err


def test_simulate_colocate_takes_a_catalogue_models_sla_from_the_catalogue(tmp_path):
    out = tmp_path / "sim.json"
    _simulate_measured(tmp_path, out)
    assert {m: v["sla_ms"] for m, v in json.loads(out.read_text())["models"].items()} == {"hera-dlrm-b": 400.0,
                                                                                         "hera-din": 100.0}
