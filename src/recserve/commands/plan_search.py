"""``recserve plan search``: Hercules' node-level task-scheduling search for one model on one server type.

Example::

    recserve plan search --model hercules-rmc1 --server hera-xeon --json search.json

Prints the chosen configuration (scheduling mode, threads, cores per thread, batch), its predicted
max load, the evaluations the gradient search used against the size of the exhaustive space (and the
exhaustive optimum unless ``--no-exhaustive``), and DeepRecSys' choice (batch-size hill-climbing).
``--live`` measures each configuration on the node server instead of the perfmodel.
"""

from __future__ import annotations

import argparse
import json

from recserve.commands._plan_common import int_list, names, number, percentile, positive, progress
from recserve.errors import InfeasibleError, RecserveError
from recserve.jsonio import write_text_atomic
from recserve.measure.config_eval import live_evaluator
from recserve.perfmodel import PerfModel
from recserve.perfmodel.evaluator import perfmodel_evaluator
from recserve.planners.hercules.search import (
    DEFAULT_BATCHES,
    MODES,
    deeprecsys,
    exhaustive,
    search,
)
from recserve.specs import SLA, get_model, get_server


def _row(label: str, cfg, qps: float, evals: int, extra: str = "") -> str:
    what = cfg.label() if cfg else "no feasible configuration"
    return f"{label:12s} {qps:10.1f} QPS  {evals:5d} evals  {what}{extra}"


def cmd_plan_search(args: argparse.Namespace) -> int:
    spec, server = get_model(args.model), get_server(args.server)
    sla = SLA(spec.sla.target_ms if args.sla_ms is None else args.sla_ms,
              spec.sla.percentile if args.percentile is None else args.percentile)
    batches = tuple(args.batches) if args.batches else DEFAULT_BATCHES
    modes = tuple(names(args.modes)) if args.modes else MODES
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise RecserveError(f"--modes: unknown mode(s) {bad}; choose from {list(MODES)}")
    if args.live:
        if args.power_budget:
            raise RecserveError("--power-budget needs the perfmodel (power is not measured live)")
        evaluate = live_evaluator(spec, server, sla=sla, scale=args.scale, duration_s=args.duration, log=progress)
    else:
        evaluate = perfmodel_evaluator(spec, server, PerfModel(args.calibration), sla=sla,
                                       power_budget_w=args.power_budget)
    progress(f"searching {spec.name} on {server.name} (SLA p{sla.percentile:g} < {sla.target_ms:g} ms"
             + (f", power <= {args.power_budget:g} W" if args.power_budget else "") + ")")
    herc = search(server, evaluate, batches, modes)
    drs = deeprecsys(server, evaluate, batches)
    ex = None if args.no_exhaustive else exhaustive(server, evaluate, batches, modes)
    print(_row("hercules", herc.best, herc.best_qps, herc.evaluations,
               f"  ({herc.evaluations}/{herc.space_size} = {herc.evaluations / herc.space_size:.1%} of the space)"))
    if ex is not None:
        ratio = herc.best_qps / ex.best_qps if ex.best_qps > 0 else float("nan")
        print(_row("exhaustive", ex.best, ex.best_qps, ex.evaluations, f"  (hercules reaches {ratio:.1%})"))
    gain = f"  (hercules {herc.best_qps / drs.best_qps:.2f}x)" if drs.best_qps > 0 else ""
    print(_row("deeprecsys", drs.best, drs.best_qps, drs.evaluations, gain))
    if herc.best is not None and not args.live and hasattr(evaluate, "detail"):
        detail = evaluate.detail(herc.best)
        print(f"at max load: power {detail.power_w:.0f} W, memory {detail.mem_gb:.1f} GB, "
              f"DRAM {detail.membw_gbs:.1f} GB/s, {detail.cores_used} cores")
    if args.json:
        out = {"model": spec.name, "server": server.name, "sla": {"target_ms": sla.target_ms,
               "percentile": sla.percentile}, "power_budget_w": args.power_budget, "batches": list(batches),
               "evaluator": "live" if args.live else "perfmodel", "hercules": herc.to_dict(),
               "deeprecsys": drs.to_dict(), "exhaustive": ex.to_dict() if ex else None}
        write_text_atomic(args.json, json.dumps(out, indent=1))
        progress(f"wrote {args.json}")
    if herc.best is None:
        raise InfeasibleError(f"{spec.name} on {server.name}: no configuration meets p{sla.percentile:g} < "
                              f"{sla.target_ms:g} ms" + (f" within {args.power_budget:g} W" if args.power_budget
                                                          else "") + " (the rows above)")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("search", help="Hercules task-scheduling search (threads x cores x batch) on one server")
    p.add_argument("--model", required=True, help="catalogue model, or a repository model's path REPO/<model>")
    p.add_argument("--server", required=True, help="catalogue server type (`recserve models servers`)")
    p.add_argument("--live", action="store_true", help="measure configurations on the node server")
    p.add_argument("--scale", type=number(0, 1, low_open=True), default=1e-3,
                   help="--live: table-row scale of the served model")
    p.add_argument("--duration", type=positive, default=3.0, help="--live: seconds per load probe")
    p.add_argument("--calibration", metavar="FILE", help="perfmodel calibration JSON")
    p.add_argument("--sla-ms", type=positive, help="override the model's SLA target")
    p.add_argument("--percentile", type=percentile, help="override the SLA percentile")
    p.add_argument("--power-budget", type=positive, metavar="W", help="reject configurations drawing more power")
    p.add_argument("--batches", type=int_list,
                   help=f"sub-batch sizes to consider (default {','.join(map(str, DEFAULT_BATCHES))})")
    p.add_argument("--modes", help="scheduling modes: model,pipeline (default both)")
    p.add_argument("--no-exhaustive", action="store_true", help="skip the exhaustive ground truth")
    p.add_argument("--json", metavar="FILE", help="write the search results as JSON")
    p.set_defaults(func=cmd_plan_search)
