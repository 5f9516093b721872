"""``recserve simulate ACTION``: actions are the modules ``commands/simulate_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "simulate", "replay plans and policies at datacenter scale")
