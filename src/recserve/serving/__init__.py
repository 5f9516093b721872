"""Node inference server: Open Inference Protocol (HTTP + gRPC), co-located models, workers, control API.

``NodeServer(config).start()`` returns the bound ports; ``load_config(path)`` reads a node YAML.
See ``docs/serving.md``.

The names below are imported on first use (PEP 562), so that ``recserve.serving.codec`` and
``recserve.serving.errors`` can be imported (by the router, the load generator) without torch and
the worker machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recserve.serving.config import ModelConfig, NodeConfig, config_from_dict, load_config, quick_config
    from recserve.serving.server import NodeServer, Ports
    from recserve.serving.worker import build_worker_model

_HOME = {
    "ModelConfig": "config", "NodeConfig": "config", "config_from_dict": "config", "load_config": "config",
    "quick_config": "config", "NodeServer": "server", "Ports": "server", "build_worker_model": "worker",
}

__all__ = ["ModelConfig", "NodeConfig", "NodeServer", "Ports", "build_worker_model", "config_from_dict",
           "load_config", "quick_config"]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"recserve.serving.{_HOME[name]}"), name)
