"""A plain-JSON request's tensors read without a Python list per number: each ``data`` array found in the raw bytes
and read straight into numpy (``json_numbers``), the rest of the request by orjson; and the bound on a request's
arrays and objects that keeps any JSON it reads from building millions of lists."""

from __future__ import annotations

from typing import Any

import numpy as np

from recserve.serving.wire import json_numbers
from recserve.serving.wire.codec.tensors import invalid, orjson

MAX_JSON_CONTAINERS = 65_536
"""``[`` and ``{`` characters (arrays and objects, and any inside strings) that a request's JSON part of at least
``JSON_FAST_BYTES`` may hold before orjson reads it: each two-byte ``[]`` would become a Python list of 30-60 bytes
(docs/decisions/2026-11-30-json-containers-bounded.md).  A nested tensor of 256 rows holds 257, and any tensor can be
sent flat, its shape folding it; past the bound the request is refused 400."""


def _containers(text: bytes | bytearray | memoryview) -> int:
    """``[`` and ``{`` in ``text``: the bytes whose value with bit 5 set is ``{`` (0x5B, 0x7B), counted by numpy
    where they lie, a MiB at a time so that its temporaries stay small."""
    view, found = np.frombuffer(text, np.uint8), 0
    for at in range(0, len(view), 1 << 20):
        found += int(np.count_nonzero((view[at : at + (1 << 20)] | 0x20) == 0x7B))
    return found


def check_containers(text: bytes | bytearray | memoryview) -> None:
    """:data:`MAX_JSON_CONTAINERS`, counted over ``text`` before it is parsed."""
    found = _containers(text)
    if found > MAX_JSON_CONTAINERS:
        raise invalid("body", f"the JSON has {found} '[' and '{{' (arrays and objects), over {MAX_JSON_CONTAINERS}; "
                              "send each tensor's data as one flat array (its shape folds it)")


JSON_FAST_BYTES = 32 * 1024
"""A request's JSON part at least this long is read by :func:`json_request` first: below it, finding the tensors
and reading the rest twice cost more than the lists save (docs/decisions/2026-11-28-json-tensors-simdjson.md)."""
DATA_BYTES = 8 * 1024  # a shorter ``data`` array is read by orjson (simdjson's setup is not worth it)
DataSpans = list[tuple[int, int, int | None]]  # each data array's start, end and room (None: not counted)


def json_request(head: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """An infer request's JSON part as :func:`json_loads` reads it, but with each input's ``data`` array of numbers
    read straight into numpy by a native reader (``json_numbers.read``: the flat array ``np.asarray`` makes of the
    list, so :func:`from_list` checks it alike).  None where this cannot be sure to read what :func:`json_loads`
    would: no native reader enabled in this process, escapes anywhere (a key spelled ``"d\\u0061ta"``), a ``"data"``
    array anywhere but once in each input, JSON that orjson refuses (``NaN``), and so on; the caller then reads the
    request the whole way.  With the native reader, ``head`` is read where it lies (a worker's receive buffer)."""
    if not json_numbers.enabled():
        return None
    head, (request, spans), containers = _skeleton(head)
    if request is None:
        return None
    for t, (start, end, room) in zip([t for t in request["inputs"] if "data" in t], spans, strict=True):
        span = head[start:end]
        nested = _nested(span)
        if nested:  # counted before a reader builds its structure; the skeleton counted the array's own "["
            containers += _containers(span) - 1
        data = json_numbers.read(span, room) if len(span) >= DATA_BYTES and containers <= MAX_JSON_CONTAINERS \
            else None
        if data is None and not nested:
            containers += _containers(span) - 1
        if containers > MAX_JSON_CONTAINERS:
            return None  # the whole decode refuses it, with the same count (``http_requests._header``)
        if data is None:
            try:
                data = orjson.loads(span)
            except orjson.JSONDecodeError:
                return None
        t["data"] = data
    return request


def json_skeleton(head: bytes | bytearray | memoryview) -> dict[str, Any] | None:
    """A plain-JSON infer request with every input's ``data`` read as ``[]``: its names, shapes and parameters for
    a fraction of a full decode (~0.1 of a ms for a 2.9 MB batch-256 query against ~2 ms), so a worker under load
    can refuse it before decoding it (``WorkerPlane.admit``).  None where this cannot be sure to read what the full
    decode would (see :func:`json_request`), or a request with no ``data`` array."""
    return _skeleton(head)[1][0]


def _nested(span: bytes | bytearray | memoryview) -> bool:
    """Whether a ``data`` array's first element is an array (its first byte after ``[`` and any whitespace)."""
    at = 1
    while at < len(span) and span[at] in b" \t\n\r":
        at += 1
    return at < len(span) and span[at] == 0x5B


def _one_data_per_input(inputs: list[dict[str, Any]], spans: DataSpans) -> bool:
    """Every ``"data"`` array found is one input's: none elsewhere, none given twice (the last would count); inputs
    without ``data`` (binary, shared memory) are read as always."""
    holders = [t for t in inputs if "data" in t]
    return len(holders) == len(spans) and all(type(t["data"]) is list and not t["data"] for t in holders)


def _skeleton(head: bytes | bytearray | memoryview) -> tuple[bytes | bytearray | memoryview,
                                                             tuple[dict[str, Any] | None, DataSpans], int]:
    """``head`` parsed with each ``data`` array replaced by ``[]``, and where those arrays were; (None, []) for
    JSON orjson refuses, escapes anywhere, no ``data`` array, no list of input objects, a ``data`` array that is
    not one input's (``_one_data_per_input``), or more than :data:`MAX_JSON_CONTAINERS` arrays and objects besides
    the ``data`` arrays.  Returned with the head the spans index (``head`` itself where the native reader found
    them, else a copy as bytes) and the arrays and objects it counted (each ``data`` array as one)."""
    if orjson is None:
        return head, (None, []), 0
    if "native" in json_numbers.readers():
        spans = json_numbers.data_spans(head)
    else:
        head = head if isinstance(head, bytes) else bytes(head)
        pairs = None if b"\\" in head else _data_spans(head)
        spans = None if pairs is None else [(start, end, None) for start, end in pairs]
    if not spans:
        return head, (None, []), 0
    pieces, last = [], 0
    for start, end, _ in spans:
        pieces += (head[last:start], b"[]")
        last = end
    pieces.append(head[last:])
    skeleton = b"".join(pieces)
    containers = _containers(skeleton)
    if containers > MAX_JSON_CONTAINERS:
        return head, (None, []), containers  # the whole decode refuses it (``http_requests._header``)
    try:
        request = orjson.loads(skeleton)
    except orjson.JSONDecodeError:
        return head, (None, []), containers
    inputs = request.get("inputs") if isinstance(request, dict) else None
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs) \
            or not _one_data_per_input(inputs, spans):
        return head, (None, []), containers
    return head, (request, spans), containers


def _data_spans(head: bytes) -> list[tuple[int, int]] | None:
    """Where each ``"data": [...]`` array of ``head`` starts and ends; None where a ``"data"`` key holds no array."""
    spans, pos = [], 0
    while True:
        k = head.find(b'"data"', pos)
        if k < 0:
            return spans
        j = k + 6
        while j < len(head) and head[j] in b" \t\n\r":
            j += 1
        if j >= len(head) or head[j] != 58:  # ':': a string "data" that is no key
            pos = j
            continue
        j += 1
        while j < len(head) and head[j] in b" \t\n\r":
            j += 1
        if j >= len(head) or head[j] != 91:  # '[': data that is not an array; the whole decode reads it
            return None
        stop = min(x for x in (head.find(b'"', j), head.find(b"}", j), len(head)) if x >= 0)
        end = head.rfind(b"]", j, stop) + 1
        if end <= j:
            return None
        spans.append((j, end))
        pos = end
