"""Building Open Inference Protocol inputs with tritonclient, as a user's client does (shared by the serving tests)."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def http_inputs(batch, binary: bool = True) -> list[thttp.InferInput]:
    inputs = []
    for name, arr in batch.as_arrays().items():
        x = thttp.InferInput(name, list(arr.shape), DTYPE_NAMES[arr.dtype])
        x.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(x)
    return inputs


def grpc_inputs(batch) -> list[tgrpc.InferInput]:
    inputs = []
    for name, arr in batch.as_arrays().items():
        x = tgrpc.InferInput(name, list(arr.shape), DTYPE_NAMES[arr.dtype])
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs
