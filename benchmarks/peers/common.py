"""What both peers share: build the model once per process and answer one v2 infer request."""

from __future__ import annotations

import os

import torch

from recserve.serving.wire.protocol import http_infer_response, parse_http_infer
from recserve.specs import get_model
from recserve.zoo import QueryBatch, RecModel, build

HEADER = "Inference-Header-Content-Length"


def load_model() -> RecModel:
    """The benchmark model from RECSERVE_PEER_MODEL / RECSERVE_PEER_SCALE, one torch thread."""
    torch.set_num_threads(int(os.environ.get("RECSERVE_PEER_THREADS", "1")))
    return build(get_model(os.environ["RECSERVE_PEER_MODEL"]), scale=float(os.environ["RECSERVE_PEER_SCALE"]))


def infer(model: RecModel, body: bytes, header_length: str | None) -> tuple[bytes, dict[str, str]]:
    request, arrays = parse_http_infer(body, header_length)
    batch = QueryBatch.from_arrays(arrays)
    model.validate(batch)
    with torch.no_grad():
        scores = model(batch).numpy()
    return http_infer_response(model.spec.name, request, scores)
