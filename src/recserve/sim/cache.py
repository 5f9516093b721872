"""Trace-driven hit rates of SDM's DRAM caches (the unified row cache and the pooled-embedding cache).

The tier planner's default hit rate is an *ideal* fill (the cache holds exactly the hottest rows).  Here the
real caches of ``embedding/rowcache.py`` (same eviction policies, same order-invariant bag keys) replay an
index trace drawn from a Zipf law with the tables' locality P, so eviction, warm-up and the pooled cache's
(rare) full-sequence repeats are in the number.  Full-size tables (billions of rows) are shrunk by ``scale``:
rows and cache slots shrink together and the Zipf exponent is refitted so that the hottest 10 % still take P
of the lookups at the scaled size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from recserve.embedding.row_index import slot_overhead_bytes
from recserve.embedding.rowcache import ROW_BITS, PooledCache, RowCache, bag_keys
from recserve.errors import SpecError
from recserve.specs import ModelSpec, TableSpec
from recserve.workload.indices import ZipfSampler, zipf_alpha_for_locality


@dataclass
class CacheSimResult:
    hit_rate: float                    # row cache, per distinct row looked up per query, after warm-up
    per_table: dict[int, float]        # table index -> hit rate
    pooled_hit_rate: float
    queries: int
    warmup_queries: int
    scale: float
    slots: int
    notes: list[str] = field(default_factory=list)


def _scaled_rows(rows: int, scale: float) -> int:
    return max(100, int(round(rows * scale)))


def simulate_tier_hits(spec: ModelSpec, sm_tables: list[int], cache_bytes: float, *, item_batch: int = 100,
                       locality: dict[str, float] | None = None, queries: int = 2000, warmup: int | None = None,
                       scale: float | None = None, policy: str = "clock", pooled_bytes: float = 0.0,
                       max_rows: int = 2_000_000, seed: int = 0) -> CacheSimResult:
    """Replay ``queries`` queries' lookups to the SM tables through a row cache of ``cache_bytes`` (full-size
    bytes; slots = bytes / (row + per-slot overhead)), after ``warmup`` queries (default: until the cache is
    full, at most ``queries``).  ``pooled_bytes`` > 0 puts a pooled cache in front (a bag hit skips its rows)."""
    if not sm_tables:
        raise SpecError("no SM tables to simulate")
    locality = locality or {"user": 0.9, "item": 0.95}
    tables = [spec.tables[i] for i in sm_tables]
    scale = scale if scale is not None else min(1.0, max_rows / sum(t.rows for t in tables))
    slots = _cache_slots(spec, sm_tables, cache_bytes, scale, policy)
    cache = RowCache(max(slots, 0), 1, policy=policy, seed=seed)
    pooled = PooledCache(int(pooled_bytes * scale), min_len=4) if pooled_bytes > 0 else None
    trace = _Trace.of(sm_tables, tables, locality, scale, item_batch, pooled, seed)
    counts = _replay(cache, pooled, trace, queries, warmup)
    return CacheSimResult(counts.hit_rate(), counts.per_table(), pooled.hit_rate if pooled is not None else 0.0,
                          counts.measured, counts.warm_done, scale, slots,
                          notes=[f"Zipf traces with locality {locality}, rows and cache scaled by {scale:.3g}",
                                 f"{policy} row cache of {slots:,} slots; pooled cache "
                                 f"{'off' if pooled is None else f'{pooled_bytes * scale / 1e6:.1f} MB'}"])


def _cache_slots(spec: ModelSpec, sm_tables: list[int], cache_bytes: float, scale: float, policy: str) -> int:
    """Row cache slots in ``cache_bytes`` scaled: a slot is the tables' mean row plus the policy's overhead."""
    overhead = slot_overhead_bytes(policy)
    slot_bytes = {i: spec.tables[i].row_bytes(spec.bytes_per_elem) + overhead for i in sm_tables}
    mean_slot = float(np.mean(list(slot_bytes.values())))
    return int(cache_bytes * scale // mean_slot)


@dataclass
class _Trace:
    """The SM tables' scaled index traces: per table a Zipf sampler over its scaled rows; one query looks up a bag
    per user table and ``item_batch`` bags per item table, a bag that hits the pooled cache skipping its rows."""

    sm_tables: list[int]
    tables: list[TableSpec]
    rows_of: dict[int, int]
    samplers: dict[int, ZipfSampler]
    item_batch: int
    pooled: PooledCache | None
    rng: np.random.Generator
    dummy: torch.Tensor

    @classmethod
    def of(cls, sm_tables: list[int], tables: list[TableSpec], locality: dict[str, float], scale: float,
           item_batch: int, pooled: PooledCache | None, seed: int) -> _Trace:
        rng = np.random.default_rng(seed)
        samplers, rows_of = {}, {}
        for i, t in zip(sm_tables, tables, strict=True):
            rows_of[i] = _scaled_rows(t.rows, scale)
            samplers[i] = ZipfSampler(alpha=zipf_alpha_for_locality(locality[t.side], rows_of[i]), hot="scattered",
                                      perm_seed=seed + i)
        return cls(sm_tables, tables, rows_of, samplers, item_batch, pooled, rng, torch.zeros(1))

    def query_keys(self) -> np.ndarray:
        """One query's distinct row keys (table index in the high bits), those of pooled-cache hits left out."""
        keys_all = []
        for i, t in zip(self.sm_tables, self.tables, strict=True):
            bags = 1 if t.side == "user" else self.item_batch
            idx = self.samplers[i](self.rows_of[i], bags * t.pooling, self.rng)
            if self.pooled is not None and t.pooling >= self.pooled.min_len:
                idx = idx[_pooled_misses(self.pooled, idx, bags, t.pooling, i, self.dummy)]
            keys_all.append((np.int64(i) << ROW_BITS) | np.unique(idx))
        return np.concatenate(keys_all)


@dataclass
class _Counts:
    """Row cache hits and lookups per table over the measured queries, and how many queries warmed it up."""

    per_hits: dict[int, int]
    per_total: dict[int, int]
    measured: int = 0
    warm_done: int = 0

    def add(self, sm_tables: list[int], keys: np.ndarray, found: np.ndarray) -> None:
        """One measured query's lookups (``keys``) and where the cache found them (``found``, -1: missed)."""
        self.measured += 1
        table_of = keys >> ROW_BITS
        for i in sm_tables:
            mine = table_of == i
            self.per_total[i] += int(mine.sum())
            self.per_hits[i] += int((found[mine] >= 0).sum())

    def hit_rate(self) -> float:
        total = sum(self.per_total.values())
        return sum(self.per_hits.values()) / total if total else 0.0

    def per_table(self) -> dict[int, float]:
        return {i: self.per_hits[i] / n if n else 0.0 for i, n in self.per_total.items()}


def _replay(cache: RowCache, pooled: PooledCache | None, trace: _Trace, queries: int, warmup: int | None) -> _Counts:
    """``trace``'s queries through the row cache (a miss inserted): the first ``warmup`` (None: until the cache is
    full, at most ``queries``) warm it up, the next ``queries`` are counted."""
    counts = _Counts({i: 0 for i in trace.sm_tables}, {i: 0 for i in trace.sm_tables})
    warming = warmup != 0
    while counts.measured < queries:
        keys = trace.query_keys()
        with cache.lock:
            found = cache.lookup(keys)
            missing = keys[found < 0]
            cache.insert(missing, np.zeros((missing.size, 1), dtype=np.uint8))
        if warming:
            counts.warm_done += 1
            full = cache.filled >= cache.slots or counts.warm_done >= queries
            warming = counts.warm_done < warmup if warmup is not None else not full
            if pooled is not None and not warming:
                pooled.reset_stats()
            continue
        counts.add(trace.sm_tables, keys, found)
    return counts


def _pooled_misses(pooled: PooledCache, idx: np.ndarray, bags: int, pooling: int, table: int,
                   value: torch.Tensor) -> np.ndarray:
    """Mask of the lookups whose bag missed the pooled cache (those bags are cached for next time)."""
    offsets = np.arange(bags, dtype=np.int64) * pooling
    hi, lo = bag_keys(idx, offsets, table)
    keep = np.ones(idx.size, dtype=bool)
    for b, key in enumerate(zip(hi.tolist(), lo.tolist(), strict=True)):
        if pooled.get(key) is not None:
            keep[b * pooling:(b + 1) * pooling] = False
        else:
            pooled.put(key, value)
    return keep
