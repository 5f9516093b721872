"""``recserve profile host`` and ``recserve bench`` end to end, kept small."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.cli import main
from recserve.measure.profiler import Budget, gather_profile, gemm_gflops, maxload_tables, pss_gb, random_read_gbs
from recserve.profiles import ProfileSet
from recserve.specs import SLA, catalogue_models

MODEL = "hera-ncf" if "hera-ncf" in catalogue_models() else next(iter(catalogue_models()))


@pytest.mark.integration  # seconds of work
def test_profile_host_quick_writes_a_profile_set_that_round_trips(tmp_path, capsys):
    out = tmp_path / "this-host.json"
    rc = main(["profile", "host", "--models", MODEL, "--scale", "1e-4", "--quick", "--batches", "1,256",
               "--no-maxload", "--array-mb", "64", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "latency_vs_batch" in printed and "GEMM" in printed
    profiles = ProfileSet.load(out)
    assert profiles.servers() == ["this-host"] and profiles.models() == [MODEL]
    kinds = {t.kind for t in profiles}
    assert kinds == {"latency_vs_batch", "gather_qps"}
    assert all(t.source == "measured" for t in profiles)
    again = ProfileSet.from_dict(json.loads(json.dumps(profiles.to_dict())))
    assert {t.key for t in again} == {t.key for t in profiles}

    lat = profiles.get(MODEL, "this-host", "latency_vs_batch")
    assert list(lat.column("batch")) == [1, 256]
    assert np.all(lat.column("mean_ms") > 0) and np.all(lat.column("p99_ms") >= lat.column("p50_ms"))
    cpu = lat.column("cpu_mean_ms")
    assert cpu[1] > cpu[0]  # 256 items cost more CPU than 1

    gq = profiles.get(MODEL, "this-host", "gather_qps")
    qps = gq.column("qps")
    assert qps[-1] < qps[0] and "fit_ms_per_gather" in gq.conditions and gq.conditions["fit_ms_per_gather"] > 0

    host = profiles.meta["host"]
    for key in ("random_read_gbs", "seq_read_gbs", "gemm_gflops"):
        assert host[key] > 0
    assert host["cores"] >= 1


@pytest.mark.slow  # starts a process pool (~10 s on a busy 2-core host); the server path is in test_measure_server
def test_maxload_footprint_and_membw_tables_from_a_worker_pool():
    from tests.support.models import tiny_spec

    spec = tiny_spec()
    budget = Budget(True, 16, 0.05, 2, 1 << 10, 0.01, 0.3, 8, 3, 0.5)
    tables = {t.kind: t for t in maxload_tables(spec, 1.0, budget, [1], mix="fixed:8", sla=SLA(800.0),
                                                start_qps=40.0, via="inprocess")}
    load, foot, bw = tables["maxload_vs_workers"], tables["footprint"], tables["membw_vs_workers"]
    assert load.server == "this-host" and load.conditions["sla_ms"] == 800.0 and load.conditions["sizes"] == "fixed:8"
    assert load.rows[0][0] == 1 and load.rows[0][1] > 0  # 8-item queries of a tiny model meet an 800 ms SLA
    assert foot.rows[0][1] > 0.01  # a worker process holding torch is more than 10 MB
    expected = load.rows[0][1] * 8 * spec.gather_bytes_per_item / 1e9
    assert bw.rows[0][1] == pytest.approx(expected) and "estimate" in bw.conditions["method"]


def test_microbenchmarks_return_positive_rates():
    wall, cpu = gemm_gflops(256, 1, 0.05)
    assert wall > 0 and cpu > 0
    wall, cpu = random_read_gbs(16, 64, 1, 0.05)
    assert wall > 0 and cpu > 0


def test_gather_profile_fits_a_line_that_grows_with_gathers():
    budget = Budget.of(True)
    rows, fit = gather_profile(16, Budget(**{**budget.__dict__, "gather_rows": 1 << 16, "gather_s": 0.02}),
                               gathers=(1, 1024, 4096))  # 64 gathers cost no more than 1 beside a call's overhead
    assert [r[0] for r in rows] == [1, 1024, 4096]
    assert fit["fit_ms_per_gather"] > 0 and rows[-1][1] < rows[0][1]


def test_pss_of_this_process_is_plausible():
    import os

    assert 0.01 < pss_gb(os.getpid()) < 64


@pytest.mark.integration  # seconds of work
def test_bench_cli_in_process_run_writes_json_and_png(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["bench", "--model", MODEL, "--scale", "1e-4", "--target", "inprocess:thread", "--rate", "50",
               "--duration", "0", "--requests", "40", "--sizes", "fixed:16", "--pool", "4", "--quiet",
               "--json", str(js), "--plot", str(png)])
    assert rc == 0
    data = json.loads(js.read_text())
    assert data["kind"] == "load_run" and data["ok"] + sum(data["errors"].values()) == 40
    assert data["latency_ms"]["p50"] > 0 and png.stat().st_size > 1000
    assert "achieved" in capsys.readouterr().out


def test_bench_cli_run_with_no_answer_says_so_and_exits_1(tmp_path, capsys):
    import socket

    with socket.socket() as bound:  # bound, never listening: every connection is refused
        bound.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{bound.getsockname()[1]}"
        js = tmp_path / "r.json"
        rc = main(["bench", "--model", MODEL, "--scale", "1e-4", "--target", target, "--rate", "50", "--duration", "0",
                   "--requests", "5", "--sizes", "fixed:4", "--pool", "2", "--no-warmup", "--quiet", "--json", str(js)])
    assert rc == 1 and json.loads(js.read_text())["ok"] == 0  # the run is still written
    err = capsys.readouterr().err
    assert f"no query was answered with scores (connection=5): is a server up at {target}, serving {MODEL}?" in err


@pytest.mark.integration  # seconds of work
def test_bench_cli_max_load_search(tmp_path, capsys):
    js = tmp_path / "m.json"
    rc = main(["bench", "--model", MODEL, "--scale", "1e-4", "--target", "inprocess:thread", "--rate", "20",
               "--duration", "0.5", "--sizes", "fixed:8", "--pool", "4", "--quiet", "--find-max-load",
               "--sla-ms", "1000", "--max-qps", "80", "--min-requests", "10", "--json", str(js)])
    assert rc == 0
    data = json.loads(js.read_text())
    # a 1 s SLA for 8-item queries is met up to the cap on any host
    assert data["kind"] == "max_load" and data["max_qps"] == 80 and data["reason"] == "reached max_qps"
    assert "max load 80.00 qps" in capsys.readouterr().out


@pytest.mark.integration  # seconds of work
def test_bench_cli_sweep_writes_one_probe_per_rate(tmp_path, capsys):
    js, png = tmp_path / "s.json", tmp_path / "s.png"
    rc = main(["bench", "--model", MODEL, "--scale", "1e-4", "--target", "inprocess:thread", "--sweep", "10,30",
               "--duration", "0", "--requests", "12", "--sizes", "fixed:4", "--pool", "2", "--quiet",
               "--sla-ms", "2000", "--json", str(js), "--plot", str(png)])
    assert rc == 0
    data = json.loads(js.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["kind"] == "sweep" and [p["rate"] for p in data["probes"]] == [10, 30]
    assert all(p["ok"] and p["detail"]["ok"] == 12 for p in data["probes"]) and data["max_qps"] == 30
    assert png.stat().st_size > 1000 and "highest swept rate" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["bench", "--model", MODEL, "--rate", "0"], "--rate"),
    (["bench", "--model", MODEL, "--target", "ftp://x"], "unknown target"),
    (["bench", "--model", MODEL, "--sizes", "zipf:2"], "zipf"),
    (["bench", "--model", "no-such-model"], "unknown model"),
    (["profile", "host", "--models", MODEL, "--batches", "1,x"], "--batches"),
])
def test_cli_user_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_policy_comparison_figure_draws_every_policy_and_missing_tails(tmp_path):
    from recserve.measure.plot import plot_policies_vs_load

    tails = {"Kairos": [50.0, 90.0, float("inf")], "FCFS": [120.0, None, 900.0]}
    png = plot_policies_vs_load([10.0, 20.0, 30.0], tails, 100.0, tmp_path / "route.png",
                                simulated_qps={"Kairos": 25.0, "FCFS": 8.0})
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_node_max_loads_seeded_at_zero_starts_its_search_at_the_default(monkeypatch):
    """A seed measured at 0 (every probe failed on a busy host) must not reach the search as start_qps 0, which it
    refuses: the demo's live step crashed that way."""
    from recserve.measure import profiler
    from recserve.measure.maxload import MaxLoadResult

    starts = []

    def search(session, budget, sla, start, seed):
        starts.append(start)
        return MaxLoadResult(0.0, sla.target_ms, sla.percentile, [], (0.0, start), False, "start violates"), None

    monkeypatch.setattr(profiler, "_search", search)
    loads = profiler.node_max_loads(None, lambda n: None, SLA(target_ms=50.0), (1, 2), start_qps=0.0)
    assert loads == {1: 0.0, 2: 0.0} and starts == [profiler.DEFAULT_START_QPS] * 2


def test_a_node_carrying_less_with_more_workers_is_said_naming_the_model(monkeypatch):
    from recserve.measure import profiler
    from recserve.measure.maxload import MaxLoadResult

    found = iter([46.9, 45.0])
    said: list[str] = []

    def search(session, budget, sla, start, seed):
        q = next(found)
        return MaxLoadResult(q, sla.target_ms, sla.percentile, [], (q, 2 * q), True, "bisected"), None

    monkeypatch.setattr(profiler, "_search", search)
    monkeypatch.setattr(profiler, "log", said.append)
    profiler.node_max_loads(None, lambda n: None, SLA(target_ms=50.0), (1, 2), start_qps=10.0, model="hera-dlrm-b")
    assert said[0].startswith("hera-dlrm-b: 1 worker(s): max load 46.9 qps")
    assert said[-1].startswith("warning: hera-dlrm-b carries less with 2 workers than with 1 (45.0 < 46.9 qps)")
