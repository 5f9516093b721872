"""Sizes that would exhaust memory or run without end are refused up front: one line and exit 2."""

from __future__ import annotations

import contextlib
import io

import pytest

from recserve.cli import main


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


SHARD = ["plan", "shard", "--model", "elasticrec-rm1", "--qps", "1000"]
COLOCATE = ["simulate", "colocate", "--reference", "kairos", "--duration", "10"]


@pytest.mark.parametrize(("extra", "said"), [
    (["--grid", "10000000"], "argument --grid: must be an integer in [2, 2048], got '10000000'"),
    (["--max-shards", "100000"], "argument --max-shards: must be an integer in [1, 64], got '100000'"),
])
def test_plan_shard_bounds_the_dp(extra, said):
    rc, err = run(SHARD + extra)
    assert rc == 2 and err.strip().endswith(said) and err.count("\n") == 1


@pytest.mark.parametrize(("extra", "said"), [
    (["--duration", "1e9"], "--duration 1e+09 s is more than 3600 s of simulated time"),
    (["--t-monitor", "1000"], "--t-monitor 1000 s leaves fewer than two monitoring windows in --duration 10 s"),
    (["--cores", "100000"], "argument --cores: must be an integer in [1, 256]"),
    (["--bw-per-worker", "nan,1"], "--bw-per-worker: must be 2 comma-separated finite numbers >= 0, got 'nan,1'"),
    (["--bw-per-worker", "abc,1"], "--bw-per-worker: must be 2 comma-separated finite numbers >= 0, got 'abc,1'"),
    (["--bw-per-worker", "1"], "argument --bw-per-worker: must be 2 comma-separated finite numbers >= 0, got '1'"),
    (["--llc-sensitivity", "inf,1"], "argument --llc-sensitivity: must be 2 comma-separated finite numbers >= 0"),
    (["--memory-fraction", "2,0.2"], "argument --memory-fraction: must be 2 comma-separated finite numbers in [0, 1]"),
])
def test_simulate_colocate_refuses_what_it_cannot_simulate(tmp_path, extra, said):
    rc, err = run(COLOCATE + ["--node-profiles", str(tmp_path / "cache.json")] + extra)
    assert rc == 2 and said in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "cache.json").exists()


def test_profile_host_refuses_an_array_larger_than_memory(tmp_path, monkeypatch):
    import recserve.measure.profiler as profiler

    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured"))
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--array-mb", "100000000", "--out",
                   str(tmp_path / "p.json")])
    assert rc == 2 and "--array-mb 100000000 is more than half this host's memory" in err


@pytest.mark.parametrize(("argv", "said"), [
    (["plan", "colocate", "--server", "hera-xeon", "--models", "hera-ncf", "--level", "1", "--seeds", "100000000"],
     "argument --seeds: must be an integer in [1, 10000]"),
    (["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--queries", "1000000000"],
     "argument --queries: must be an integer in [1, 1e+06]"),
    (["plan", "pool", "--reference", "kairos", "--sim-queries", "1000000000"],
     "argument --sim-queries: must be an integer in [1, 1e+06]"),
    (["simulate", "colocate", "--reference", "kairos", "--profile-queries", "1000000000"],
     "argument --profile-queries: must be an integer in [1, 1e+06]"),
])
def test_repetitions_are_bounded(argv, said):
    rc, err = run(argv)
    assert rc == 2 and said in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["10", "100", "0"])
@pytest.mark.parametrize("argv", [
    ["plan", "search", "--model", "hercules-rmc1", "--server", "hercules-t2", "--no-exhaustive"],
    ["simulate", "colocate", "--reference", "kairos"],
    ["profile", "host", "--models", "hera-ncf"],
])
def test_a_percentile_outside_an_slas_range_is_refused_by_the_parser(argv, value):
    rc, err = run([*argv, "--percentile", value])
    assert rc == 2 and f"argument --percentile: must be a finite number in [50, 100), got '{value}'" in err


def test_plan_tier_refuses_more_dram_than_the_server_has():
    rc, err = run(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "1000", "--qps", "1000", "--server", "sdm-hw-ss"])
    assert rc == 2 and err.strip() == "recserve: error: --dram-gb 1000 is more than sdm-hw-ss's 64 GB of DRAM"


def test_plan_shard_refuses_a_locality_below_uniform():
    rc, err = run(SHARD + ["--locality", "0"])
    assert rc == 2 and "argument --locality: must be a finite number in [0.1, 1], got '0'" in err


def test_profile_host_refuses_more_workers_than_the_node_runs(tmp_path, monkeypatch):
    import recserve.measure.profiler as profiler
    from recserve.serving.node import control_api

    monkeypatch.setattr(control_api, "available_cores", lambda: [0, 1])
    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured"))
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--workers", "1,2,1000", "--out",
                   str(tmp_path / "p.json")])
    assert rc == 2 and err.count("\n") == 1
    assert "--workers 1000: at most 8 on this 2-core host (4 per core" in err
    assert not (tmp_path / "p.json").exists()


def test_profile_host_keeps_oversubscription_up_to_four_workers_per_core(monkeypatch):
    from recserve.measure.profiler import check_worker_counts
    from recserve.serving.node import control_api

    monkeypatch.setattr(control_api, "available_cores", lambda: [0, 1])
    check_worker_counts([1, 2, 4, 8])


def test_profile_host_refuses_more_device_workers_than_a_device_shares(tmp_path, monkeypatch):
    import recserve.measure.profiler as profiler
    from recserve.serving.node import control_api

    monkeypatch.setattr(control_api, "available_cores", lambda: list(range(16)))
    monkeypatch.setattr(profiler, "profile_host", lambda *a, **k: pytest.fail("measured"))
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--device", "cpu", "--device-workers", "1,2,1000",
                   "--out", str(tmp_path / "p.json")])
    assert rc == 2 and err.count("\n") == 1
    assert "--device-workers 1000: at most 8 per device on this 16-core host (8 per device, 4 per core" in err
    assert not (tmp_path / "p.json").exists()
    monkeypatch.setattr(control_api, "available_cores", lambda: [0])  # one core: 4 processes at most, as --workers
    rc, err = run(["profile", "host", "--models", "hera-ncf", "--device", "cpu", "--device-workers", "5",
                   "--out", str(tmp_path / "p.json")])
    assert rc == 2 and "--device-workers 5: at most 4 per device on this 1-core host" in err


def test_profile_host_takes_device_workers_up_to_the_bound(monkeypatch):
    from recserve.measure.accel_profile import check_device_worker_counts
    from recserve.serving.node import control_api

    monkeypatch.setattr(control_api, "available_cores", lambda: list(range(16)))
    check_device_worker_counts([1, 2, 4, 8])
