"""A JSON array of numbers read straight into numpy, with no Python object per number.

Why: a plain-JSON query carries its tensors as ``data`` arrays; orjson makes a Python int or float per number and
numpy reads them back one by one (~37 ns a number), so a batch-256 hercules-rmc1 query (2.9 MB, 270k numbers)
spent most of its decode there.  Two readers parse an array in C:

- ``native``: recserve's own number parser (``_json_arrays.c``, built at install where a C compiler is found): ids
  at ~4 ns a number, floats by the Eisel-Lemire algorithm, straight into the array's memory;
- ``simdjson`` (pysimdjson): a document parsed, then exported as one buffer (~10 ns an id, ~19 ns a float).

The native one goes first; what it refuses (an infinite value, more than 19 significant digits) goes to simdjson.

The array read here is exactly what ``np.asarray`` makes of the list ``json.loads`` returns, or None where it might
not be (the caller then reads the list): integers only -> int64; any JSON float among them -> float64 (ints
converted as numpy converts them); anything else (true, null, strings, integers past int64, a ragged nesting)
-> None.  Both readers are native code, so each is used only once ``enable`` named it after its probe in a child
process passed (``probe``): a wheel or build that is missing, or dies on this CPU, only means the next reader.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np

from recserve.hostinfo import probe_in_child

PROBE_TIMEOUT_S = 20.0
READERS = ("native", "simdjson")  # fastest first
# each probe parses both kinds of array (an import alone would miss an illegal instruction in a parser); the native
# one runs every exported function over arrays long enough for its vector paths (SSE2, SSE4.1): a short one would
# pass on a CPU without them and leave the illegal instruction to a worker's first large query
NATIVE_PROBE_CODE = """
import numpy as np
from recserve.serving.wire import _json_arrays
floats = b'[' + b', '.join([b'-1.7291035652160645', b'0.45616060495376587', b'12', b'1e-5'] * 64) + b']'
out = np.empty(_json_arrays.room(floats), np.int64)
assert len(out) == 256 and _json_arrays.parse(floats, out) == (256, True, False)
assert out.view(np.float64)[:4].tolist() == [-1.7291035652160645, 0.45616060495376587, 12.0, 1e-5]
ids = b'[' + b','.join(b'%d' % i for i in range(0, 3_000_000, 9_999)) + b']'
out = np.empty(_json_arrays.room(ids), np.int64)
assert _json_arrays.parse(ids, out) == (301, False, False) and out.tolist() == list(range(0, 3_000_000, 9_999))
nested = b'[[1, 2], [3, 4]]'
assert _json_arrays.parse(nested, out) == (4, False, True) and out[:4].tolist() == [1, 2, 3, 4]
head = b'{"inputs": [{"name": "x", "data": ' + ids + b'}]}'
assert _json_arrays.data_spans(head) == [(34, 34 + len(ids), 301)]
print("ok")
"""
SIMDJSON_PROBE_CODE = """
import simdjson
parser = simdjson.Parser()
doc = parser.parse(b'[1, -2, 30000000000]')
assert bytes(doc.as_buffer(of_type='i')) == (1).to_bytes(8, 'little', signed=True) + (-2).to_bytes(8, 'little', \
signed=True) + (30000000000).to_bytes(8, 'little', signed=True)
del doc
doc = parser.parse(b'[0.5, 2]')
assert len(bytes(doc.as_buffer(of_type='d'))) == 16
print("ok")
"""
# what a nested array's brackets and commas are left of when its numbers and spaces are deleted
NUMBER_BYTES = b"0123456789-+.eE \t\n\r"

_readers: tuple[str, ...] = ()  # the readers this process may use, fastest first
_local = threading.local()  # one parser per thread: a parser's buffers are reused, and parsers are not thread-safe


READERS_ENV = "RECSERVE_JSON_READERS"  # e.g. "simdjson" (not the native one), "" (lists only); unset: both


@functools.cache
def probe() -> tuple[tuple[str, ...], str]:
    """The readers that parse arrays in a child process of this interpreter (fastest first), and why the others
    did not; only those named in ``$RECSERVE_JSON_READERS`` (comma-separated) where it is set."""
    wanted = os.environ.get(READERS_ENV)
    allowed = READERS if wanted is None else tuple(r.strip() for r in wanted.split(",") if r.strip())
    passed, why = [], []
    for name, code in (("native", NATIVE_PROBE_CODE), ("simdjson", SIMDJSON_PROBE_CODE)):
        if name not in allowed:
            why.append(f"{name} not in ${READERS_ENV}")
            continue
        ok, reason = probe_in_child(code, f"the {name} JSON number reader's probe", PROBE_TIMEOUT_S)
        if ok:
            passed.append(name)
        else:
            why.append(reason)
    return tuple(passed), "; ".join(why)


def enable(readers: tuple[str, ...] | list[str] = READERS) -> None:
    """Read arrays with these readers from now on in this process (only those whose ``probe`` passed); () stops."""
    global _readers
    unknown = set(readers) - set(READERS)
    if unknown:
        raise ValueError(f"unknown JSON number readers {sorted(unknown)}; known: {list(READERS)}")
    _readers = tuple(r for r in READERS if r in readers)


def readers() -> tuple[str, ...]:
    return _readers


def enabled() -> bool:
    return bool(_readers)


def read(span: bytes | memoryview, room: int | None = None) -> np.ndarray | None:
    """The JSON array ``span`` (``[`` to ``]``) as the flat array ``np.asarray`` makes of its list, or None: no
    reader enabled, or an array none can be sure to read alike (see the module's docstring).  ``room``: the most
    numbers it can hold, where :func:`data_spans` gave it (else the native reader counts them)."""
    for name in _readers:
        values = _native(span, room) if name == "native" else _simdjson(bytes(span))
        if values is not None:
            return values
    return None


def data_spans(head: bytes | bytearray | memoryview) -> list[tuple[int, int, int]] | None:
    """Where each ``"data": [...]`` array of a request's JSON lies, and the most numbers it can hold (its commas
    and one), found by the native reader in ``head`` where it is (a receive buffer: no copy of the request), one
    pass over each array's bytes; None where it cannot be sure (``codec.json_tensors._data_spans``' rules, and any
    backslash).  Only while the native reader is enabled."""
    from recserve.serving.wire import _json_arrays

    return _json_arrays.data_spans(head)


def _native(span: bytes | memoryview, room: int | None = None) -> np.ndarray | None:
    from recserve.serving.wire import _json_arrays

    # one slot a comma, and one: exact for a flat array
    out = np.empty(_json_arrays.room(span) if room is None else room, np.int64)
    result = _json_arrays.parse(span, out)
    if result is None:
        return None
    count, floats, nested = result
    if nested and _ragged(span):
        return None
    if count < len(out):  # nested arrays' commas between their rows
        out = out[:count].copy()
    return out.view(np.float64) if floats else out


def _simdjson(span: bytes) -> np.ndarray | None:
    if span.find(b"[", 1) >= 0 and _ragged(span):
        return None
    parser = getattr(_local, "parser", None)
    if parser is None:
        import simdjson

        parser = _local.parser = simdjson.Parser()
    try:
        doc = parser.parse(span)
    except Exception:  # noqa: BLE001 - not JSON simdjson reads (NaN, 1e400, a bigint...): the list decides
        return None
    try:
        values = _exported(doc)
    finally:
        del doc  # the parser may be reused only once no element of its last document is held
    return values if values is not None and values.size else None  # numpy makes float64 of an empty list


def _exported(doc) -> np.ndarray | None:
    try:
        return np.frombuffer(doc.as_buffer(of_type="i"), np.int64).copy()
    except TypeError:  # a float, or something that is no number at all
        pass
    except Exception:  # noqa: BLE001 - an integer past int64: numpy reads that list as uint64 or objects
        return None
    try:
        return np.frombuffer(doc.as_buffer(of_type="d"), np.float64).copy()
    except Exception:  # noqa: BLE001 - true, null, a string...: the list decides
        return None


def _ragged(span: bytes | memoryview) -> bool:
    """Whether a nested array is one numpy refuses (ragged, empty, too deep): both readers flatten any nesting."""
    return not regular(bytes(span).translate(None, NUMBER_BYTES))


MAX_DEPTH = 32  # deeper nesting is left to the lists (numpy refuses arrays of more than 64 dimensions)


def regular(structure: bytes) -> bool:
    """Whether ``structure`` (a nested array's brackets and commas) is that of a regular array with no empty
    list: what ``np.asarray`` reads into one shape (a ragged one is refused by the whole decode, in its words)."""
    depth = len(structure) - len(structure.lstrip(b"["))
    if depth > MAX_DEPTH:
        return False
    group, inner = b"", 0
    for level in range(depth, 0, -1):  # the first list at each level, innermost first: its length gives its size
        close = structure.find(b"]" * (depth - level + 1))
        if close < 0:
            return False
        length = close + depth - level + 1 - (level - 1)
        size, rest = divmod(length - 1, inner + 1)
        if rest or size < 1:
            return False
        group = b"[" + b",".join([group] * size) + b"]"
        inner = length
    return group == structure
