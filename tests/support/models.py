"""The tiny models the serving tests start nodes with, and the scores they must answer, computed in this process.

A catalogue model at ``TINY_SCALE`` (tables a ten-thousandth of the paper's) starts in seconds, and built here with
``build_worker_model`` it scores exactly as the node's workers do."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from recserve.serving import build_worker_model
from recserve.serving.node.config import ModelConfig
from recserve.specs import SLA, ModelSpec, TableSpec, catalogue_models

TINY_SCALE = 1e-4


def first_dlrm() -> str:
    """The first DLRM of the catalogue by name: the model the protocol, access, router and control tests serve."""
    return sorted(name for name, spec in catalogue_models().items() if spec.family == "dlrm")[0]


def reference(cfg: ModelConfig) -> torch.nn.Module:
    """The model a node's worker serves for ``cfg``, built here to compare answers with."""
    return build_worker_model(cfg).eval()


def scores(model: Any, batch: Any) -> np.ndarray:
    """``model``'s scores for ``batch``, computed in this process without autograd."""
    with torch.no_grad():
        return model(batch).numpy()


def tiny_spec() -> ModelSpec:
    """A two-table DLRM small enough to build, profile and serve in a blink (the load-generator tests' model)."""
    return ModelSpec(
        name="tiny", family="dlrm", dense_in=4, interaction="dot", sla=SLA(50.0),
        tables=(TableSpec("a", 1000, 8, pooling=4), TableSpec("b", 500, 8, pooling=2)),
        bottom_mlp=(16, 8), top_mlp=(16, 1),
    )
