"""The fleet plan (issue #49) against the single-paper planners, over random fleet scenarios.

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_fleet [--scenarios 24] [--seed0 4900] [--out results/fleet.json]

Each scenario (its seed printed) draws a model mix from the catalogue, each model's peak as a random number of
"servers' worth" of its own capacity on a reference type, owned servers, rentable types with prices (the
catalogue's, else the type's provisioned power times a random $/kWh-like rate) and limits, a budget and whether
tables may go to SSD.  The fleet plan's cost ($/hr of rented servers, capacity >= every peak at the SLA) is
compared with each single planner applied alone as its paper defines it and with the planners chained
(``recserve.planners.fleet_baselines``).  Nothing here is fitted: every capacity is the perfmodel's, every rule
the planners' own.  Prints a row per scenario and the summary; writes everything as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks import harness
from recserve.errors import RecserveError
from recserve.perfmodel import PerfModel
from recserve.planners.fleet import plan_fleet, solve
from recserve.planners.fleet_baselines import BASELINES
from recserve.planners.fleet_candidates import columns, hercules_capacity, sdm_capacity
from recserve.planners.fleet_spec import FleetSpec, parse_fleet
from recserve.specs import get_model, get_server

MODELS = ("hercules-rmc1", "hercules-rmc2", "hercules-rmc3", "hercules-mtwnd", "kairos-rm2", "kairos-wnd",
          "kairos-ncf", "elasticrec-rm1", "elasticrec-rm2", "sdm-m1", "sdm-m2", "hera-dlrm-a", "hera-ncf")
OWNED = ("hercules-t1", "hercules-t2", "hercules-t4", "hera-xeon", "sdm-hw-s", "sdm-hw-l")
RENTABLE = ("c5n.2xlarge", "g4dn.xlarge", "r5n.large", "hercules-t1", "hercules-t2", "hercules-t4", "sdm-hw-ss",
            "sdm-hw-an", "hercules-t7")
REFERENCE_TYPES = ("hercules-t2", "hercules-t4", "sdm-hw-ss")  # a model's "one server's worth" of load
SINGLE = ("hercules", "kairos", "hera", "elasticrec", "sdm")


def reference_qps(name: str, pm: PerfModel) -> float:
    spec = get_model(name)
    for h in REFERENCE_TYPES:
        server = get_server(h)
        q = hercules_capacity(spec, server, pm)[0] or (sdm_capacity(spec, server, pm)[0] if server.ssd else 0.0)
        if q > 0:
            return q
    return 0.0


def scenario(seed: int, pm: PerfModel) -> dict:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 6))
    models = {}
    for name in rng.choice(MODELS, size=k, replace=False):
        ref = reference_qps(str(name), pm)
        if ref <= 0:
            continue
        level = float(np.exp(rng.uniform(np.log(0.3), np.log(8.0))))   # servers' worth, log-uniform
        models[str(name)] = {"peak_qps": round(level * ref, 1)}
    owned = {str(h): int(rng.integers(1, 5)) for h in rng.choice(OWNED, size=int(rng.integers(0, 3)), replace=False)}
    rentable = {}
    for h in rng.choice(RENTABLE, size=int(rng.integers(2, 5)), replace=False):
        server = get_server(str(h))
        price = server.price_per_hr or round((server.power_w or 200) / 1000 * float(rng.uniform(3.0, 6.0)), 3)
        rentable[str(h)] = {"price": price, "max": int(rng.integers(5, 31))}
    return {"models": models, "owned": owned, "rentable": rentable, "budget": round(float(rng.uniform(2, 40)), 2),
            "constraints": {"ssd": bool(rng.random() < 0.8)}}


def shortfall_on(fleet: FleetSpec, counts: dict[str, int], pm: PerfModel) -> dict[str, float]:
    """One yardstick for every plan: the share of each model's peak that the baseline's servers cannot carry at the
    SLA under the fleet planner's capacity model (its columns, with exactly those servers owned and nothing to
    rent).  Empty when every peak is carried: the baseline's servers hold the SLA under the same model."""
    used = {h: n for h, n in counts.items() if n}
    if not used:
        return {m.name: 1.0 for m in fleet.models}
    same = FleetSpec(fleet.models, used, {}, None, fleet.ssd, {h: fleet.servers[h] for h in used}, "yardstick")
    cols, _ = columns(same, pm)
    short = solve(same, cols)[2]
    return {m.name: round(float(s), 4) for m, s in zip(fleet.models, short, strict=True) if s > 1e-6}


def money(cost: float | None) -> str:
    return "-" if cost is None else f"{cost:.2f}"


def saving(fleet: float, other: float | None) -> float | None:
    if other is None:
        return None
    if other == 0:
        return 0.0 if fleet == 0 else -1.0  # the baseline needs no rented server, the fleet plan does
    return 1 - fleet / other


def headline(summary: dict) -> list[dict]:
    """Scenarios where the fleet plan is cheaper than planning each model alone (target: all comparable ones)."""
    return [harness.row("fleet plan cheaper than sequential planners", summary["cheaper_than_sequential"],
                        "scenarios", summary["with_a_feasible_single_planner"]),
            harness.row("fleet plan feasible", summary["fleet_feasible"], "scenarios", summary["scenarios"])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", type=int, default=24)
    ap.add_argument("--seed0", type=int, default=4900, help="scenario seeds are seed0, seed0+1, ...")
    ap.add_argument("--out", default="results/fleet.json")
    args = ap.parse_args()
    pm = PerfModel()
    rows = []
    t0 = time.perf_counter()
    for seed in range(args.seed0, args.seed0 + args.scenarios):
        data = scenario(seed, pm)
        fleet = parse_fleet(data, f"scenario {seed}")
        start = time.perf_counter()
        try:
            plan = plan_fleet(fleet, pm)
        except RecserveError as exc:
            print(f"seed {seed}: fleet plan failed: {exc}", flush=True)
            rows.append({"seed": seed, "spec": data, "error": str(exc)})
            continue
        plan_s = time.perf_counter() - start
        base = {name: BASELINES[name](fleet, pm) for name in BASELINES}
        for b in base.values():
            if b["feasible"]:
                b["short_under_common_model"] = shortfall_on(fleet, b["counts"], pm)
        singles = {n: base[n]["cost_per_hr"] for n in SINGLE if base[n]["feasible"]}
        best_name = min(singles, key=singles.get) if singles else None
        best = singles[best_name] if best_name else None
        held = {n: c for n, c in singles.items() if not base[n]["short_under_common_model"]}
        held_best = min(held.values()) if held else None
        fleet_cost = plan.cost_per_hr if plan.feasible else None
        row = {"seed": seed, "spec": data, "fleet_cost": fleet_cost, "fleet_feasible": plan.feasible,
               "fleet_within_budget": plan.within_budget, "plan_s": plan_s,
               "fleet_groups": [f"{g.count}x {g.kind} {g.server}: {'+'.join(g.qps)}"
                                f"{' (ssd)' if 'ssd' in g.tier.values() else ''}" for g in plan.groups],
               "baselines": base, "best_single": best_name, "best_single_cost": best,
               "saving_vs_best_single": saving(fleet_cost, best) if fleet_cost is not None else None,
               "best_single_at_sla_cost": held_best,
               "saving_vs_best_single_at_sla": saving(fleet_cost, held_best) if fleet_cost is not None else None,
               "saving_vs_sequential": saving(fleet_cost, base["sequential"]["cost_per_hr"])
               if fleet_cost is not None else None}
        rows.append(row)
        cells = " ".join(f"{n}={money(base[n]['cost_per_hr'])}" for n in BASELINES)
        sv = row["saving_vs_best_single"]
        print(f"seed {seed}: {len(fleet.models)} models, fleet ${fleet_cost if fleet_cost is not None else 'n/a'}"
              f"/hr ({plan_s:.0f} s) | {cells} | vs best single "
              f"{'n/a (none feasible)' if sv is None else f'{100 * sv:+.1f}%'}", flush=True)
    done = [r for r in rows if "error" not in r and r["fleet_feasible"]]
    comparable = [r for r in done if r["saving_vs_best_single"] is not None]
    savings = [r["saving_vs_best_single"] for r in comparable]
    at_sla = [r["saving_vs_best_single_at_sla"] for r in done if r["saving_vs_best_single_at_sla"] is not None]
    seq = [r["saving_vs_sequential"] for r in done if r["saving_vs_sequential"] is not None]
    not_cheaper = []
    for r in done:
        for n, b in r["baselines"].items():
            if b["feasible"] and b["cost_per_hr"] <= r["fleet_cost"] + 1e-9:
                short = b.get("short_under_common_model") or {}
                not_cheaper.append({"seed": r["seed"], "baseline": n, "baseline_cost": b["cost_per_hr"],
                                    "fleet_cost": r["fleet_cost"], "why": b["note"],
                                    "short_under_common_model": short})
    summary = {
        "scenarios": len(rows), "seeds": [args.seed0, args.seed0 + args.scenarios - 1],
        "fleet_feasible": len(done), "with_a_feasible_single_planner": len(comparable),
        "no_single_planner_feasible": len(done) - len(comparable),
        "median_saving_vs_best_single": float(np.median(savings)) if savings else None,
        "min_saving_vs_best_single": float(min(savings)) if savings else None,
        "strictly_cheaper_than_best_single": sum(1 for s in savings if s > 1e-9),
        "tied_with_best_single": sum(1 for s in savings if abs(s) <= 1e-9),
        "costlier_than_best_single": sum(1 for s in savings if s < -1e-9),
        "median_saving_vs_best_single_at_sla": float(np.median(at_sla)) if at_sla else None,
        "costlier_than_best_single_at_sla": sum(1 for s in at_sla if s < -1e-9),
        "baselines_short_under_common_model": {n: sum(1 for r in done if r["baselines"][n]["feasible"]
                                                      and r["baselines"][n]["short_under_common_model"])
                                               for n in BASELINES},
        "median_saving_vs_sequential": float(np.median(seq)) if seq else None,
        "cheaper_than_sequential": sum(1 for s in seq if s > 1e-9),
        "tied_with_sequential": sum(1 for s in seq if abs(s) <= 1e-9),
        "costlier_than_sequential": sum(1 for s in seq if s < -1e-9),
        "feasible_per_baseline": {n: sum(1 for r in done if r["baselines"][n]["feasible"]) for n in BASELINES},
        "wall_s": time.perf_counter() - t0,
    }
    print("\nsummary:")
    for k, v in summary.items():
        print(f"  {k}: {v}")
    if not_cheaper:
        print("\nwhere a baseline costs no more than the fleet plan:")
        for x in not_cheaper:
            print(f"  seed {x['seed']}: {x['baseline']} ${x['baseline_cost']:.3f}/hr vs fleet "
                  f"${x['fleet_cost']:.3f}/hr ({x['why']})"
                  + (f"; its servers fall short under the fleet's capacity model: {x['short_under_common_model']}"
                     if x["short_under_common_model"] else ""))
    out = harness.write_result(args.out, args, headline(summary),
                               {"summary": summary, "not_cheaper": not_cheaper, "scenarios": rows})
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
