"""Hot rows of a model's fused tables on the device, the rest on the host.

Why (docs/decisions/2026-11-28-device-row-cache-on-host.md): ``FusedModel.to_device`` moves every fused weight whole, so
a model whose tables exceed device memory cannot be served on a GPU.  FBGEMM's UVM caching keeps such tables in host
memory with a device cache of hot rows, resolved by kernels on the device; this is the same idea in plain PyTorch +
numpy (no extra wheel), resolved on the *host*, because that is where a query's ids already are (the CPU worker decoded
them; the accelerator worker reads them from its staging arena):

- per width group ``g`` of :class:`~recserve.zoo.fused.FusedTables` a device weight of ``capacity[g]`` cached rows
  followed by a *spare* region, and one host int32 ``remap`` over every row of every group (global row -> slot in
  its group's device weight, or ``~row`` < 0 if not cached, so a missed slot names its row);
- per pass, numpy maps the query's ids to slots (``remap[ids]``, one ``np.take`` per table on large passes: no
  global ids), finds the distinct rows it misses (no sort), gathers them from the host weight into the spare
  region (through a pinned buffer, copied non-blocking with the query), rewrites the missed ids to their spare
  slots, and the pass runs the fused path's own ``FusedTables.lookup`` (one int32 slot array is copied; several
  width groups are split on the device): the same rows in the same order, so scores equal the uncached fused
  path's exactly.  Nothing waits for the device but the scores;
- the hot set is the most looked-up rows: every ``count_stride``-th id of a pass adds one to its row's count, once
  per pass however often it occurs among them (a fancy-index add; ``np.add.at``, which counts repeats, costs ~10x
  as much).  A row's chance to be in a pass's sample grows with its lookup rate, so the
  counts rank rows as their rates do.  Once ``refresh_ids`` ids were counted (default: the tables' rows, at least
  2^18, so a refresh's O(rows) scan is spread over at least as many counted ids) the cache is refilled between
  passes with each group's top rows (rows staying keep their slot; only entering rows are copied), counts then
  halved so the set follows drift.  Before any count the cache holds a prefix of every table, pro rata (the
  catalogue's samplers scatter hot rows over the ids, so a prefix is only a start, not a policy).

The device budget (``budget_bytes``) is shared out so every group caches the same fraction of its rows.  A pass also
needs its missed rows on the device: the spare region grows to 1.25x the largest pass's distinct misses, at most
the group's uncached rows (reported in :meth:`DeviceTableCache.stats`); at large batches that is most of the
table.  A budget of at
least the tables' bytes caches everything: the remap is the identity, nothing is counted, no row is ever
gathered, and a pass skips the host remap: the ids are resolved on the device as ``FusedModel`` does (today's
whole-table path).

Buffers reused across passes (the pinned staging rows and slot arrays) are safe because every pass ends by copying
its scores to the host, which waits for the pass's copies; a caller that does not must synchronise before the next.
Host memory: the fused host weights (the model's own when it was built fused, ``RecModel.fuse_tables``, as a node
builds it: one copy shared by the node's workers; else a copy private to the process) plus 8 B per row (remap and
counts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from recserve.zoo.base import RecModel
from recserve.zoo.batch import QueryBatch
from recserve.zoo.fused import dense_to, fused_tables

COUNT_STRIDE = 16  # every 16th id of a pass is counted (a systematic sample)
REFRESH_IDS = 1 << 18  # counted ids between two refreshes of the hot set, at least (and at least the rows)
PER_TABLE_IDS = 2048  # ids a table (mean) from which a pass remaps table by table (no global ids)
MARK_SCAN = 8  # a pass's misses are deduplicated by a scan of the remap when it has at most 8 rows per missed id
MARK_ROW_LIMIT = (1 << 31) - 1  # rows the int32 remap can hold: ~row > MARK for every row below it
MARK = np.int32(-MARK_ROW_LIMIT - 1)  # a remap entry no row has (nor any slot)


class DeviceTableCache:
    """The fused sparse part of ``model`` with at most ``budget_bytes`` of cached rows on ``device`` (any torch
    device: on ``cpu`` the "device" weights are host tensors and the whole path runs, which is how it is tested)."""

    def __init__(self, model: RecModel, device: torch.device | str, budget_bytes: float, *,
                 count_stride: int = COUNT_STRIDE, refresh_ids: int | None = None, pinned: bool | None = None) -> None:
        if not budget_bytes >= 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes!r}")
        self.fused = fused = fused_tables(model)
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
        if self.base[-1] >= MARK_ROW_LIMIT:
            raise ValueError(f"{int(self.base[-1]):,} rows: the int32 remap holds fewer than {MARK_ROW_LIMIT:,}")
        self.remap = ~np.arange(int(self.base[-1]), dtype=np.int32)  # nothing cached yet: every row ~row
        self.table_remap = [self.remap[f:f + t.num_rows] for f, t in zip(self.table_first, model.tables, strict=True)]
        total_bytes = sum(w.numel() * w.element_size() for w in self.host)
        share = 1.0 if budget_bytes >= total_bytes else budget_bytes / total_bytes
        self.capacity = [r if share >= 1.0 else min(r, int(share * r)) for r in rows]
        self.whole = all(c == r for c, r in zip(self.capacity, rows, strict=True))
        self.refresh_ids = max(REFRESH_IDS, int(self.base[-1])) if refresh_ids is None else max(1, int(refresh_ids))
        self.slot_row = [np.full(c, -1, np.int64) for c in self.capacity]  # slot -> global row (-1: empty)
        self.counts = np.zeros(int(self.base[-1]), np.uint32)
        self.counted = 0  # sampled lookups counted since the last refresh
        self.spare = [1] * groups  # rows after the cached ones: a pass's misses
        self.weights = [torch.empty((c + 1, w.shape[1]), dtype=w.dtype, device=self.device)
                        for c, w in zip(self.capacity, self.host, strict=True)]
        self._slots: list[torch.Tensor] = [torch.empty(0, dtype=torch.int32)]  # one buffer, every group's slots
        self._staging: list[torch.Tensor] = [w[:0] for w in self.host]
        self.lookups = self.hits = self.gathered = self.refreshes = self.passes = 0
        self._device_layout: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # see _layout
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
        self.remap[leaving] = ~leaving
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
        self._count(np.ascontiguousarray(self._global_ids(values, lengths)[::self.count_stride]))

    # ---------------------------------------------------------------- a pass

    def _global_ids(self, values: np.ndarray, lengths: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """Every value as a row of the concatenated weights; ``counts``: ids per table, if the caller has them."""
        counts = lengths.sum(axis=1, dtype=np.int64) if counts is None else counts
        return np.asarray(values, np.int64) + np.repeat(self.table_first, counts)

    def _count(self, sample: np.ndarray) -> None:
        """Count the rows of a pass's sample (every ``count_stride``-th id, contiguous: a fancy index with a strided
        view costs several times the copy)."""
        if self.whole or not len(sample):
            return
        self.counts[sample] += 1  # one per sample a row is in (not np.add.at: ~10x slower)
        self.counted += len(sample)

    def _buffer(self, buffers: list[torch.Tensor], g: int, rows: int, like: torch.Tensor) -> torch.Tensor:
        """``rows`` rows of a reusable host buffer (pinned when copies go to a GPU), grown by doubling."""
        if buffers[g].shape[0] < rows:
            shape = (max(rows, 2 * buffers[g].shape[0]), *like.shape[1:])
            buffers[g] = torch.empty(shape, dtype=like.dtype, pin_memory=self.pinned)
        return buffers[g][:rows]

    def _reserve(self, g: int, rows: int) -> torch.Tensor:
        """The spare region of group ``g`` with room for ``rows`` rows, cached rows kept.  Grown to 1.25x the need,
        at most the group's uncached rows (a pass's distinct misses, never more): doubling overshot, up to more
        than the table itself at large batches."""
        cap = self.capacity[g]
        weight = self.weights[g]
        if weight.shape[0] - cap < rows:
            spare = min(rows + rows // 4, int(self.base[g + 1] - self.base[g]) - cap)
            grown = torch.empty((cap + spare, weight.shape[1]), dtype=weight.dtype, device=self.device)
            grown[:cap].copy_(weight[:cap])
            self.weights[g] = weight = grown
            self.spare[g] = spare
        return weight[cap:cap + rows]

    def prepare(self, values: np.ndarray, lengths: np.ndarray) -> torch.Tensor:
        """The device slot of every value (int32, in a reusable host buffer), each in its own group's weight: hits
        from the remap, misses gathered into the spare region (queued to the device).  ``values`` must be valid
        ids (``QueryBatch.validate``, which every worker runs first): the remap clips, it does not check."""
        if self.counted >= self.refresh_ids:
            self.refresh()
        counts = lengths.sum(axis=1, dtype=np.int64)
        buffer = self._buffer(self._slots, 0, len(values), self._slots[0])
        slots = buffer.numpy()
        if len(values) < PER_TABLE_IDS * len(counts):
            ids = self._global_ids(values, lengths, counts)
            np.take(self.remap, ids, out=slots, mode="clip")  # clip: with out, "raise" buffers a copy
            self._count(np.ascontiguousarray(ids[::self.count_stride]))
        else:
            self._count(self._remap_tables(values, counts, slots))
        missed = np.flatnonzero(slots < 0)
        self.passes += 1
        self.lookups += len(values)
        self.hits += len(values) - len(missed)
        if len(missed):
            self._fetch_misses(missed, slots)
        return buffer

    def _remap_tables(self, values: np.ndarray, counts: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """``slots`` = every value's remap entry (``~row`` < 0: not cached), one ``np.take`` per table on the
        table's own slice of the remap; returns the count sample (the global rows of every ``count_stride``-th
        value).  With many ids a table this beats one take over global ids: making those (a repeat and an add over
        every id) cost as much as the take itself."""
        stride = self.count_stride
        sample = np.empty(-(-len(values) // stride), np.int64)
        start = 0
        for remap, first, count in zip(self.table_remap, self.table_first.tolist(), counts.tolist(), strict=True):
            end = start + count
            if count:
                np.take(remap, values[start:end], out=slots[start:end], mode="clip")
                lo, hi = -(-start // stride), -(-end // stride)  # sampled positions: multiples of stride
                np.add(values[lo * stride:end:stride], first, out=sample[lo:hi])
            start = end
        return sample

    def _fetch_misses(self, missed: np.ndarray, slots: np.ndarray) -> None:
        """Gather the distinct rows of the ``missed`` positions into their groups' spare regions and point the
        missed slots at them; the remap is left as it was.  An uncached row's remap entry is ``~row``, so a missed
        slot names its row: no global ids, no second look at the values."""
        rows = np.invert(slots[missed], dtype=np.int64)  # int64: a fancy index converts int32 on every use
        distinct = self._distinct(rows)
        for g, mine in self._by_group(distinct):
            self.remap[mine] = self.capacity[g] + np.arange(len(mine), dtype=np.int32)
            self._gather(g, mine)
        slots[missed] = self.remap[rows]
        self.remap[distinct] = ~distinct
        self.gathered += len(distinct)

    def _distinct(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` (uncached) without repeats, in O(len) with no sort; their remap entries are left for the caller
        to overwrite.  With few rows per missed id (large passes), each row's entry is marked and the remap scanned
        for marks: one scatter, and the rows come out sorted (so the gather runs in row order, which is faster).
        Otherwise each row's entry is set to one of its positions (whichever write lands), and the
        positions that find their own number there are one per distinct row."""
        if len(self.remap) <= MARK_SCAN * len(rows):
            self.remap[rows] = MARK
            return np.flatnonzero(self.remap == MARK)
        position = np.arange(len(rows), dtype=np.int32)
        self.remap[rows] = position
        return rows[np.flatnonzero(self.remap[rows] == position)]  # not a boolean index: slower

    def _by_group(self, rows: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``rows`` (global) split by width group, groups without any left out."""
        if len(self.host) == 1:
            return [(0, rows)]
        group = np.searchsorted(self.base, rows, side="right") - 1
        return [(g, rows[group == g]) for g in range(len(self.host)) if (group == g).any()]

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

    def _layout(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The fused module's ``first_row`` and per-group ``member`` masks on the device (made once)."""
        if self._device_layout is None:
            self._device_layout = (self.fused.first_row.to(self.device),
                                   [getattr(self.fused, f"member{g}").to(self.device) for g in range(len(self.host))])
        return self._device_layout

    def sparse(self, values: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """``RecModel.sparse``'s output on the device for a query whose ids and lengths (``[T, B]``) are host
        tensors (pinned if they are to be copied asynchronously).  With whole tables cached the host does nothing:
        the ids go to the device and are resolved there, as ``FusedModel`` does.  Otherwise one int32 slot array
        goes to the device and is split by width group there (``FusedTables.group_ids``' rule: other groups'
        tables read slot 0), so several groups cost the host no pass and the copy no extra array."""
        lens = lengths.to(self.device, non_blocking=True).to(torch.int64)
        if self.whole:
            ids = self.fused.group_ids(values.to(self.device, non_blocking=True), lens, *self._layout())
            self.passes += 1
            self.lookups += values.shape[0]
            self.hits += values.shape[0]
            return self.fused.lookup(lens, ids, self.weights)
        slots = self.prepare(values.numpy(), lengths.numpy()).to(self.device, non_blocking=True).to(torch.int64)
        members = self._layout()[1] if len(self.host) > 1 else None
        return self.fused.lookup(lens, self.fused.split_groups(slots, lens, members), self.weights)

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
