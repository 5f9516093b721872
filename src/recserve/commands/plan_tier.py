"""``recserve plan tier``: SDM placement of a model's tables between DRAM and SSD under a DRAM budget."""

from __future__ import annotations

import argparse
import json
import sys

from recserve.commands._plan_common import count, fraction, number, positive, qps
from recserve.errors import EXIT_INFEASIBLE, SpecError
from recserve.planners.sdm import HOT_FRACTION, POLICIES, SIDES, compare_policies
from recserve.specs import get_model, get_server

locality = number(HOT_FRACTION, 1)
"""A locality: the share of accesses to a table's hottest 10 % of rows, from uniform (0.1) to all (1)."""


def sides(text: str) -> tuple[str, ...]:
    """``--sm-sides``: ``user``, ``item`` or both, comma-separated; anything else is an argument error."""
    chosen = tuple(dict.fromkeys(s.strip() for s in text.split(",")))
    if not chosen or any(s not in SIDES for s in chosen):
        raise argparse.ArgumentTypeError(f"must be {', '.join(SIDES)} or {','.join(SIDES)}, got {text!r}")
    return chosen


sides.__name__ = "sides"


def cmd_tier(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    server = get_server(args.server) if args.server else None
    if server is not None and server.ssd is None:
        raise SpecError(f"--server: {server.name} has no SSD; omit --server to assume a NAND SSD (SDM Table 1)")
    if server is not None and args.dram_gb > server.mem_gb:
        raise SpecError(f"--dram-gb {args.dram_gb:g} is more than {server.name}'s {server.mem_gb:g} GB of DRAM")
    plan = compare_policies(
        spec, args.dram_gb, args.qps, policy=args.policy, item_batch=args.batch, server=server,
        sm_sides=args.sm_sides, locality_user=args.locality_user,
        locality_item=args.locality_item, fm_fraction=args.fm_fraction, min_hit=args.min_hit,
        queue_depth=args.queue_depth,
    )
    if args.out:
        plan.save(args.out)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=1))
    else:
        print(plan.table())
        for note in plan.notes:
            print(f"note: {note}")
    if not plan.summary.get("feasible", True):
        print("recserve: the plan is infeasible: the SSD cannot hold or serve its tables at this load (its capacity "
              "and IOPS are in the summary)", file=sys.stderr)
        return EXIT_INFEASIBLE
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("tier", help="place embedding tables on DRAM or SSD behind a row cache (SDM)")
    p.add_argument("--model", required=True,
                   help="catalogue model name or a model repository's path, REPO/<model>")
    p.add_argument("--dram-gb", type=positive, required=True, help="DRAM budget for embeddings (tables + caches), GB; "
                   "at most --server's memory")
    p.add_argument("--qps", type=qps, required=True, help="queries per second per host")
    p.add_argument("--server", help="server type (its SSD spec and memory bandwidth); default: assumed NAND SSD")
    p.add_argument("--policy", choices=POLICIES, default="sm-cache",
                   help="sm-cache: the SM sides' tables on SSD, the rest of DRAM row cache; fixed-fm: --fm-fraction "
                        "of the budget maps tables directly; per-table-cache: sm-cache without caching tables "
                        "below --min-hit (default %(default)s)")
    p.add_argument("--batch", type=count, default=100, help="candidate items per query (item batch); user batch 1")
    p.add_argument("--sm-sides", type=sides, default=("user",), metavar="SIDES",
                   help="sides placed on SSD by sm-cache policies: user | item | user,item (default user)")
    p.add_argument("--locality-user", type=locality, default=0.9,
                   help="user tables: share of accesses to their hottest 10%% of rows, in [0.1, 1] (0.1: uniform "
                        "access, 1: only hot rows) (default %(default)s)")
    p.add_argument("--locality-item", type=locality, default=0.95,
                   help="item tables: the same share, in [0.1, 1] (default %(default)s)")
    p.add_argument("--fm-fraction", type=fraction, default=0.5, help="fixed-fm: budget share mapped directly")
    p.add_argument("--min-hit", type=fraction, default=0.05, help="per-table-cache: cache tables above this hit rate")
    p.add_argument("--queue-depth", type=count, default=32, help="outstanding IOs per table")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", help="also save the plan JSON here")
    p.set_defaults(func=cmd_tier)
