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

from recserve.commands._plan_common import names, positive, progress
from recserve.errors import SpecError
from recserve.jsonio import write_text_atomic
from recserve.perfmodel import load_calibration
from recserve.perfmodel.fit import FIT_PARAMS, errors, fit, points_from_profiles
from recserve.profiles import ProfileSet
from recserve.specs import get_model, get_server

DISTRUST_PCT = 50.0  # a median error above which a fitted calibration is called out


def cmd_profile_calibrate(args: argparse.Namespace) -> int:
    if args.server == "this-host":
        from recserve.perfmodel.hostbench import calibration_host

        server = calibration_host()
    else:
        server = get_server(args.server)
    base = load_calibration(args.base)
    if args.micro_only and not args.micro:
        raise SpecError("--micro-only goes with --micro")
    if not (args.micro or args.measured or args.measure):
        raise SpecError("give --micro (microbenchmarks), --measured FILE or --measure MODELS")
    if args.micro:
        return _micro(args, server, base)
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
    for warning in _fit_warnings(len(points), fit_err, heldout):
        progress(f"warning: {warning}")
    progress(f"wrote {args.out}")
    return 0


def _fit_warnings(points: int, fit_err: float, heldout: float | None) -> list[str]:
    """What makes a fitted calibration one to distrust: fewer points than constants, or large errors (it would
    predict worse than the bundled defaults, which ``profile model`` uses when no --calibration is given)."""
    out = []
    if points <= len(FIT_PARAMS):
        out.append(f"{points} measured points for {len(FIT_PARAMS)} constants: the fit is underdetermined; measure "
                   "more models (--measure a,b,c)")
    if heldout is not None and heldout > DISTRUST_PCT:
        out.append(f"it predicts the held-out models {heldout:.0f}% off (median): prefer the bundled defaults "
                   "(give no --calibration) or measure more models")
    elif fit_err > DISTRUST_PCT:
        out.append(f"it misses its own points by {fit_err:.0f}% (median)")
    return out


def _micro(args: argparse.Namespace, server, base) -> int:
    """Constants for this host from its microbenchmarks: fitted on the other recorded hosts and carried here (default),
    or the microbenchmarks' own values (``--micro-only``); with --measured, report the error on those timings."""
    import json

    from recserve.perfmodel.hosts import Machine, calibration_for_host
    from recserve.perfmodel.microbench import calibration_from_micro, measure_micro

    micro = measure_micro(server, progress=progress)
    moved = None if args.micro_only else calibration_for_host(micro, Machine.this(server), base)
    if moved is not None:
        cal = moved.calibration
        progress(f"constants fitted on recorded hosts {', '.join(moved.sources)}, carried here by the "
                 f"microbenchmarks" + (f" (left out as this machine: {', '.join(moved.skipped)})" if moved.skipped
                                       else ""))
    else:
        cal = calibration_from_micro(micro, base)
        if not args.micro_only:
            progress("no other host recorded under recserve/data/hosts: microbenchmark-only constants")
    if args.measured:
        points = points_from_profiles(ProfileSet.load(args.measured), server)
        held = float(np.median(errors(cal, points)))
        bundled = float(np.median(errors(base, points)))
        cal = cal.with_values(fit_error={"heldout_all_models_median_ape": held})
        print(f"{len(points)} measured calls (none used for the constants): median |error| {held:.1f}% "
              f"(base constants: {bundled:.1f}%)")
    cal.save(args.out)
    if args.save_micro:
        write_text_atomic(args.save_micro, json.dumps(micro, indent=1))
    for name in ("compute_eff", "batch_half", "fixed_ms", "per_op_us", "per_module_us", "lookup_ns",
                 "llc_gbs_per_core", "dram_gbs_per_core", "stream_gbs_per_core", "act_gbs_per_core"):
        print(f"{name:20s} {getattr(base, name):10.4g} -> {getattr(cal, name):10.4g}")
    print(f"microbenchmarks: {micro['seconds']:.0f} s")
    progress(f"wrote {args.out}")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("calibrate", help="fit perfmodel constants to measured latency_vs_batch tables")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--measured", metavar="FILE", help="ProfileSet with measured latency_vs_batch tables")
    src.add_argument("--measure", metavar="MODELS", help="time these catalogue models in-process now instead")
    p.add_argument("--micro", action="store_true",
                     help="calibrate this host from microbenchmarks (no model timing, a minute or two): constants "
                          "fitted on the model timings of the hosts recorded with recserve (recserve/data/hosts), "
                          "carried here by the microbenchmarks; --measured FILE then only reports the error on those "
                          "model timings")
    p.add_argument("--micro-only", action="store_true",
                   help="with --micro: the microbenchmarks' own values, no recorded host (median error 37-39%% on "
                        "the recorded hosts, against 14-15%% carried)")
    p.add_argument("--scale", type=positive, default=1e-3, help="table-row scale for --measure")
    p.add_argument("--save-measured", metavar="FILE", help="write the --measure tables")
    p.add_argument("--server", default="this-host", help="server type the measurements ran on")
    p.add_argument("--base", metavar="FILE", help="calibration to start from (default: bundled constants)")
    p.add_argument("--out", default="calibration.json", help="calibration JSON to write")
    p.add_argument("--save-micro", metavar="FILE", help="write the raw microbenchmark results (with --micro)")
    p.set_defaults(func=cmd_profile_calibrate)
