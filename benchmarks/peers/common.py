"""What every peer shares: build the model once per process and score one query.

Only ``recserve.specs`` and ``recserve.zoo`` are imported at module level (torch, numpy and pyyaml): the KServe and
MLServer peers run in venvs of their own that hold no more of recserve's requirements.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from recserve.specs import get_model
from recserve.zoo import QueryBatch, RecModel, build

HEADER = "Inference-Header-Content-Length"
OUTPUT = "scores"  # recserve.wire.OUTPUT_SCORES: the name every peer answers under


def load_model() -> RecModel:
    """The benchmark model from RECSERVE_PEER_MODEL / RECSERVE_PEER_SCALE, one torch thread."""
    torch.set_num_threads(int(os.environ.get("RECSERVE_PEER_THREADS", "1")))
    return build(get_model(os.environ["RECSERVE_PEER_MODEL"]), scale=float(os.environ["RECSERVE_PEER_SCALE"]))


def model_name() -> str:
    return os.environ["RECSERVE_PEER_MODEL"]


def score(model: RecModel, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Scores ``[B, towers]`` FP32 of one query given as its wire tensors (name -> array)."""
    batch = QueryBatch.from_arrays(arrays)
    model.validate(batch)
    with torch.no_grad():
        return model(batch).numpy()


def infer(model: RecModel, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
    """One v2 HTTP infer request (binary extension or JSON) answered with recserve's own codec."""
    from recserve.serving.wire.protocol import http_infer_response, parse_http_infer

    request, arrays = parse_http_infer(body, header_length)
    return http_infer_response(model.spec.name, request, score(model, arrays))
