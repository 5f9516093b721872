"""``recserve simulate colocate``: Hera RMU vs PARTIES-style vs static under fluctuating load (Hera Fig. 14).

Example::

    recserve simulate colocate --reference kairos \\
        --models rm2,wnd --json-out results/colocate.json --plot results/colocate.png

Two models share one simulated CPU node (16 cores, 11 LLC ways by default).  The first model is
the memory-bound one (DLRM(D)'s role), the second the cache-sensitive one (NCF's role); their
single-worker latencies come from the reference tables of ``--server``, and their co-location
sensitivities are the documented parameters below.  The Hera RMU needs worker-scalability and
LLC-ways profiles: they are measured on the simulated node (max-load searches) and cached in
``--node-profiles``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recserve.commands._plan_common import (
    count,
    number,
    number_list,
    percentile,
    positive,
    seed,
    simulated_queries,
)
from recserve.errors import RecserveError
from recserve.jsonio import write_text_atomic
from recserve.measure.plot import pyplot
from recserve.profiles import ProfileSet
from recserve.reference import resolve_reference
from recserve.sim.colocate import SCENARIOS, hera_fig14, run_scenario
from recserve.sim.dispatch_eval import resolve_model
from recserve.sim.latency import ServiceModel, load_reference
from recserve.sim.node import ColocModel, profile_node

NODE = "sim-node"


MAX_DURATION_S = 3600.0
"""An hour of simulated time: the arrivals of both models are held in memory, and each controller replays them."""
MAX_CORES = 256


def _check_times(args: argparse.Namespace) -> None:
    if args.duration > MAX_DURATION_S:
        raise RecserveError(f"--duration {args.duration:g} s is more than {MAX_DURATION_S:g} s of simulated time")
    if args.t_monitor * 2 > args.duration:
        raise RecserveError(f"--t-monitor {args.t_monitor:g} s leaves fewer than two monitoring windows in "
                            f"--duration {args.duration:g} s")


def _catalogue_sla_ms(model: str) -> float:
    """The SLA target of a model the profile meta gives none for (profiles from `profile host|model`)."""
    from recserve.errors import SpecError
    from recserve.specs import get_model

    try:
        return get_model(model).sla.target_ms
    except SpecError:
        raise RecserveError(f"no SLA target for {model!r} in the profile meta, and no catalogue model of that "
                            "name") from None


def build_models(args: argparse.Namespace) -> list[ColocModel]:
    profiles = load_reference(resolve_reference(args.reference)) if args.reference else ProfileSet.load(args.profiles)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    if len(names) != 2:
        raise RecserveError("--models needs exactly two models: memory-bound first, cache-sensitive second")
    llc, bw, memf = args.llc_sensitivity, args.bw_per_worker, args.memory_fraction
    if args.interference:
        llc, memf = measured_sensitivities(args, names, llc, memf)
    qos = profiles.meta.get("qos_p99_ms", {})
    out = []
    for k, name in enumerate(names):
        model = resolve_model(profiles, name)
        sla = qos.get(model) or _catalogue_sla_ms(model)
        service = ServiceModel.from_profiles(profiles, model, [args.server])
        out.append(ColocModel(name, service, args.server, float(sla), args.percentile, llc[k], bw[k], memf[k]))
    return out


def measured_sensitivities(args: argparse.Namespace, names: list[str], llc: list[float],
                           memf: list[float]) -> tuple[list[float], list[float]]:
    """LLC sensitivity and memory fraction fitted to measured interference tables (``recserve profile
    interference``), for the measured models named by ``--interference-models`` (default: ``--models``)."""
    from recserve.perfmodel.interference import fit_interference

    measured = ProfileSet.load(args.interference)
    which = [m.strip() for m in (args.interference_models or ",".join(names)).split(",") if m.strip()]
    if len(which) != len(names):
        raise RecserveError(f"--interference-models needs {len(names)} names, got {which}")
    fits = [fit_interference(measured, m) for m in which]
    print("measured interference: " + "; ".join(
        f"{n} <- {f.model}: llc_sensitivity {f.llc_sensitivity(args.ways):.3f}, memory_fraction "
        f"{f.memory_fraction():.3f}" for n, f in zip(names, fits, strict=True)), file=sys.stderr)
    return [f.llc_sensitivity(args.ways) for f in fits], [f.memory_fraction() for f in fits]


def node_profiles(args: argparse.Namespace, models: list[ColocModel]) -> ProfileSet:
    path = Path(args.node_profiles)
    key = {"models": [m.name for m in models], "cores": args.cores, "ways": args.ways, "mem_bw_gbs": args.mem_bw,
           "llc": args.llc_sensitivity, "bw": args.bw_per_worker, "memf": args.memory_fraction,
           "server": args.server, "percentile": args.percentile, "interference": args.interference,
           "interference_models": args.interference_models}
    if path.exists():
        cached = ProfileSet.load(path)
        if cached.meta.get("key") == key:
            return cached
        if "key" not in cached.meta:
            raise RecserveError(f"--node-profiles {path}: profiles not made by `simulate colocate`; name a new file "
                                "for its cache (it is rewritten whenever the node's settings change)")
    print("profiling the simulated node (max-load searches; cached for next time)...", file=sys.stderr)
    prof = profile_node(models, args.cores, args.ways, args.mem_bw, NODE, queries=args.profile_queries,
                        log=lambda s: print(s, file=sys.stderr, flush=True))
    prof.meta["key"] = key
    prof.save(path)
    return prof


def _plot(res: dict[str, Any], path: str) -> None:
    plt = pyplot()

    ctls = list(res["controllers"])
    fig, axes = plt.subplots(3, len(ctls), figsize=(4.2 * len(ctls), 7.5), squeeze=False, sharex=True)
    for c, name in enumerate(ctls):
        windows = res["controllers"][name]["windows"]
        t = [w["t_s"] for w in windows]
        for m in windows[0]["models"]:
            axes[0][c].plot(t, [min(w["models"][m]["tail_over_sla"], 5.0) for w in windows], label=m)
            axes[1][c].step(t, [w["models"][m]["workers"] for w in windows], where="post", label=m)
            axes[2][c].step(t, [w["models"][m]["ways"] for w in windows], where="post", label=m)
        axes[0][c].axhline(1.0, color="k", lw=0.8, ls="--")
        frac = res["controllers"][name]["violating_window_fraction"]
        axes[0][c].set_title(f"{name}: {frac:.0%} windows violate", fontsize=9)
        axes[0][c].set_ylabel("tail / SLA (clipped at 5)", fontsize=8)
        axes[1][c].set_ylabel("workers (cores)", fontsize=8)
        axes[2][c].set_ylabel("LLC ways", fontsize=8)
        axes[2][c].set_xlabel("time (s)", fontsize=8)
        axes[0][c].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_colocate(args: argparse.Namespace) -> int:
    if not args.reference and not args.profiles:
        raise RecserveError("give --reference (Kairos latency JSON) or --profiles (latency_vs_batch tables)")
    _check_times(args)
    models = build_models(args)
    prof = node_profiles(args, models)
    alone = {m.name: prof.get(m.name, NODE, "maxload_vs_workers").interp(float(args.cores), "max_qps")
             for m in models}
    if args.scenario == "fig14":
        shapes = hera_fig14(args.duration, memory_peak=args.memory_peak, cache_peak=args.cache_peak)
    elif args.scenario in SCENARIOS:
        shapes = SCENARIOS[args.scenario](args.duration)
    else:
        raise RecserveError(f"unknown scenario {args.scenario!r}; known: {', '.join(SCENARIOS)}")
    ctls = [c.strip() for c in args.controllers.split(",") if c.strip()]
    res = run_scenario(models, shapes, alone, prof, NODE, ctls, args.duration, args.cores, args.ways, args.mem_bw,
                       args.t_monitor, args.seed, progress=lambda line: print(line, file=sys.stderr, flush=True))
    res["settings"] = {k: v for k, v in vars(args).items() if k != "func"}
    res["models"] = {m.name: {"sla_ms": m.sla_ms, "percentile": m.percentile, "llc_sensitivity": m.llc_sensitivity,
                              "bw_per_worker_gbs": m.bw_per_worker_gbs, "memory_fraction": m.memory_fraction}
                     for m in models}
    if args.json_out:
        write_text_atomic(args.json_out, json.dumps(res, indent=1))
    if args.plot:
        _plot(res, args.plot)
    summary = {name: {"violating_window_fraction": v["violating_window_fraction"],
                      "severe_window_fraction": v["severe_window_fraction"],
                      "per_model": v["per_model_violating_fraction"], "decisions": v["decisions"]}
               for name, v in res["controllers"].items()}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"node: {args.cores} cores, {args.ways} LLC ways, {args.mem_bw:g} GB/s; T_monitor {args.t_monitor:g}s; "
              f"max load alone: " + ", ".join(f"{k} {v:.1f} qps" for k, v in alone.items()))
        for name, s in summary.items():
            per = ", ".join(f"{m} {f:.0%}" for m, f in s["per_model"].items())
            print(f"{name:8s} windows violating SLA: {s['violating_window_fraction']:.1%} ({per}); "
                  f"over 1.5x SLA: {s['severe_window_fraction']:.1%}; {s['decisions']} decisions")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("colocate", help="Hera RMU vs PARTIES-style vs static on a co-located node under "
                                            "fluctuating load (Hera Fig. 14)")
    p.add_argument("--reference", help="Kairos AWS latency JSON (single-worker latencies per batch size)")
    p.add_argument("--profiles", help="a recserve profile file with latency_vs_batch tables instead")
    p.add_argument("--models", default="rm2,wnd", help="memory-bound model, cache-sensitive model")
    p.add_argument("--server", default="c5n.2xlarge", help="whose latency table is one worker's latency")
    p.add_argument("--controllers", default="hera,parties,static",
                   help="comma-separated controllers to compare: hera, parties, static")
    p.add_argument("--scenario", default="fig14", help="load over time: fig14 (rise, drop, spike) | diurnal | steps")
    p.add_argument("--duration", type=positive, default=120.0,
                   help=f"seconds of simulated time, at most {MAX_DURATION_S:g}")
    p.add_argument("--t-monitor", type=positive, default=2.0, help="monitoring window T_monitor (s)")
    p.add_argument("--cores", type=number(1, MAX_CORES, integer=True), default=16, help="cores of the simulated node")
    p.add_argument("--ways", type=count, default=11, help="LLC ways of the simulated node")
    p.add_argument("--mem-bw", type=positive, default=60.0, help="node memory bandwidth GB/s")
    p.add_argument("--percentile", type=percentile, default=95.0, help="SLA percentile (Hera uses p95)")
    p.add_argument("--llc-sensitivity", type=number_list(0, length=2), default="0.1,1.0",
                   help="slowdown at 1 LLC way minus 1, per model")
    p.add_argument("--bw-per-worker", type=number_list(0, length=2), default="6,1",
                   help="GB/s each busy worker draws, per model")
    p.add_argument("--memory-fraction", type=number_list(0, 1, length=2), default="0.8,0.2",
                   help="share of service time bound by DRAM bandwidth, per model")
    p.add_argument("--interference", metavar="FILE",
                   help="measured interference (`recserve profile interference`): fit --llc-sensitivity and "
                        "--memory-fraction to it instead of the documented defaults")
    p.add_argument("--interference-models", help="measured model standing in for each of --models (default: same)")
    p.add_argument("--memory-peak", type=positive, default=0.6, help="memory-bound model's peak load (x max load)")
    p.add_argument("--cache-peak", type=positive, default=0.5, help="cache-sensitive model's load before T1")
    p.add_argument("--node-profiles", default="results/colocate_node_profiles.json",
                   help="cache of the node's worker/ways profiles (made on first use)")
    p.add_argument("--profile-queries", type=simulated_queries, default=3000,
                   help="queries per profiling max-load probe")
    p.add_argument("--seed", type=seed, default=0, help="seed of the arrivals and query sizes")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--json-out", help="write the full timeline JSON here")
    p.add_argument("--plot", help="write a PNG (tail/SLA, workers, ways over time per controller)")
    p.set_defaults(func=cmd_colocate)
