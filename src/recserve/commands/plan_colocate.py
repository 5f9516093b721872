"""``recserve plan colocate``: Hera co-location of models on one CPU server type.

Examples::

    recserve plan colocate --server hera-xeon --traffic targets.yaml --json plan.json --plot emu.png
    recserve plan colocate --server hera-xeon --models hera-dlrm-a,hera-dlrm-b,hera-ncf --level 4 --low-share 0.25

``targets.yaml`` maps model -> target QPS (or ``models: {...}``).  ``--level L`` instead sets every
model's target to L times its isolated max load (Hera Fig. 15); ``--low-share S`` gives the
low-scalability models together the share S of that total (Fig. 16).
"""

from __future__ import annotations

import argparse

from recserve.commands._plan_common import (
    add_output_args,
    emit,
    figure,
    fraction,
    names,
    positive,
    profiles_for,
    read_traffic,
    repeats,
    save_figure,
    static_targets,
)
from recserve.errors import RecserveError
from recserve.planners.hera import all_curves, plan_colocation, targets_at_load
from recserve.planners.plan import ColocationPlan
from recserve.specs import get_server


def run(args: argparse.Namespace) -> int:
    server = get_server(args.server)
    targets = static_targets(read_traffic(args.traffic), args.traffic) if args.traffic else {}
    models = names(args.models, "models") or list(targets)
    if not models:
        raise RecserveError("give --traffic FILE (model: qps) or --models with --level")
    profiles = profiles_for(args, models, [server.name], tables=args.tables, efficiency=False)
    if not targets:
        if args.level is None:
            raise RecserveError("without --traffic, give --level (target = level x isolated max load)")
        curves = all_curves(profiles, models, server, threshold=args.threshold)
        targets = targets_at_load(curves, args.level, args.low_share)
    else:
        targets = {m: targets[m] for m in models if m in targets}
    plan = plan_colocation(profiles, server, targets, seeds=args.seeds, threshold=args.threshold)
    emit(plan, args)
    if args.plot:
        plot(plan, args.plot)
    return 0


def plot(plan: ColocationPlan, path: str) -> None:
    plt, fig, (left, right) = figure(1, 2, (11, 4))
    policies = [plan.planner, *plan.baselines]
    counts = [plan.summary["servers"], *(b["servers"] for b in plan.baselines.values())]
    left.bar(policies, counts, color=["tab:green"] + ["tab:gray"] * len(plan.baselines))
    left.set_ylabel("servers needed")
    left.set_title("servers to reach the target QPS")
    emus = [100 * s.emu for s in plan.servers if len(s.placements) > 1]
    right.hist(emus, bins=20, color="tab:green")
    right.axvline(100, color="k", ls="--", lw=1)
    right.set_xlabel("EMU of co-located servers (%)")
    right.set_ylabel("servers")
    right.set_title("Hera's chosen pairs")
    save_figure(plt, fig, path)


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("colocate", help="Hera: pair low- and high-scalability models on CPU servers",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, help="server type (catalogue name), e.g. hera-xeon")
    p.add_argument("--traffic", metavar="FILE", help="YAML/JSON: model -> target QPS")
    p.add_argument("--models", help="comma-separated models (default: those in --traffic)")
    p.add_argument("--level", type=positive, help="target = LEVEL x each model's isolated max load")
    p.add_argument("--low-share", type=fraction, help="share of the total target for low-scalability models")
    p.add_argument("--threshold", type=fraction, default=0.5,
                   help="normalised slope over the last quarter of cores below which scalability is low")
    p.add_argument("--seeds", type=repeats, default=20, help="runs averaged for the random baselines")
    p.add_argument("--tables", default="copied", choices=("copied", "shared"),
                   help="perfmodel only: each worker holds its own tables (Hera's servers) or shares one copy")
    add_output_args(p)
    p.set_defaults(func=run)
