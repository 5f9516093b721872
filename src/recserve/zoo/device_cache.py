"""Hot rows of a model's fused tables on the device, the rest on the host (issue #16).

Why: ``FusedModel.to_device`` moves every fused weight whole, so a model whose tables exceed device memory cannot
be served on a GPU.  FBGEMM's UVM caching keeps such tables in host memory with a device cache of hot rows,
resolved by kernels on the device; this is the same idea in plain PyTorch + numpy (no extra wheel), resolved on
the *host*, because that is where a query's ids already are (the CPU worker decoded them; the accelerator worker
reads them from its staging arena):

- per width group ``g`` of :class:`~recserve.zoo.fused.FusedTables` a device weight of ``capacity[g]`` cached rows
  followed by a *spare* region, and one host int32 ``remap`` over every row of every group (global row -> slot in
  its group's device weight, or -1);
- per pass, numpy maps the query's ids to slots (``remap[ids]``), gathers the rows it misses from the host weight
  into the spare region (through a pinned buffer, copied non-blocking with the query), rewrites the missed ids to
  their spare slots, and the pass runs the fused path's own ``FusedTables.lookup``: the same rows in the same
  order, so scores equal the uncached fused path's exactly.  Nothing waits for the device but the scores;
- the hot set is the most looked-up rows: every ``count_stride``-th id of a pass adds one to its row's count, once
  per pass however often it occurs among them (a fancy-index add; ``np.add.at``, which counts repeats, cost 10x
  as much: 270 vs 14 us for 4,096 ids).  A row's chance to be in a pass's sample grows with its lookup rate, so the
  counts rank rows as their rates do.  Once ``refresh_ids`` ids were counted (default: the tables' rows, at least
  2^18, so a refresh's O(rows) scan is spread over at least as many counted ids) the cache is refilled between
  passes with each group's top rows (rows staying keep their slot; only entering rows are copied), counts then
  halved so the set follows drift.  Before any count the cache holds a prefix of every table, pro rata (the
  catalogue's samplers scatter hot rows over the ids, so a prefix is only a start, not a policy).

The device budget (``budget_bytes``) is shared out so every group caches the same fraction of its rows.  A pass also
needs its missed rows on the device: the spare region grows to the largest pass's distinct misses (reported in
:meth:`DeviceTableCache.stats`).  A budget of at least the tables' bytes caches everything: the remap is the
identity, nothing is counted, no row is ever gathered, and a pass skips the host remap: the ids are resolved on
the device as ``FusedModel`` does (today's whole-table path).

Buffers reused across passes (the pinned staging rows and slot arrays) are safe because every pass ends by copying
its scores to the host, which waits for the pass's copies; a caller that does not must synchronise before the next.
Host memory: the fused host weights (one copy of the tables, private to the process, as ``FusedTables`` builds)
plus 8 B per row (remap and counts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from recserve.zoo.base import RecModel
from recserve.zoo.batch import QueryBatch
from recserve.zoo.fused import FusedTables, dense_to

COUNT_STRIDE = 16  # every 16th id of a pass is counted (a systematic sample)
REFRESH_IDS = 1 << 18  # counted ids between two refreshes of the hot set, at least (and at least the rows)


class DeviceTableCache:
    """The fused sparse part of ``model`` with at most ``budget_bytes`` of cached rows on ``device`` (any torch
    device: on ``cpu`` the "device" weights are host tensors and the whole path runs, which is how it is tested)."""

    def __init__(self, model: RecModel, device: torch.device | str, budget_bytes: float, *,
                 count_stride: int = COUNT_STRIDE, refresh_ids: int | None = None, pinned: bool | None = None) -> None:
        if not budget_bytes >= 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes!r}")
        self.fused = fused = FusedTables(model)
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda" if pinned is None else pinned
        self.count_stride = max(1, int(count_stride))
        groups = len(fused.widths)
        self.host = [fused.weight(g) for g in range(groups)]  # [rows_g, width_g], host memory
        rows = [int(w.shape[0]) for w in self.host]
        self.base = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)  # group g's global rows start here
        first = fused.first_row.numpy()
        self.table_first = np.array([self.base[g] + first[t] for t, g in enumerate(fused.group_of)], np.int64)
        self.table_group = np.array(fused.group_of, np.int64)
        total_bytes = sum(w.numel() * w.element_size() for w in self.host)
        share = 1.0 if budget_bytes >= total_bytes else budget_bytes / total_bytes
        self.capacity = [r if share >= 1.0 else min(r, int(share * r)) for r in rows]
        self.whole = all(c == r for c, r in zip(self.capacity, rows, strict=True))
        self.refresh_ids = max(REFRESH_IDS, int(self.base[-1])) if refresh_ids is None else max(1, int(refresh_ids))
        self.remap = np.full(int(self.base[-1]), -1, np.int32)
        self.slot_row = [np.full(c, -1, np.int64) for c in self.capacity]  # slot -> global row (-1: empty)
        self.counts = np.zeros(int(self.base[-1]), np.uint32)
        self.counted = 0  # sampled lookups counted since the last refresh
        self.spare = [1] * groups  # rows after the cached ones: a pass's misses
        self.weights = [torch.empty((c + 1, w.shape[1]), dtype=w.dtype, device=self.device)
                        for c, w in zip(self.capacity, self.host, strict=True)]
        self._slots: list[torch.Tensor] = [torch.empty(0, dtype=torch.int32) for _ in range(groups)]
        self._staging: list[torch.Tensor] = [w[:0] for w in self.host]
        self.lookups = self.hits = self.gathered = self.refreshes = self.passes = 0
        self._device_layout: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # for whole tables
        for g in range(groups):
            self._install(g, self._prefix(g))

    # ---------------------------------------------------------------- the hot set

    def _prefix(self, g: int) -> np.ndarray:
        """Global rows of the first ``capacity[g]`` rows of group ``g``, every table taking its share pro rata."""
        lo, hi = self.base[g], self.base[g + 1]
        cap = self.capacity[g]
        if cap >= hi - lo:
            return np.arange(lo, hi, dtype=np.int64)
        firsts = self.table_first[self.table_group == g]
        sizes = np.diff(np.append(firsts, hi))  # tables of one group are contiguous, in table order
        take = cap * sizes // (hi - lo)
        short = np.flatnonzero(take < sizes)[:cap - int(take.sum())]  # what rounding left, one row a table
        take[short] += 1
        return np.concatenate([np.arange(f, f + n, dtype=np.int64) for f, n in zip(firsts, take, strict=True)])

    def _hottest(self, g: int) -> np.ndarray:
        """Global rows of group ``g``'s ``capacity[g]`` most counted rows (rows never counted only if fewer are)."""
        lo, hi = self.base[g], self.base[g + 1]
        cap = self.capacity[g]
        counts = self.counts[lo:hi]
        seen = np.flatnonzero(counts)
        if len(seen) >= cap:
            top = seen[np.argpartition(counts[seen], len(seen) - cap)[len(seen) - cap:]] if cap else seen[:0]
            return lo + top
        cached = self.slot_row[g]  # fill up with rows cached now and never counted, then any others
        rest = cached[(cached >= 0) & (self.counts[np.maximum(cached, 0)] == 0)]
        chosen = np.concatenate([lo + seen, rest])
        if len(chosen) < cap:
            free = np.ones(hi - lo, bool)
            free[chosen - lo] = False
            chosen = np.concatenate([chosen, lo + np.flatnonzero(free)[:cap - len(chosen)]])
        return chosen[:cap]

    def _install(self, g: int, rows: np.ndarray) -> int:
        """Make ``rows`` (global, of group ``g``, at most ``capacity[g]``) the cached set; returns rows copied."""
        slot_row = self.slot_row[g]
        slots_now = self.remap[rows]
        staying = slots_now >= 0
        keep = np.zeros(len(slot_row), bool)
        keep[slots_now[staying]] = True
        leaving = slot_row[~keep & (slot_row >= 0)]
        self.remap[leaving] = -1
        entering = rows[~staying]
        free = np.flatnonzero(~keep)[:len(entering)]
        slot_row[free] = entering
        slot_row[np.flatnonzero(~keep)[len(entering):]] = -1
        self.remap[entering] = free.astype(np.int32)
        if len(entering):
            source = torch.from_numpy(entering - self.base[g])
            values = self.host[g].index_select(0, source)
            self.weights[g].index_copy_(0, torch.from_numpy(free).to(self.device), values.to(self.device))
        return len(entering)

    def refresh(self) -> int:
        """Refill every group with its most counted rows, then halve the counts; returns rows copied."""
        copied = 0
        if not self.whole:
            for g in range(len(self.host)):
                copied += self._install(g, self._hottest(g))
            self.counts >>= 1
            self.refreshes += 1
        self.counted = 0
        return copied

    def observe(self, values: np.ndarray, lengths: np.ndarray) -> None:
        """Count a query's ids (a warm-up) without computing it."""
        self._count(self._global_ids(values, lengths))

    # ---------------------------------------------------------------- a pass

    def _global_ids(self, values: np.ndarray, lengths: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """Every value as a row of the concatenated weights; ``counts``: ids per table, if the caller has them."""
        counts = lengths.sum(axis=1, dtype=np.int64) if counts is None else counts
        return np.asarray(values, np.int64) + np.repeat(self.table_first, counts)

    def _count(self, ids: np.ndarray) -> None:
        if self.whole or not len(ids):
            return
        sample = ids[::self.count_stride]
        self.counts[sample] += 1  # one per sample a row is in (not np.add.at: 10x slower, measured)
        self.counted += len(sample)

    def _buffer(self, buffers: list[torch.Tensor], g: int, rows: int, like: torch.Tensor) -> torch.Tensor:
        """``rows`` rows of a reusable host buffer (pinned when copies go to a GPU), grown by doubling."""
        if buffers[g].shape[0] < rows:
            shape = (max(rows, 2 * buffers[g].shape[0]), *like.shape[1:])
            buffers[g] = torch.empty(shape, dtype=like.dtype, pin_memory=self.pinned)
        return buffers[g][:rows]

    def _reserve(self, g: int, rows: int) -> torch.Tensor:
        """The spare region of group ``g`` with room for ``rows`` rows (grown by doubling, cached rows kept)."""
        cap = self.capacity[g]
        weight = self.weights[g]
        if weight.shape[0] - cap < rows:
            spare = max(rows, 2 * (weight.shape[0] - cap))
            grown = torch.empty((cap + spare, weight.shape[1]), dtype=weight.dtype, device=self.device)
            grown[:cap].copy_(weight[:cap])
            self.weights[g] = weight = grown
            self.spare[g] = spare
        return weight[cap:cap + rows]

    def prepare(self, values: np.ndarray, lengths: np.ndarray) -> list[torch.Tensor]:
        """Per group, the device slot of every value (int32, in a host buffer): hits from the remap, misses
        gathered into the spare region (queued to the device), ids of other groups' tables at slot 0."""
        if self.counted >= self.refresh_ids:
            self.refresh()
        counts = lengths.sum(axis=1, dtype=np.int64)
        ids = self._global_ids(values, lengths, counts)
        self._count(ids)
        groups = len(self.host)
        first = self._buffer(self._slots, 0, len(ids), self._slots[0])
        slots = first.numpy()
        np.take(self.remap, ids, out=slots)
        missed = np.flatnonzero(slots < 0)
        self.passes += 1
        self.lookups += len(ids)
        self.hits += len(ids) - len(missed)
        if len(missed):
            rows = ids[missed]
            position = np.arange(len(rows), dtype=np.int32)
            self.remap[rows] = position  # one position per distinct row wins: dedup without a sort
            distinct = rows[self.remap[rows] == position]
            group = np.searchsorted(self.base, distinct, side="right") - 1 if groups > 1 else None
            for g in range(groups):
                mine = distinct if group is None else distinct[group == g]
                if not len(mine):
                    continue
                self.remap[mine] = self.capacity[g] + np.arange(len(mine), dtype=np.int32)
                self._gather(g, mine)
            slots[missed] = self.remap[rows]
            self.remap[distinct] = -1
            self.gathered += len(distinct)
        if groups == 1:
            return [first]
        out = [first]
        for g in range(1, groups):
            member = np.repeat(self.table_group == g, counts)
            mine = self._buffer(self._slots, g, len(ids), self._slots[0])
            np.multiply(slots, member, out=mine.numpy())
            out.append(mine)
        np.multiply(slots, np.repeat(self.table_group == 0, counts), out=slots)
        return out

    def _gather(self, g: int, rows: np.ndarray) -> None:
        """Rows (global, of group ``g``) from the host weight into the first ``len(rows)`` spare slots."""
        source = torch.from_numpy(rows - self.base[g])
        target = self._reserve(g, len(rows))
        if self.device.type == "cpu":
            torch.index_select(self.host[g], 0, source, out=target)
            return
        staging = self._buffer(self._staging, g, len(rows), self.host[g])
        torch.index_select(self.host[g], 0, source, out=staging)
        target.copy_(staging, non_blocking=True)

    def sparse(self, values: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """``RecModel.sparse``'s output on the device for a query whose ids and lengths (``[T, B]``) are host
        tensors (pinned if they are to be copied asynchronously).  With whole tables cached the host does nothing:
        the ids go to the device and are resolved there, as ``FusedModel`` does."""
        lens = lengths.to(self.device, non_blocking=True).to(torch.int64)
        if self.whole:
            if self._device_layout is None:
                self._device_layout = (self.fused.first_row.to(self.device),
                                       [getattr(self.fused, f"member{g}").to(self.device)
                                        for g in range(len(self.host))])
            ids = self.fused.group_ids(values.to(self.device, non_blocking=True), lens, *self._device_layout)
            self.passes += 1
            self.lookups += values.shape[0]
            self.hits += values.shape[0]
            return self.fused.lookup(lens, ids, self.weights)
        slots = self.prepare(values.numpy(), lengths.numpy())
        device_slots = [s.to(self.device, non_blocking=True).to(torch.int64) for s in slots]
        return self.fused.lookup(lens, device_slots, self.weights)

    def stats(self) -> dict[str, Any]:
        lookups = max(1, self.lookups)
        return {"capacity_rows": list(self.capacity), "table_rows": [int(w.shape[0]) for w in self.host],
                "spare_rows": list(self.spare), "device_bytes": self.device_bytes(),
                "passes": self.passes, "lookups": self.lookups, "hit_rate": self.hits / lookups,
                "gathered_rows": self.gathered, "refreshes": self.refreshes}

    def device_bytes(self) -> int:
        return sum(w.numel() * w.element_size() for w in self.weights)


class CachedModel(nn.Module):
    """A zoo model served with :class:`DeviceTableCache`: dense layers on ``device``, tables on the host with the
    hot rows cached on the device.  ``run((dense, values, lengths))`` takes host arrays and returns host scores."""

    def __init__(self, model: RecModel, device: torch.device | str, budget_bytes: float, **cache: Any) -> None:
        super().__init__()
        self.cache = DeviceTableCache(model, device, budget_bytes, **cache)
        self.model = model
        dense_to(model, self.cache.device)

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        """Scores on the device; ``batch.values`` and ``batch.lengths`` must be on the host (CPU tensors)."""
        sparse = self.cache.sparse(batch.values, batch.lengths)
        return self.model.dense(batch.dense.to(self.cache.device, non_blocking=True), sparse)

    def run(self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray],
            host: Callable[[np.ndarray], torch.Tensor] = torch.from_numpy) -> np.ndarray:
        """Host scores of one query given as host arrays (dense, values, lengths); ``host`` makes the tensors
        copied to the device (``serving.accel.device_runner`` pins them)."""
        dense, values, lengths = arrays
        with torch.inference_mode():
            sparse = self.cache.sparse(host(values) if self.cache.whole else torch.from_numpy(values), host(lengths))
            return self.model.dense(host(dense).to(self.cache.device, non_blocking=True), sparse).cpu().numpy()
