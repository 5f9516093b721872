"""Accelerator Profile tables (issue #16): ``recserve profile host --device`` writes rows the planners read.

Without a GPU the same path runs on a CPU accelerator worker (``device: cpu``): the tables' kinds, server name,
columns and the search are what a CUDA run writes; only the numbers differ.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from recserve.cli import main
from recserve.measure.accel_profile import device_server, device_tables
from recserve.measure.profiler import Budget
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import SLA, get_model


def test_device_server_names_follow_the_device():
    assert [device_server(d) for d in ("cuda", "cuda:1", "cpu")] == ["this-host-cuda", "this-host-cuda1",
                                                                      "this-host-cpu"]


@pytest.mark.integration  # seconds of work
def test_device_tables_are_the_kinds_the_planners_read():
    spec = get_model("hera-ncf")
    # the quick budget's 4 probes halve from 30% of the capacity the latency table predicts: on a host busy enough
    # that the prediction is far off, 8 probes reach a rate a 2 s SLA holds at (one full-suite run beside 4 CPU
    # hogs read 0 with 4)
    budget = dataclasses.replace(Budget.of(True), max_probes=8)
    tables = device_tables(spec, 1e-4, budget, [1, 64], "cpu", workers=(1, 2), sla=SLA(2000, 95))
    by_kind = {t.kind: t for t in tables}
    assert set(by_kind) == {"latency_vs_batch", "footprint", "maxload_vs_workers"}
    assert {t.server for t in tables} == {"this-host-cpu"} and {t.source for t in tables} == {"measured"}
    lat = by_kind["latency_vs_batch"]
    assert list(lat.column("batch")) == [1, 64] and min(lat.column("mean_ms")) > 0
    assert lat.conditions["device"] == "cpu"
    foot = by_kind["footprint"]
    assert list(foot.column("workers")) == [1, 2] and foot.rows[0][1] > 0
    assert foot.rows[1][1] == pytest.approx(2 * foot.rows[0][1])
    load = by_kind["maxload_vs_workers"]
    assert list(load.column("workers")) == [1, 2] and min(load.column("max_qps")) > 0  # a 2 s SLA is met by any host


def _latency(server: str, fixed_ms: float, per_item_ms: float) -> ProfileTable:
    rows = [[b, fixed_ms + per_item_ms * b, fixed_ms + per_item_ms * b, 1.2 * (fixed_ms + per_item_ms * b)]
            for b in (1, 32, 128, 256, 512, 1024)]
    return ProfileTable("hera-din", server, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows,
                        "measured")


def test_plan_pool_mixes_measured_host_and_accelerator_rows_at_given_prices(tmp_path, capsys):
    """Kairos' pool over this host's CPU rows and its accelerator rows: types outside the catalogue are priced
    with --price; one without a price is refused naming the flag."""
    path = ProfileSet([_latency("this-host", 0.5, 0.35), _latency("this-host-cuda", 1.5, 0.003)]).save(
        tmp_path / "p.json")
    argv = ["plan", "pool", "--profiles", str(path), "--models", "hera-din", "--servers", "this-host,this-host-cuda",
            "--budget", "10", "--json", str(tmp_path / "pool.json")]
    assert main([*argv, "--price", "this-host=0.5,this-host-cuda=3"]) == 0
    config = json.loads((tmp_path / "pool.json").read_text())["pools"][0]["config"]
    assert config.get("this-host-cuda", 0) >= 1, config  # the one type that serves 1024-item queries in 100 ms
    capsys.readouterr()
    assert main([*argv, "--price", "this-host-cuda=3"]) == 2
    assert "--price" in capsys.readouterr().err
    assert main([*argv, "--price", "this-host=0,this-host-cuda=3"]) == 2


def test_profile_host_device_only_writes_and_prints_the_accelerator_tables(tmp_path, capsys):
    out = tmp_path / "dev.json"
    assert main(["profile", "host", "--models", "hera-ncf", "--scale", "1e-4", "--quick", "--device", "cpu",
                 "--device-only", "--no-maxload", "--batches", "1,8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hera-ncf on this-host-cpu latency_vs_batch" in printed and "memory: 1w" in printed
    assert "this-host latency" not in printed  # --device-only: no CPU tables measured
    kinds = {(t.server, t.kind) for t in ProfileSet.load(out)}
    assert kinds == {("this-host-cpu", "latency_vs_batch"), ("this-host-cpu", "footprint")}
    assert main(["profile", "host", "--models", "hera-ncf", "--device-only", "--out", str(out)]) == 2
    assert "--device-only needs --device" in capsys.readouterr().err
