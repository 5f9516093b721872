"""Open Inference Protocol (KServe v2) model metadata and Triton-compatible configuration, shared by HTTP and gRPC.

Inputs are ``dense`` FP32 ``[B, D]``, ``sparse_values`` INT64 ``[N]``, ``sparse_lengths`` INT32
``[T, B]`` (INT64 accepted); the output is ``scores`` FP32 ``[B, towers]``.  Because the sparse
layout is table-major, no input has a leading batch dimension (``sparse_lengths`` is ``[T, B]``),
so Triton's implicit one cannot describe them.  The model configuration therefore says
``max_batch_size: 0`` ("dims are the full shape", Triton's rule for models that do not batch along
the first dimension) with full-rank dims and -1 for the variable sizes; perf_analyzer and
tritonclient then check request shapes against exactly those dims.  The largest query the server
admits is ``parameters.max_query_size`` (a string, as Triton's model parameters are).

Encoding and decoding of requests and responses live in :mod:`recserve.serving.wire.codec` (numpy only);
the names re-exported below keep ``from recserve.serving.wire.protocol import parse_http_infer`` working.
Errors and their HTTP/gRPC status are :mod:`recserve.serving.wire.errors`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from recserve.serving.wire.codec import (
    DTYPES,
    EXPECTED,
    check_outputs,
    from_list,
    from_raw,
    http_infer_response,
    invalid,
    parse_grpc_infer,
    parse_http_infer,
    wants_binary_output,
)
from recserve.serving.wire.errors import InferError
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, OUTPUT_SCORES

if TYPE_CHECKING:
    from recserve.serving.wire.model_info import ModelInfo

__all__ = ["DTYPES", "EXPECTED", "check_load_parameters", "check_outputs", "from_list", "from_raw",
           "http_infer_response", "invalid", "io_shapes", "model_config", "model_metadata", "parse_grpc_infer",
           "parse_http_infer", "server_metadata", "wants_binary_output"]

SERVER_VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository", "system_shared_memory",
              "recserve_control"]
# Triton extensions this server does not offer, answered 501 / UNIMPLEMENTED with these words
TRACE_UNSUPPORTED = ("trace settings are not supported by this server (Triton's trace extension); per-request "
                     "timings are in /v2/models/{model}/stats and /metrics")
LOGGING_UNSUPPORTED = ("log settings are not supported by this server (Triton's logging extension); the node "
                       "logs to its standard error at the level of `recserve serve --log-level` (default info)")
PLATFORM = "pytorch_libtorch"
BACKEND = "pytorch"

# ---------------------------------------------------------------- metadata / config


def io_shapes(info: ModelInfo) -> tuple[list[dict], list[dict]]:
    inputs = [
        {"name": INPUT_DENSE, "datatype": "FP32", "shape": [-1, info.dense_in]},
        {"name": INPUT_VALUES, "datatype": "INT64", "shape": [-1]},
        {"name": INPUT_LENGTHS, "datatype": "INT32", "shape": [len(info.rows), -1]},
    ]
    outputs = [{"name": OUTPUT_SCORES, "datatype": "FP32", "shape": [-1, info.towers]}]
    return inputs, outputs


def model_metadata(name: str, info: ModelInfo, versions: list[str] | None = None) -> dict[str, Any]:
    inputs, outputs = io_shapes(info)
    return {"name": name, "versions": versions or ["1"], "platform": PLATFORM, "inputs": inputs, "outputs": outputs}


def model_config(name: str, info: ModelInfo, max_batch_size: int, workers: int,
                 version_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """Triton's model configuration JSON (the fields perf_analyzer and tritonclient read); ``version_policy`` in
    Triton's form (default: the newest version alone, what a node config's model serves).

    ``max_batch_size`` is the largest query the server admits (the node config's ``max_batch_size``);
    it is reported as ``parameters.max_query_size`` while the Triton field is 0 (see the module doc).
    """
    inputs, outputs = io_shapes(info)
    return {
        "name": name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "version_policy": version_policy or {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [{"name": t["name"], "data_type": "TYPE_" + t["datatype"], "format": "FORMAT_NONE",
                   "dims": t["shape"]} for t in inputs],
        "output": [{"name": t["name"], "data_type": "TYPE_" + t["datatype"], "dims": t["shape"]} for t in outputs],
        "instance_group": [{"name": name, "kind": "KIND_CPU", "count": workers}],
        "parameters": {"batch_dim_explicit": {"string_value": "true"},
                       "max_query_size": {"string_value": str(max_batch_size)}},
    }


def server_metadata(name: str, extensions: list[str] = EXTENSIONS) -> dict[str, Any]:
    return {"name": name, "version": SERVER_VERSION, "extensions": list(extensions)}


def check_load_parameters(names: Iterable[str]) -> None:
    """A repository load's parameters: Triton's ``config`` override and ``file:`` contents are refused, not
    ignored, since a load reads the model's folder as it is on disk."""
    for name in names:
        if name == "config" or name.startswith("file:"):
            raise InferError("invalid", f"parameters.{name}: a load with a config override or model files is not "
                                        "supported; this server loads REPO/<model> as it is on disk: change its "
                                        "config.yaml or version folders, then load again", f"parameters.{name}")
