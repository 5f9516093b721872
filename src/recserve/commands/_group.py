"""Command groups whose actions live in separate modules: ``<group>_<action>.py`` each exposing
``register(group_subparsers)``.  This lets independent planners add ``recserve plan <x>`` without
sharing a file."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

from recserve import commands


def register_group(sub: argparse._SubParsersAction, group: str, help_text: str, epilog: str | None = None) -> None:
    """The group's parser and its actions'; ``epilog`` closes the help of the group and of each action (the
    group's exit codes, say)."""
    parser = sub.add_parser(group, help=help_text, epilog=epilog)
    actions = parser.add_subparsers(dest=f"{group}_action", metavar="ACTION", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith(f"{group}_"):
            importlib.import_module(f"recserve.commands.{info.name}").register(actions)
    for action in actions.choices.values():
        action.epilog = action.epilog or epilog
