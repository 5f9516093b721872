"""The native JSON number reader (``serving/wire/_json_arrays.c``) alone: every number it reads is the double Python's
``float`` reads (correctly rounded: Eisel-Lemire with a 128-bit table of powers of five) or the int64 Python's
``int`` reads, and what it cannot read alike it refuses, for the next reader; the shared checks of every reader
against numpy are in ``test_json_numbers.py``."""

from __future__ import annotations

import itertools
import json
import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.serving.wire import json_numbers
from tests.test_json_numbers import finite, numpy_or_none, same


@pytest.fixture(autouse=True)
def native(monkeypatch):
    passed, why = json_numbers.probe()
    if "native" not in passed:
        pytest.skip(f"the native reader is not built here: {why}")
    monkeypatch.setattr(json_numbers, "_readers", ("native",))


# ---------------------------------------------------------------- the native parser's numbers, one by one


def native_or_none(text: str) -> np.ndarray | None:
    return json_numbers.read(f"[{text}]".encode())


def assert_reads_as_python(texts: list[str], must_read: bool = True) -> None:
    """Each number alone, then all together, as numpy reads ``json.loads``' list; ``must_read``: never refused."""
    for text in texts:
        got = native_or_none(text)
        if got is None:
            assert not must_read, text
            continue
        want = np.asarray(json.loads(text)).reshape(-1)
        assert (got.dtype, got.tobytes()) == (want.dtype, want.tobytes()), (text, got, want)
    span = ("[" + ", ".join(texts) + "]").encode()
    if must_read:
        same(span)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=20))
def test_floats_read_as_python_reads_them_in_every_spelling(values):
    spellings = [repr(v) for v in values] + [f"{v:.16e}".replace("e+", "e") for v in values] + [
        f"{v:.16E}" for v in values]
    assert_reads_as_python(spellings)


def test_every_float32_and_random_bit_pattern_reads_as_python():
    rng = random.Random(7)
    doubles = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(20_000)]
    singles = np.frombuffer(np.random.default_rng(7).integers(0, 2**32, 20_000, dtype=np.uint32).tobytes(),
                            np.float32)
    texts = [repr(v) for v in doubles if finite(v)] + [repr(float(v)) for v in singles if finite(float(v))]
    assert_reads_as_python(texts)


def test_decimal_strings_of_up_to_19_digits_round_as_python_rounds_them():
    """Random significands and exponents across the whole range, subnormals and zeros included; past the largest
    double the parser refuses, and simdjson or the list decides."""
    rng = random.Random(11)
    texts = []
    for _ in range(20_000):
        digits = str(rng.randint(1, 10**rng.randint(1, 19) - 1))
        point = rng.randint(0, len(digits))
        text = (digits[:point] or "0") + ("." + digits[point:] if point < len(digits) else "")
        if rng.random() < 0.6:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 330))
        texts.append(rng.choice(["", "-"]) + text)
    assert_reads_as_python(texts, must_read=False)
    read = sum(native_or_none(t) is not None for t in texts)
    assert read > 0.8 * len(texts)  # what is refused is infinite, not a whole class of spellings
    assert_reads_as_python([t for t in texts if finite(float(t))])


def test_exactly_halfway_decimals_round_to_even():
    rng = random.Random(3)
    odd = [rng.randrange(2**53 + 1, 2**54, 2) for _ in range(2000)]  # halfway between two doubles 2 apart
    halves = [rng.randrange(2**52, 2**53) for _ in range(2000)]  # m + 0.5: halfway between doubles 1 apart
    texts = ([f"{m}.0" for m in odd] + [f"{m}e0" for m in odd] + [f"{m}.5" for m in halves]
             + [f"{m * 5}e-1" for m in odd[:500]] + [f"{m}0e-1" for m in odd[:500]])
    assert_reads_as_python(texts)


@pytest.mark.parametrize("texts", [
    ["0", "-0", "7", "-7", "9223372036854775807", "-9223372036854775808", "1000000000000000000"],
    ["0.0", "-0.0", "0e5", "-0E-5", "0.000", "1E0", "1e+0", "1.0e-0", "0.1", "0.30000000000000004"],
    ["1.7976931348623157e308", "2.2250738585072014e-308", "5e-324", "1e-310", "1e309", "-1e400"],
    ["0.0000000000000000000000000001", "100000000000000000000.0", "1.2345678901234567890123"],
    ["9007199254740993", "0.5", "18014398509481985", "-9223372036854775807"],  # ints past 2^53 beside a float
])
def test_edges_read_as_python_or_are_refused(texts):
    assert_reads_as_python(texts, must_read=False)
    for text in texts:  # refused only past the largest double or past 19 significant digits
        if native_or_none(text) is None:
            value = json.loads(text)
            digits = len(text.lstrip("-").split("e")[0].split("E")[0].replace(".", "").lstrip("0"))
            assert not finite(float(value)) or digits > 19, text


def assert_spoiled_read_as_numpy(texts: list[str], comma: str, spoilers: list[str], rng: np.random.Generator) -> None:
    """The array of ``texts`` reads as numpy reads it; so does each copy with one element replaced by a spoiler (at
    the ends, the middle and six random places), or it is refused where numpy's list is no array."""
    same(("[" + comma.join(texts) + "]").encode())
    count = len(texts)
    for at in sorted({0, count // 2, count - 1, *rng.integers(0, count, 6).tolist()}):
        for spoiler in spoilers:
            spoiled = ("[" + comma.join(texts[:at] + [spoiler] + texts[at + 1:]) + "]").encode()
            if numpy_or_none(spoiled) is None:
                assert json_numbers.read(spoiled) is None, spoiled
            else:
                same(spoiled)


def test_long_id_arrays_read_as_numpy_with_every_kind_of_element_at_every_offset():
    """Integers of 1-8 digits are read 64 bytes at a time (``ids``): arrays of them from 1 to 3,000 elements, compact
    and spaced as ``json.dumps`` spaces them, then one element spoiled at several positions (a 9- or 19-digit id, a
    leading zero, a minus, a decimal, more whitespace, a letter): each reads as numpy reads its list, or is refused
    where numpy's list is no array."""
    rng = np.random.default_rng(5)
    spoilers = ["123456789", "1234567890123456789", "007", "-42", "3.5", " 8", "  8", "9 ", "\t9", "1e3", "x1", ""]
    for count, comma in itertools.product((1, 7, 8, 9, 63, 64, 65, 200, 3000), (",", ", ")):
        ids = [str(v) for v in rng.integers(0, 10 ** rng.integers(1, 9, count))]
        assert_spoiled_read_as_numpy(ids, comma, spoilers, rng)


def test_long_decimal_arrays_read_as_numpy_with_every_kind_of_element_at_every_offset():
    """Decimals "-?d.d{1,18}" are read 64 bytes at a time once an array holds doubles (``decimals``): float32 and
    float64 reprs and decimals of 1-18 fraction digits, compact and spaced, then one element spoiled at several
    positions (an exponent, a 19-digit fraction, two whole digits, a leading zero, a sign, a missing digit, more
    whitespace, -0.0, an integer): each reads as numpy reads its list, or is refused where numpy's list is no array."""
    rng = np.random.default_rng(6)
    spoilers = ["1.5e-05", "0.1234567890123456789", "12.5", "00.5", "+1.5", "1.", ".5", "- 1.5", "  1.5", "1.5 ",
                "-0.0", "7", "1.2.3", "1e10", "7x12", "x", ""]
    for count, comma in itertools.product((1, 5, 40, 400, 3000), (",", ", ")):
        normal = rng.standard_normal(count)
        texts = [repr(float(np.float32(v))) if k % 3 else repr(float(v)) for k, v in enumerate(normal)]
        texts[::7] = [f"{v:.{1 + k % 18}f}" for k, v in enumerate(normal[::7])]  # 1-18 fraction digits
        assert_spoiled_read_as_numpy(texts, comma, spoilers, rng)


@pytest.mark.parametrize("span", [b"[ 1 ,\n2\t,\r3 ]", b"[\n  [1, 2],\n  [3, 4]\n]", b"[1.5e3 , -2]"])
def test_whitespace_anywhere_JSON_allows_it(span):
    same(span)


@pytest.mark.parametrize("span", [b"[1, 2", b"1, 2]", b"[1, 2]]", b"[1, 2] x", b"[-]", b"[1.]", b"[.5]",
                                  b"[1e]", b"[+1]", b"[1, -a]", b"[0x10]", b"[1e5.5]", b"[1, 2,]"])
def test_broken_arrays_are_refused(span):
    assert json_numbers.read(span) is None


def test_what_the_native_parser_leaves_the_next_reader_reads(monkeypatch):
    passed = json_numbers.probe()[0]
    if "simdjson" not in passed:
        pytest.skip("simdjson is not available here")
    monkeypatch.setattr(json_numbers, "_readers", ("native", "simdjson"))
    same(b"[1.23456789012345678901234, 2]")  # more than 19 significant digits
