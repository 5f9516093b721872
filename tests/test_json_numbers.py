"""``serving/wire/json_numbers.py``: a JSON array read by either native reader (recserve's own parser, simdjson) is
exactly the array numpy makes of the list ``json.loads`` returns, or None (the list decides); a reader is used only
after its probe passed.  The native parser's floats are checked against Python's ``float`` (correctly rounded)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.hostinfo import probe_in_child
from recserve.serving.wire import json_numbers


@pytest.fixture(autouse=True, params=json_numbers.READERS)
def reader(request, monkeypatch):
    """Each test once per reader, that reader alone."""
    passed, why = json_numbers.probe()
    if request.param not in passed:
        pytest.skip(f"the {request.param} reader is not available here: {why}")
    monkeypatch.setattr(json_numbers, "_readers", (request.param,))
    return request.param


def as_numpy(span: bytes) -> np.ndarray:
    return np.asarray(json.loads(span)).reshape(-1)


def same(span: bytes) -> None:
    got = json_numbers.read(span)
    assert got is not None, span
    want = as_numpy(span)
    assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes())
    assert got.flags.writeable  # as the binary path's arrays: a model may take them with torch.from_numpy


def finite(x: float) -> bool:
    return abs(x) < float("inf")


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
    monkeypatch.setattr(json_numbers, "_readers", ())
    assert json_numbers.read(b"[1, 2, 3]") is None


def test_the_probes_pass_here_and_a_failing_one_only_means_the_next_reader(reader, monkeypatch):
    monkeypatch.delenv(json_numbers.READERS_ENV, raising=False)  # every reader, whatever the caller narrowed
    json_numbers.probe.cache_clear()
    passed, why = json_numbers.probe()
    assert "simdjson" in passed
    if importlib.util.find_spec("recserve.serving.wire._json_arrays") is not None:  # built at install (a C compiler)
        assert passed == ("native", "simdjson") and why == ""
    ok, why = probe_in_child("import simdjson_missing_module", "the simdjson probe", 20.0)
    assert not ok and "the simdjson probe failed" in why
    monkeypatch.setenv(json_numbers.READERS_ENV, "simdjson")
    json_numbers.probe.cache_clear()
    try:
        assert json_numbers.probe() == (("simdjson",), "native not in $RECSERVE_JSON_READERS")
        with pytest.raises(ValueError, match="unknown JSON number readers"):
            json_numbers.enable(("fast",))
    finally:
        json_numbers.probe.cache_clear()


# ---------------------------------------------------------------- hostile bytes: never a crash, never a wrong number

HOSTILE_BYTES = b"0123456789-+.eE,[] \t\n\"\\x\x00\xff"


def numpy_or_none(span: bytes) -> np.ndarray | None:
    try:
        values = np.asarray(json.loads(span)).reshape(-1)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return values if values.dtype.kind in "if" and values.size else None


@settings(max_examples=600, deadline=None)
@given(st.lists(numbers, min_size=1, max_size=30), st.data())
def test_a_mangled_array_is_read_as_numpy_reads_it_or_refused(values, data):
    """Bytes inserted, replaced, deleted or cut off anywhere in an array: what the reader returns is what numpy
    makes of ``json.loads``' list, or None (json refuses it, or the reader cannot be sure)."""
    span = bytearray(json.dumps(values).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(span)))
        edit = data.draw(st.sampled_from(["insert", "replace", "delete", "cut"]))
        byte = data.draw(st.sampled_from(list(HOSTILE_BYTES)))
        if edit == "insert":
            span[at:at] = bytes([byte])
        elif edit == "replace" and at < len(span):
            span[at] = byte
        elif edit == "delete" and at < len(span):
            del span[at]
        elif edit == "cut":
            del span[at:]
    got = json_numbers.read(bytes(span))
    if got is not None:
        want = numpy_or_none(bytes(span))
        assert want is not None, bytes(span)
        assert (got.dtype, got.tobytes()) == (want.dtype, want.tobytes()), bytes(span)


@pytest.mark.parametrize("span", [
    b"[" * 100_000 + b"1" + b"]" * 100_000,  # nesting past any limit
    b"[" + b"9" * 100_000 + b"]",  # one number of 100k digits
    b"[1e" + b"9" * 100_000 + b"]", b"[0." + b"0" * 100_000 + b"1]",  # an exponent, a fraction of 100k digits (0.0)
    b"[" + b",".join([b"1"] * 100_000) + b",]",  # a trailing comma after 100k numbers
    b"[" + b" " * 100_000 + b"]",  # only whitespace
])
def test_pathological_arrays_are_refused_or_read_as_numpy_reads_them(span):
    got, want = json_numbers.read(span), numpy_or_none(span)
    assert got is None or (got.dtype, got.tobytes()) == (want.dtype, want.tobytes())
