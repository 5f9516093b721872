"""A JSON array of numbers read straight into numpy by simdjson (pysimdjson), with no Python object per number.

Why: a plain-JSON query carries its tensors as ``data`` arrays; orjson makes a Python int or float per number and
numpy reads them back one by one (~37 ns a number), so a batch-256 hercules-rmc1 query (2.9 MB, 270k numbers)
spent most of its decode there.  simdjson parses the array in C and exports it as one contiguous buffer.

The array read here is exactly what ``np.asarray`` makes of the list ``json.loads`` returns, or None where it might
not be (the caller then reads the list): integers only -> int64; any JSON float among them -> float64 (ints
converted as numpy converts them); anything else (true, null, strings, integers past int64, a ragged nesting)
-> None.  simdjson is native code, so it is used only once ``enable`` was called after a probe in a child process
passed (``probe``): a wheel that is missing, or dies on this CPU, only means the lists.
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from recserve.hostinfo import probe_in_child

PROBE_TIMEOUT_S = 20.0
# parse and export both kinds of array: an import alone would miss an illegal instruction in the parser's kernels
PROBE_CODE = """
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

_enabled = False
_local = threading.local()  # one parser per thread: a parser's buffers are reused, and parsers are not thread-safe


@functools.cache
def probe() -> tuple[bool, str]:
    """Whether simdjson parses and exports arrays in a child process of this interpreter, and why not."""
    return probe_in_child(PROBE_CODE, "the simdjson probe", PROBE_TIMEOUT_S)


def enable(on: bool = True) -> None:
    """Read arrays with simdjson from now on in this process (only after ``probe`` passed), or stop."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def read(span: bytes) -> np.ndarray | None:
    """The JSON array ``span`` (``[`` to ``]``) as the flat array ``np.asarray`` makes of its list, or None: not
    enabled, or an array this cannot be sure to read alike (see the module's docstring)."""
    if not _enabled:
        return None
    nested = span.find(b"[", 1) >= 0
    if nested and not regular(span.translate(None, NUMBER_BYTES)):
        return None  # simdjson flattens any nesting; numpy refuses a ragged one
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
