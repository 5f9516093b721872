"""``recserve profile calibrate``: fit the perfmodel's host-measurable constants to measured latencies.

Example::

    recserve profile host --models hercules-rmc1,kairos-ncf --out profiles/this-host.json
    recserve profile calibrate --measured profiles/this-host.json --out calibration.json

Prints the fitted constants and the median absolute percentage error of per-call latency on the
fit points and — when the file holds at least two models — on held-out models (fit on every other
model, evaluated on the rest).
"""

from __future__ import annotations

import argparse

import numpy as np

from recserve.commands._plan_common import names, progress
from recserve.perfmodel import load_calibration
from recserve.perfmodel.fit import FIT_PARAMS, errors, fit, points_from_profiles
from recserve.profiles import ProfileSet
from recserve.specs import get_model, get_server


def cmd_profile_calibrate(args: argparse.Namespace) -> int:
    if args.server == "this-host":
        from recserve.perfmodel.hostbench import calibration_host

        server = calibration_host()
    else:
        server = get_server(args.server)
    base = load_calibration(args.base)
    if args.measured:
        measured = ProfileSet.load(args.measured)
    else:
        from recserve.perfmodel.hostbench import measure_host

        specs = [get_model(m) for m in names(args.measure)]
        measured = measure_host(specs, scale=args.scale, progress=progress)
        if args.save_measured:
            measured.save(args.save_measured)
    from recserve.perfmodel.hostbench import measured_constants

    base = base.with_values(**measured_constants(measured))
    points = points_from_profiles(measured, server)
    models = sorted({p.spec.name for p in points})
    heldout = None
    if len(models) >= 2:  # alternate within each family: every family fitted, every family held out
        family = {p.spec.name: p.spec.family for p in points}
        ordered = sorted(models, key=lambda m: (family[m], m))
        train, test = ordered[0::2], ordered[1::2]
        cal_half = fit([p for p in points if p.spec.name in train], base)
        heldout = float(np.median(errors(cal_half, [p for p in points if p.spec.name in test])))
    cal = fit(points, base, label=f"{args.measured or 'in-process measurement'} on {server.name}: {', '.join(models)}")
    fit_err = float(np.median(errors(cal, points)))
    cal = cal.with_values(fit_error={"fit_median_ape": fit_err, "heldout_models_median_ape": heldout})
    cal.save(args.out)
    for name in FIT_PARAMS:
        print(f"{name:20s} {getattr(base, name):10.4g} -> {getattr(cal, name):10.4g}")
    print(f"{'p99_over_mean':20s} {base.p99_over_mean:10.4g} -> {cal.p99_over_mean:10.4g}")
    print(f"fit: {len(points)} points from {len(models)} models, median |error| {fit_err:.1f}%")
    if heldout is not None:
        print(f"held-out models (fit on half, evaluated on the other half): median |error| {heldout:.1f}%")
    progress(f"wrote {args.out}")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("calibrate", help="fit perfmodel constants to measured latency_vs_batch tables")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--measured", metavar="FILE", help="ProfileSet with measured latency_vs_batch tables")
    src.add_argument("--measure", metavar="MODELS", help="time these catalogue models in-process now instead")
    p.add_argument("--scale", type=float, default=1e-3, help="table-row scale for --measure")
    p.add_argument("--save-measured", metavar="FILE", help="write the --measure tables")
    p.add_argument("--server", default="this-host", help="server type the measurements ran on")
    p.add_argument("--base", metavar="FILE", help="calibration to start from (default: bundled constants)")
    p.add_argument("--out", default="calibration.json", help="calibration JSON to write")
    p.set_defaults(func=cmd_profile_calibrate)
