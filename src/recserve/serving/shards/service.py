"""One ElasticRec embedding-shard replica: a process holding a contiguous, hotness-sorted slice of a
table and serving it over the standard ``inference.GRPCInferenceService/ModelInfer``.

Wire format (Triton/KServe v2 tensors in ``raw_input_contents``), model name = the shard name:

- pooled tables: inputs ``indices`` INT64 ``[n]`` (ids relative to the shard's first row) and
  ``offsets`` INT64 ``[B]`` (EmbeddingBag offsets, ``offsets[0] == 0``) -> output ``pooled`` FP32
  ``[B, dim]``, the per-bag partial sums of this shard's rows;
- sequence tables (the ``gather`` variant): input ``indices`` only -> output ``rows`` FP32 ``[n, dim]``.

A replica is a process of its own with a *private copy* of its rows (loaded from a ``.npy`` file,
as a container loads its shard), so replicating a shard costs its rows again, as in the paper.
One handler thread per replica: a replica is one worker; more throughput = more replicas.
"""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch
from torch.nn import functional as F

from recserve.serving.wire.proto import service_pb2, service_pb2_grpc
from recserve.zoo.threads import inherit_torch_threads

INPUT_INDICES, INPUT_OFFSETS = "indices", "offsets"
OUTPUT_POOLED, OUTPUT_ROWS = "pooled", "rows"
INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)]


class ShardRequestError(ValueError):
    """A malformed shard request (answered with INVALID_ARGUMENT)."""


# ---------------------------------------------------------------- encoding (client and server)


def encode_request(shard: str, indices: np.ndarray, offsets: np.ndarray | None) -> Any:
    """A ModelInferRequest for ``shard``: pooled if ``offsets`` is given, gather otherwise."""
    req = service_pb2.ModelInferRequest(model_name=shard)
    tensors = [(INPUT_INDICES, indices)] + ([(INPUT_OFFSETS, offsets)] if offsets is not None else [])
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype="<i8")
        t = req.inputs.add()
        t.name, t.datatype = name, "INT64"
        t.shape.extend(arr.shape)
        req.raw_input_contents.append(arr.tobytes())
    return req


def decode_response(resp: Any) -> np.ndarray:
    if len(resp.outputs) != 1 or len(resp.raw_output_contents) != 1 or resp.outputs[0].datatype != "FP32":
        raise ValueError("embedding shard reply must hold one FP32 output in raw_output_contents")
    shape = tuple(resp.outputs[0].shape)
    return np.frombuffer(resp.raw_output_contents[0], dtype="<f4").reshape(shape)


def decode_request(req: Any) -> dict[str, np.ndarray]:
    raw = list(req.raw_input_contents)
    if len(raw) != len(req.inputs):
        raise ShardRequestError(f"{len(raw)} raw buffers for {len(req.inputs)} inputs (raw tensors required)")
    arrays: dict[str, np.ndarray] = {}
    for t, buf in zip(req.inputs, raw, strict=True):
        if t.name not in (INPUT_INDICES, INPUT_OFFSETS) or t.name in arrays:
            raise ShardRequestError(f"unexpected or repeated input {t.name!r}; expected indices [+ offsets]")
        if t.datatype != "INT64" or len(t.shape) != 1:
            raise ShardRequestError(f"{t.name}: must be INT64 of rank 1, got {t.datatype} {list(t.shape)}")
        if len(buf) != int(t.shape[0]) * 8:
            raise ShardRequestError(f"{t.name}: {len(buf)} bytes for shape {list(t.shape)}")
        arrays[t.name] = np.frombuffer(buf, dtype="<i8")
    if INPUT_INDICES not in arrays:
        raise ShardRequestError("input 'indices' missing")
    return arrays


# ---------------------------------------------------------------- the replica


def lookup(weight: torch.Tensor, arrays: dict[str, np.ndarray]) -> tuple[str, np.ndarray]:
    """(output name, tensor) for one decoded request, after bounds checks."""
    indices = arrays[INPUT_INDICES]
    rows = weight.shape[0]
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= rows):
        raise ShardRequestError(f"indices must lie in [0, {rows}) for this shard")
    idx = torch.from_numpy(indices.copy())
    offsets = arrays.get(INPUT_OFFSETS)
    if offsets is None:
        return OUTPUT_ROWS, F.embedding(idx, weight).numpy()
    if offsets.size and (offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] > indices.size):
        raise ShardRequestError("offsets must start at 0, never decrease and stay within indices")
    return OUTPUT_POOLED, F.embedding_bag(idx, weight, torch.from_numpy(offsets.copy()), mode="sum").numpy()


class ShardServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, name: str, weight: torch.Tensor) -> None:
        self.name, self.weight = name, weight

    def ServerLive(self, request, context):  # noqa: N802 (generated names)
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):  # noqa: N802
        return service_pb2.ModelReadyResponse(ready=request.name == self.name)

    def ModelInfer(self, request, context):  # noqa: N802
        if request.model_name != self.name:
            context.abort(grpc.StatusCode.NOT_FOUND, f"this replica serves shard {self.name!r}, "
                                                     f"not {request.model_name!r}")
        try:
            output, out = lookup(self.weight, decode_request(request))
        except ShardRequestError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"shard {self.name}: {exc}")
        response = service_pb2.ModelInferResponse(model_name=self.name, model_version="1", id=request.id)
        t = response.outputs.add()
        t.name, t.datatype = output, "FP32"
        t.shape.extend(out.shape)
        response.raw_output_contents.append(np.ascontiguousarray(out, dtype="<f4").tobytes())
        return response


@dataclass
class ReplicaArgs:
    shard: str
    replica: int
    weight_path: str
    host: str = "127.0.0.1"
    port: int = 0
    threads: int = 1


def replica_main(conn: Any, args: ReplicaArgs) -> None:
    """Process entry: load the rows, serve until the parent says stop or goes away (pipe EOF)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal Ctrl-C reaches the whole group: the parent stops us
    torch.set_num_threads(args.threads)
    weight = torch.from_numpy(np.load(args.weight_path))  # a private copy, not a shared mapping
    server = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"shard-{args.shard}",
                                            initializer=inherit_torch_threads),
                         options=GRPC_OPTIONS)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(ShardServicer(args.shard, weight), server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        conn.send(("error", f"cannot bind {args.host}:{args.port}"))
        return
    server.start()
    conn.send(("ready", os.getpid(), port))
    stop = threading.Event()

    def wait_parent() -> None:
        try:
            conn.recv()
        except (EOFError, OSError):
            pass
        stop.set()

    threading.Thread(target=wait_parent, daemon=True).start()
    stop.wait()
    server.stop(grace=1.0).wait(5.0)
