"""Building Open Inference Protocol inputs with tritonclient, as a user's client does (shared by the serving tests)."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from recserve.serving.wire.codec import triton_inputs

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def http_inputs(batch, binary: bool = True) -> list[thttp.InferInput]:
    return triton_inputs(thttp, batch.as_arrays(), binary)


def grpc_inputs(batch) -> list[tgrpc.InferInput]:
    return triton_inputs(tgrpc, batch.as_arrays())


def small_query(batch: int = 1, ids: int = 3, lengths_dtype=np.int32, seed: int = 0) -> dict[str, np.ndarray]:
    """Wire arrays of a two-table query whose ``ids`` all sit in the first table's first bag (ids below 10): what the
    request-plan tests send again and again with other values."""
    rng = np.random.default_rng(seed)
    lengths = np.zeros((2, batch), lengths_dtype)
    lengths[0, 0] = ids
    return {"dense": rng.standard_normal((batch, 4)).astype(np.float32),
            "sparse_values": rng.integers(0, 10, ids).astype(np.int64), "sparse_lengths": lengths}
