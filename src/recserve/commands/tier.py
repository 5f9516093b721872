"""``recserve tier ACTION``: maintenance of SSD table files; actions are the modules ``commands/tier_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "tier", "SSD-tier table files: rebuild corrupt ones from the DRAM weights")
