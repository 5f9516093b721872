"""``recserve deploy ACTION``: actions are the modules ``commands/deploy_<action>.py``."""

from __future__ import annotations

import argparse

from recserve.commands._group import register_group


def register(sub: argparse._SubParsersAction) -> None:
    register_group(sub, "deploy", "deploy a plan: node servers on this host, Ray Serve, or Kubernetes manifests")
