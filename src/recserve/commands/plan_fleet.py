"""``recserve plan fleet``: one plan for every model on the servers owned plus those rentable.

Example::

    recserve plan fleet --spec examples/fleet.yaml --out fleet.json
    recserve plan fleet --spec examples/fleet.yaml --baselines      # also each single planner alone

The spec (YAML or JSON) lists models with their SLA and traffic, servers owned, types rentable with their
$/hr and limits, a budget and constraints (see ``examples/fleet.yaml``).  Capacities come from the analytic
perfmodel; every decision is made by the single planners' own functions (Hercules' search, SDM's tiering,
ElasticRec's shards, Hera's pairs) and one integer program picks the cheapest mix of them that carries every
model's peak.  Exit status 3 when the plan cannot serve every peak or exceeds the budget (the plan is still
printed and written).
"""

from __future__ import annotations

import argparse

from recserve.commands._plan_common import emit, progress
from recserve.errors import EXIT_INFEASIBLE


def run(args: argparse.Namespace) -> int:
    from recserve.jsonio import refuse_plan
    from recserve.planners.fleet import plan_fleet
    from recserve.planners.fleet_spec import load_fleet

    refuse_plan(args.spec, "a fleet spec")
    fleet = load_fleet(args.spec)
    progress(f"{args.spec}: {len(fleet.models)} model(s), {len(fleet.servers)} server type(s)")
    plan = plan_fleet(fleet, progress=progress, pairs=not args.no_pairs, shards=not args.no_shards,
                      baselines=args.baselines)
    args.json = args.out
    emit(plan, args)
    return 0 if plan.feasible and plan.within_budget else EXIT_INFEASIBLE


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("fleet", help="the whole fleet: tiering, shards, node configs, co-location and instance "
                                         "mix in one ILP", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, metavar="FILE", help="fleet spec, YAML or JSON (examples/fleet.yaml)")
    p.add_argument("--out", metavar="FILE", help="write the FleetPlan as JSON (a registered plan kind: 'fleet')")
    p.add_argument("--baselines", action="store_true",
                   help="also plan with each single-paper planner alone and with them chained, for comparison")
    p.add_argument("--no-pairs", action="store_true", help="leave out Hera's co-located pairs")
    p.add_argument("--no-shards", action="store_true", help="leave out ElasticRec's shard blocks")
    p.set_defaults(func=run)
