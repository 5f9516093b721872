"""HTTP infer requests, server side: a body (JSON header and binary tail) validated whole into its input arrays, and
the plans that read a repeated binary-extension header without JSON (``HttpPlans``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from recserve.serving.wire.codec.json_tensors import JSON_FAST_BYTES, check_containers, json_request
from recserve.serving.wire.codec.plans import PlanStore, RawPlan, parse_raw
from recserve.serving.wire.codec.tensors import (
    DTYPES,
    HEADER_LENGTH,
    LITTLE_ENDIAN,
    check_inputs,
    check_names,
    check_output_params,
    check_outputs,
    checked_shape,
    from_list,
    from_raw,
    invalid,
    json_loads,
    shm_input,
)
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import tensor_params
from recserve.wire import INPUT_DENSE


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


def _header(head: bytes | bytearray | memoryview) -> dict[str, Any]:
    if len(head) >= JSON_FAST_BYTES:  # smaller ones cannot hold enough containers to matter
        check_containers(head)
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
            check_output_params(o["name"], params, regions)


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
        return shm_input(name, t.get("datatype"), t.get("shape"), target, regions), offset
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
    check_names([t.get("name") for t in tensors])
    _check_request(request, regions)
    arrays, offset = {}, 0
    for t in tensors:
        arrays[t["name"]], offset = _input_array(t, binary, offset, regions)
    if offset != len(binary):
        raise invalid("body", f"{len(binary) - offset} binary bytes after the last input")
    check_inputs(arrays)
    return request, arrays


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
            dims = checked_shape(INPUT_DENSE, t.get("shape"))
            if len(dims) != 2:
                raise invalid(INPUT_DENSE, f"shape must be [batch, features], got {list(dims)}")
            return dims[0]
    raise invalid(INPUT_DENSE, "input tensor missing")
