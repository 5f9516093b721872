"""``recserve plan pool``: Kairos' heterogeneous instance pool per model under a $/hr budget.

Examples::

    recserve plan pool --reference kairos --json pool.json --plot pool.png
    recserve plan pool --models kairos-rm2 --servers g4dn.xlarge,c5n.2xlarge,r5n.large,t3.xlarge --budget 2.5

With ``--reference`` the Kairos authors' latencies, prices, caps, QoS and budget are used (flags
override budget and caps).  Otherwise latencies come from ``--profiles`` or the perfmodel, prices
from the catalogue's ``price_per_hr`` and QoS from each model's SLA.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from recserve.commands._plan_common import (
    add_output_args,
    counts,
    emit,
    figure,
    names,
    positive,
    prices,
    profiles_for,
    save_figure,
    simulated_queries,
)
from recserve.errors import InfeasibleError, ProfileError, RecserveError
from recserve.planners.kairos import empirical_size_mix, load_kairos_reference, plan_pool
from recserve.planners.plan import PoolPlan
from recserve.reference import resolve_reference
from recserve.specs import get_model, get_server


def run(args: argparse.Namespace) -> int:
    caps = counts(args.cap, "cap")
    if args.reference:
        profiles = load_kairos_reference(resolve_reference(args.reference))
        meta = profiles.meta
        qos = dict(meta["qos_p99_ms"])
        cost = {**meta["prices_usd_per_hr"], **prices(args.price)}
        caps = {**meta.get("max_instances", {}), **caps}
        budget = args.budget if args.budget is not None else meta.get("budget_usd_per_hr")
        models = names(args.models, "models") or sorted(qos)
        types = names(args.servers, "servers") or None
        _check_named_types(args, types, list(meta["prices_usd_per_hr"]))
    else:
        models, types = names(args.models, "models"), names(args.servers, "servers")
        if not models or not types:
            raise RecserveError("without --reference give --models and --servers (catalogue names)")
        _check_named_types(args, types, types)
        given = prices(args.price)
        cost = {**{s: get_server(s).price_per_hr for s in types if s not in given}, **given}
        unpriced = [s for s in types if not cost.get(s)]
        if unpriced:
            raise RecserveError(f"server types without price_per_hr: {unpriced} (give --price NAME=USD_PER_HR)")
        qos = {m: get_model(m).sla.target_ms for m in models}
        profiles = profiles_for(args, models, types)
        budget = args.budget
    if budget is None:
        raise RecserveError("give --budget ($/hr)")
    unknown = [m for m in models if m not in qos]
    if unknown:
        raise ProfileError(f"no QoS target (or latency table) for {unknown}; known: {sorted(qos)}")
    evaluate = sim_evaluator(profiles, qos, args.sim_queries) if args.evaluate == "sim" else None
    mix = None
    if args.sizes:
        from recserve.workload import load_sizes

        mix = empirical_size_mix(load_sizes(args.sizes))
    plan = plan_pool(profiles, models, float(budget), cost, qos, caps or None, evaluate=evaluate, stat=args.stat,
                     types=types, size_mix=mix)
    if evaluate is not None:
        for pool in plan.pools:
            kp = pool.details["kairos_plus"]
            print(f"{pool.model}: Kairos+ best {kp['config']} = {kp['qps']:.2f} QPS after {kp['evaluations']} "
                  f"simulated evaluations of {pool.details['configurations']}; Kairos' one-shot pick "
                  f"{pool.evaluated_qps:.2f} QPS; homogeneous {pool.homogeneous['evaluated_qps']:.2f} QPS "
                  "(budget-scaled)")
    emit(plan, args)
    if args.plot:
        plot(plan, args.plot, profiles, cost, qos, caps, args.stat, types)
    return 0


def _check_named_types(args: argparse.Namespace, types: list[str] | None, available: list[str]) -> None:
    """Every type named by --servers, --cap and --price is one the plan can use (a typo is not a silent no-op)."""
    for flag, given in (("--servers", types or []), ("--cap", counts(args.cap, "cap")),
                        ("--price", prices(args.price))):
        unknown = sorted(set(given) - set(available))
        if unknown:
            raise RecserveError(f"{flag}: no instance type {', '.join(unknown)} here; known: "
                                f"{', '.join(sorted(available))}")


def sim_evaluator(profiles, qos: dict[str, float], queries: int):
    """Kairos+ evaluation function: allowable QPS of a pool under Kairos dispatch, from the simulator."""
    try:
        from recserve.policies.dispatch import make_policy
        from recserve.sim.dispatch_eval import DispatchEvaluation, config_to_pool
    except ImportError as exc:
        raise RecserveError(f"--evaluate sim needs the simulator (recserve.sim.dispatch_eval): {exc}") from exc
    evaluations: dict[str, DispatchEvaluation] = {}

    def evaluate(model: str, config: dict[str, int]) -> float:
        if model not in evaluations:
            evaluations[model] = DispatchEvaluation(profiles, model, qos[model], queries=queries, log=None)
        ev = evaluations[model]
        pool = config_to_pool(config)
        qps, _ = ev.max_load(pool, lambda: make_policy("kairos", ev.qos_ms), max(ev.oracle(pool) / 2.0, 0.5))
        print(f"  {model} {config}: {qps:.2f} QPS", file=sys.stderr, flush=True)
        return qps

    return evaluate


def plot(plan: PoolPlan, path: str, profiles, prices, qos, caps, stat, types) -> None:
    """Upper bound of Kairos' pick and budget-scaled homogeneous QPS as the budget grows (normalised)."""
    budget = plan.inputs["budget_usd_per_hr"]
    budgets = np.linspace(budget / 2, budget * 2, 7)
    plt, fig, (left, right) = figure(1, 2, (12, 4.5))
    for pool in plan.pools:
        ratio = []
        for b in budgets:
            try:
                sub = plan_pool(profiles, [pool.model], float(b), prices, qos, caps or None, stat=stat, types=types)
                ratio.append(sub.pools[0].upper_bound_qps / sub.pools[0].homogeneous["qps"])
            except InfeasibleError:
                ratio.append(np.nan)
        left.plot(budgets, ratio, marker="o", label=pool.model)
    left.axhline(1.0, color="k", lw=1, ls="--")
    left.set_xlabel("budget ($/hr)")
    left.set_ylabel("Kairos upper bound / homogeneous")
    left.legend(fontsize=8)
    x = np.arange(len(plan.pools))
    right.bar(x - 0.2, [p.homogeneous["qps"] / p.homogeneous["qps"] for p in plan.pools], 0.4, label="homogeneous")
    right.bar(x + 0.2, [p.upper_bound_qps / p.homogeneous["qps"] for p in plan.pools], 0.4, label="Kairos (UB)")
    right.set_xticks(x, [p.model for p in plan.pools], rotation=20, fontsize=8)
    right.set_ylabel(f"QPS at ${budget:g}/hr (normalised)")
    right.legend()
    save_figure(plt, fig, path)


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("pool", help="Kairos: heterogeneous instance pool under a $/hr budget",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", metavar="JSON", help="Kairos authors' latency JSON, or 'kairos' for the bundled copy")
    p.add_argument("--models", help="comma-separated models (default: all in the reference)")
    p.add_argument("--servers", help="comma-separated instance types (default: all)")
    p.add_argument("--budget", type=positive, help="$/hr (default: the reference's)")
    p.add_argument("--cap", help="per-type instance caps NAME=COUNT,...")
    p.add_argument("--price", help="$/hr per type NAME=USD,... (types outside the catalogue, e.g. this-host-cuda "
                                   "from `recserve profile host --device cuda`; overrides catalogue prices)")
    p.add_argument("--stat", default="mean", choices=("mean", "p50", "p99"),
                   help="per-query latency compared with QoS to find each type's batch limit s")
    p.add_argument("--sizes", metavar="FILE",
                   help="observed query sizes (one per line or .npy) instead of the production-like mix")
    p.add_argument("--evaluate", choices=("none", "sim"), default="none",
                   help="sim: also run Kairos+ (Alg. 1) with simulated allowable throughput under Kairos dispatch")
    p.add_argument("--sim-queries", type=simulated_queries, default=2000, help="queries per simulated evaluation")
    add_output_args(p)
    p.set_defaults(func=run)
