"""ElasticRec sharded serving, the query path: the dense shard calling embedding-shard services.

The local deployment (``recserve.deploy.local_shards.start_sharded``) starts, on loopback,

- per embedding shard (a contiguous range of a hotness-sorted table) its planned number of replica
  processes (:mod:`recserve.serving.shards.service`), each a gRPC server with a private copy of its rows;
- a :class:`~recserve.serving.NodeServer` whose model is the *dense shard*: ``table_backend:
  elasticrec``, so each worker builds the dense layers and :class:`RemoteShardedTable` tables that
  bucketize every query and call the shard services concurrently (one gRPC future per shard with
  ids, all tables at once), sum the partial pooled embeddings and run ``model.dense``.  The fan-out and
  combine are ``embedding.sharded.ShardedLookup``'s, shared with the Ray Serve dense shard.

Clients see the usual Open Inference Protocol (HTTP + gRPC) of every recserve model.

Replicas are balanced on the client side (each dense worker keeps a channel per replica and sends
to the one with the fewest calls outstanding): no dispatcher hop between the dense and the
embedding shards (on a 2-core host a relay process costs more than the lookup), a replica is an
independent process as a Kubernetes pod is, and a dead replica is seen directly as a failed call:
the call is retried once on another replica of that shard if there is one, else the query gets
an error reply (never a hang: every call has a deadline).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import torch
from torch import nn

from recserve.embedding.sharded import PendingLookup, ShardedLookup
from recserve.errors import SpecError
from recserve.serving.shards.service import (
    GRPC_OPTIONS,
    INFER_METHOD,
    decode_response,
    encode_request,
)
from recserve.serving.wire.proto import service_pb2
from recserve.specs import get_model
from recserve.zoo import QueryBatch, RecModel, build

BACKEND = "elasticrec"
DEFAULT_TIMEOUT_S = 10.0
RETRY_AFTER_S = 2.0  # a replica that refused a call is skipped this long


class ShardCallError(RuntimeError):
    """An embedding-shard call failed; the dense worker turns it into an error reply for the query."""


# ---------------------------------------------------------------- client side (in dense workers)


# a replica restarted on its port is reached within a second (gRPC's default back-off grows to 120 s)
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass
class _Replica:
    address: str
    call: Any = None
    channel: Any = None
    outstanding: int = 0
    down_until: float = 0.0


class ShardClient:
    """Channels to every replica of every shard; least-outstanding choice, futures for concurrency."""

    def __init__(self, endpoints: dict[str, list[str]], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.replicas = {name: [_Replica(a) for a in addrs] for name, addrs in endpoints.items()}
        self.timeout_s = timeout_s
        self._turn = itertools.count()
        self._lock = threading.Lock()

    def _connect(self, r: _Replica) -> None:
        r.channel = grpc.insecure_channel(r.address, options=GRPC_OPTIONS[:2] + RECONNECT_OPTIONS)
        r.call = r.channel.unary_unary(INFER_METHOD, request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                       response_deserializer=service_pb2.ModelInferResponse.FromString)

    def _pick(self, shard: str, avoid: _Replica | None = None) -> _Replica:
        replicas = self.replicas.get(shard)
        if not replicas:
            raise ShardCallError(f"no endpoint for embedding shard {shard!r}")
        now = time.monotonic()
        live = [r for r in replicas if r.down_until <= now and r is not avoid] or [
            r for r in replicas if r is not avoid] or replicas
        k = next(self._turn)
        return min((live[(k + i) % len(live)] for i in range(len(live))), key=lambda r: r.outstanding)

    def start(self, shard: str, indices: np.ndarray, offsets: np.ndarray | None) -> _Call:
        """Send one request now; the returned call's ``result()`` waits for it."""
        request = encode_request(shard, indices, offsets)
        return _Call(self, shard, request)._send(self._pick(shard))

    def _release(self, r: _Replica) -> None:
        with self._lock:
            r.outstanding -= 1

    def close(self) -> None:
        for rs in self.replicas.values():
            for r in rs:
                if r.channel is not None:
                    r.channel.close()
                    r.channel = r.call = None


class _Call:
    def __init__(self, client: ShardClient, shard: str, request: Any) -> None:
        self.client, self.shard, self.request = client, shard, request
        self.replica: _Replica | None = None
        self.future: Any = None
        self.retried = False

    def _send(self, r: _Replica) -> _Call:
        if r.call is None:
            self.client._connect(r)
        with self.client._lock:
            r.outstanding += 1
        self.replica = r
        self.future = r.call.future(self.request, timeout=self.client.timeout_s)
        self.future.add_done_callback(lambda _f, r=r: self.client._release(r))
        return self

    def result(self) -> np.ndarray:
        try:
            return decode_response(self.future.result())
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            where = f"embedding shard {self.shard} replica {self.replica.address}"
            if code == grpc.StatusCode.UNAVAILABLE:
                self.replica.down_until = time.monotonic() + RETRY_AFTER_S
                others = [r for r in self.client.replicas[self.shard] if r is not self.replica]
                if others and not self.retried:
                    self.retried = True
                    return self._send(self.client._pick(self.shard, avoid=self.replica)).result()
            name = code.name if code is not None else "ERROR"
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise ShardCallError(f"{where}: {name}: {details}") from None


class RemoteShardedTable(nn.Module):
    """A zoo table lookup whose shards live in embedding-shard services: the one
    :class:`~recserve.embedding.sharded.ShardedLookup` path over the gRPC transport (:class:`ShardClient`).
    :meth:`start` sends every shard's part at once and returns a pending lookup, which is how the dense shard
    overlaps all shards of all tables."""

    def __init__(self, name: str, num_rows: int, dim: int, boundaries: list[int], remap: np.ndarray,
                 client: ShardClient) -> None:
        super().__init__()
        self.lookup = ShardedLookup(name, num_rows, dim, boundaries, remap)
        self.name, self.num_rows, self.dim = name, self.lookup.num_rows, self.lookup.dim
        self.client = client

    def start(self, indices: torch.Tensor, offsets: torch.Tensor | None) -> PendingLookup:
        """Bucketize and send; ``offsets=None`` gathers rows (sequence tables)."""
        return self.lookup.start(indices, offsets, self.client.start)

    def pool(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.start(indices, offsets).result()

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        return self.start(indices, None).result()


class DenseShardModel(nn.Module):
    """The dense shard as a node-server worker model: concurrent remote sparse part, local dense part."""

    def __init__(self, model: RecModel, client: ShardClient) -> None:
        super().__init__()
        self.model, self.client = model, client
        self.spec, self.rows, self.sequence_lengths = model.spec, model.rows, model.sequence_lengths

    def sparse(self, batch: QueryBatch) -> list[torch.Tensor]:
        pending = []
        for t, (indices, offsets) in enumerate(batch.tables()):
            sequence = t in self.sequence_lengths
            pending.append(self.model.tables[t].start(indices, None if sequence else offsets))
        out = []
        for t, p in enumerate(pending):  # every call is in flight before the first wait
            res = p.result()
            out.append(res.view(batch.size, self.sequence_lengths[t], -1) if t in self.sequence_lengths else res)
        return out

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        return self.model.dense(dense, pooled)

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        return self.dense(batch.dense, self.sparse(batch))


def build_dense_shard_model(model_config: Any) -> DenseShardModel:
    """``table_backend: elasticrec`` worker model; ``options`` = :func:`dense_options` output."""
    options = model_config.options
    for key in ("tables", "endpoints"):
        if key not in options:
            raise SpecError(f"model {model_config.name!r}: table_backend elasticrec needs options.{key}")
    spec = get_model(model_config.model)
    model = build(spec, scale=1e-12, seed=model_config.seed, min_rows=1)  # dense weights as the full model's
    client = ShardClient(options["endpoints"], float(options.get("timeout_s", DEFAULT_TIMEOUT_S)))
    model.rows = tuple(int(t["rows"]) for t in options["tables"])
    for t, table in enumerate(options["tables"]):
        model.replace_table(t, RemoteShardedTable(table["name"], table["rows"], spec.tables[t].dim,
                                                  table["boundaries"], table["remap"], client))
    return DenseShardModel(model, client).eval()
