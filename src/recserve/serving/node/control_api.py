"""The control API's request schema and access rule, kept apart from the HTTP routing that calls them.

Every field of every control request is checked here (pydantic models, ``recserve/schema.py``) before anything
changes on the node: an unknown key, a value the runtime would store and then fail on (``{"threads": true}``), a
size beyond what this host can run, or a query parameter that would reach numpy as NaN is
``InferError("invalid", "<field>: ...", field)``, an HTTP 400 naming the field.  The runtime keeps its own
checks; these add the bounds it cannot know about.

Access: the control API resizes workers and reassigns cores, so on anything but a loopback address it
requires a bearer token (``Authorization: Bearer <token>``); a server bound elsewhere without one refuses
to start (:func:`check_exposure`).  Tokens come from the node config's ``control_token`` or the
``RECSERVE_CONTROL_TOKEN`` environment variable (``recserve serve``).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from recserve.errors import SpecError
from recserve.schema import describe, field_path
from recserve.serving.node.config import available_cores
from recserve.serving.node.metrics import HISTORY_S
from recserve.serving.wire.errors import InferError

MAX_WORKERS_PER_CORE = 4
"""Workers beyond this many per usable core only add processes that wait for a core (and their memory)."""
MAX_WORKERS = 256
TOKEN_ENV = "RECSERVE_CONTROL_TOKEN"


def invalid(field: str, message: str) -> InferError:
    return InferError("invalid", f"{field}: {message}", field)


def _within(value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise ValueError(f"must be an integer in [{low}, {high}], got {value!r}")
    return value


class Body(BaseModel):
    """A control request's JSON body: unknown keys refused (a typo such as ``worker`` would otherwise be a silent
    no-op); the bounds this node knows (its cores, the model's max_batch_size) come in the validation context."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    @classmethod
    def read(cls, body: Any, **bounds: Any) -> Any:
        try:
            return cls.model_validate(body, context=bounds)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            field = field_path(error["loc"][:1]) or "body"
            raise invalid(field, describe(error, cls)) from None


CORES_SHAPE = "a list of core ids ([0, 1]) or a list of non-empty core-id lists ([[0], [1]])"


def _core_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _core_sets(value: Any) -> Any:
    """A flat list of core ids or a list of non-empty core-id lists (whether this host has them: the runtime's
    check); one message naming both shapes, not the first of a union's errors."""
    if isinstance(value, list) and value and (all(_core_id(c) for c in value) or all(
            isinstance(c, list) and c and all(_core_id(i) for i in c) for c in value)):
        return value
    raise ValueError(f"must be {CORES_SHAPE}, got {json.dumps(value)[:80]}")


class WorkersRequest(Body):
    """``POST /control/models/{m}/workers``: ``{"workers": n, "cores"?, "threads"?, "stage"?, "replace"?}``
    (``replace``: every worker is replaced by a fresh one, e.g. to read table files rewritten since they started)."""

    workers: StrictInt
    cores: list[Any] | None = None
    threads: StrictInt | None = None
    stage: str | None = None
    replace: StrictBool = False

    @field_validator("workers")
    @classmethod
    def _workers(cls, value: int, info: ValidationInfo) -> int:
        return _within(value, 1, info.context["max_workers"])

    @field_validator("cores", mode="before")
    @classmethod
    def _cores(cls, value: Any) -> Any:
        return None if value is None else _core_sets(value)

    @field_validator("threads")
    @classmethod
    def _threads(cls, value: int | None, info: ValidationInfo) -> int | None:
        return None if value is None else _within(value, 1, info.context["max_threads"])

    @field_validator("stage")
    @classmethod
    def _stage(cls, value: str | None, info: ValidationInfo) -> str | None:
        stages = info.context["stages"]
        if value is not None and value not in stages:
            raise ValueError(f"must be one of {stages} or null, got {value!r}")
        return value


def worker_limits() -> tuple[int, int]:
    """(most workers, most threads per worker) this host can sensibly run."""
    cores = len(available_cores())
    return min(MAX_WORKERS, MAX_WORKERS_PER_CORE * cores), cores


def workers_request(body: Any, stages: list[str]) -> WorkersRequest:
    """The workers body checked against this host's limits and the model's stages (core ids: by the runtime)."""
    max_workers, max_threads = worker_limits()
    return WorkersRequest.read(body, max_workers=max_workers, max_threads=max_threads, stages=stages)


class SubBatchRequest(Body):
    """``POST /control/models/{m}/sub_batch``: ``{"sub_batch": k}``, 0 (never split) to max_batch_size."""

    sub_batch: StrictInt

    @field_validator("sub_batch")
    @classmethod
    def _bounded(cls, value: int, info: ValidationInfo) -> int:
        return _within(value, 0, info.context["max_batch_size"])


class AcceleratorRequest(Body):
    """``POST /control/models/{m}/accelerator``: ``{"min_items": k}``, 1 to max_batch_size + 1 (= none offloaded)."""

    min_items: StrictInt

    @field_validator("min_items")
    @classmethod
    def _bounded(cls, value: int, info: ValidationInfo) -> int:
        return _within(value, 1, info.context["max_batch_size"] + 1)


class LlcRequest(Body):
    """``POST /control/models/{m}/llc``: ``{"ways": w}`` (the allocator checks w against the cache)."""

    ways: StrictInt

    @field_validator("ways")
    @classmethod
    def _bounded(cls, value: int) -> int:
        return _within(value, 1, 64)


def sub_batch_request(body: Any, max_batch_size: int) -> int:
    return SubBatchRequest.read(body, max_batch_size=max_batch_size).sub_batch


def accelerator_request(body: Any, max_batch_size: int) -> int:
    return AcceleratorRequest.read(body, max_batch_size=max_batch_size).min_items


def llc_request(body: Any) -> int:
    return LlcRequest.read(body).ways


class WindowQuery(Body):
    """``GET /control/models/{m}/window?seconds=&percentile=``: seconds in (0, HISTORY_S], percentile in (0, 100]
    (query strings, read as finite numbers)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    seconds: float = Field(10.0, gt=0, le=HISTORY_S)
    percentile: float | None = Field(None, gt=0, le=100)


def window_query(query: Any, default_percentile: float) -> tuple[float, float]:
    window = WindowQuery.read(dict(query))
    return window.seconds, default_percentile if window.percentile is None else window.percentile


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
