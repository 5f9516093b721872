"""Calibrating the perfmodel from latencies measured in-process on this host."""

from __future__ import annotations

import numpy as np

from recserve.perfmodel import PerfModel, load_calibration
from recserve.perfmodel.fit import errors, fit, points_from_profiles
from recserve.perfmodel.hostbench import measure_host
from recserve.profiles import ProfileSet
from recserve.specs import SLA, ModelSpec, TableSpec, get_server


def small(name: str, dim: int, pooling: int, top: tuple[int, ...]) -> ModelSpec:
    return ModelSpec(name=name, family="dlrm", dense_in=13, interaction="concat", sla=SLA(50, 95),
                     tables=tuple(TableSpec(f"t{i}", 200_000, dim, pooling) for i in range(4)),
                     bottom_mlp=(64, 16), top_mlp=top)


def test_fit_reduces_error_and_round_trips(tmp_path):
    specs = [small("fit-a", 16, 20, (128, 1)), small("fit-b", 32, 4, (512, 256, 1))]
    measured = measure_host(specs, batches=(1, 16, 128), scale=0.05, budget_s=0.05)
    assert {t.source for t in measured} == {"measured"}
    path = measured.save(tmp_path / "host.json")
    back = ProfileSet.load(path)
    host = get_server("this-host")
    points = points_from_profiles(back, host)
    assert len(points) == 6 and all(p.spec.tables[0].rows == 10_000 for p in points)
    base = load_calibration()
    cal = fit(points, base, label="test")
    assert np.median(errors(cal, points)) <= np.median(errors(base, points)) + 1e-9
    saved = cal.save(tmp_path / "cal.json")
    assert PerfModel(saved).cal == load_calibration(saved)

    from recserve.cli import main

    out = tmp_path / "cli.json"
    assert main(["profile", "calibrate", "--measured", str(path), "--out", str(out)]) == 0
    assert load_calibration(out).fit_error["heldout_models_median_ape"] is not None
