"""The perfmodel's GPU terms against GPU latencies measured on an H100 (issue #16).

Input: a ``bench_gpu.py`` JSON (default: the H100 run committed in ``docs/measured/h100-2026-11-22/``).  Its
``gpu_tables_ms`` column is the model as the perfmodel describes it (one kernel group per table and per dense
operator, inputs copied host -> device, scores back); ``gpu_ms`` is what recserve's accelerator workers run
(tables fused, pinned copies).  For each (model, batch) this prints the measured time beside
``PerfModel.call_ms`` on a ServerType for that machine, with the bundled calibration and with the GPU constants
(``gpu_launch_us``, ``gpu_compute_eff``, ``gpu_batch_half``, ``gpu_gather_eff``, ``pcie_eff``) fitted to the
``--train`` models only, and reports the median absolute error on the held-out models, which the fit never saw.
Then leave-one-model-out: each measured model held out in turn, the GPU constants fitted on the other five; the
median over all held-out rows.

The host half of a GPU call (Python, the dispatcher: per module and per operator, ``ServiceTimes.launch_ms``) is the
host CPU's framework time, so it takes the CPU constants fitted on that machine's own CPU timings
(``src/recserve/data/hosts/h100-host.json``, the 16-core host of the same H100 machine), with every model held out
of the GPU fit also left out of that CPU fit (``--host-cpu none``: the bundled constants).

    .venv/bin/python -m benchmarks.bench_gpu_perfmodel [--batch1]

``--batch1`` also fits the batch-1 rows alone to three host terms (operators; modules + kernels; the same host's
measured CPU batch-1 time + kernels), each model held out in turn.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.perfmodel.calibration import Calibration, load_calibration
from recserve.perfmodel.fit import fit as fit_cpu
from recserve.perfmodel.fit import points_from_profiles
from recserve.perfmodel.model import Allocation, PerfModel
from recserve.profiles import ProfileSet
from recserve.specs import ServerType, get_model, server_from_dict

MEASURED = ROOT / "docs" / "measured" / "h100-2026-11-22" / "bench_gpu_run1.json"
# The lent machine: NVIDIA H100 80GB HBM3 (SXM5) and 16 host cores (NVIDIA's data sheet for the GPU; the host
# CPU's model was not recorded, so its clock is an assumption that only the host-side terms use).
H100_HOST = ServerType(
    name="lent-h100", cores=16, mem_gb=128, mem_bw_gbs=100.0, freq_ghz=2.0, flops_per_cycle=32,
    accelerator="H100", accel_tflops=67.0, accel_mem_gb=80, accel_mem_bw_gbs=3350.0, pcie_gbs=64.0,
    source="the GPU machine lent on 2026-11-22: H100 SXM5 80 GB (67 FP32 TFLOPS, 3.35 TB/s HBM3, PCIe Gen5 x16)",
    assumptions=("host: 16 cores at 2.0 GHz, 100 GB/s (not recorded)",))
FITTED = ("gpu_launch_us", "gpu_compute_eff", "gpu_batch_half", "gpu_gather_eff", "pcie_eff", "pcie_latency_us")
BOUNDS = ((0.5, 50.0), (0.01, 1.0), (1.0, 1e5), (0.01, 1.0), (0.05, 1.0), (1.0, 5000.0))


HOST_CPU = ROOT / "src" / "recserve" / "data" / "hosts" / "h100-host.json"
_HOST_FITS: dict[frozenset[str], Calibration] = {}


def host_calibration(path: Path | None, leave_out: set[str]) -> Calibration:
    """CPU constants fitted on the GPU machine's own CPU timings without the ``leave_out`` models (cached)."""
    if path is None:
        return load_calibration()
    key = frozenset(leave_out)
    if key not in _HOST_FITS:
        ps = ProfileSet.load(path)
        host = server_from_dict("this-host", ps.meta["host"])
        points = [p for p in points_from_profiles(ps, host) if p.spec.name not in leave_out]
        _HOST_FITS[key] = fit_cpu(points, load_calibration())
    return _HOST_FITS[key]


def rows_of(path: Path, column: str) -> list[tuple[str, int, float]]:
    data = json.loads(path.read_text())
    return [(part["model"], row["batch"], row[column]) for part in data["in_process"] for row in part["rows"]
            if column in row]


def predict(model: PerfModel, rows: list[tuple[str, int, float]]) -> np.ndarray:
    alloc = Allocation(accelerator=True)
    return np.array([model.call_ms(get_model(name), H100_HOST, batch, alloc) for name, batch, _ in rows])


def error_pct(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured * 100


def fit(base: PerfModel, rows: list[tuple[str, int, float]]) -> PerfModel:
    """GPU constants minimising the squared log error over ``rows`` (bounded; scipy's trust-region solver)."""
    measured = np.array([r[2] for r in rows])
    low, high = (np.log([b[i] for b in BOUNDS]) for i in (0, 1))

    def model_at(x: np.ndarray) -> PerfModel:
        return PerfModel(dataclasses.replace(base.cal, **dict(zip(FITTED, np.exp(x).tolist(), strict=True))))

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(model_at(x), rows) / measured)

    start = np.clip(np.log([getattr(base.cal, k) for k in FITTED]), low + 1e-9, high - 1e-9)
    return model_at(least_squares(residuals, start, bounds=(low, high)).x)


BATCH1_FORMS = {"operators": ("ops",), "modules + kernels": ("modules", "kernels"),
                "CPU batch 1 + kernels": ("cpu1_ms", "kernels")}


def _relative_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients minimising the squared relative error of ``x @ coef`` against ``y``."""
    return np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)[0]


def batch1_regression(path: Path) -> dict[str, Any]:
    """Batch-1 GPU time as a constant plus a linear form of the model's counts or of the same host's measured CPU
    batch-1 time, each model held out in turn (relative least squares on the other five): which host term the
    launch-bound regime follows, apart from the CPU constants' fit."""
    from recserve.perfmodel.cost import model_cost, scaled_spec
    from recserve.perfmodel.microbench import modules_called

    scale = float(json.loads(path.read_text())["scale"])
    gpu = {name: ms for name, batch, ms in rows_of(path, "gpu_tables_ms") if batch == 1}
    cpu = {name: ms for name, batch, ms in rows_of(path, "cpu1_ms") if batch == 1}
    names = [n for n in gpu if n in cpu]
    features: dict[str, dict[str, float]] = {}
    for name in names:
        cost = model_cost(scaled_spec(get_model(name), scale))
        features[name] = {"ops": cost.sparse_ops + (cost.device_dense_ops or cost.dense_ops),
                          "modules": modules_called(name, scale),
                          "kernels": cost.device_sparse_launches + cost.device_dense_launches,
                          "cpu1_ms": cpu[name]}
    y = np.array([gpu[n] for n in names])
    out: dict[str, Any] = {}
    for label, form in BATCH1_FORMS.items():
        x = np.array([[1.0] + [features[n][k] for k in form] for n in names])
        errors = []
        for i in range(len(names)):
            keep = np.arange(len(names)) != i
            coef = _relative_lstsq(x[keep], y[keep])
            errors.append(float(abs(x[i] @ coef - y[i]) / y[i] * 100))
        coef = _relative_lstsq(x, y)
        out[label] = {"coefficients": dict(zip(("ms",) + form, coef.tolist(), strict=True)),
                      "held_out_error_pct": dict(zip(names, errors, strict=True)), "median": float(np.median(errors))}
        print(f"batch 1, {label:22s}: leave-one-model-out median {np.median(errors):4.0f}% ("
              + ", ".join(f"{n} {e:.0f}%" for n, e in zip(names, errors, strict=True)) + "); all six: "
              + " + ".join(f"{c:.4g} x {k}" if k != "ms" else f"{c:.3g} ms" for k, c in
                           zip(("ms",) + form, coef, strict=True)))
    return out


def headline(result: dict) -> list[dict]:
    """Median abs. error of the GPU latencies: fitted GPU constants against the bundled calibration's."""
    return [harness.row(f"perfmodel GPU median abs. % error, {label}, fitted (target: default calibration)",
                        e.get("fitted"), "%", e.get("default")) for label, e in result["errors_pct"].items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, default=MEASURED)
    parser.add_argument("--column", default="gpu_tables_ms", help="gpu_tables_ms (per-table) or gpu_ms (fused)")
    parser.add_argument("--train", default="hera-din,hera-wnd,hercules-rmc2,hera-dlrm-a")
    parser.add_argument("--min-batch", type=int, default=1)
    parser.add_argument("--host-cpu", default=str(HOST_CPU),
                        help="CPU timings of the GPU machine's host for its framework constants; 'none': bundled")
    parser.add_argument("--no-lomo", action="store_true", help="skip leave-one-model-out")
    parser.add_argument("--batch1", action="store_true",
                        help="also fit batch-1 rows to counts or to the host's measured CPU batch-1 time")
    parser.add_argument("--out", default="results/bench_gpu_perfmodel.json")
    args = parser.parse_args()
    host_cpu = None if args.host_cpu == "none" else Path(args.host_cpu)
    rows = [r for r in rows_of(args.measured, args.column) if r[1] >= args.min_batch]
    if not rows:
        parser.error(f"{args.measured} has no {args.column} rows")
    train_names = {m.strip() for m in args.train.split(",") if m.strip()}
    train = [r for r in rows if r[0] in train_names]
    held = [r for r in rows if r[0] not in train_names]
    default = PerfModel()
    fitted = fit(PerfModel(host_calibration(host_cpu, {r[0] for r in held})), train)
    measured = np.array([r[2] for r in rows])
    pred_default, pred_fitted = predict(default, rows), predict(fitted, rows)
    print(f"{'model':14s} {'batch':>6s} {'measured':>9s} {'default':>9s} {'fitted':>9s}  set")
    for (name, batch, ms), d, f in zip(rows, pred_default, pred_fitted, strict=True):
        print(f"{name:14s} {batch:6d} {ms:9.3f} {d:9.3f} {f:9.3f}  {'train' if name in train_names else 'held out'}")
    result: dict[str, Any] = {"measured": str(args.measured), "column": args.column, "server": H100_HOST.name,
                              "fitted": {k: getattr(fitted.cal, k) for k in FITTED},
                              "default": {k: getattr(default.cal, k) for k in FITTED}, "errors_pct": {}}
    for label, subset in (("train", train), ("held out", held)):
        if not subset:
            continue
        idx = [rows.index(r) for r in subset]
        e_default = float(np.median(error_pct(pred_default[idx], measured[idx])))
        e_fitted = float(np.median(error_pct(pred_fitted[idx], measured[idx])))
        result["errors_pct"][label] = {"default": e_default, "fitted": e_fitted, "rows": len(subset)}
        print(f"median abs error, {label} ({len(subset)} rows): default calibration {e_default:.0f}%, "
              f"GPU constants fitted on the train models {e_fitted:.0f}%")
    print("fitted: " + ", ".join(f"{k} {getattr(fitted.cal, k):.4g}" for k in FITTED)
          + f"; host framework: per_op_us {fitted.cal.per_op_us:.3g}, per_module_us {fitted.cal.per_module_us:.3g}")
    if not args.no_lomo:
        names = list(dict.fromkeys(r[0] for r in rows))
        per_model: dict[str, float] = {}
        held_errors: list[float] = []
        for name in names:
            out = [r for r in rows if r[0] == name]
            model = fit(PerfModel(host_calibration(host_cpu, {name})), [r for r in rows if r[0] != name])
            err = error_pct(predict(model, out), np.array([r[2] for r in out]))
            per_model[name] = float(np.median(err))
            held_errors += err.tolist()
        lomo = float(np.median(held_errors))
        result["errors_pct"]["leave one model out"] = {"fitted": lomo, "rows": len(held_errors),
                                                        "per_model_median": per_model}
        print(f"leave-one-model-out ({len(names)} models, {len(held_errors)} held-out rows): median abs error "
              f"{lomo:.0f}%; per model " + ", ".join(f"{k} {v:.0f}%" for k, v in per_model.items()))
    if args.batch1:
        result["batch1_regression"] = batch1_regression(args.measured)
    harness.write_result(args.out, args, headline(result), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
