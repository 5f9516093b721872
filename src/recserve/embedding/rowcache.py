"""DRAM caches in front of SSD tables (SDM §4.3–4.4).

- :class:`RowCache`: one *unified* row cache shared by all tiered tables (a byte budget, fixed-size slots),
  keyed by ``(table, row)``.  Lookups, inserts and evictions take a whole batch of keys at once: the key → slot
  map is the native open-addressing table of ``row_index.py`` (~17 B per row) where its probe passed, else a
  Python dict (~114 B per row, :class:`DictIndex`); row bytes live in one ``[slots, slot_bytes]`` uint8 arena.
- Eviction policies ``lru`` (exact, a timestamp per slot; victims by ``argpartition``), ``clock``
  (second chance: a reference bit per slot and a sweeping hand, vectorised over windows of slots) and ``lfu``
  (a frequency count per slot halved every ``slots`` accesses, victims = least frequent of 8 random
  candidates).  ``benchmarks/bench_sdm.py`` compares them; docs/sdm.md records why ``clock`` is the default.
- :class:`PooledCache`: pooled (summed) embeddings keyed by an order-invariant hash of a bag's full index
  sequence (SDM Algorithm 1), only for bags at least ``min_len`` long.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from recserve.embedding.row_index import DICT_BYTES_PER_ENTRY, NativeIndex, available

POLICIES = ("lru", "clock", "lfu")
_EMPTY = -1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
ROW_BITS = 40  # key = table_id << 40 | row


def mix64(x: np.ndarray, seed: int = 0) -> np.ndarray:
    """splitmix64 finaliser of ``x + seed``: a well-spread 64-bit value per input (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(seed) * _GOLDEN + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class DictIndex:
    """int64 key → slot in a Python dict, with the batch interface of ``row_index.NativeIndex``: the index where
    the native one is not built or its probe failed.  It takes ~114 B per entry (key and value objects, the
    dict's own arrays)."""

    BYTES_PER_ENTRY = DICT_BYTES_PER_ENTRY

    def __init__(self, capacity: int) -> None:
        self.map: dict[int, int] = {}

    @property
    def used(self) -> int:
        return len(self.map)

    def find(self, keys: np.ndarray) -> np.ndarray:
        get = self.map.get
        return np.fromiter((get(k, -1) for k in keys.tolist()), dtype=np.int64, count=keys.size)

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        self.map.update(zip(keys.tolist(), vals.tolist(), strict=True))

    def remove(self, keys: np.ndarray) -> None:
        pop = self.map.pop
        for k in keys.tolist():
            pop(k, None)


INDEXES = {"dict": DictIndex, "native": NativeIndex}


def default_index() -> str:
    """The native index where this process may use it (``row_index.available``), else the dict."""
    return "native" if available()[0] else "dict"


class RowCache:
    """The unified DRAM row cache shared by every tiered table of a process (see module doc)."""

    def __init__(self, capacity_bytes: int, slot_bytes: int, policy: str = "clock", seed: int = 0,
                 index: str | None = None) -> None:
        """``index``: "native", "dict", or None for ``default_index()``."""
        index = index or default_index()
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if index not in INDEXES:
            raise ValueError(f"index must be one of {sorted(INDEXES)}, got {index!r}")
        if index == "native" and not available()[0]:
            raise ValueError(f"the native row index cannot be used here: {available()[1]}")
        self.slot_bytes = int(slot_bytes)
        self.slots = max(0, int(capacity_bytes) // self.slot_bytes)
        self.capacity_bytes = self.slots * self.slot_bytes
        self.policy = policy
        self.data = np.zeros((self.slots, self.slot_bytes), dtype=np.uint8)
        self.slot_key = np.full(self.slots, _EMPTY, dtype=np.int64)
        self.index_kind = index
        self.index = INDEXES[index](self.slots)
        self.filled = 0
        self.tick = 0
        # each policy's state, allocated for that policy only
        self.stamp = np.zeros(self.slots if policy == "lru" else 0, dtype=np.int64)
        self.ref = np.zeros(self.slots if policy == "clock" else 0, dtype=bool)
        self.hand = 0
        self.freq = np.zeros(self.slots if policy == "lfu" else 0, dtype=np.uint32)
        self.since_aging = 0
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        self._tables = 0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def register(self, row_bytes: int) -> int:
        """A table id for a new table whose rows are ``row_bytes`` long (must fit a slot)."""
        if row_bytes > self.slot_bytes:
            raise ValueError(f"row of {row_bytes} bytes does not fit the cache's {self.slot_bytes}-byte slots")
        self._tables += 1
        return self._tables - 1

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def reset_stats(self) -> None:
        self.hits = self.misses = self.evictions = 0

    @property
    def dram_bytes(self) -> int:
        """DRAM this cache takes when full: row slots, per-slot arrays and the key index."""
        arrays = self.data.nbytes + self.slot_key.nbytes + self.stamp.nbytes + self.ref.nbytes + self.freq.nbytes
        if isinstance(self.index, DictIndex):
            return arrays + self.slots * DictIndex.BYTES_PER_ENTRY
        return arrays + self.index.nbytes

    # ---- batch operations (call under ``lock``) ----------------------------------
    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each (distinct) key or -1; counts hits and misses and marks hits as used."""
        self.tick += 1
        if self.slots == 0:
            self.misses += keys.size
            return np.full(keys.size, -1, dtype=np.int64)
        slots = self.index.find(keys)
        hit = slots[slots >= 0]
        self.hits += hit.size
        self.misses += keys.size - hit.size
        self._touch(hit)
        return slots

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Cache rows ``[n, row_bytes]`` of distinct keys known to be absent, evicting as the policy says."""
        free = self.slots - self.filled
        # While filling, use free slots only (victims are chosen only in a full cache, so never a free slot).
        n = min(keys.size, free) if free else min(keys.size, self.slots)
        if n == 0:
            return
        keys, rows = keys[:n], rows[:n]
        if free:
            slots = np.arange(self.filled, self.filled + n, dtype=np.int64)
            self.filled += n
        else:
            slots = self._victims(n)
        old = self.slot_key[slots]
        evicted = old[old >= 0]
        if evicted.size:
            self.index.remove(evicted)
            self.evictions += evicted.size
        self.slot_key[slots] = keys
        self.index.insert(keys, slots.astype(np.int32))
        self.data[slots, : rows.shape[1]] = rows
        self._admit(slots)

    # ---- policies ----------------------------------------------------------------
    def _touch(self, slots: np.ndarray) -> None:
        if self.policy == "lru":
            self.stamp[slots] = self.tick
        elif self.policy == "clock":
            self.ref[slots] = True
        else:
            self.freq[slots] += 1  # slots of distinct keys are distinct
            self._age(slots.size)

    def _age(self, accesses: int) -> None:
        self.since_aging += accesses
        if self.since_aging >= self.slots:
            self.freq >>= 1
            self.since_aging = 0

    def _admit(self, slots: np.ndarray) -> None:
        if self.policy == "lru":
            self.stamp[slots] = self.tick
        elif self.policy == "clock":
            self.ref[slots] = False  # a new row earns its second chance by being hit
        else:
            self.freq[slots] = 1
            self._age(slots.size)

    def _victims(self, k: int) -> np.ndarray:
        if self.policy == "lru":
            return np.argpartition(self.stamp, k - 1)[:k] if k < self.slots else np.arange(self.slots)
        if self.policy == "clock":
            return self._clock_victims(k)
        return self._lfu_victims(k)

    def _clock_victims(self, k: int) -> np.ndarray:
        """CLOCK, vectorised: sweep windows from the hand; slots with ref=0 are victims in hand order, slots
        passed over lose their reference bit (their second chance)."""
        chosen: list[np.ndarray] = []
        need = k
        window = max(2 * k, 64)
        while need:
            idx = (self.hand + np.arange(min(window, self.slots))) % self.slots
            cold = np.flatnonzero(~self.ref[idx])
            if cold.size >= need:
                last = cold[need - 1]
                self.ref[idx[: last + 1]] = False
                chosen.append(idx[cold[:need]])
                self.hand = int((idx[last] + 1) % self.slots)
                need = 0
            else:
                self.ref[idx] = False
                self.ref[idx[cold]] = True  # already chosen: not again on the next lap (``_admit`` clears it)
                chosen.append(idx[cold])
                need -= cold.size
                self.hand = int((idx[-1] + 1) % self.slots)
        return np.concatenate(chosen)

    def _lfu_victims(self, k: int) -> np.ndarray:
        sample = 8
        cand = self.rng.integers(0, self.slots, size=(k * 2, sample))
        best = cand[np.arange(cand.shape[0]), np.argmin(self.freq[cand], axis=1)]
        uniq = np.unique(best)
        if uniq.size < k:  # tiny caches: fall back to the k least frequent overall
            return np.argpartition(self.freq, k - 1)[:k]
        return self.rng.permutation(uniq)[:k]


def bag_keys(indices: np.ndarray, offsets: np.ndarray, table_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Order-invariant 128-bit key per bag (SDM Algorithm 1): two independent sums of 64-bit mixes of the
    indices (sums, not xors, so a repeated id — which pooling counts twice — changes the key), folded with the
    table id and the bag length.  Returns (key_hi, key_lo) uint64 arrays of length B."""
    n = indices.size
    lengths = np.diff(np.append(offsets, n))
    a = mix64(indices, seed=1)
    b = mix64(indices, seed=2)
    starts = np.minimum(offsets, max(n - 1, 0))
    with np.errstate(over="ignore"):
        sa = np.add.reduceat(a, starts) if n else np.zeros(offsets.size, np.uint64)
        sb = np.add.reduceat(b, starts) if n else np.zeros(offsets.size, np.uint64)
    sa = np.where(lengths > 0, sa, 0).astype(np.uint64)
    sb = np.where(lengths > 0, sb, 0).astype(np.uint64)
    salt = mix64(np.asarray([table_id], dtype=np.int64), seed=3)[0]
    hi = mix64(sa ^ salt, seed=4) ^ lengths.astype(np.uint64)
    return hi, sb


class PooledCache:
    """Pooled embeddings by bag key (LRU, a byte budget), for bags of at least ``min_len`` ids (SDM §4.4)."""

    ENTRY_OVERHEAD = 120  # bytes per entry beyond the vector: dict slot, key tuple, OrderedDict links (measured)

    def __init__(self, capacity_bytes: int, min_len: int = 4) -> None:
        self.capacity_bytes = int(capacity_bytes)
        self.min_len = int(min_len)
        self.entries: OrderedDict[tuple[int, int], torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()
        self.hits = self.misses = 0
        self.hit_ids = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def reset_stats(self) -> None:
        self.hits = self.misses = self.hit_ids = 0

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()

    def get(self, key: tuple[int, int]) -> torch.Tensor | None:
        vec = self.entries.get(key)
        if vec is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return vec

    def put(self, key: tuple[int, int], vec: torch.Tensor) -> None:
        if key in self.entries:
            return
        size = vec.numel() * 4 + self.ENTRY_OVERHEAD
        if size > self.capacity_bytes:
            return
        self.entries[key] = vec
        self.bytes += size
        while self.bytes > self.capacity_bytes:
            _, old = self.entries.popitem(last=False)
            self.bytes -= old.numel() * 4 + self.ENTRY_OVERHEAD
