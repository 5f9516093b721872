"""``serving/wire/json_numbers.py``: a JSON array read by simdjson is exactly the array numpy makes of the list
``json.loads`` returns, or None (the list decides); the native parser is used only after its probe passed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.hostinfo import probe_in_child
from recserve.serving.wire import json_numbers


@pytest.fixture(autouse=True)
def enabled(monkeypatch):
    monkeypatch.setattr(json_numbers, "_enabled", True)


def as_numpy(span: bytes) -> np.ndarray:
    return np.asarray(json.loads(span)).reshape(-1)


def same(span: bytes) -> None:
    got = json_numbers.read(span)
    assert got is not None, span
    want = as_numpy(span)
    assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())
    assert got.flags.writeable  # as the binary path's arrays: a model may take them with torch.from_numpy


numbers = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(numbers, min_size=1, max_size=40), st.sampled_from([(",", ":"), (", ", ": ")]))
def test_a_flat_array_reads_as_numpy_reads_its_list(values, separators):
    same(json.dumps(values, separators=separators).encode())


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 5), st.integers(1, 5), st.lists(st.integers(-(2**40), 2**40), min_size=25, max_size=25))
def test_a_regular_nested_array_reads_flat(rows, cols, pool):
    values = [[pool[(r * cols + c) % 25] for c in range(cols)] for r in range(rows)]
    same(json.dumps(values).encode())
    same(json.dumps(values, indent=2).encode())


@pytest.mark.parametrize("span", [
    b"[1.5e3, 2, -0.0, 1e-300, 123456789012345678]",  # floats and ints together: float64
    b"[9223372036854775807, -9223372036854775808]",  # int64's ends
    b"[0.1, 0.2, 0.30000000000000004]",
])
def test_edges_of_the_number_grammar_read_alike(span):
    same(span)


@pytest.mark.parametrize("span", [
    b"[]", b"[[]]",  # numpy: float64 of nothing
    b"[[1, 2], [3]]", b"[[1, [2]], [3, 4]]",  # ragged: numpy refuses
    b"[9223372036854775808]", b"[-99999999999999999999, 1]", b"[1.5, 99999999999999999999999]",  # past 64 bits
    b"[1, true]", b"[1, null]", b'[1, "2"]', b"[NaN]", b"[1e400]", b"[01]", b"[1,]", b"[1 2]",
])
def test_what_numpy_reads_otherwise_is_left_to_the_list(span):
    assert json_numbers.read(span) is None


def test_nothing_is_read_until_enabled(monkeypatch):
    monkeypatch.setattr(json_numbers, "_enabled", False)
    assert json_numbers.read(b"[1, 2, 3]") is None


def test_the_probe_passes_here_and_a_failing_one_only_means_lists():
    assert json_numbers.probe() == (True, "")
    ok, why = probe_in_child("import simdjson_missing_module", "the simdjson probe", 20.0)
    assert not ok and "the simdjson probe failed" in why
