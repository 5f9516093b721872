"""The control API's request schema and access rule, kept apart from the HTTP routing that calls them.

Every field of every control request is checked here before anything changes on the node: a value the
runtime would store and then fail on (``{"threads": true}``), a size beyond what this host can run, or a
query parameter that would reach numpy as NaN is ``InferError("invalid", "<field>: ...", field)``, an
HTTP 400 naming the field.  The runtime keeps its own checks; these add the bounds it cannot know about.

Access: the control API resizes workers and reassigns cores, so on anything but a loopback address it
requires a bearer token (``Authorization: Bearer <token>``); a server bound elsewhere without one refuses
to start (:func:`check_exposure`).  Tokens come from the node config's ``control_token`` or the
``RECSERVE_CONTROL_TOKEN`` environment variable (``recserve serve``).
"""

from __future__ import annotations

import hmac
import ipaddress
import math
from dataclasses import dataclass
from typing import Any

from recserve.errors import SpecError
from recserve.serving.node.config import available_cores
from recserve.serving.node.metrics import HISTORY_S
from recserve.serving.wire.errors import InferError

MAX_WORKERS_PER_CORE = 4
"""Workers beyond this many per usable core only add processes that wait for a core (and their memory)."""
MAX_WORKERS = 256
TOKEN_ENV = "RECSERVE_CONTROL_TOKEN"


def invalid(field: str, message: str) -> InferError:
    return InferError("invalid", f"{field}: {message}", field)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounded_int(body: dict[str, Any], field: str, low: int, high: int) -> int:
    value = body[field]
    if not _is_int(value) or not low <= value <= high:
        raise invalid(field, f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def _only(body: dict[str, Any], allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> None:
    """Unknown keys are refused (a typo such as ``worker`` would otherwise be a silent no-op)."""
    for key in body:
        if key not in allowed:
            raise invalid(str(key), f"unknown field; this request takes {list(allowed)}")
    for key in required:
        if body.get(key) is None:
            raise invalid(key, "required")


# ---------------------------------------------------------------- request bodies


@dataclass(frozen=True)
class WorkersRequest:
    workers: int
    cores: Any
    threads: int | None
    stage: str | None


def worker_limits() -> tuple[int, int]:
    """(most workers, most threads per worker) this host can sensibly run."""
    cores = len(available_cores())
    return min(MAX_WORKERS, MAX_WORKERS_PER_CORE * cores), cores


def _cores(value: Any) -> Any:
    """``null``, a flat list of core ids, or a list of non-empty core-id lists (ids checked by the runtime)."""
    if value is None:
        return None
    if isinstance(value, list) and value:
        if all(_is_int(c) and c >= 0 for c in value):
            return value
        if all(isinstance(s, list) and s and all(_is_int(c) and c >= 0 for c in s) for s in value):
            return value
    raise invalid("cores", f"must be null, a list of core ids or a list of core-id lists, got {value!r}")


def workers_request(body: dict[str, Any], stages: list[str]) -> WorkersRequest:
    """``POST /control/models/{m}/workers``: ``{"workers": n, "cores"?, "threads"?, "stage"?}``."""
    _only(body, ("workers", "cores", "threads", "stage"), required=("workers",))
    max_workers, max_threads = worker_limits()
    workers = _bounded_int(body, "workers", 1, max_workers)
    threads = None if body.get("threads") is None else _bounded_int(body, "threads", 1, max_threads)
    stage = body.get("stage")
    if stage is not None and stage not in stages:
        raise invalid("stage", f"must be one of {stages} or null, got {stage!r}")
    return WorkersRequest(workers, _cores(body.get("cores")), threads, stage)


def sub_batch_request(body: dict[str, Any], max_batch_size: int) -> int:
    """``POST /control/models/{m}/sub_batch``: ``{"sub_batch": k}``, 0 (never split) to max_batch_size."""
    _only(body, ("sub_batch",), required=("sub_batch",))
    return _bounded_int(body, "sub_batch", 0, max_batch_size)


def accelerator_request(body: dict[str, Any], max_batch_size: int) -> int:
    """``POST /control/models/{m}/accelerator``: ``{"min_items": k}``, 1 to max_batch_size + 1 (= none offloaded)."""
    _only(body, ("min_items",), required=("min_items",))
    return _bounded_int(body, "min_items", 1, max_batch_size + 1)


def llc_request(body: dict[str, Any]) -> int:
    """``POST /control/models/{m}/llc``: ``{"ways": w}`` (the allocator checks w against the cache)."""
    _only(body, ("ways",), required=("ways",))
    return _bounded_int(body, "ways", 1, 64)


def _query_number(query: Any, field: str, default: float, low: float, high: float, low_open: bool) -> float:
    text = query.get(field)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
        raise invalid(field, f"must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {text!r}")
    return value


def window_query(query: Any, default_percentile: float) -> tuple[float, float]:
    """``GET /control/models/{m}/window?seconds=&percentile=``: seconds in (0, HISTORY_S], percentile in (0, 100]."""
    for key in query:
        if key not in ("seconds", "percentile"):
            raise invalid(str(key), "unknown query parameter; this request takes ['seconds', 'percentile']")
    seconds = _query_number(query, "seconds", 10.0, 0.0, HISTORY_S, low_open=True)
    percentile = _query_number(query, "percentile", default_percentile, 0.0, 100.0, low_open=True)
    return seconds, percentile


# ---------------------------------------------------------------- access


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def check_exposure(host: str, token: str | None) -> str:
    """The line the server prints at start about control access; SpecError if exposed without a token."""
    if token:
        return f"control API requires a bearer token (Authorization: Bearer ...) on {host}"
    if not is_loopback(host):
        raise SpecError(f"serve: bound to {host!r} (not loopback), the control API needs a token: set "
                        f"{TOKEN_ENV} or control_token in the node config, or bind 127.0.0.1")
    return f"control API open to loopback clients only ({host}); set {TOKEN_ENV} to require a token"


GUARDED_HTTP = {"/control": "the control API", "/v2/systemsharedmemory": "shared memory",
                "/v2/repository/models/": "loading and unloading models"}
"""HTTP path prefixes behind the node's control token (when it has one), with what each is named in the 401."""
GUARDED_GRPC = {"SystemSharedMemoryStatus": "shared memory", "SystemSharedMemoryRegister": "shared memory",
                "SystemSharedMemoryUnregister": "shared memory", "RepositoryModelLoad": "loading and unloading models",
                "RepositoryModelUnload": "loading and unloading models"}
"""The same operations over gRPC, by method name: one rule for both transports (a region's key names a file in
/dev/shm, and loading or unloading changes what the node serves, so neither is left open where control is not)."""


def guarded_http(path: str) -> str | None:
    """What an HTTP path is named in its 401 if it needs the control token, else None."""
    return next((what for prefix, what in GUARDED_HTTP.items() if path.startswith(prefix)), None)


def require_token(what: str, header: str | None, token: str | None, header_name: str = "Authorization") -> None:
    """The access rule: with a control token, ``what`` needs ``Bearer <token>`` (InferError "unauthorized")."""
    if not authorised(header, token):
        raise InferError("unauthorized", f"{header_name}: {what} needs 'Bearer <token>'", header_name)


def authorised(header: str | None, token: str | None) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (constant-time compare); no token = open."""
    if not token:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
