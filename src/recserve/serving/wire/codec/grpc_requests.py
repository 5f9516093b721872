"""gRPC infer requests, server side: a serialized ``ModelInferRequest``'s top level walked so that its raw contents stay
where they arrived (and its fields stay bounded), the request validated into its input arrays, its plan, and the
answer's output entry."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from recserve.serving.wire.codec.http_requests import timeout_s
from recserve.serving.wire.codec.plans import RawPlan
from recserve.serving.wire.codec.tensors import (
    DTYPES,
    GRPC_CONTENTS,
    LITTLE_ENDIAN,
    Target,
    check_inputs,
    check_names,
    check_output_params,
    check_outputs,
    checked_dtype,
    finite_scores,
    from_list,
    from_raw,
    invalid,
    raw_tensor,
    shm_input,
    write_scores,
)
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import grpc_params, tensor_params
from recserve.wire import OUTPUT_SCORES

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
    check_names([t.name for t in request.inputs])
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
            arrays[t.name] = shm_input(t.name, t.datatype, list(t.shape), target, regions)
        elif raw:
            if t.contents.ListFields():
                raise invalid(t.name, "has both raw_input_contents and typed contents; send one of them")
            arrays[t.name] = from_raw(t.name, t.datatype, list(t.shape), raw[k])
            k += 1
        else:
            checked_dtype(t.name, t.datatype)
            values = getattr(t.contents, GRPC_CONTENTS[t.datatype])
            arrays[t.name] = from_list(t.name, t.datatype, list(t.shape), values)
    check_outputs(o.name for o in request.outputs)
    for o in request.outputs:
        if o.parameters:
            check_output_params(o.name, grpc_params(o.parameters), regions)
    grpc_timeout_s(request)
    check_inputs(arrays)
    return arrays


def grpc_timeout_s(request: Any) -> float | None:
    """A ``ModelInferRequest``'s ``timeout`` parameter (tritonclient.grpc's ``timeout=``: microseconds, Triton's
    convention) in seconds, checked as HTTP's is (``timeout_s``); None if absent.  It bounds the query as the
    call's own deadline does: the earlier of the two applies (``earliest``)."""
    if "timeout" not in request.parameters:
        return None
    return timeout_s(grpc_params(request.parameters))


def earliest(first: float | None, second: float | None) -> float | None:
    """The shorter of two timeouts in seconds, either of which may be None (none set)."""
    if first is None or second is None:
        return second if first is None else first
    return min(first, second)


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
        return write_scores(target, scores, regions), None
    return raw_tensor(OUTPUT_SCORES, scores)
