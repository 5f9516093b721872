"""The row cache's native key index (``_row_index.c``): int64 key → slot in ~17 B per entry.

SDM keeps small rows in CacheLib's memory-optimised cache (§4.3): a row cache is only worth its DRAM if what
indexes a row costs little beside the row (M1's user rows are 51 B).  A Python dict costs ~114 B per entry; this
table holds an int64 key and an int32 slot per position at a load of at most ``LOAD``, in two numpy arrays (so
it pickles, and its bytes are counted as they are).  It is native code, built at install where a C compiler is
found, so it is used only after a probe in a child process passed (``available``); else the cache keeps its
dict.  ``$RECSERVE_ROW_INDEX=dict`` chooses the dict regardless.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from types import ModuleType

import numpy as np

from recserve.hostinfo import probe_in_child

LOAD = 0.7  # most keys per table position: linear probing stays a few positions long below it
EMPTY = -1
DICT_BYTES_PER_ENTRY = 114  # the dict index: a key and a value object and the dict's arrays (tracemalloc, 1M keys)
POLICY_STATE_BYTES = {"lru": 8, "clock": 1, "lfu": 4}  # the row cache's per-slot tick, reference bit, count
INDEX_ENV = "RECSERVE_ROW_INDEX"
PROBE_ENV = "RECSERVE_ROW_INDEX_PROBE"  # "ok" or "unavailable: <reason>": a parent's verdict, inherited
PROBE_TIMEOUT_S = 60.0
PROBE_CODE = """
import numpy as np
from recserve.embedding.row_index import NativeIndex
rng = np.random.default_rng(0)
index, truth = NativeIndex(500), {}
for _ in range(30):
    keys = np.unique(rng.integers(0, 2000, 200)).astype(np.int64)
    gone = keys[: len(keys) // 3]
    index.remove(gone)
    for k in gone.tolist():
        truth.pop(k, None)
    new = keys[len(keys) // 3:]
    vals = rng.integers(0, 2**31 - 1, new.size).astype(np.int32)
    index.insert(new, vals)
    truth.update(zip(new.tolist(), vals.tolist()))
probe = np.arange(2000, dtype=np.int64)
assert index.find(probe).tolist() == [truth.get(k, -1) for k in range(2000)] and index.used == len(truth)
print("ok")
"""


@functools.cache
def available() -> tuple[bool, str]:
    """Whether this process may use the native index, and why not: built, wanted, and its probe passed (here, or
    in the parent process whose verdict ``$RECSERVE_ROW_INDEX_PROBE`` carries: one probe per node, not per
    worker).  The verdict is left in the environment for this process's children."""
    if os.environ.get(INDEX_ENV, "native").strip().lower() == "dict":
        return False, f"${INDEX_ENV}=dict"
    if importlib.util.find_spec("recserve.embedding._row_index") is None:  # found, not imported: only the probe runs it
        return False, "the native row index is not built (no C compiler at install?)"
    inherited = os.environ.get(PROBE_ENV, "")
    if inherited == "ok":
        return True, ""
    if inherited.startswith("unavailable: "):
        return False, inherited.removeprefix("unavailable: ")
    ok, why = probe_in_child(PROBE_CODE, "the native row index's probe", PROBE_TIMEOUT_S)
    os.environ[PROBE_ENV] = "ok" if ok else f"unavailable: {why}"
    return ok, why


def slot_overhead_bytes(policy: str = "clock", index: str = "native") -> float:
    """DRAM one row-cache slot takes beside its row: the key it holds (8 B), its policy's state and its index
    entry (the native table's at its full load).  What ``RowCache.dram_bytes`` counts, per slot."""
    entry = DICT_BYTES_PER_ENTRY if index == "dict" else NativeIndex.BYTES_PER_POSITION / LOAD
    return 8 + POLICY_STATE_BYTES[policy] + entry


def _native() -> ModuleType:
    from recserve.embedding import _row_index

    return _row_index


def table_positions(capacity: int) -> int:
    """Positions of a table that holds ``capacity`` keys within ``LOAD``."""
    return max(8, math.ceil(max(capacity, 1) / LOAD) + 1)


class NativeIndex:
    """int64 key (>= 0) → int32 value, with the batch interface of ``rowcache.DictIndex``; grows past ``LOAD``."""

    BYTES_PER_POSITION = 12  # an int64 key and an int32 value

    def __init__(self, capacity: int) -> None:
        self._allocate(table_positions(capacity))

    def _allocate(self, positions: int) -> None:
        self.keys = np.full(positions, EMPTY, dtype=np.int64)
        self.vals = np.zeros(positions, dtype=np.int32)
        self.used = 0

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.vals.nbytes

    def find(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        out = np.empty(keys.size, dtype=np.int64)
        _native().find(self.keys, self.vals, keys, out)
        return out

    def insert(self, keys: np.ndarray, vals: np.ndarray) -> None:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        vals = np.ascontiguousarray(vals, dtype=np.int32)
        if keys.size != vals.size:
            raise ValueError(f"{keys.size} keys but {vals.size} values")
        if self.used + keys.size > LOAD * self.keys.size:
            self._grow(self.used + keys.size)
        try:
            self.used += _native().insert(self.keys, self.vals, keys, vals)
        except OverflowError:  # never under LOAD; if it were, count what went in before the table filled
            self.used = int((self.keys != EMPTY).sum())
            raise

    def remove(self, keys: np.ndarray) -> None:
        self.used -= _native().remove(self.keys, self.vals, np.ascontiguousarray(keys, dtype=np.int64))

    def _grow(self, capacity: int) -> None:
        live = self.keys != EMPTY
        keys, vals = self.keys[live], self.vals[live]
        self._allocate(table_positions(max(capacity, 2 * self.used)))
        self.used = _native().insert(self.keys, self.vals, keys, vals)
