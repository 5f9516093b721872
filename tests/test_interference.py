"""Measured interference: the co-runner tooling and the fits the simulator and Hera use."""

from __future__ import annotations

import os

import numpy as np
import pytest

from recserve.perfmodel.interference import Interference, fit_interference, hera_ways_tables
from recserve.profiles import ProfileSet, ProfileTable

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


def _synthetic(s: float = 0.6, ways: int = 16, llc_mb: float = 32.0) -> Interference:
    """Slowdowns generated with the simulator's own curve 1 + s((W-k)/(W-1))^2."""
    occupied = np.array([4.0, 8.0, 16.0, 24.0, 30.0])
    k = ways * (1 - occupied / llc_mb)
    slow = 1 + s * ((ways - k) / (ways - 1)) ** 2
    return Interference("m", llc_mb, tuple(occupied), tuple(slow), 9.0, 1.3)


def test_llc_sensitivity_recovers_the_simulator_parameter_and_curve_interpolates():
    inter = _synthetic(0.6)
    assert inter.llc_sensitivity(16) == pytest.approx(0.6, rel=1e-6)
    assert inter.llc_slowdown(32.0) == pytest.approx(1.0)
    assert inter.llc_slowdown(2.0) > inter.llc_slowdown(16.0) > 1.0
    assert inter.memory_fraction() == pytest.approx(0.3)
    flat = Interference("f", 32.0, (8.0, 16.0), (0.97, 0.99), 9.0, 0.95)   # noise below 1 is no sensitivity
    assert flat.llc_sensitivity(16) == 0.0 and flat.memory_fraction() == 0.0 and flat.llc_slowdown(1.0) == 1.0


def test_hera_ways_tables_depend_on_workers_and_ways_jointly():
    inter = _synthetic(0.8)
    workers = ProfileTable("m", "srv", "maxload_vs_workers", ("workers", "max_qps"),
                           [[1.0, 100.0], [4.0, 380.0], [16.0, 1200.0]], "modelled")
    made = hera_ways_tables(inter, workers, "srv", 11, 22.0)
    whole = [t for t in made if not t.conditions]
    assert len(whole) == 1 and whole[0].rows[0][2] == 16.0       # Alg. 1's whole-server curve, at the most workers
    tables = {int(t.conditions["workers"]): t for t in made if t.conditions}
    for w, t in tables.items():
        q = t.column("max_qps")
        assert q[-1] == pytest.approx(workers.interp(float(w), "max_qps"))   # full cache = the workers curve
        assert np.all(np.diff(q) >= -1e-9)                                   # more ways never hurt
    keep = {w: tables[w].column("max_qps")[0] / tables[w].column("max_qps")[-1] for w in tables}
    assert keep[1] != pytest.approx(keep[16])            # not a product of a worker curve and a ways curve


def test_fit_interference_reads_measured_tables():
    prof = ProfileSet(meta={"llc_mb": 32.0})
    prof.add(ProfileTable("m", "this-host", "slowdown_vs_llc_occupied", ("occupied_mb", "alone_ms", "with_ms",
                                                                          "slowdown"),
                          [[16.0, 1.0, 1.2, 1.2], [32.0, 1.0, 1.5, 1.5]], "measured"))
    prof.add(ProfileTable("m", "this-host", "slowdown_vs_corunner_gbs", ("corunner_gbs", "alone_ms", "with_ms",
                                                                          "slowdown"),
                          [[0.0, 1.0, 1.0, 1.0], [8.0, 1.0, 1.4, 1.4]], "measured"))
    inter = fit_interference(prof, "m")
    assert inter.llc_mb == 32.0 and inter.corunner_gbs == 8.0 and inter.slowdown_bw == pytest.approx(1.4)
    assert inter.llc_slowdown(16.0) == pytest.approx(1.2)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux affinity")
def test_corunner_runs_and_stops_and_a_tiny_measurement_has_every_kind():
    from recserve.measure.interference import CoRunner, measure_interference
    from recserve.specs import get_model

    with CoRunner("occupy", 1.0) as co:
        pid = co.proc.pid
        assert co.proc.poll() is None
    assert co.proc.poll() is not None and pid > 0
    prof = measure_interference([get_model("hera-ncf")], max_table_mb=1.0, batch=8, seconds=0.02, llc_mb=4.0,
                                occupy_fractions=(0.5,), table_sweep=(), pairs=False)
    kinds = {t.kind for t in prof}
    assert kinds == {"slowdown_vs_llc_occupied", "slowdown_vs_corunner_gbs"}
    gbs = prof.get("hera-ncf", "this-host", "slowdown_vs_corunner_gbs").rows[-1][0]
    assert gbs > 0


def test_profile_model_cli_builds_ways_tables_from_measured_interference(tmp_path):
    from recserve.cli import main

    measured = tmp_path / "interference.json"
    prof = ProfileSet(meta={"llc_mb": 32.0})
    prof.add(ProfileTable("hera-ncf", "this-host", "slowdown_vs_llc_occupied",
                          ("occupied_mb", "alone_ms", "with_ms", "slowdown"),
                          [[16.0, 1.0, 1.3, 1.3], [32.0, 1.0, 2.0, 2.0]], "measured"))
    prof.add(ProfileTable("hera-ncf", "this-host", "slowdown_vs_corunner_gbs",
                          ("corunner_gbs", "alone_ms", "with_ms", "slowdown"),
                          [[0.0, 1.0, 1.0, 1.0], [5.0, 1.0, 1.1, 1.1]], "measured"))
    prof.save(measured)
    out = tmp_path / "modelled.json"
    assert main(["profile", "model", "--models", "hera-ncf", "--servers", "hera-xeon", "--no-efficiency",
                 "--interference", str(measured), "--out", str(out)]) == 0
    ways = [t for t in ProfileSet.load(out).find("hera-ncf", "hera-xeon", "maxload_vs_ways") if not t.conditions]
    assert len(ways) == 1 and ways[0].conditions == {}
    q = ways[0].column("max_qps")
    assert q[0] < q[-1]                      # the measured 2x slowdown at an empty LLC shows at 1 way


def test_profile_interference_cli_reads_this_hosts_llc_when_not_given(tmp_path, monkeypatch):
    """Without ``--llc-mb`` the command sizes its co-runners from the LLC detected on this host (the command once
    read a field of the host facts as an attribute and crashed before measuring anything)."""
    import recserve.measure.interference as measuring
    from recserve.cli import main
    from recserve.hostinfo import this_host

    seen = {}

    def fake(specs, **kwargs):
        seen.update(kwargs)
        return ProfileSet()

    monkeypatch.setattr(measuring, "measure_interference", fake)
    assert main(["profile", "interference", "--models", "hera-ncf", "--out", str(tmp_path / "i.json")]) == 0
    assert seen["llc_mb"] == this_host()["llc_mb"] and seen["llc_mb"] > 0


@pytest.mark.parametrize("name", ["interference_dev_host.json", "interference_zen1_vm.json"])
def test_every_bundled_measurement_covers_each_hera_model(name):
    """The bundled measurements (two hosts, 32 and 8 MB of LLC) feed ``bench_papers.py``'s Hera rows, which need an
    LLC curve and a bandwidth slowdown for all eight Hera models, measured on the host the file names."""
    from recserve.reference import reference_path

    measured = ProfileSet.load(reference_path(name))
    hera = {"hera-dlrm-a", "hera-dlrm-b", "hera-dlrm-c", "hera-dlrm-d", "hera-ncf", "hera-dien", "hera-din", "hera-wnd"}
    assert hera <= {t.model for t in measured.find(kind="slowdown_vs_llc_occupied")}
    for model in sorted(hera):
        inter = fit_interference(measured, model)
        assert inter.llc_mb == measured.meta["llc_mb"] and len(inter.occupied_mb) >= 4
        assert all(0.5 < s < 3.0 for s in inter.slowdown_llc) and inter.slowdown_bw > 0.5


def test_a_slowdown_the_hosts_noise_could_make_is_doubted():
    from recserve.measure.interference import Bracket

    assert Bracket(10.0, 12.0, spread=0.01).doubt() == ""
    assert "faster with the co-runner" in Bracket(10.0, 8.06, spread=0.01).doubt()
    assert "the alone runs differ by 25%" in Bracket(10.0, 12.0, spread=0.25).doubt()
