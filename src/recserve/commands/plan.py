"""``recserve plan ACTION``: actions are the modules ``commands/plan_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group
from recserve.errors import EXIT_INFEASIBLE

EXIT_CODES = (f"exit status: 0 a feasible plan; 2 a bad argument or input file; {EXIT_INFEASIBLE} a valid request "
              "that no plan meets (one line saying why, or the plan printed and marked infeasible); 1 a crash")


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "plan", "plan deployments: co-location, provisioning, pools, shards, tiers, node search",
                   epilog=EXIT_CODES)
