"""Fit the host-measurable perfmodel constants to measured latency_vs_batch tables.

Only the constants a single-socket CPU measurement can identify are fitted (``FIT_PARAMS``);
the weight-streaming rate is measured directly (``hostbench.measured_constants``);
the rest (memory-bandwidth contention, power, accelerator) stay as stated in the calibration file.
The fit minimises squared log error (relative error) of per-call mean latency with bounded,
log-parameterised constants (scipy ``least_squares``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from recserve.errors import ProfileError, SpecError
from recserve.perfmodel.calibration import Calibration
from recserve.perfmodel.cost import scaled_spec
from recserve.perfmodel.model import Allocation, PerfModel
from recserve.profiles import ProfileSet
from recserve.specs import ModelSpec, ServerType, get_model, model_from_dict

# name -> (lower, upper) bounds
FIT_PARAMS: dict[str, tuple[float, float]] = {
    "fixed_ms": (1e-3, 5.0),
    "per_op_us": (0.05, 200.0),
    "per_module_us": (0.05, 500.0),
    "compute_eff": (0.005, 4.0),  # > 1 when the host spec understates its peak
    "batch_half": (0.1, 2000.0),
    "lookup_ns": (0.01, 500.0),
    "llc_gbs_per_core": (0.5, 200.0),
    "dram_gbs_per_core": (0.1, 50.0),
    "act_gbs_per_core": (0.1, 200.0),
}


@dataclass(frozen=True)
class Point:
    """One measured call: ``spec`` already at the table rows that ran."""

    spec: ModelSpec
    server: ServerType
    batch: int
    cores: int
    mean_ms: float
    p99_ms: float


def _spec_for(name: str, profiles: ProfileSet) -> ModelSpec:
    stored = profiles.meta.get("specs", {}).get(name)
    if stored is not None:
        return model_from_dict(name, json.loads(json.dumps(stored)))
    try:
        return get_model(name)
    except SpecError as exc:
        raise ProfileError(f"measured profile names model {name!r}, which is neither in the catalogue nor in "
                           f"the file's meta.specs") from exc


def points_from_profiles(profiles: ProfileSet, server: ServerType, models: Iterable[str] | None = None) -> list[Point]:
    """Measured latency_vs_batch rows as fit points (model specs shrunk to the scale they ran at)."""
    keep = set(models) if models is not None else None
    points = []
    for table in profiles.find(kind="latency_vs_batch"):
        if table.source != "measured" or (keep is not None and table.model not in keep):
            continue
        cond = table.conditions
        scale = float(cond.get("scale", profiles.meta.get("scale", 1e-3)))
        cores = int(cond.get("threads", cond.get("cores", profiles.meta.get("threads", 1))))
        spec = scaled_spec(_spec_for(table.model, profiles), scale)
        batch, mean, p99 = table.column("batch"), table.column("mean_ms"), table.column("p99_ms")
        for b, m, p in zip(batch, mean, p99, strict=True):
            points.append(Point(spec, server, int(b), cores, float(m), float(p)))
    if not points:
        raise ProfileError("no measured latency_vs_batch tables to calibrate from")
    return points


def predict(cal: Calibration, points: list[Point]) -> np.ndarray:
    """Predicted mean ms of each point; the points of one model, server and thread width are predicted together."""
    pm = PerfModel(cal)
    groups: dict[tuple[int, int, int], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((id(p.spec), id(p.server), p.cores), []).append(i)
    out = np.empty(len(points))
    for idx in groups.values():
        first = points[idx[0]]
        batches = np.array([points[i].batch for i in idx], dtype=float)
        out[idx] = pm.call_ms_many(first.spec, first.server, batches, Allocation(cores_per_worker=first.cores))
    return out


def errors(cal: Calibration, points: list[Point]) -> np.ndarray:
    """Absolute percentage error of predicted mean latency per point."""
    measured = np.array([p.mean_ms for p in points])
    return np.abs(predict(cal, points) - measured) / measured * 100.0


def median_ape(cal: Calibration, points: list[Point]) -> float:
    return float(np.median(errors(cal, points)))


def fit(points: list[Point], base: Calibration, params: Iterable[str] = tuple(FIT_PARAMS),
        label: str = "") -> Calibration:
    """``base`` with ``params`` fitted to ``points`` (relative error of mean latency)."""
    names = list(params)
    lo = np.log([FIT_PARAMS[n][0] for n in names])
    hi = np.log([FIT_PARAMS[n][1] for n in names])
    x0 = np.clip(np.log([getattr(base, n) for n in names]), lo + 1e-9, hi - 1e-9)
    measured = np.log(np.array([p.mean_ms for p in points]))

    def residuals(x: np.ndarray) -> np.ndarray:
        cal = base.with_values(**{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})
        return np.log(np.maximum(predict(cal, points), 1e-9)) - measured

    res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=300)
    fitted = base.with_values(**{n: float(math.exp(v)) for n, v in zip(names, res.x, strict=True)})
    ratios = [p.p99_ms / p.mean_ms for p in points if p.mean_ms > 0]
    if ratios:
        fitted = fitted.with_values(p99_over_mean=float(np.median(ratios)))
    return fitted.with_values(fitted_on=label) if label else fitted
