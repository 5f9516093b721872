"""Node configs for tests that start a node: behaviour, not this host's speed.

The catalogue's deadlines (twice each model's SLA, often 10-50 ms) and the 10 s hang timeout are what a user
gets; on a busy 2-core host they turn a scheduling hiccup into 504s or a worker taken for hung. Tests that are
not about deadlines or hangs start nodes with these generous values; a test about them sets its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from recserve.serving.node.config import NodeConfig, quick_config
from recserve.serving.node.server import NodeServer

DEADLINE_MS = 60_000.0
HANG_TIMEOUT_S = 120.0
GENEROUS = {"deadline_ms": DEADLINE_MS, "hang_timeout_s": HANG_TIMEOUT_S}


def generous(model: dict[str, Any]) -> dict[str, Any]:
    """A config file's model entry with the generous deadline and hang timeout, unless it sets its own."""
    return {**GENEROUS, **model}


def node_config(model: str, scale: float = 1e-4, workers: int = 1, **options: Any) -> NodeConfig:
    """``quick_config`` with the generous deadline and hang timeout, unless ``options`` set their own."""
    return quick_config(model, scale=scale, workers=workers, **{**GENEROUS, **options})


def generous_yaml() -> str:
    """The same for a repository model's config.yaml."""
    return "".join(f"{key}: {value:g}\n" for key, value in GENEROUS.items())


@contextlib.contextmanager
def started(config: NodeConfig, drain: bool = True) -> Iterator[NodeServer]:
    """A node started from ``config`` (its ports in ``.ports``), stopped on leaving however the test ends;
    ``drain=False`` stops it without waiting for queries in flight."""
    server = NodeServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop(drain=drain)
