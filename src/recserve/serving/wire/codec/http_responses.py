"""HTTP infer answers, server side: scores as JSON ``data``, as the binary extension (its JSON header made from a
cached template), or written into the shared-memory region the request names."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from recserve.serving.wire.codec.tensors import (
    HEADER_LENGTH,
    Target,
    finite_scores,
    json_dumps,
    raw_tensor,
    write_scores,
)
from recserve.serving.wire.shm import tensor_params
from recserve.wire import OUTPUT_SCORES


def wants_binary_output(request: dict) -> bool:
    """Binary ``scores`` if asked per output or with ``binary_data_output``; JSON otherwise (request validated)."""
    for out in request.get("outputs") or []:
        if out.get("name") == OUTPUT_SCORES:
            flag = (out.get("parameters") or {}).get("binary_data")
            if flag is not None:
                return flag
    return (request.get("parameters") or {}).get("binary_data_output", False)


def output_target(request: dict) -> Target | None:
    """Where the request asks ``scores`` to be written in shared memory (request validated), or None."""
    for out in request.get("outputs") or []:
        params = out.get("parameters")
        if params and out.get("name") == OUTPUT_SCORES:
            return tensor_params(OUTPUT_SCORES, params)
    return None


def http_infer_response(name: str, request: dict, scores: np.ndarray, version: str = "1",
                        regions: Any = None) -> tuple[bytes, dict[str, str]]:
    """Body and extra headers of a v2 infer response (``model_version``: the version that answered); scores asked
    into a shared-memory region are written there and left out of the body."""
    scores = finite_scores(scores)
    target = output_target(request)
    if target is not None:
        response = {"model_name": name, "model_version": version,
                    "outputs": [write_scores(target, scores, regions)]}
        if "id" in request:
            response["id"] = request["id"]
        return json_dumps(response), {"Content-Type": "application/json"}
    if wants_binary_output(request):
        raw = scores.astype("<f4", copy=False).tobytes()
        head, length = _binary_head_bytes(name, version, scores.shape, len(raw), request.get("id"))
        return head + raw, {HEADER_LENGTH: length, "Content-Type": "application/octet-stream"}
    out, _ = raw_tensor(OUTPUT_SCORES, scores)
    response: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": [out]}
    if "id" in request:
        response["id"] = request["id"]
    out["data"] = scores.reshape(-1).tolist()
    return json_dumps(response), {"Content-Type": "application/json"}


def _binary_head(name: str, version: str, shape: tuple[int, ...], size: int, request_id: Any) -> str:
    """The JSON header of a binary-output response, from a template: ``json.dumps`` of the same dict on every
    answer was a visible part of a batch-1 query's cost besides its model."""
    ident = "" if request_id is None else f',"id":{json.dumps(request_id)}'
    return (f'{{"model_name":{_json_str(name)},"model_version":{_json_str(version)},"outputs":[{{"name":'
            f'"{OUTPUT_SCORES}","datatype":"FP32","shape":[{",".join(map(str, shape))}],'
            f'"parameters":{{"binary_data_size":{size}}}}}]{ident}}}')


def _binary_head_bytes(name: str, version: str, shape: tuple[int, ...], size: int,
                       request_id: str | None) -> tuple[bytes, str]:
    """``_binary_head`` encoded, and its length as the header's value: remembered per (model, version, shape) for
    requests without an ``id`` (answers of one shape repeat it); an id,
    often unique per request, is written every time."""
    if request_id is None:
        return _cached_binary_head(name, version, shape, size)
    head = _binary_head(name, version, shape, size, request_id).encode()
    return head, str(len(head))


@functools.lru_cache(maxsize=256)
def _cached_binary_head(name: str, version: str, shape: tuple[int, ...], size: int) -> tuple[bytes, str]:
    head = _binary_head(name, version, shape, size, None).encode()
    return head, str(len(head))


@functools.lru_cache(maxsize=256)
def _json_str(text: str) -> str:
    return json.dumps(text)
