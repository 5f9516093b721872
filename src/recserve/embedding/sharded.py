"""ElasticRec's embedding shards: hotness remapping, bucketization and recombination.

A table is sorted by access count (hottest row gets id 0) and cut into contiguous id ranges,
one per shard.  A query's (indices, offsets) is *bucketized* into per-shard (indices, offsets)
with each shard's base subtracted; each shard returns per-bag partial sums, and because sum
pooling is additive the full pooled embedding is the sum of the partials.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def hotness_order(access_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, remap): ``order[new] = old`` (hottest first, ties by id) and ``remap[old] = new``."""
    order = np.argsort(-np.asarray(access_counts), kind="stable").astype(np.int64)
    remap = np.empty_like(order)
    remap[order] = np.arange(order.size, dtype=np.int64)
    return order, remap


@dataclass
class ShardInput:
    """One shard's part of a table lookup: ids relative to the shard base, EmbeddingBag offsets,
    and where each id sat in the original index array (to scatter gathered rows back)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    positions: torch.Tensor


def bucketize(indices: torch.Tensor, offsets: torch.Tensor,
              boundaries: Sequence[int] | torch.Tensor) -> list[ShardInput]:
    """Split one table's (indices, offsets) by shard.  ``boundaries`` = shard starts plus the end:
    ``[0, b1, …, N]``.  Vectorised: one searchsorted, then a mask and a bincount per shard."""
    bounds = torch.as_tensor(boundaries, dtype=torch.int64)
    batch = offsets.numel()
    lengths = torch.diff(offsets, append=torch.tensor([indices.numel()], dtype=torch.int64))
    bag = torch.repeat_interleave(torch.arange(batch, dtype=torch.int64), lengths)
    shard = torch.searchsorted(bounds, indices, right=True) - 1
    out = []
    for s in range(bounds.numel() - 1):
        positions = torch.nonzero(shard == s, as_tuple=True)[0]
        counts = torch.bincount(bag[positions], minlength=batch)
        shard_offsets = torch.zeros(batch, dtype=torch.int64)
        if batch > 1:
            shard_offsets[1:] = torch.cumsum(counts[:-1], 0)
        out.append(ShardInput(indices[positions] - bounds[s], shard_offsets, positions))
    return out


def combine_pooled(partials: Sequence[torch.Tensor]) -> torch.Tensor:
    """Full pooled embeddings from per-shard partial sums (sum pooling is additive)."""
    total = partials[0].clone()
    for p in partials[1:]:
        total += p
    return total


def combine_gathered(parts: Sequence[torch.Tensor], inputs: Sequence[ShardInput], n: int, dim: int) -> torch.Tensor:
    """Rows in the original index order from per-shard gathered rows."""
    out = torch.empty((n, dim), dtype=parts[0].dtype if parts else torch.float32)
    for rows, shard_input in zip(parts, inputs, strict=True):
        out[shard_input.positions] = rows
    return out


# ---------------------------------------------------------------- remote shards: one fan-out / combine path

# A transport sends one shard's part: (shard name, ids, EmbeddingBag offsets or None to gather rows) -> a pending
# call: an object with ``result()`` (gRPC futures) or an awaitable (Ray Serve handles); the answer is a numpy array.
SendFn = Callable[[str, np.ndarray, np.ndarray | None], Any]


@dataclass
class PendingLookup:
    """One table lookup in flight: every non-empty shard's call sent, answers combined in one place."""

    inputs: list[ShardInput]
    calls: list[Any]  # None where the shard has nothing to read
    gather: bool
    bags: int
    n: int
    dim: int

    def combine(self, answers: Sequence[np.ndarray | None]) -> torch.Tensor:
        empty = (0 if self.gather else self.bags, self.dim)
        parts = [torch.zeros(empty) if a is None else torch.from_numpy(np.array(a, copy=True)) for a in answers]
        if self.gather:
            return combine_gathered(parts, self.inputs, self.n, self.dim)
        return combine_pooled(parts)

    def result(self) -> torch.Tensor:
        """Wait for blocking calls (``call.result()``)."""
        return self.combine([None if c is None else c.result() for c in self.calls])

    async def wait(self) -> torch.Tensor:
        """Await asynchronous calls concurrently."""
        import asyncio

        live = [c for c in self.calls if c is not None]
        got = iter(await asyncio.gather(*live))
        return self.combine([None if c is None else next(got) for c in self.calls])


class ShardedLookup:
    """A table whose shards live elsewhere: hotness remap + boundaries (no rows), shard names ``<table>-s<k>``.

    ``start`` bucketizes a lookup and sends every non-empty part through a transport at once, so a caller can
    overlap all shards of all tables; gRPC shard services and Ray Serve handles are two transports of it."""

    def __init__(self, name: str, num_rows: int, dim: int, boundaries: Sequence[int], remap: np.ndarray) -> None:
        if boundaries[0] != 0 or boundaries[-1] != num_rows or list(boundaries) != sorted(set(boundaries)):
            raise ValueError(f"boundaries must rise strictly from 0 to {num_rows}, got {list(boundaries)}")
        self.name, self.num_rows, self.dim = name, int(num_rows), int(dim)
        self.boundaries = torch.as_tensor(list(boundaries), dtype=torch.int64)
        self.remap = torch.from_numpy(np.asarray(remap, dtype=np.int64))

    def shard_name(self, s: int) -> str:
        return f"{self.name}-s{s}"

    def start(self, indices: torch.Tensor, offsets: torch.Tensor | None, send: SendFn) -> PendingLookup:
        """Bucketize and send; ``offsets=None`` gathers rows (sequence tables)."""
        gather = offsets is None
        if gather:
            offsets = torch.arange(indices.numel(), dtype=torch.int64)
        inputs = bucketize(self.remap[indices], offsets, self.boundaries)
        calls = [None if x.indices.numel() == 0 else
                 send(self.shard_name(s), x.indices.numpy(), None if gather else x.offsets.numpy())
                 for s, x in enumerate(inputs)]
        return PendingLookup(inputs, calls, gather, int(offsets.numel()), int(indices.numel()), self.dim)


# A shard backend: (shard, ShardInput) -> partial pooled [B, dim]; lets the same ShardedTable call
# in-process tensors, local worker pools or remote shard services.
PoolFn = Callable[[int, ShardInput], torch.Tensor]


class ShardedTable(nn.Module):
    """A table held as hotness-sorted contiguous shards; implements the zoo's TableLookup.

    ``pool`` and ``gather`` remap ids, bucketize and recombine; the shards are tensors here, and a
    remote backend can be injected with ``pool_fn`` (the dense shard calling embedding shards).
    """

    def __init__(self, weight: torch.Tensor, boundaries: Sequence[int], remap: np.ndarray | None = None,
                 pool_fn: PoolFn | None = None) -> None:
        super().__init__()
        self.num_rows, self.dim = int(weight.shape[0]), int(weight.shape[1])
        if boundaries[0] != 0 or boundaries[-1] != self.num_rows or list(boundaries) != sorted(set(boundaries)):
            raise ValueError(f"boundaries must rise strictly from 0 to {self.num_rows}, got {list(boundaries)}")
        self.boundaries = torch.as_tensor(list(boundaries), dtype=torch.int64)
        identity = np.arange(self.num_rows, dtype=np.int64)
        self.register_buffer("remap", torch.from_numpy(identity if remap is None else np.asarray(remap)),
                             persistent=False)
        sorted_weight = weight.detach().clone()
        if remap is not None:
            sorted_weight[self.remap] = weight.detach()
        self.shards = [sorted_weight[int(a):int(b)].contiguous() for a, b in zip(boundaries[:-1], boundaries[1:],
                                                                                  strict=True)]
        self.pool_fn = pool_fn or self._local_pool

    def _local_pool(self, s: int, shard_input: ShardInput) -> torch.Tensor:
        return F.embedding_bag(shard_input.indices, self.shards[s], shard_input.offsets, mode="sum")

    def shard_inputs(self, indices: torch.Tensor, offsets: torch.Tensor) -> list[ShardInput]:
        return bucketize(self.remap[indices], offsets, self.boundaries)

    def pool(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        inputs = self.shard_inputs(indices, offsets)
        return combine_pooled([self.pool_fn(s, x) for s, x in enumerate(inputs)])

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(indices.numel(), dtype=torch.int64)
        inputs = self.shard_inputs(indices, offsets)
        parts = [F.embedding(x.indices, self.shards[s]) for s, x in enumerate(inputs)]
        return combine_gathered(parts, inputs, indices.numel(), self.dim)
