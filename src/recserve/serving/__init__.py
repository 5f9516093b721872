"""Node inference server: Open Inference Protocol (HTTP + gRPC), co-located models, workers, control API.

``NodeServer(config).start()`` returns the bound ports; ``load_config(path)`` reads a node YAML.
See ``docs/serving.md``.
"""

from recserve.serving.config import ModelConfig, NodeConfig, config_from_dict, load_config, quick_config
from recserve.serving.server import NodeServer, Ports
from recserve.serving.worker import build_worker_model

__all__ = ["ModelConfig", "NodeConfig", "NodeServer", "Ports", "build_worker_model", "config_from_dict",
           "load_config", "quick_config"]
