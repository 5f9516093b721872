"""Node inference server: Open Inference Protocol (HTTP + gRPC), co-located models, workers, control API.

``NodeServer(config).start()`` returns the bound ports; ``load_config(path)`` reads a node YAML.
See ``docs/serving.md``.

Sub-packages, lowest first (``tests/test_layers.py`` enforces it): ``transport`` (HTTP/1.1 and HTTP/2, knowing
nothing of recserve) -> ``wire`` (codec, errors, metadata, shared memory, gRPC messages) -> ``worker`` (a worker
process) -> ``node`` (the supervisor); ``shards`` apart.

The names below are imported on first use (PEP 562), so that ``recserve.serving.wire.codec`` and
``recserve.serving.wire.errors`` can be imported (by the router, the load generator) without torch and
the worker machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recserve.serving.node.config import ModelConfig, NodeConfig, config_from_dict, load_config, quick_config
    from recserve.serving.node.server import NodeServer, Ports
    from recserve.serving.worker.main import build_worker_model

_HOME = {
    "ModelConfig": "node.config", "NodeConfig": "node.config", "config_from_dict": "node.config",
    "load_config": "node.config", "quick_config": "node.config", "NodeServer": "node.server", "Ports": "node.server",
    "build_worker_model": "worker.main",
}

__all__ = ["ModelConfig", "NodeConfig", "NodeServer", "Ports", "build_worker_model", "config_from_dict",
           "load_config", "quick_config"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"recserve.serving.{_HOME[name]}"), name)
