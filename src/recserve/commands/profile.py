"""``recserve profile ACTION``: actions are the modules ``commands/profile_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "profile", "measure this host or model other server types into Profile tables")
