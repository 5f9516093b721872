"""``recserve simulate dispatch``: allowable throughput of dispatch policies on a heterogeneous pool.

Example::

    recserve simulate dispatch --reference kairos \\
        --model rm2 --policies kairos,ribbon,drs,clockwork,oracle --json out.json --plot out.png

Without ``--pool`` the pool is the Kairos pool planner's one-shot choice under the budget; the best
homogeneous pool is simulated too (Kairos Sec. 8.1 compares against it, scaled to the full budget).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recserve.commands._plan_common import open_fraction, positive, seed, simulated_queries
from recserve.errors import RecserveError
from recserve.jsonio import write_text_atomic
from recserve.measure.plot import pyplot
from recserve.profiles import ProfileSet
from recserve.reference import resolve_reference
from recserve.sim.cluster import parse_pool, pool_text
from recserve.sim.dispatch_eval import (
    DispatchEvaluation,
    config_to_pool,
    homogeneous_pool,
    oracle_best_pool,
    resolve_model,
    ribbon_best_pool,
)
from recserve.sim.latency import load_reference

DEFAULT_POLICIES = "kairos,ribbon,drs,clockwork,oracle"


def _profiles(args: argparse.Namespace) -> ProfileSet:
    if args.reference:
        return load_reference(resolve_reference(args.reference))
    if args.profiles:
        from recserve.commands._plan_common import check_this_host

        profiles = ProfileSet.load(args.profiles)
        return check_this_host(profiles, profiles.servers(), args.profiles)
    raise RecserveError("give --reference (Kairos latency JSON) or --profiles (a recserve profile file)")


def _settings(profiles: ProfileSet, args: argparse.Namespace, model: str) -> tuple[float, dict, dict, float]:
    meta = profiles.meta
    qos = args.qos_ms or meta.get("qos_p99_ms", {}).get(model)
    if not qos:
        raise RecserveError(f"no QoS target for {model!r}: pass --qos-ms")
    prices = dict(meta.get("prices_usd_per_hr", {}))
    caps = dict(meta.get("max_instances", {}))
    budget = args.budget or meta.get("budget_usd_per_hr") or 2.5
    return float(qos), prices, caps, float(budget)


def _planned_pool(profiles: ProfileSet, model: str, qos: float, prices: dict, caps: dict, budget: float) -> tuple[
        list[str], dict[str, Any]]:
    from recserve.planners.kairos import plan_pool

    plan = plan_pool(profiles, [model], budget, prices, {model: qos}, caps)
    choice = plan.pools[0]
    return config_to_pool(choice.config), {"config": choice.config, "cost_per_hr": choice.cost_per_hr,
                                           "upper_bound_qps": choice.upper_bound_qps,
                                           "planner_homogeneous": choice.homogeneous}


def _plan_file_pool(path: str, model: str) -> tuple[list[str], dict[str, Any]]:
    """The pool that a ``recserve plan pool --json`` file chose for ``model``."""
    from recserve.planners.plan import Plan, PoolPlan

    plan = Plan.load(path)
    if not isinstance(plan, PoolPlan):
        raise RecserveError(f"--pool {path}: a {plan.kind} plan, not a pool plan (`recserve plan pool --json` "
                            "writes one)")
    choice = next((p for p in plan.pools if p.model == model), None)
    if choice is None:
        raise RecserveError(f"--pool {path}: no pool for {model!r}; it plans {[p.model for p in plan.pools]}")
    return config_to_pool(choice.config), {"config": choice.config, "chosen_by": f"--pool {path}",
                                           "upper_bound_qps": choice.upper_bound_qps}


def run_model(profiles: ProfileSet, args: argparse.Namespace, name: str) -> dict[str, Any]:
    model = resolve_model(profiles, name)
    qos, prices, caps, budget = _settings(profiles, args, model)
    ev = DispatchEvaluation(profiles, model, qos, queries=args.queries, seed=args.seed, mix=args.mix,
                            rtol=args.rtol)
    if args.pool == "oracle-best":
        pool, oracle_qps = oracle_best_pool(ev, prices, caps, budget)
        source = {"config": pool_text(pool), "chosen_by": "highest Oracle throughput under the budget",
                  "oracle_qps": oracle_qps}
    elif args.pool and (Path(args.pool).suffix == ".json" or Path(args.pool).is_file()):
        pool, source = _plan_file_pool(args.pool, model)
    elif args.pool:
        pool, source = parse_pool(args.pool), {"config": args.pool, "chosen_by": "--pool"}
    else:
        pool, source = _planned_pool(profiles, model, qos, prices, caps, budget)
        source["chosen_by"] = "Kairos upper bound + similarity pick (recserve.planners.kairos)"
    for name in set(pool):
        ev.service.type_index(name)  # an instance type without a latency table: one line naming those there are
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    print(f"{model}: pool {pool_text(pool)} (QoS p99 {qos:g} ms)", file=sys.stderr)
    results = ev.evaluate(pool, policies)
    out: dict[str, Any] = {
        "model": model, "qos_ms": qos, "budget_usd_per_hr": budget, "pool": pool_text(pool), "pool_source": source,
        "pool_cost_per_hr": sum(prices.get(t, 0.0) for t in pool),
        "policies": {k: {"max_qps": v.max_qps, "probes": v.probes, **v.details} for k, v in results.items()},
    }
    if not args.no_homogeneous and prices:
        homo, scale = homogeneous_pool(profiles, model, prices, budget, qos, caps)
        homo_res = ev.evaluate(homo, ["kairos"])["kairos"]
        out["homogeneous"] = {"pool": pool_text(homo), "max_qps": homo_res.max_qps,
                              "budget_scale": scale, "max_qps_scaled_to_budget": homo_res.max_qps * scale}
    if args.ribbon_own_pool and prices:
        rpool, rqps, search = ribbon_best_pool(ev, prices, caps, budget, seed=args.seed)
        tried = search["evaluations"]
        out["ribbon_own_pool"] = {"pool": pool_text(rpool), "max_qps": rqps, "pools_evaluated": tried,
                                  "search_space": search["candidates"]}
        print(f"  {model} ribbon on its own best pool [{pool_text(rpool)}]: {rqps:.2f} qps ({tried} pools)",
              file=sys.stderr)
    return out


def _ratios(res: dict[str, Any]) -> dict[str, float]:
    pol = res["policies"]
    k = pol.get("kairos", {}).get("max_qps")
    out = {}
    if k:
        for name, v in pol.items():
            if name != "kairos" and v["max_qps"] > 0:
                out[f"kairos/{name}"] = k / v["max_qps"]
        if "homogeneous" in res and res["homogeneous"]["max_qps_scaled_to_budget"] > 0:
            out["kairos/homogeneous(scaled)"] = k / res["homogeneous"]["max_qps_scaled_to_budget"]
        if res.get("ribbon_own_pool", {}).get("max_qps"):
            out["kairos/ribbon(own pool)"] = k / res["ribbon_own_pool"]["max_qps"]
    return out


def _print_table(results: list[dict[str, Any]]) -> None:
    names = list(dict.fromkeys(p for r in results for p in r["policies"]))
    header = ["model", "pool", *names, "homog.(scaled)"]
    rows = []
    for r in results:
        homo = r.get("homogeneous", {}).get("max_qps_scaled_to_budget")
        rows.append([r["model"], r["pool"], *[f"{r['policies'][n]['max_qps']:.1f}" if n in r["policies"] else "-"
                                               for n in names], f"{homo:.1f}" if homo else "-"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    for r in results:
        print(f"{r['model']}: " + ", ".join(f"{k} {v:.2f}x" for k, v in _ratios(r).items()))


def _plot(results: list[dict[str, Any]], path: str) -> None:
    plt = pyplot()

    names = list(dict.fromkeys(p for r in results for p in r["policies"])) + ["homogeneous"]
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 3.2), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        vals = [r["policies"][n]["max_qps"] if n in r["policies"] else
                r.get("homogeneous", {}).get("max_qps_scaled_to_budget", 0.0) for n in names]
        ax.bar(range(len(names)), vals, color=["C0" if n == "kairos" else "C7" for n in names])
        ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
        ax.set_title(r["model"], fontsize=9)
        ax.set_ylabel("allowable QPS (p99 under QoS)", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_dispatch(args: argparse.Namespace) -> int:
    profiles = _profiles(args)
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    if models == ["all"]:
        models = profiles.models()
    results = [run_model(profiles, args, m) for m in models]
    for r in results:
        r["ratios"] = _ratios(r)
    if args.json_out:
        write_text_atomic(args.json_out, json.dumps({"queries_per_probe": args.queries, "seed": args.seed,
                                                     "results": results}, indent=1))
    if args.plot:
        _plot(results, args.plot)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        _print_table(results)
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("dispatch", help="allowable throughput of dispatch policies (Kairos, Ribbon, DRS, "
                                            "Clockwork, Oracle) on a heterogeneous pool")
    p.add_argument("--reference", help="Kairos AWS latency JSON, or 'kairos' for the bundled copy")
    p.add_argument("--profiles", help="a recserve profile file with latency_vs_batch tables instead")
    p.add_argument("--model", required=True, help="model name(s), comma-separated, or 'all' (rm2 = kairos-rm2)")
    p.add_argument("--pool", help="instances, e.g. g4dn.xlarge=1,c5n.2xlarge=2, a `plan pool --json` file (its "
                   "pool for each model), or 'oracle-best' (default: the Kairos planner's pick)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma-separated (default {DEFAULT_POLICIES})")
    p.add_argument("--budget", type=positive, help="$/hr budget for the planner and homogeneous pool")
    p.add_argument("--qos-ms", type=positive, help="p99 target (default: from the reference)")
    p.add_argument("--queries", type=simulated_queries, default=10000, help="queries per max-load probe")
    p.add_argument("--mix", default="production",
                   help="query-size distribution (recserve.workload spec), e.g. production, normal:mean=256,sd=32")
    p.add_argument("--seed", type=seed, default=0, help="seed of the query sizes and arrivals")
    p.add_argument("--rtol", type=open_fraction, default=0.02, help="max-load bisection tolerance")
    p.add_argument("--no-homogeneous", action="store_true", help="skip the homogeneous baseline")
    p.add_argument("--ribbon-own-pool", action="store_true",
                   help="also run Ribbon as Kairos compares it: FCFS on the pool its Bayesian search finds (slow)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--json-out", help="write the results JSON here")
    p.add_argument("--plot", help="write a PNG bar chart here")
    p.set_defaults(func=cmd_dispatch)
