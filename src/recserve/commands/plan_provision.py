"""``recserve plan provision``: Hercules' minimum-power provisioning of a heterogeneous cluster over a day.

Example::

    recserve plan provision --traffic examples/day.yaml --json prov.json --plot prov.png

``examples/day.yaml``::

    available: {hercules-t1: 100, hercules-t2: 100, hercules-t3: 15}   # or --available a=1,b=2
    peak_qps: {hercules-rmc1: 50000, hercules-rmc2: 10000}          # diurnal trace from recserve.workload
    steps: 48                                                          # provisioning intervals per day
    # or an explicit trace instead of peak_qps:
    # trace: {hours: [0, 1, ...], loads: {hercules-rmc1: [..], hercules-rmc2: [..]}}

Efficiency tuples (max QPS, provisioned power) come from ``efficiency`` Profile tables
(``--profiles``) or the perfmodel.
"""

from __future__ import annotations

import argparse

import numpy as np

from recserve.commands._plan_common import (
    TrafficFile,
    add_output_args,
    counts,
    emit,
    figure,
    non_negative,
    number,
    positive,
    profiles_for,
    progress,
    read_traffic,
    save_figure,
    seed,
)
from recserve.errors import SpecError
from recserve.planners.hercules.provision import STEP_TIME_LIMIT_S, diurnal_trace, plan_provision
from recserve.planners.plan import ProvisionPlan

MAX_STEPS = 1440
"""One provisioning interval a minute; each interval is one ILP of up to --time-limit seconds."""


def day_loads(traffic: TrafficFile, where: str, steps: int | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Hours and per-workload loads from a traffic file (peak_qps for a diurnal trace, or trace)."""
    if traffic.trace is not None:
        loads = {m: np.asarray(v, dtype=float) for m, v in traffic.trace.loads.items()}
        lengths = {len(v) for v in loads.values()}
        if len(lengths) != 1:
            raise SpecError(f"{where}: every trace series needs the same number of steps")
        n = lengths.pop()
        if n == 0 or not any(v.any() for v in loads.values()):
            raise SpecError(f"{where}: trace.loads holds no load above 0: nothing to provision")
        if n > MAX_STEPS:
            raise SpecError(f"{where}: trace.loads holds {n} steps, more than {MAX_STEPS} (one a minute)")
        hours = np.asarray(traffic.trace.hours if traffic.trace.hours is not None else np.arange(n) * 24.0 / n,
                           dtype=float)
        if hours.shape != (n,):
            raise SpecError(f"{where}: trace.hours holds {hours.size} value(s); give one per step of trace.loads ({n})")
        return hours, loads
    if not traffic.peak_qps:
        raise SpecError(f"{where}: give 'peak_qps: {{model: qps}}' or 'trace: {{loads: ...}}'")
    if not any(traffic.peak_qps.values()):
        raise SpecError(f"{where}: every peak_qps is 0: nothing to provision")
    steps = steps if steps is not None else traffic.steps
    if steps > MAX_STEPS:
        raise SpecError(f"{where}: {steps} steps a day is more than {MAX_STEPS} (one a minute)")
    return diurnal_trace(dict(traffic.peak_qps), steps=steps,
                         trough_ratio=traffic.trough_ratio)


def alpha_arg(text: str) -> float | str:
    """``--alpha``'s argparse type: ``history``, or a finite number in [0, 10] (one-line error otherwise)."""
    if text.strip().lower() == "history":
        return "history"
    try:
        return number(0, 10)(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or 'history'") from None


def over_provision_rate(arg: str | float, loads: dict) -> float:
    """``--alpha``: a number, or ``history`` = the largest growth per interval in the (cyclic) day's loads."""
    if str(arg).strip().lower() == "history":
        from recserve.planners.hercules.provision import alpha_from_history

        cyclic = {w: list(v) + [v[0]] for w, v in loads.items()}
        alpha = alpha_from_history(cyclic)
        progress(f"over-provision rate from the load history: alpha = {alpha:.4f}")
        return alpha
    try:
        return float(arg)
    except ValueError as exc:
        raise SpecError(f"--alpha must be a number or 'history', got {arg!r}") from exc


def run(args: argparse.Namespace) -> int:
    traffic = read_traffic(args.traffic)
    available = counts(args.available, "available") or dict(traffic.available or {})
    if not available:
        raise SpecError("give the cluster: --available NAME=COUNT,... or 'available:' in the traffic file")
    if not any(available.values()):
        raise SpecError(f"no servers available: every count is 0 in {available}")
    hours, loads = day_loads(traffic, args.traffic, args.steps)
    profiles = profiles_for(args, list(loads), [h for h, n in available.items() if n > 0])
    alpha = over_provision_rate(args.alpha, loads)
    plan = plan_provision(profiles, available, loads, hours, alpha=alpha, seed=args.seed, progress=progress,
                          time_limit_s=args.time_limit, mip_rel_gap=args.gap)
    emit(plan, args)
    if args.plot:
        plot(plan, args.plot)
    return 0


def plot(plan: ProvisionPlan, path: str) -> None:
    plt, fig, (top, bottom) = figure(2, 1, (9, 6.5))
    series = {plan.planner: plan.steps, **plan.baseline_steps}
    for name, steps in series.items():
        hours = [s.t for s in steps]
        top.step(hours, [s.power_w / 1e3 for s in steps], where="post", label=name)
        bottom.step(hours, [s.servers for s in steps], where="post", label=name)
    top.set_ylabel("provisioned power (kW)")
    bottom.set_ylabel("active servers")
    bottom.set_xlabel("hour of day")
    top.legend()
    top.set_title("Hercules provisioning over a day")
    save_figure(plt, fig, path)


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("provision", help="Hercules: minimum provisioned power for a diurnal load (ILP)",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traffic", required=True, metavar="FILE", help="YAML/JSON with peak_qps or trace")
    p.add_argument("--available", help="server counts NAME=COUNT,... (else 'available:' in the traffic file)")
    p.add_argument("--alpha", type=alpha_arg, default=0.05,
                   help="over-provision rate α in [0, 10] (0 = none), or 'history' to estimate it from the load "
                        "trace's growth per interval (Hercules §IV-C)")
    p.add_argument("--steps", type=number(1, MAX_STEPS, integer=True),
                   help=f"provisioning intervals per day, at most {MAX_STEPS} (default 48 or 'steps:')")
    p.add_argument("--seed", type=seed, default=0, help="seed of the heterogeneity-oblivious baseline")
    p.add_argument("--time-limit", type=positive, default=STEP_TIME_LIMIT_S,
                   help="HiGHS time limit per interval (s); its best allocation is kept and the gap reported")
    p.add_argument("--gap", type=non_negative, default=1e-3, help="HiGHS relative optimality gap per interval")
    add_output_args(p)
    p.set_defaults(func=run)
