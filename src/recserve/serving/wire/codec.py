"""Open Inference Protocol (KServe v2) tensors on the wire: JSON, the HTTP binary extension, gRPC raw contents.

Only numpy and the standard library are imported, so the router, the load generator and benchmark
peers encode and decode queries without torch, aiohttp or grpc (gRPC messages are duck-typed: the
caller owns the protobuf classes).

Server side, :func:`parse_http_infer` and :func:`parse_grpc_infer` validate the *whole* request
(inputs, request and output ``parameters``, ``outputs``, ``id``) before anything runs: every
malformed field is ``InferError("invalid", "<field>: …", field)`` (HTTP 400 / gRPC INVALID_ARGUMENT),
never an exception after the model has run.  Given the process's ``regions``
(:class:`recserve.serving.wire.shm.Regions`), an input or output whose parameters name a ``shared_memory_region`` is
read from or written to that region (Triton's system shared-memory extension) on every transport alike.

Client side, the ``encode_*``/``decode_*`` functions raise ``ValueError`` on a malformed response.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from recserve.serving.wire import json_numbers
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import grpc_params, tensor_params
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, OUTPUT_SCORES, SMALL_QUERY_LENGTHS

HEADER_LENGTH = "Inference-Header-Content-Length"

DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_), "INT8": np.dtype(np.int8), "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32), "INT64": np.dtype(np.int64), "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16), "UINT32": np.dtype(np.uint32), "UINT64": np.dtype(np.uint64),
    "FP16": np.dtype(np.float16), "FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64),
}
DATATYPES: dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}
LITTLE_ENDIAN: dict[np.dtype, np.dtype] = {v: v.newbyteorder("<") for v in DTYPES.values()}
"""The wire's byte order of each datatype (made once: ``newbyteorder`` builds a new dtype on every call)."""
EXPECTED: dict[str, tuple[str, ...]] = {
    INPUT_DENSE: ("FP32",), INPUT_VALUES: ("INT64",), INPUT_LENGTHS: ("INT32", "INT64"),
}
GRPC_CONTENTS = {"FP32": "fp32_contents", "INT64": "int64_contents", "INT32": "int_contents"}
"""Typed ``InferTensorContents`` field per accepted datatype."""
RANKS: dict[str, int] = {INPUT_DENSE: 2, INPUT_VALUES: 1, INPUT_LENGTHS: 2}
"""Rank of each input (``[B, D]``, ``[N]``, ``[T, B]``): reshaping any other rank would silently reinterpret ids."""
MAX_ELEMENTS = 2**40
"""Elements one tensor may declare: far above any body this server accepts, far below int64 overflow."""


try:  # a native wheel, so optional: without it (no wheel for the platform) the standard library reads the same JSON
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; this is the fail-soft path
    orjson = None


def json_loads(text: bytes | bytearray | memoryview | str) -> Any:
    """JSON from a request, with orjson where it is installed (several times faster than ``json`` on headers and on
    ``data`` tensors; docs/decisions/2026-11-24-worker-per-query-costs.md).  What orjson refuses
    is read again by ``json`` (``NaN`` literals, which ``check_inputs`` then refuses naming the tensor), so errors
    read as before; integers beyond 64 bits become floats, refused wherever an integer is required."""
    if isinstance(text, memoryview):  # a body received in place (``http_connection.Connection``): neither reads views
        text = text.tobytes()
    if orjson is not None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text)


def json_dumps(obj: Any) -> bytes:
    """A JSON answer, by orjson where it is installed (a 241-score answer: 4 us against ``json``'s 85 us); what
    orjson refuses (an ``id`` integer past 64 bits) is written by ``json``.  Numbers read back as the same floats:
    both write each float's shortest round-trip form."""
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return json.dumps(obj, allow_nan=False).encode()


TENSOR_ALIGN = 64  # where a received request's largest tensor starts (a cache line)


def aligned_buffer(size: int, lead: int = 0) -> memoryview:
    """An uninitialised buffer of ``size`` bytes for a request being received, placed so that its byte ``lead`` (where
    its tensors, or its largest one, begin) is ``TENSOR_ALIGN``-aligned: numpy reads misaligned ids at about half
    speed, and zeroing a large buffer would cost the receiving loop for nothing
    (docs/decisions/2026-11-24-worker-per-query-costs.md)."""
    store = np.empty(size + TENSOR_ALIGN, np.uint8)
    pad = -(store.ctypes.data + lead) % TENSOR_ALIGN
    return memoryview(store)[pad : pad + size]


def invalid(field: str, message: str) -> InferError:
    return InferError("invalid", f"{field}: {message}", field)


# ---------------------------------------------------------------- tensors


def raw_tensor(name: str, arr: np.ndarray) -> tuple[dict[str, Any], bytes]:
    """``{"name", "datatype", "shape"}`` and the little-endian C-order bytes of ``arr`` (the wire form)."""
    arr = np.ascontiguousarray(arr)
    datatype = DATATYPES.get(arr.dtype.newbyteorder("="))
    if datatype is None:
        raise ValueError(f"{name}: no Open Inference Protocol datatype for {arr.dtype}")
    raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return {"name": name, "datatype": datatype, "shape": list(arr.shape)}, raw


def _shape(field: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, list | tuple):
        raise invalid(field, f"shape must be a list of non-negative integers, got {shape!r}")
    total, huge = 1, False
    for d in shape:  # a plain loop: cheaper than a generator check, and this runs per tensor of every query
        if type(d) is not int or d < 0:
            raise invalid(field, f"shape must be a list of non-negative integers, got {shape!r}")
        huge = huge or d > MAX_ELEMENTS
        total *= d
    # each dimension bounded too: a zero elsewhere makes the product 0 but numpy still refuses the reshape
    if huge or total > MAX_ELEMENTS:
        raise invalid(field, f"shape {list(shape)} declares more than {MAX_ELEMENTS} elements")
    if field in RANKS and len(shape) != RANKS[field]:
        raise invalid(field, f"shape must have rank {RANKS[field]}, got {list(shape)}")
    return tuple(shape)


def _check_dtype(field: str, datatype: Any) -> np.dtype:
    if datatype not in EXPECTED[field]:
        raise invalid(field, f"datatype must be {' or '.join(EXPECTED[field])}, got {datatype!r}")
    return DTYPES[datatype]


def from_raw(field: str, datatype: Any, shape: Any, raw: bytes | memoryview) -> np.ndarray:
    dtype = _check_dtype(field, datatype)
    dims = _shape(field, shape)
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise invalid(field, f"binary data has {len(raw)} bytes, shape {list(dims)} of {datatype} needs {expected}")
    # frombuffer views the request body (no copy); the model only reads its inputs.
    return np.frombuffer(raw, dtype=LITTLE_ENDIAN[dtype]).reshape(dims)


def _numbers(field: str, datatype: str, data: Any) -> np.ndarray:
    """``data`` as a flat array, refusing what a cast would silently change (floats to ints, overflow)."""
    try:
        values = np.asarray(data).reshape(-1)
    except ValueError as exc:  # ragged nesting
        raise invalid(field, f"data is not a list of {datatype} numbers: {exc}") from exc
    if values.size == 0:
        return values
    dtype = DTYPES[datatype]
    integral = dtype.kind in "iu"
    if values.dtype.kind == "O" and any(v is None for v in values):
        raise invalid(field, "data holds null; every element must be a number")
    if values.dtype.kind not in ("iu" if integral else "iuf"):
        kind = "integers" if integral else "numbers"
        raise invalid(field, f"data must hold {datatype} {kind} (integers beyond 64 bits are refused too), "
                             f"got {values.dtype} values")
    if integral and values.dtype != dtype:  # (int64 values of an INT64 input fit by their type)
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise invalid(field, f"data holds values outside the {datatype} range [{info.min}, {info.max}]")
    return values


def from_list(field: str, datatype: Any, shape: Any, data: Any) -> np.ndarray:
    dtype = _check_dtype(field, datatype)
    dims = _shape(field, shape)
    arr = _numbers(field, datatype, data)
    count = math.prod(dims)
    if arr.size != count:
        raise invalid(field, f"data holds {arr.size} elements, shape {list(dims)} needs {count}")
    return arr.astype(dtype, copy=False).reshape(dims)


def _check_names(names: Sequence[Any]) -> None:
    for n in names:
        if not isinstance(n, str):
            raise invalid("inputs", f"every input needs a string 'name', got {n!r}")
        if n not in EXPECTED:
            raise invalid(n, f"unknown input; expected {sorted(EXPECTED)}")
    if len(set(names)) != len(names):
        raise invalid("inputs", "an input is given twice")
    for n in EXPECTED:
        if n not in names:
            raise invalid(n, "input tensor missing")


def check_inputs(arrays: dict[str, np.ndarray]) -> None:
    """What no single tensor shows: non-finite features, bag lengths that overrun (or wrap past) the ids."""
    dense = arrays[INPUT_DENSE]
    if np.count_nonzero(np.isfinite(dense)) != dense.size:  # not ``.all()``: its Python wrapper costs more
        raise invalid(INPUT_DENSE, "holds NaN or infinite values; every feature must be a finite number")
    lengths, ids = arrays[INPUT_LENGTHS], arrays[INPUT_VALUES].size
    total = 0
    if lengths.size:
        flat = lengths.ravel().tolist() if lengths.size <= SMALL_QUERY_LENGTHS else None
        lo, hi = (min(flat), max(flat)) if flat is not None else (lengths.min(), lengths.max())
        # bounding each length by the id count first keeps the int64 sum below from wrapping round
        if lo < 0 or hi > ids:
            raise invalid(INPUT_LENGTHS, f"every length must be in [0, {ids}] (the number of sparse_values)")
        total = sum(flat) if flat is not None else int(lengths.sum(dtype=np.int64))
    if total != ids:
        raise invalid(INPUT_VALUES, f"has {ids} ids but sparse_lengths sum to {total}")


def finite_scores(scores: Any) -> np.ndarray:
    """``scores`` as FP32, refusing NaN/inf: a response must never carry them (bare ``NaN`` is not JSON)."""
    scores = np.asarray(scores, dtype=np.float32)
    if np.count_nonzero(np.isfinite(scores)) != scores.size:
        raise InferError("internal", f"{OUTPUT_SCORES}: the model produced non-finite scores", OUTPUT_SCORES)
    return scores


def check_outputs(names: Iterable[Any]) -> None:
    for n in names:
        if n != OUTPUT_SCORES:
            raise invalid(str(n), f"unknown output; this model has only {OUTPUT_SCORES!r}")


Target = tuple[str, int, int]
"""A tensor's place in shared memory: (region, byte_size, offset)."""


def _no_regions(field: str) -> InferError:
    return invalid(field, "parameters.shared_memory_region: this server path reads no shared memory")


def _shm_input(field: str, datatype: Any, shape: Any, target: Target, regions: Any) -> np.ndarray:
    """An input read from a registered region (a view of the client's memory, checked against shape and bounds)."""
    dtype = _check_dtype(field, datatype)
    dims = _shape(field, shape)
    if regions is None:
        raise _no_regions(field)
    return regions.view(field, *target, LITTLE_ENDIAN[dtype], dims)


def _shm_output(field: str, params: dict[str, Any], regions: Any) -> None:
    """A requested output's shared-memory parameters, checked (the region exists, the span lies within it)."""
    target = tensor_params(field, params)
    if target is not None:
        if regions is None:
            raise _no_regions(field)
        regions.check_output(field, *target)


def _write_scores(target: Target, scores: np.ndarray, regions: Any) -> dict[str, Any]:
    """Scores written into the output's region; the response's output entry, without data (Triton's rule)."""
    entry = {"name": OUTPUT_SCORES, "datatype": "FP32", "shape": list(scores.shape)}
    regions.write(OUTPUT_SCORES, *target, scores.astype("<f4", copy=False))
    return entry


# ---------------------------------------------------------------- HTTP requests (server side)


def _split(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary tail of a request body."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError as exc:
        raise invalid(HEADER_LENGTH, f"not an integer: {header_length!r}") from exc
    if not 0 < n <= len(body):
        raise invalid(HEADER_LENGTH, f"{n} is outside the body of {len(body)} bytes")
    return body[:n], memoryview(body)[n:]


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


def _check_containers(text: bytes | bytearray | memoryview) -> None:
    """:data:`MAX_JSON_CONTAINERS`, counted over ``text`` before it is parsed."""
    found = _containers(text)
    if found > MAX_JSON_CONTAINERS:
        raise invalid("body", f"the JSON has {found} '[' and '{{' (arrays and objects), over {MAX_JSON_CONTAINERS}; "
                              "send each tensor's data as one flat array (its shape folds it)")


def _header(head: bytes | bytearray | memoryview) -> dict[str, Any]:
    if len(head) >= JSON_FAST_BYTES:  # smaller ones cannot hold enough containers to matter
        _check_containers(head)
    try:
        request = json_loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise invalid("body", f"not valid JSON: {exc}") from exc
    return _checked_header(request)


def _checked_header(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise invalid("inputs", "request must be a JSON object with an 'inputs' list")
    if not all(isinstance(t, dict) for t in request["inputs"]):
        raise invalid("inputs", "every input must be a JSON object")
    return request


def _parameters(field: str, holder: dict[str, Any], flag: str | None = None) -> dict[str, Any]:
    """``holder["parameters"]`` (a JSON object or absent); ``flag``, if present in it, must be a boolean."""
    params = holder.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid(field, f"parameters must be a JSON object, got {params!r}")
    if flag is not None and flag in params and not isinstance(params[flag], bool):
        raise invalid(field, f"parameters.{flag} must be true or false, got {params[flag]!r}")
    return params


MAX_TIMEOUT_US = 3600 * 10**6


def timeout_s(params: dict[str, Any]) -> float | None:
    """The request's ``timeout`` parameter (microseconds, Triton's convention) in seconds; None if absent."""
    value = params.get("timeout")
    if value is None:
        return None
    if type(value) is not int or not 0 < value <= MAX_TIMEOUT_US:
        raise invalid("parameters.timeout", f"must be an integer number of microseconds in (0, {MAX_TIMEOUT_US}], "
                                            f"got {value!r}")
    return value / 1e6


def request_timeout_s(request: dict[str, Any]) -> float | None:
    """:func:`timeout_s` of a decoded request's ``parameters`` (none given: None)."""
    return timeout_s(request.get("parameters") or {})


def _check_request(request: dict[str, Any], regions: Any = None) -> None:
    """Everything of the request besides the input tensors: ``id``, ``parameters``, ``outputs``."""
    if "id" in request and not isinstance(request["id"], str):
        raise invalid("id", f"must be a string, got {request['id']!r}")
    timeout_s(_parameters("parameters", request, "binary_data_output"))
    outputs = request.get("outputs")
    if outputs is None:
        return
    if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
        raise invalid("outputs", f"must be a list of JSON objects, got {outputs!r}")
    names = [o.get("name") for o in outputs]
    if not all(isinstance(n, str) for n in names):
        raise invalid("outputs", f"every output needs a string 'name', got {names!r}")
    check_outputs(names)
    for o in outputs:
        params = _parameters(o["name"], o, "binary_data")
        if params:
            _shm_output(o["name"], params, regions)


def _input_array(t: dict[str, Any], binary: memoryview, offset: int, regions: Any = None) -> tuple[np.ndarray, int]:
    """One input tensor (JSON ``data``, the binary slice at ``offset`` or a shared-memory region) and the next
    offset."""
    name = t["name"]
    params = _parameters(name, t)
    size = params.get("binary_data_size")
    target = tensor_params(name, params) if params else None
    if target is not None:
        if "data" in t or size is not None:
            raise invalid(name, "has parameters.shared_memory_region and also 'data' or binary_data_size; "
                                "send the tensor one way")
        return _shm_input(name, t.get("datatype"), t.get("shape"), target, regions), offset
    if size is None:
        if "data" not in t:
            raise invalid(name, "needs 'data' or parameters.binary_data_size")
        return from_list(name, t.get("datatype"), t.get("shape"), t["data"]), offset
    if "data" in t:
        raise invalid(name, "has both 'data' and parameters.binary_data_size")
    if type(size) is not int or size < 0 or offset + size > len(binary):
        raise invalid(name, f"binary_data_size {size!r} runs past the {len(binary)} binary bytes")
    return from_raw(name, t.get("datatype"), t.get("shape"), binary[offset : offset + size]), offset + size


MAX_JSON_BYTES = 16 * 1024 * 1024


def parse_http_infer(body: bytes, header_length: str | None, max_json: int = MAX_JSON_BYTES,
                     regions: Any = None) -> tuple[dict, dict[str, np.ndarray]]:
    """The validated JSON part of a v2 infer request and its input arrays (JSON ``data``, binary extension, or
    shared-memory regions of ``regions``).

    The JSON part is bounded (``max_json`` bytes): tens of MB of JSON take seconds and most of a GB to decode, so
    large tensors must travel in the binary extension (or shared memory)."""
    head, binary = _split(body, header_length)
    if len(head) > max_json:
        raise InferError("too_large", f"body: the JSON part is {len(head)} bytes, over the limit of {max_json}; "
                                      "send large tensors with the binary tensor extension", "body")
    if len(head) >= JSON_FAST_BYTES:
        request = json_request(head)
        if request is not None:
            try:
                return _parse_request(_checked_header(request), binary, regions)
            except InferError:
                pass  # refused: the whole decode below says why, in the words it always has
    return _parse_request(_header(head), binary, regions)


def _parse_request(request: dict[str, Any], binary: memoryview, regions: Any) -> tuple[dict, dict[str, np.ndarray]]:
    """The rest of :func:`parse_http_infer`, given the request's JSON part (``_checked_header``)."""
    tensors = request["inputs"]
    _check_names([t.get("name") for t in tensors])
    _check_request(request, regions)
    arrays, offset = {}, 0
    for t in tensors:
        arrays[t["name"]], offset = _input_array(t, binary, offset, regions)
    if offset != len(binary):
        raise invalid("body", f"{len(binary) - offset} binary bytes after the last input")
    check_inputs(arrays)
    return request, arrays


# ---------------------------------------------------------------- JSON tensors read without Python lists

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
            return None  # the whole decode refuses it, with the same count (``_header``)
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
        return head, (None, []), containers  # the whole decode refuses it (``_header``)
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


def http_raw_plan(request: dict[str, Any]) -> RawPlan | None:
    """For a request that :func:`parse_http_infer` accepted: its inputs' plan when nothing but its binary tensors'
    bytes could change the verdict on a request with the same JSON header (every input sent as binary data with no
    other parameter, no output naming a shared-memory region); None otherwise."""
    for o in request.get("outputs") or ():
        if o.get("parameters") and tensor_params(o["name"], o["parameters"]) is not None:
            return None
    plan = []
    for t in request["inputs"]:
        params = t.get("parameters")
        if not params or len(params) != 1 or "binary_data_size" not in params:
            return None
        plan.append((t["name"], LITTLE_ENDIAN[DTYPES[t["datatype"]]], tuple(t["shape"]), params["binary_data_size"]))
    return tuple(plan)


class HttpPlans:
    """JSON headers of requests this worker accepted, each with its parsed header and plan.

    A request whose header bytes were seen before is read without JSON: its tensors are viewed where they arrived
    and only their sizes and values are checked, as a gRPC request is read by its bytes but for the raw contents
    (``grpc_worker.Plan``).  Why: tritonclient and perf_analyzer send the same header on every call, and reading
    it again (JSON, names, datatypes, shapes, parameters) was a tenth of a batch-1 query's cost besides its model
    (docs/decisions/2026-11-24-worker-per-query-costs.md)."""

    def __init__(self) -> None:
        self._plans = PlanStore()

    def parse(self, body: bytes | bytearray | memoryview, header_length: str | None, max_json: int = MAX_JSON_BYTES,
              regions: Any = None) -> tuple[dict, dict[str, np.ndarray]]:
        """What :func:`parse_http_infer` returns for this request.  A planned request's dict is the one parsed
        from the first request of its header, shared with every later one: read it, never change it."""
        request, arrays, _ = self.parse_planned(body, header_length, max_json, regions)
        return request, arrays

    def parse_planned(self, body: bytes | bytearray | memoryview, header_length: str | None,
                      max_json: int = MAX_JSON_BYTES, regions: Any = None) -> tuple[dict, dict[str, np.ndarray],
                                                                                  RawPlan | None]:
        """:meth:`parse`, and the request's plan (None for a request without one): requests of one plan share
        their inputs' names, dtypes and shapes."""
        key = _header_bytes(body, header_length)
        known = self._plans.get(key) if key is not None else None
        if known is not None:
            parts = _binary_parts(known[1], memoryview(body)[len(key):])  # type: ignore[arg-type]
            arrays = parse_raw(known[1], parts) if parts is not None else None
            if arrays is not None:
                return known[0], arrays, known[1]
        request, arrays = parse_http_infer(body, header_length, max_json, regions)
        plan = http_raw_plan(request) if key is not None else None
        if plan is not None:
            self._plans.remember(key, (request, plan))  # type: ignore[arg-type]
        return request, arrays, plan


def _header_bytes(body: bytes | bytearray | memoryview, header_length: str | None) -> bytes | None:
    """The JSON header of a binary-extension request as bytes (a plan's key); None without one."""
    if header_length is None:
        return None
    try:
        n = int(header_length)
    except ValueError:
        return None
    return bytes(memoryview(body)[:n]) if 0 < n <= len(body) else None


def _binary_parts(plan: RawPlan, binary: memoryview) -> list[memoryview] | None:
    """``binary`` cut into the plan's tensors; None unless their sizes add up to it exactly."""
    parts, offset = [], 0
    for *_, size in plan:
        parts.append(binary[offset : offset + size])
        offset += size
    return parts if offset == len(binary) else None


def parse_header(head: bytes) -> dict[str, Any]:
    """The JSON header of an infer request alone, checked as ``parse_http_infer`` checks it."""
    return _header(head)


def batch_size_of(body: bytes, header_length: str | None) -> int:
    """Rows of the ``dense`` input of an encoded request, read from the JSON header alone (cheap: no tensors)."""
    head, _ = _split(body, header_length)
    return dense_rows(_header(head))


def dense_rows(request: dict[str, Any]) -> int:
    """Rows of the ``dense`` input named in a decoded JSON header (``_header``'s checks already applied)."""
    for t in request["inputs"]:
        if t.get("name") == INPUT_DENSE:
            dims = _shape(INPUT_DENSE, t.get("shape"))
            if len(dims) != 2:
                raise invalid(INPUT_DENSE, f"shape must be [batch, features], got {list(dims)}")
            return dims[0]
    raise invalid(INPUT_DENSE, "input tensor missing")


# ---------------------------------------------------------------- HTTP responses (server side)


def wants_binary_output(request: dict) -> bool:
    """Binary ``scores`` if asked per output or with ``binary_data_output``; JSON otherwise (request validated)."""
    for out in request.get("outputs") or []:
        if out.get("name") == OUTPUT_SCORES:
            flag = (out.get("parameters") or {}).get("binary_data")
            if flag is not None:
                return flag
    return (request.get("parameters") or {}).get("binary_data_output", False)


def output_target(request: dict) -> Target | None:
    """Where the request asks ``scores`` to be written in shared memory (request validated), or None."""
    for out in request.get("outputs") or []:
        params = out.get("parameters")
        if params and out.get("name") == OUTPUT_SCORES:
            return tensor_params(OUTPUT_SCORES, params)
    return None


def http_infer_response(name: str, request: dict, scores: np.ndarray, version: str = "1",
                        regions: Any = None) -> tuple[bytes, dict[str, str]]:
    """Body and extra headers of a v2 infer response (``model_version``: the version that answered); scores asked
    into a shared-memory region are written there and left out of the body."""
    scores = finite_scores(scores)
    target = output_target(request)
    if target is not None:
        response = {"model_name": name, "model_version": version,
                    "outputs": [_write_scores(target, scores, regions)]}
        if "id" in request:
            response["id"] = request["id"]
        return json_dumps(response), {"Content-Type": "application/json"}
    if wants_binary_output(request):
        raw = scores.astype("<f4", copy=False).tobytes()
        head, length = _binary_head_bytes(name, version, scores.shape, len(raw), request.get("id"))
        return head + raw, {HEADER_LENGTH: length, "Content-Type": "application/octet-stream"}
    out, _ = raw_tensor(OUTPUT_SCORES, scores)
    response: dict[str, Any] = {"model_name": name, "model_version": version, "outputs": [out]}
    if "id" in request:
        response["id"] = request["id"]
    out["data"] = scores.reshape(-1).tolist()
    return json_dumps(response), {"Content-Type": "application/json"}


def _binary_head(name: str, version: str, shape: tuple[int, ...], size: int, request_id: Any) -> str:
    """The JSON header of a binary-output response, from a template: ``json.dumps`` of the same dict on every
    answer was a visible part of a batch-1 query's cost besides its model."""
    ident = "" if request_id is None else f',"id":{json.dumps(request_id)}'
    return (f'{{"model_name":{_json_str(name)},"model_version":{_json_str(version)},"outputs":[{{"name":'
            f'"{OUTPUT_SCORES}","datatype":"FP32","shape":[{",".join(map(str, shape))}],'
            f'"parameters":{{"binary_data_size":{size}}}}}]{ident}}}')


def _binary_head_bytes(name: str, version: str, shape: tuple[int, ...], size: int,
                       request_id: str | None) -> tuple[bytes, str]:
    """``_binary_head`` encoded, and its length as the header's value: remembered per (model, version, shape) for
    requests without an ``id`` (answers of one shape repeat it); an id,
    often unique per request, is written every time."""
    if request_id is None:
        return _cached_binary_head(name, version, shape, size)
    head = _binary_head(name, version, shape, size, request_id).encode()
    return head, str(len(head))


@functools.lru_cache(maxsize=256)
def _cached_binary_head(name: str, version: str, shape: tuple[int, ...], size: int) -> tuple[bytes, str]:
    head = _binary_head(name, version, shape, size, None).encode()
    return head, str(len(head))


@functools.lru_cache(maxsize=256)
def _json_str(text: str) -> str:
    return json.dumps(text)


# ---------------------------------------------------------------- HTTP (client side)


def triton_inputs(client: Any, arrays: dict[str, np.ndarray], binary: bool = True) -> list[Any]:
    """tritonclient ``InferInput`` objects for ``arrays``, as a user's client builds them; ``client`` is the module
    ``tritonclient.http`` or ``tritonclient.grpc`` (passed in, so this module needs no tritonclient).
    ``binary=False`` (HTTP only) sends the tensors as JSON lists."""
    inputs = []
    for name, arr in arrays.items():
        x = client.InferInput(name, list(arr.shape), DATATYPES[arr.dtype.newbyteorder("=")])
        x.set_data_from_numpy(arr) if binary else x.set_data_from_numpy(arr, binary_data=False)
        inputs.append(x)
    return inputs


def encode_http_request(arrays: dict[str, np.ndarray], request_id: str = "",
                        binary_output: bool = True) -> tuple[bytes, int]:
    """Body and JSON-header length of a binary-extension infer request for ``arrays`` (name -> tensor)."""
    inputs, blobs = [], []
    for name, arr in arrays.items():
        entry, raw = raw_tensor(name, arr)
        entry["parameters"] = {"binary_data_size": len(raw)}
        inputs.append(entry)
        blobs.append(raw)
    header: dict[str, Any] = {"inputs": inputs,
                              "outputs": [{"name": OUTPUT_SCORES, "parameters": {"binary_data": binary_output}}]}
    if request_id:
        header["id"] = request_id
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


def _output_array(datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(raw, dtype=DTYPES[datatype].newbyteorder("<")).reshape(tuple(shape))


def decode_http_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Output tensors of an infer response, binary or plain JSON; ``ValueError`` if malformed."""
    head_len = len(body) if header_length is None else header_length
    try:
        header = json_loads(body[:head_len])
        out, pos = {}, head_len
        for o in header["outputs"]:
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is None:
                out[o["name"]] = np.asarray(o["data"], dtype=DTYPES[o["datatype"]]).reshape(o["shape"])
            else:
                out[o["name"]] = _output_array(o["datatype"], o["shape"], body[pos : pos + size])
                pos += size
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed infer response: {exc!r}") from exc


# ---------------------------------------------------------------- gRPC messages' contents


RETRY_BUFFER_BYTES = 64 << 20  # a client channel's grpc.per_rpc_retry_buffer_size: queries up to 64 MiB


def grpc_client_options(max_message: int = -1) -> list[tuple[str, int]]:
    """The channel options recserve's gRPC clients use, and recommend: messages up to ``max_message`` (-1: any),
    and a per-call retry buffer that holds a large query.  grpc-core retries a call refused by a server's GOAWAY
    (a worker retiring, a node draining) only while the call's messages fit that buffer, 256 KiB by default; a
    larger call sent as the GOAWAY arrives fails ``UNAVAILABLE: GOAWAY received`` instead."""
    return [("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", max_message),
            ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]


RAW_INPUT_CONTENTS = 7  # ModelInferRequest's field number for ``raw_input_contents`` (grpc_service.proto)
_RAW_KEY = RAW_INPUT_CONTENTS << 3 | 2  # its key byte: the field number and wire type 2 (length-delimited)
_ID_KEY = 3 << 3 | 2  # ModelInferRequest.id (field 3, a string)
# Top-level fields of one ModelInferRequest that a worker walks in Python (its name, version, id, parameters, inputs,
# outputs and raw contents: two or three per input).  Past this many the request is refused: a message of tiny fields
# (two bytes each) would otherwise hold the worker's loop in proportion to its size, and protobuf would then build an
# object per field (docs/decisions/2026-11-30-grpc-request-fields-bounded.md).
MAX_REQUEST_FIELDS = 1024


class TooManyFields(Exception):
    """A serialized request with more than :data:`MAX_REQUEST_FIELDS` top-level fields."""

    def error(self) -> InferError:
        return invalid("request", f"more than {MAX_REQUEST_FIELDS} top-level fields (inputs, outputs, parameters "
                                  "and raw contents together); send fewer inputs per request")


def protobuf_field(key: int, value: bytes) -> bytes:
    """A length-delimited protobuf field (``key`` of one byte): key, varint length, value (the writer beside
    :func:`_varint`, the reader; the workers' gRPC answers are built from such fields around cached heads)."""
    size = len(value)
    out = bytearray((key,))
    while size >= 0x80:
        out.append(size & 0x7F | 0x80)
        size >>= 7
    out.append(size)
    return bytes(out) + value


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def split_raw_input_contents(message: memoryview, cut_id: bool = False) -> tuple[Any, ...] | None:
    """A serialized ``ModelInferRequest`` as (its bytes without ``raw_input_contents``, those contents as views
    of ``message``); None if its top level is not well-formed (protobuf then parses it whole and says why);
    :class:`TooManyFields` past :data:`MAX_REQUEST_FIELDS` of them.
    ``cut_id``: the ``id`` field is cut out too and its value (the last one, as protobuf reads it; "" if none)
    comes third, so requests that differ only in their id share a plan (perf_analyzer ``--streaming`` numbers
    every request; docs/decisions/2026-11-28-grpc-plan-key-and-streams.md).

    Why: protobuf copies a message's bytes fields into fresh allocations, twice (its arena, then one bytes object
    per ``raw_input_contents`` read); for a large query those copies and their page faults cost more than the
    model.  Scanning the top level keeps the tensors where they arrived
    and leaves protobuf the few hundred bytes of names, shapes and parameters."""
    rest: list[memoryview] = []  # runs of fields between the raw contents (one run, before them, as clients send)
    raw: list[memoryview] = []
    request_id: memoryview | bytes = b""
    cut = _RAW_KEY, (_ID_KEY if cut_id else _RAW_KEY)
    pos, size, kept, fields = 0, len(message), 0, 0
    try:
        while pos < size:  # single-byte keys and lengths (the usual case) read inline, not through _varint
            fields += 1
            if fields > MAX_REQUEST_FIELDS:
                raise TooManyFields
            key, body = message[pos], pos + 1
            if key >= 0x80:
                key, body = _varint(message, pos)
            wire = key & 7
            if wire == 2:
                length, start = message[body], body + 1
                if length >= 0x80:
                    length, start = _varint(message, body)
                end = start + length
            elif wire == 0:
                start, end = body, _varint(message, body)[1]
            elif wire in (1, 5):
                start, end = body, body + (8 if wire == 1 else 4)
            else:
                return None
            if end > size:
                return None
            if key in cut:
                if kept < pos:
                    rest.append(message[kept:pos])
                if key == _RAW_KEY:
                    raw.append(message[start:end])
                else:
                    request_id = message[start:end]
                kept = end
            pos = end
    except (IndexError, ValueError):
        return None
    if kept < size:
        rest.append(message[kept:size])
    joined = bytes(rest[0]) if len(rest) == 1 else b"".join(rest)
    if not cut_id:
        return joined, raw
    try:
        return joined, raw, bytes(request_id).decode()
    except UnicodeDecodeError:
        return None


def check_request_fields(message: memoryview) -> None:
    """:class:`TooManyFields` if ``message``, a serialized request, has more than :data:`MAX_REQUEST_FIELDS` top-level
    fields (the walk stops there); a message not well-formed is left to protobuf."""
    if sum(1 for _ in _head_fields(message, MAX_REQUEST_FIELDS + 1)) > MAX_REQUEST_FIELDS:
        raise TooManyFields


def _head_fields(head: memoryview, limit: int = MAX_REQUEST_FIELDS) -> Iterator[tuple[int, int, int, int]]:
    """Each top-level field of a serialized message of which ``head`` is the first bytes, as (where its key begins,
    its key, where its value begins, the value's length), while its key and length are whole in ``head``; none after
    a wire type that cannot be walked, nor after ``limit`` of them (a request of more is refused once whole)."""
    pos = 0
    try:
        for _ in range(limit):
            if pos >= len(head):
                return
            key, body = _varint(head, pos)
            wire = key & 7
            if wire == 2:
                length, start = _varint(head, body)
            elif wire == 0:
                start, length = body, _varint(head, body)[1] - body
            elif wire in (1, 5):
                start, length = body, 8 if wire == 1 else 4
            else:
                return
            yield pos, key, start, length
            pos = start + length
    except (IndexError, ValueError):  # a field cut off where ``head`` ends
        return


def first_raw_content(head: memoryview) -> int:
    """Where the first ``raw_input_contents`` field (its key) begins in the first bytes ``head`` of a serialized
    ``ModelInferRequest``; -1 if it has not arrived or ``head`` is not well-formed that far.  Every other field of
    the request lies before it (protobuf writes fields in number order; the raw contents are the last)."""
    return next((pos for pos, key, _, _ in _head_fields(head) if key == _RAW_KEY), -1)


def raw_content_starts(first: int, sizes: Sequence[int]) -> list[int]:
    """Where each raw content's data begins in a request whose first ``raw_input_contents`` key is at ``first`` and
    whose contents are ``sizes`` bytes long, in order: each is one key byte and its length's varint, then its data."""
    starts, pos = [], first
    for size in sizes:
        pos += 1 + max(1, (size.bit_length() + 6) // 7)
        starts.append(pos)
        pos += size
    return starts


def largest_raw_content(head: memoryview) -> int:
    """Where the data of the largest ``raw_input_contents`` entry begins in a serialized ``ModelInferRequest`` of
    which only ``head`` (its first bytes) has arrived, among the entries whose start is in it; 0 if none is.  What a
    worker aligns a large gRPC request's buffer on (:func:`aligned_buffer`): a query's ids are its largest tensor."""
    raw = [(start, length) for _, key, start, length in _head_fields(head) if key == _RAW_KEY]
    return max(raw, key=lambda field: field[1])[0] if raw else 0  # the first of equal ones


def parse_grpc_infer(request: Any, raw_contents: list[memoryview] | None = None,
                     regions: Any = None) -> dict[str, np.ndarray]:
    """Input arrays of a ``ModelInferRequest``: the inputs not in shared memory all as ``raw_input_contents`` (or
    ``raw_contents``, those split off by :func:`split_raw_input_contents`, in input order) or all as typed
    ``contents``; an input whose parameters name a ``shared_memory_region`` is read from ``regions``."""
    _check_names([t.name for t in request.inputs])
    raw = list(request.raw_input_contents) if raw_contents is None else raw_contents
    targets = [tensor_params(t.name, grpc_params(t.parameters)) if t.parameters else None for t in request.inputs]
    inline = sum(target is None for target in targets)
    if raw and len(raw) != inline:
        shared = " not in shared memory" if inline != len(targets) else ""
        raise invalid("raw_input_contents", f"{len(raw)} raw buffers for {inline} inputs{shared}")
    arrays, k = {}, 0
    for t, target in zip(request.inputs, targets, strict=True):
        if target is not None:
            if t.contents.ListFields():
                raise invalid(t.name, "has parameters.shared_memory_region and also typed contents; send one")
            arrays[t.name] = _shm_input(t.name, t.datatype, list(t.shape), target, regions)
        elif raw:
            if t.contents.ListFields():
                raise invalid(t.name, "has both raw_input_contents and typed contents; send one of them")
            arrays[t.name] = from_raw(t.name, t.datatype, list(t.shape), raw[k])
            k += 1
        else:
            _check_dtype(t.name, t.datatype)
            values = getattr(t.contents, GRPC_CONTENTS[t.datatype])
            arrays[t.name] = from_list(t.name, t.datatype, list(t.shape), values)
    check_outputs(o.name for o in request.outputs)
    for o in request.outputs:
        if o.parameters:
            _shm_output(o.name, grpc_params(o.parameters), regions)
    check_inputs(arrays)
    return arrays


RawPlan = tuple[tuple[str, np.dtype, tuple[int, ...], int], ...]
"""Each input's name, wire dtype, shape and byte count, in request order (:func:`grpc_raw_plan`,
:func:`http_raw_plan`): what a request sent again but for its tensors' bytes needs (:func:`parse_raw`)."""
PLANS = 64  # plans a worker remembers per transport; more distinct requests start it over (plans do not pay then)
PLAN_KEY_BYTES = 4096  # a request whose bytes besides its tensors exceed this is not remembered (a header is
# ~0.3-0.5 KB; a long id or unknown fields, up to the JSON limit, would otherwise hold PLANS x 16 MB)


class PlanStore:
    """Plans by the bytes of their request besides its tensors (HTTP's JSON header, gRPC's message without its raw
    contents), bounded for both transports alike: at most ``PLANS``, each key at most ``PLAN_KEY_BYTES``."""

    def __init__(self) -> None:
        self._plans: dict[bytes, Any] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: bytes) -> Any:
        return self._plans.get(key)

    def remember(self, key: bytes, plan: Any) -> None:
        """Keep ``plan`` for ``key``, unless the key is too long to hold; a full store starts over (a client whose
        ids or shapes change on every call: plans do not pay then)."""
        if len(key) > PLAN_KEY_BYTES:
            return
        if len(self._plans) >= PLANS:
            self._plans.clear()
        self._plans[key] = plan


def grpc_raw_plan(request: Any, raw_count: int) -> RawPlan | None:
    """For a ``ModelInferRequest`` that :func:`parse_grpc_infer` accepted with ``raw_count`` raw contents (split
    off): its inputs' plan when nothing but those contents' bytes could change the verdict on a request with the
    same other fields (every input sent as raw contents, no shared-memory region named); None otherwise.

    Why: a client sends the same names, datatypes and shapes call after call, and reading them back out of
    protobuf objects (names, datatypes, shapes as lists, parameters, typed contents, outputs) was a tenth of a
    batch-1 query's cost besides its model (docs/decisions/2026-11-24-worker-per-query-costs.md)."""
    if not raw_count or any(t.parameters for t in request.inputs) or any(o.parameters for o in request.outputs):
        return None
    plan = []
    for t in request.inputs:
        dtype, dims = LITTLE_ENDIAN[DTYPES[t.datatype]], tuple(t.shape)
        plan.append((t.name, dtype, dims, math.prod(dims) * dtype.itemsize))
    return tuple(plan)


def parse_raw(plan: RawPlan, raw: Sequence[Any], checked: bool = True) -> dict[str, np.ndarray] | None:
    """The input arrays of a request with ``plan``'s other fields and raw contents ``raw`` (views, not copied), as
    :func:`parse_grpc_infer` or :func:`parse_http_infer` would return them; None when the contents do not fit the
    plan (the whole decode then says why).  The checks of the values themselves (:func:`check_inputs`) run on every
    request, unless ``checked`` is False: the caller then owes them."""
    if len(raw) != len(plan):
        return None
    arrays = {}
    for (name, dtype, dims, size), contents in zip(plan, raw, strict=True):
        if len(contents) != size:
            return None
        arrays[name] = np.ndarray(dims, dtype, contents)  # one call, cheaper than frombuffer + reshape
    if checked:
        check_inputs(arrays)
    return arrays


def grpc_output_target(outputs: Sequence[Any]) -> Target | None:
    """Where a ``ModelInferRequest``'s ``outputs`` (validated) ask ``scores`` to be written, or None."""
    for o in outputs:
        if o.parameters and o.name == OUTPUT_SCORES:
            return tensor_params(OUTPUT_SCORES, grpc_params(o.parameters))
    return None


def grpc_output_entry(scores: np.ndarray, target: Target | None, regions: Any) -> tuple[dict[str, Any], bytes | None]:
    """A ``ModelInferResponse`` output entry for ``scores`` (finite, checked) and its raw contents; None when the
    scores went to the requested shared-memory region instead."""
    scores = finite_scores(scores)
    if target is not None:
        return _write_scores(target, scores, regions), None
    return raw_tensor(OUTPUT_SCORES, scores)


def decode_raw_outputs(outputs: Sequence[Any], raw: Sequence[bytes]) -> dict[str, np.ndarray]:
    """Arrays of a ``ModelInferResponse``'s ``outputs`` and ``raw_output_contents``; ``ValueError`` if malformed."""
    try:
        return {o.name: _output_array(o.datatype, o.shape, raw[k]) for k, o in enumerate(outputs)}
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"malformed infer response: {exc!r}") from exc
