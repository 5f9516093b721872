"""The row cache's native key index (embedding/_row_index.c) against a dict, and what a cache slot costs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from recserve.embedding import row_index
from recserve.embedding.row_index import LOAD, NativeIndex, slot_overhead_bytes
from recserve.embedding.rowcache import DictIndex, RowCache

pytestmark = pytest.mark.skipif(not row_index.available()[0], reason="the native row index is not usable here")


@pytest.mark.parametrize("capacity", [1, 37, 5000])
def test_the_native_index_answers_as_a_dict_through_churn_and_growth(capacity):
    """Keys drawn from a narrow range (long probe runs, many deletions inside them); inserts past the capacity grow
    the table; re-inserting a present key updates its value."""
    rng = np.random.default_rng(capacity)
    native, truth = NativeIndex(capacity), {}
    for step in range(150):
        keys = np.unique(rng.integers(0, 4 * capacity + 50, 3 * capacity // 2 + 5)).astype(np.int64)
        gone = keys[rng.random(keys.size) < 0.4]
        native.remove(gone)
        for k in gone.tolist():
            truth.pop(k, None)
        vals = rng.integers(0, 2**31 - 1, keys.size).astype(np.int32)
        native.insert(keys, vals)
        truth.update(zip(keys.tolist(), vals.tolist(), strict=True))
        probe = rng.integers(-3, 4 * capacity + 60, 400).astype(np.int64)
        assert native.find(probe).tolist() == [truth.get(k, -1) for k in probe.tolist()], step
        assert native.used == len(truth) and native.used <= LOAD * native.keys.size
    assert native.find(np.array([], dtype=np.int64)).size == 0


def test_the_native_index_refuses_what_it_cannot_hold_and_pickles():
    native = NativeIndex(10)
    with pytest.raises(ValueError, match="negative"):
        native.insert(np.array([3, -5]), np.array([1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="values"):
        native.insert(np.array([3, 4]), np.array([1], dtype=np.int32))
    native.insert(np.arange(100, 120), np.arange(20, dtype=np.int32))
    copy = pickle.loads(pickle.dumps(native))
    assert copy.find(np.arange(95, 125)).tolist() == native.find(np.arange(95, 125)).tolist()
    assert copy.used == 20


@pytest.mark.parametrize("policy", ["lru", "clock", "lfu"])
@pytest.mark.parametrize("index", ["native", "dict"])
def test_a_slot_costs_what_the_planner_charges_for_it(policy, index):
    cache = RowCache(2_000_000, 51, policy, index=index)
    per_slot = (cache.dram_bytes - cache.data.nbytes) / cache.slots
    assert per_slot == pytest.approx(slot_overhead_bytes(policy, index), rel=0.01)
    assert isinstance(cache.index, NativeIndex if index == "native" else DictIndex)


def test_the_dict_is_chosen_where_the_native_index_is_not_wanted(monkeypatch):
    monkeypatch.setenv(row_index.INDEX_ENV, "dict")
    row_index.available.cache_clear()
    try:
        assert row_index.available() == (False, "$RECSERVE_ROW_INDEX=dict")
        assert isinstance(RowCache(1000, 16).index, DictIndex)
        with pytest.raises(ValueError, match="cannot be used here"):
            RowCache(1000, 16, index="native")
    finally:
        monkeypatch.delenv(row_index.INDEX_ENV)
        row_index.available.cache_clear()
    assert isinstance(RowCache(1000, 16).index, NativeIndex)


def test_the_native_functions_refuse_buffers_that_do_not_fit_them():
    """Called directly (not through NativeIndex), every mismatch is an exception, never a read or write out of
    bounds."""
    from recserve.embedding import _row_index as native

    tk, tv = np.full(16, -1, np.int64), np.zeros(16, np.int32)
    keys, out = np.arange(4, dtype=np.int64), np.empty(4, np.int64)
    bad_calls = [
        (native.find, (tk, np.zeros(15, np.int32), keys, out)),           # vals of another length
        (native.find, (tk[:0], tv[:0], keys, out)),                        # an empty table
        (native.find, (tk, tv, keys, np.empty(3, np.int64))),             # output shorter than the keys
        (native.find, (tk, tv, keys[:3].astype(np.int32), out)),          # keys of 12 bytes: not int64s
        (native.insert, (tk, tv, keys, np.zeros(3, np.int32))),           # fewer values than keys
        (native.remove, (tk[:15], tv, keys)),                             # table keys of another length
    ]
    for fn, args in bad_calls:
        with pytest.raises(ValueError):
            fn(*args)
    readonly = tk.copy()
    readonly.flags.writeable = False
    for fn, args in [(native.insert, (readonly, tv, keys, np.zeros(4, np.int32))),
                     (native.find, (tk[::2], tv[::2], keys, out))]:  # read-only, then not contiguous
        with pytest.raises((TypeError, BufferError, ValueError)):
            fn(*args)
    assert native.insert(tk, tv, keys, np.arange(4, dtype=np.int32)) == 4
    native.find(tk, tv, keys, out)
    assert out.tolist() == [0, 1, 2, 3]
    full = np.full(4, -1, np.int64), np.zeros(4, np.int32)
    assert native.insert(*full, keys, np.zeros(4, np.int32)) == 4
    with pytest.raises(OverflowError, match="full"):
        native.insert(*full, np.array([99], np.int64), np.zeros(1, np.int32))
