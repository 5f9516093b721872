"""``recserve plan ACTION``: actions are the modules ``commands/plan_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "plan", "plan deployments: co-location, provisioning, pools, shards, tiers, node search")
