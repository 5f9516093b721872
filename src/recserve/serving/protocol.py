"""Open Inference Protocol (KServe v2) tensors and Triton-compatible metadata, shared by HTTP and gRPC.

Inputs are ``dense`` FP32 ``[B, D]``, ``sparse_values`` INT64 ``[N]``, ``sparse_lengths`` INT32
``[T, B]`` (INT64 accepted); the output is ``scores`` FP32 ``[B, towers]``.  Because the sparse
layout is table-major, the batch dimension is explicit in every shape (Triton's implicit leading
batch dimension cannot describe ``[T, B]``): model metadata and config report full-rank dims with
-1 for the variable sizes, and ``max_batch_size`` is the largest query the server admits.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from recserve.serving.runtime import InferError, ModelInfo
from recserve.zoo.batch import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, OUTPUT_SCORES

SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "recserve_control"]
PLATFORM = "pytorch_libtorch"
BACKEND = "pytorch"

DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16), "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
EXPECTED: dict[str, tuple[str, ...]] = {
    INPUT_DENSE: ("FP32",), INPUT_VALUES: ("INT64",), INPUT_LENGTHS: ("INT32", "INT64"),
}


def invalid(field: str, message: str) -> InferError:
    return InferError("invalid", f"{field}: {message}", field)


# ---------------------------------------------------------------- metadata / config


def io_shapes(info: ModelInfo) -> tuple[list[dict], list[dict]]:
    inputs = [
        {"name": INPUT_DENSE, "datatype": "FP32", "shape": [-1, info.dense_in]},
        {"name": INPUT_VALUES, "datatype": "INT64", "shape": [-1]},
        {"name": INPUT_LENGTHS, "datatype": "INT32", "shape": [len(info.rows), -1]},
    ]
    outputs = [{"name": OUTPUT_SCORES, "datatype": "FP32", "shape": [-1, info.towers]}]
    return inputs, outputs


def model_metadata(name: str, info: ModelInfo) -> dict[str, Any]:
    inputs, outputs = io_shapes(info)
    return {"name": name, "versions": ["1"], "platform": PLATFORM, "inputs": inputs, "outputs": outputs}


def model_config(name: str, info: ModelInfo, max_batch_size: int, workers: int) -> dict[str, Any]:
    """Triton's model configuration JSON (the fields perf_analyzer and tritonclient read)."""
    inputs, outputs = io_shapes(info)
    return {
        "name": name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": max_batch_size,
        "input": [{"name": t["name"], "data_type": "TYPE_" + t["datatype"], "format": "FORMAT_NONE",
                   "dims": t["shape"]} for t in inputs],
        "output": [{"name": t["name"], "data_type": "TYPE_" + t["datatype"], "dims": t["shape"]} for t in outputs],
        "instance_group": [{"name": name, "kind": "KIND_CPU", "count": workers}],
        "parameters": {"batch_dim_explicit": {"string_value": "true"}},
    }


def server_metadata(name: str) -> dict[str, Any]:
    return {"name": name, "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}


# ---------------------------------------------------------------- decoding


def _shape(field: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise invalid(field, f"shape must be a list of non-negative integers, got {shape!r}")
    return tuple(int(d) for d in shape)


def _check_names(names: list[str]) -> None:
    for n in names:
        if n not in EXPECTED:
            raise invalid(n, f"unknown input; expected {sorted(EXPECTED)}")
    if len(set(names)) != len(names):
        raise invalid("inputs", "an input is given twice")
    for n in EXPECTED:
        if n not in names:
            raise invalid(n, "input tensor missing")


def _check_dtype(field: str, datatype: Any) -> np.dtype:
    if datatype not in EXPECTED[field]:
        raise invalid(field, f"datatype must be {' or '.join(EXPECTED[field])}, got {datatype!r}")
    return DTYPES[datatype]


def from_raw(field: str, datatype: Any, shape: Any, raw: bytes | memoryview) -> np.ndarray:
    dtype = _check_dtype(field, datatype)
    dims = _shape(field, shape)
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise invalid(field, f"binary data has {len(raw)} bytes, shape {list(dims)} of {datatype} needs {expected}")
    # frombuffer views the request body (no copy); the model only reads its inputs.
    return np.frombuffer(raw, dtype=dtype).reshape(dims)


def from_list(field: str, datatype: Any, shape: Any, data: Any) -> np.ndarray:
    dtype = _check_dtype(field, datatype)
    dims = _shape(field, shape)
    try:
        arr = np.asarray(data, dtype=dtype).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise invalid(field, f"data is not a list of {datatype} numbers: {exc}") from exc
    count = int(np.prod(dims, dtype=np.int64))
    if arr.size != count:
        raise invalid(field, f"data holds {arr.size} elements, shape {list(dims)} needs {count}")
    return arr.reshape(dims)


def parse_http_infer(body: bytes, header_length: str | None) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON part of a v2 infer request and its input arrays (JSON ``data`` or binary extension)."""
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError as exc:
            raise invalid("Inference-Header-Content-Length", f"not an integer: {header_length!r}") from exc
        if not 0 < n <= len(body):
            raise invalid("Inference-Header-Content-Length", f"{n} is outside the body of {len(body)} bytes")
        head, binary = body[:n], memoryview(body)[n:]
    else:
        head, binary = body, memoryview(b"")
    try:
        request = json.loads(head)
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid("body", f"not valid JSON: {exc}") from exc
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise invalid("inputs", "request must be a JSON object with an 'inputs' list")
    tensors = request["inputs"]
    if not all(isinstance(t, dict) for t in tensors):
        raise invalid("inputs", "every input must be a JSON object")
    _check_names([t.get("name") for t in tensors])
    arrays, offset = {}, 0
    for t in tensors:
        name = t["name"]
        params = t.get("parameters") or {}
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise invalid(name, f"binary_data_size {size!r} runs past the {len(binary)} binary bytes")
            arrays[name] = from_raw(name, t.get("datatype"), t.get("shape"), binary[offset : offset + size])
            offset += size
        elif "data" in t:
            arrays[name] = from_list(name, t.get("datatype"), t.get("shape"), t["data"])
        else:
            raise invalid(name, "needs 'data' or parameters.binary_data_size")
    if offset != len(binary):
        raise invalid("body", f"{len(binary) - offset} binary bytes after the last input")
    return request, arrays


def wants_binary_output(request: dict) -> bool:
    """Binary ``scores`` if asked per output or with ``binary_data_output``; JSON otherwise."""
    for out in request.get("outputs") or []:
        if isinstance(out, dict) and out.get("name") == OUTPUT_SCORES:
            flag = (out.get("parameters") or {}).get("binary_data")
            if flag is not None:
                return bool(flag)
    return bool((request.get("parameters") or {}).get("binary_data_output", False))


def check_outputs(names: list[Any]) -> None:
    for n in names:
        if n != OUTPUT_SCORES:
            raise invalid(str(n), f"unknown output; this model has only {OUTPUT_SCORES!r}")


def http_infer_response(name: str, request: dict, scores: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """Body and extra headers of a v2 infer response."""
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    out: dict[str, Any] = {"name": OUTPUT_SCORES, "datatype": "FP32", "shape": list(scores.shape)}
    response: dict[str, Any] = {"model_name": name, "model_version": "1", "outputs": [out]}
    if "id" in request:
        response["id"] = request["id"]
    if wants_binary_output(request):
        raw = scores.tobytes()
        out["parameters"] = {"binary_data_size": len(raw)}
        head = json.dumps(response).encode()
        return head + raw, {"Inference-Header-Content-Length": str(len(head)),
                            "Content-Type": "application/octet-stream"}
    out["data"] = scores.reshape(-1).tolist()
    return json.dumps(response).encode(), {"Content-Type": "application/json"}


# ---------------------------------------------------------------- gRPC


_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents"}


def parse_grpc_infer(request: Any) -> dict[str, np.ndarray]:
    names = [t.name for t in request.inputs]
    _check_names(names)
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise invalid("raw_input_contents", f"{len(raw)} raw buffers for {len(request.inputs)} inputs")
    arrays = {}
    for i, t in enumerate(request.inputs):
        if raw:
            arrays[t.name] = from_raw(t.name, t.datatype, list(t.shape), raw[i])
        else:
            _check_dtype(t.name, t.datatype)
            values = getattr(t.contents, _CONTENTS[t.datatype])
            arrays[t.name] = from_list(t.name, t.datatype, list(t.shape), values)
    check_outputs([o.name for o in request.outputs])
    return arrays
