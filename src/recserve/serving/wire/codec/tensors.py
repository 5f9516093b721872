"""The codec's vocabulary and its tensors: Open Inference Protocol datatypes, a tensor checked from JSON ``data``,
from raw bytes or from a shared-memory region, the checks no single tensor shows, and scores checked for an answer.
JSON is read and written by orjson where its wheel is installed, by ``json`` otherwise."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import tensor_params
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


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` (C-contiguous) where its first byte is ``TENSOR_ALIGN``-aligned: itself, or a copy.

    Why: BLAS picks its kernel by where a small matrix starts, so a query's scores differed in their last bit with
    the offset its floats happened to have in the request (binary HTTP against JSON or gRPC).  The model gets its
    floats at one alignment whatever the protocol."""
    if array.ctypes.data % TENSOR_ALIGN == 0:
        return array
    store = np.empty(array.nbytes + TENSOR_ALIGN, np.uint8)
    pad = -store.ctypes.data % TENSOR_ALIGN
    out = store[pad : pad + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def invalid(field: str, message: str) -> InferError:
    """The 400 / INVALID_ARGUMENT of a malformed ``field``, its message naming it."""
    return InferError("invalid", f"{field}: {message}", field)


def raw_tensor(name: str, arr: np.ndarray) -> tuple[dict[str, Any], bytes]:
    """``{"name", "datatype", "shape"}`` and the little-endian C-order bytes of ``arr`` (the wire form)."""
    arr = np.ascontiguousarray(arr)
    datatype = DATATYPES.get(arr.dtype.newbyteorder("="))
    if datatype is None:
        raise ValueError(f"{name}: no Open Inference Protocol datatype for {arr.dtype}")
    raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return {"name": name, "datatype": datatype, "shape": list(arr.shape)}, raw


def checked_shape(field: str, shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple: non-negative integers, at most ``MAX_ELEMENTS`` in all, the input's rank (``RANKS``)."""
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


def checked_dtype(field: str, datatype: Any) -> np.dtype:
    """The numpy dtype of ``datatype``, one that ``field`` accepts (``EXPECTED``)."""
    if datatype not in EXPECTED[field]:
        raise invalid(field, f"datatype must be {' or '.join(EXPECTED[field])}, got {datatype!r}")
    return DTYPES[datatype]


def from_raw(field: str, datatype: Any, shape: Any, raw: bytes | memoryview) -> np.ndarray:
    dtype = checked_dtype(field, datatype)
    dims = checked_shape(field, shape)
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
    dtype = checked_dtype(field, datatype)
    dims = checked_shape(field, shape)
    arr = _numbers(field, datatype, data)
    count = math.prod(dims)
    if arr.size != count:
        raise invalid(field, f"data holds {arr.size} elements, shape {list(dims)} needs {count}")
    with np.errstate(over="ignore"):  # a number past FP32's range becomes inf, which ``check_inputs`` refuses
        return arr.astype(dtype, copy=False).reshape(dims)


def check_names(names: Sequence[Any]) -> None:
    """A request's input names: strings, each known, none twice, none missing."""
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
    """A request's output names: each one this model has."""
    for n in names:
        if n != OUTPUT_SCORES:
            raise invalid(str(n), f"unknown output; this model has only {OUTPUT_SCORES!r}")


Target = tuple[str, int, int]
"""A tensor's place in shared memory: (region, byte_size, offset)."""


def _no_regions(field: str) -> InferError:
    return invalid(field, "parameters.shared_memory_region: this server path reads no shared memory")


def shm_input(field: str, datatype: Any, shape: Any, target: Target, regions: Any) -> np.ndarray:
    """An input read from a registered region (a view of the client's memory, checked against shape and bounds)."""
    dtype = checked_dtype(field, datatype)
    dims = checked_shape(field, shape)
    if regions is None:
        raise _no_regions(field)
    return regions.view(field, *target, LITTLE_ENDIAN[dtype], dims)


def check_output_params(field: str, params: dict[str, Any], regions: Any) -> None:
    """A requested output's parameters, checked: shared memory (the region exists, the span lies within it); a
    ``classification`` count (Triton's classification extension, tritonclient's ``class_count``, which this server
    does not offer) refused, not ignored."""
    if params.get("classification"):
        raise invalid(field, "parameters.classification (class_count): the classification extension is not "
                             "supported; the model's scores come back as FP32, to rank yourself")
    target = tensor_params(field, params)
    if target is not None:
        if regions is None:
            raise _no_regions(field)
        regions.check_output(field, *target)


def write_scores(target: Target, scores: np.ndarray, regions: Any) -> dict[str, Any]:
    """Scores written into the output's region; the response's output entry, without data (Triton's rule)."""
    entry = {"name": OUTPUT_SCORES, "datatype": "FP32", "shape": list(scores.shape)}
    regions.write(OUTPUT_SCORES, *target, scores.astype("<f4", copy=False))
    return entry
