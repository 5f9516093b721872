"""Building Open Inference Protocol inputs with tritonclient, as a user's client does (shared by the serving tests)."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from recserve.serving.codec import triton_inputs

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def http_inputs(batch, binary: bool = True) -> list[thttp.InferInput]:
    return triton_inputs(thttp, batch.as_arrays(), binary)


def grpc_inputs(batch) -> list[tgrpc.InferInput]:
    return triton_inputs(tgrpc, batch.as_arrays())
