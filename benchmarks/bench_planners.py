"""Planner speed: Hera affinity matrix (200 models), one Hercules provisioning step (20 workloads x
10 server types), Kairos upper bounds for every configuration under $10/hr.  With ``--scenarios``
also the papers' comparisons on catalogue models with perfmodel profiles (cached under results/):
Hera vs DeepRecSys/Random/Hera(Random), Hercules vs greedy/oblivious over a day, Kairos vs homogeneous.

    .venv/bin/python -m benchmarks.bench_planners [--scenarios] [--reference PATH] [--out results/planners.json]

Prints wall and CPU seconds (the CPU time is what one core spends; wall time suffers on a shared
machine) and writes them as JSON.  Inputs are synthetic except the Kairos latencies (reference data).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.common.scenarios import (
    HERA_MODELS,
    HERCULES_AVAILABLE,
    HERCULES_MODELS,
    cached_profiles,
    hera_profiles,
    scenario_kairos,
)
from recserve.planners.hera import affinity_matrix, all_curves
from recserve.planners.hercules.provision import Efficiency, solve_greedy, solve_ilp
from recserve.planners.kairos import (
    enumerate_configs,
    load_kairos_reference,
    production_size_mix,
    type_stats,
    upper_bounds,
)
from recserve.profiles import ProfileSet, ProfileTable
from recserve.reference import reference_path
from recserve.specs import ServerType


def timed(fn, repeat: int = 3):
    best_wall, best_cpu, out = np.inf, np.inf, None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return out, best_wall, best_cpu


def synthetic_hera(n: int, server: ServerType, seed: int = 0) -> ProfileSet:
    rng = np.random.default_rng(seed)
    W, K = server.cores, server.llc_ways
    tables = []
    for i in range(n):
        name = f"m{i:03d}"
        knee = rng.integers(6, W + 1)
        ws = np.arange(1, W + 1)
        qps = rng.uniform(10, 1000) * np.minimum(ws, knee + 0.1 * np.maximum(ws - knee, 0))
        sens = rng.uniform(0, 0.6)
        ways = np.arange(1, K + 1)
        tables += [
            ProfileTable(name, server.name, "maxload_vs_workers", ("workers", "max_qps"),
                         [[float(w), float(q)] for w, q in zip(ws, qps, strict=True)], "modelled"),
            ProfileTable(name, server.name, "maxload_vs_ways", ("ways", "max_qps"),
                         [[float(k), float(qps[-1] * (1 - sens * np.exp(-(k - 1) / 2) * (k < K)))] for k in ways],
                         "modelled"),
            ProfileTable(name, server.name, "membw_vs_workers", ("workers", "gbs"),
                         [[float(w), float(rng.uniform(0.1, 6) * min(w, knee))] for w in ws], "modelled"),
        ]
    return ProfileSet(tables)


def bench_hera(n: int = 200) -> dict:
    server = ServerType(name="bench-node", cores=16, mem_gb=192, mem_bw_gbs=128, llc_mb=22, llc_ways=11)
    profiles = synthetic_hera(n, server)
    models = [f"m{i:03d}" for i in range(n)]
    curves, wall_c, cpu_c = timed(lambda: all_curves(profiles, models, server), repeat=1)
    _, wall, cpu = timed(lambda: affinity_matrix(curves, server))
    return {"models": n, "affinity_wall_s": wall, "affinity_cpu_s": cpu,
            "curves_from_profiles_wall_s": wall_c, "curves_from_profiles_cpu_s": cpu_c,
            "total_wall_s": wall + wall_c, "target_s": 1.0}


def bench_provision(workloads: int = 20, types: int = 10, instances: int = 5, gap: float = 1e-3) -> dict:
    rng = np.random.default_rng(0)
    avail = np.array([100, 100, 15, 10, 5, 10, 5, 6, 4, 2][:types]) * 3
    walls, cpus, gaps, saving = [], [], [], []
    for _ in range(instances):
        qps = rng.uniform(100, 400, (workloads, types)) * (1 + np.arange(types) * 0.5)
        power = (200 + np.arange(types) * 60.0) * rng.uniform(0.9, 1.1, (workloads, types))
        eff = Efficiency([f"w{i}" for i in range(workloads)], [f"h{j}" for j in range(types)], qps, power)
        need = (qps @ avail) / workloads * rng.uniform(0.2, 0.6, workloads)
        info: dict = {}
        x, wall, cpu = timed(lambda eff=eff, need=need, info=info: solve_ilp(eff, need, avail, mip_rel_gap=gap,
                                                                            info=info), repeat=1)
        greedy = solve_greedy(eff, need, avail)
        walls.append(wall)
        cpus.append(cpu)
        gaps.append(info["gap"])
        saving.append(1 - (power * x).sum() / (power * greedy).sum())
    return {"workloads": workloads, "server_types": types, "instances": instances, "mip_rel_gap": gap,
            "ilp_wall_s_median": float(np.median(walls)), "ilp_wall_s_max": float(max(walls)),
            "ilp_cpu_s_median": float(np.median(cpus)), "ilp_cpu_s_max": float(max(cpus)),
            "ilp_gap_max": float(max(gaps)), "power_saving_vs_greedy_mean": float(np.mean(saving)), "target_s": 1.0}


def bench_kairos(reference: Path, budget: float = 10.0) -> dict:
    profiles = load_kairos_reference(reference)
    meta = profiles.meta
    sizes, pmf = production_size_mix()
    inputs = type_stats(profiles, "kairos-rm2", meta["qos_p99_ms"]["kairos-rm2"], meta["prices_usd_per_hr"],
                        None, sizes, pmf)
    prices = [t.price for t in inputs.types]
    caps = [10**6] * len(prices)  # budget-limited only

    def run():
        configs = enumerate_configs(prices, caps, budget)
        bounds = upper_bounds(inputs, configs)
        order = np.argsort(-bounds)
        return configs, bounds, order

    (configs, bounds, _), wall, cpu = timed(run)
    return {"budget_usd_per_hr": budget, "configurations": int(len(configs)), "wall_s": wall, "cpu_s": cpu,
            "best_upper_bound_qps": float(bounds.max()), "target_s": 2.0}


# ----------------------------------------------------------------- scenarios (perfmodel profiles)


def scenario_hera(results_dir: Path) -> dict:
    from recserve.planners.hera import plan_colocation, targets_at_load
    from recserve.specs import get_server

    server = get_server("hera-xeon")
    profiles = hera_profiles(results_dir)
    curves = all_curves(profiles, HERA_MODELS, server)
    out: dict = {"classes": {c.name: "high" if c.high else "low" for c in curves}, "runs": []}
    for level, share in [(1, None), (2, None), (4, None), (8, None), (4, 0.1), (4, 0.25), (4, 0.5), (4, 0.75)]:
        plan = plan_colocation(profiles, server, targets_at_load(curves, level, share), seeds=20)
        out["runs"].append({"level": level, "low_share": share, "hera": plan.summary["servers"],
                            **{k: v["servers"] for k, v in plan.baselines.items()},
                            "hera_pair_emu": sorted(round(s.emu, 3) for s in plan.servers if len(s.placements) > 1),
                            "random_pair_emu_range": [plan.summary["random_pair_emu_min"],
                                                      plan.summary["random_pair_emu_max"]]})
    return out


def scenario_hercules(results_dir: Path, peaks: dict[str, float]) -> dict:
    from recserve.planners.hercules.provision import diurnal_trace, efficiency_matrix, plan_provision

    profiles = cached_profiles(results_dir / "profiles_hercules.json", HERCULES_MODELS, list(HERCULES_AVAILABLE))
    hours, loads = diurnal_trace(peaks, steps=48)
    plan = plan_provision(profiles, HERCULES_AVAILABLE, loads, hours, alpha=0.05)
    eff = efficiency_matrix(profiles, HERCULES_MODELS, list(HERCULES_AVAILABLE))
    avail = np.array(list(HERCULES_AVAILABLE.values()))
    cpu = []
    for k in range(len(hours)):
        c = time.process_time()
        solve_ilp(eff, np.array([loads[w][k] for w in HERCULES_MODELS]), avail, 0.05)
        cpu.append(time.process_time() - c)
    step_cpu = {"median": float(np.median(cpu)), "p90": float(np.percentile(cpu, 90)), "max": float(max(cpu))}
    return {"peaks": peaks, "hercules": plan.summary, **plan.baselines, "ilp_step_cpu_s": step_cpu}


def headline(results: dict) -> list[dict]:
    """Each planner's time against the seconds allowed."""
    return [harness.row(f"{label} (target: seconds allowed)", harness.dig(results, key, value), "s",
                        harness.dig(results, key, "target_s"))
            for key, label, value in (("hera_affinity", "Hera affinity matrix, 200 models", "total_wall_s"),
                                      ("hercules_provision_step", "Hercules provisioning step (ILP), median",
                                       "ilp_wall_s_median"),
                                      ("kairos_upper_bounds", "Kairos upper bounds, all configs <= budget", "wall_s"))]


def scenarios_headline(scen: dict) -> list[dict]:
    """The papers' comparisons: Hercules' power saving, Kairos' pool against the best homogeneous one, Hera's
    servers against DeepRecSys'."""
    out = [harness.row(f"Hercules provisioning: avg power saving vs {base}",
                       harness.dig(scen, "hercules", base, "hercules_power_saving_avg"), "fraction")
           for base in ("greedy", "oblivious")]
    for model, k in sorted((scen.get("kairos") or {}).items()):
        out.append(harness.row(f"Kairos pool QPS, {model}, same budget (target: best homogeneous)",
                               harness.dig(k, "upper_bound_qps"), "QPS", harness.dig(k, "homogeneous", "qps")))
    runs = harness.dig(scen, "hera", "runs") or []
    if runs:
        last = runs[-1]
        out.append(harness.row(f"Hera servers, level {last.get('level')} (target: DeepRecSys)", last.get("hera"),
                               "servers", last.get("deeprecsys")))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference", default=str(reference_path("kairos_aws_latency.json")))
    parser.add_argument("--out", default="results/planners.json")
    parser.add_argument("--scenarios", action="store_true", help="also run the papers' comparisons (minutes)")
    args = parser.parse_args()
    if args.scenarios:
        out_dir = Path(args.out).parent
        out_dir.mkdir(parents=True, exist_ok=True)
        peaks = {"hercules-rmc1": 70000.0, "hercules-rmc2": 1800.0, "hercules-rmc3": 40000.0,
                 "hercules-mtwnd": 25000.0, "hercules-din": 20000.0, "hercules-dien": 10000.0}
        scen = {"hera": scenario_hera(out_dir), "hercules": scenario_hercules(out_dir, peaks)}
        if Path(args.reference).exists():
            scen["kairos"] = scenario_kairos(Path(args.reference))
        harness.write_result(out_dir / "planners_scenarios.json", args, scenarios_headline(scen), scen)
        print(json.dumps(scen, indent=1))
        print(f"wrote {out_dir / 'planners_scenarios.json'}")
    results = {"hera_affinity": bench_hera(), "hercules_provision_step": bench_provision(),
               "hercules_provision_step_gap_1e-4": bench_provision(gap=1e-4)}
    if Path(args.reference).exists():
        results["kairos_upper_bounds"] = bench_kairos(Path(args.reference))
    else:
        print(f"skipping Kairos: {args.reference} not found", file=sys.stderr)
    for name, r in results.items():
        print(name)
        for k, v in r.items():
            print(f"  {k:34s} {v:.4g}" if isinstance(v, float) else f"  {k:34s} {v}")
    out = harness.write_result(args.out, args, headline(results), results)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
