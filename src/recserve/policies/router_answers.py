"""What a live router answers itself, and how its backends' answers are combined: refusals, 502 bodies naming each
backend that failed, Triton statistics summed over nodes, and what of a client's request reaches a backend (the
model's path segments, the headers)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from recserve.serving.wire.codec import HEADER_LENGTH
from recserve.serving.wire.errors import InferError

FORWARD_HEADERS = ("Content-Type", HEADER_LENGTH)  # a query's headers sent on to its backend
ANSWER_HEADERS = (*FORWARD_HEADERS, "Retry-After")  # a backend's answer's headers given back to the client


def summed_stats(entries: list[dict]) -> list[dict]:
    """Triton ``model_stats`` entries of one model version from several nodes as one: counts and durations added,
    the latest ``last_inference`` kept."""
    merged: dict[tuple[str, str], dict] = {}
    for entry in entries:
        key = (str(entry.get("name")), str(entry.get("version")))
        merged[key] = _summed(merged[key], entry) if key in merged else entry
    return list(merged.values())


def _summed(a: Any, b: Any, key: str = "") -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _summed(a[k], b[k], k) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    numbers = isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool)
    if not numbers:
        return a  # names, versions, batch_stats: the first node's
    return max(a, b) if key == "last_inference" else a + b


def model_target(model: str, version: str = "") -> str:
    """A model (and version) as the path segments of a backend's URL, every byte outside unreserved characters
    percent-encoded: a name a client sent can neither add a request (CR LF), climb out of ``/v2/models`` (``../``)
    nor fail to encode."""
    return quote(model, safe="") + (f"/versions/{quote(version, safe='')}" if version else "")


def forwarded(headers: Any) -> dict[str, str]:
    """The query's headers its backend reads (``FORWARD_HEADERS``), those whose value is printable ASCII: one with
    other bytes is not sent (a query is never lost to a header it could not encode)."""
    return {k: v for k in FORWARD_HEADERS if (v := headers.get(k)) is not None and v.isascii() and v.isprintable()}


def describe_failures(failed: list[tuple[str, BaseException | str]]) -> str:
    """Each backend that failed, and how."""
    return "; ".join(f"backend {endpoint}: {_how(why)}" for endpoint, why in failed)


def _how(why: BaseException | str) -> str:
    """A reason as given, or an error's type and its message, where it has one."""
    if isinstance(why, str):
        return why
    return type(why).__name__ + (f" ({why})" if str(why) else "")


def refusal(error: InferError, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict]:
    """A query the router answers itself: (status, JSON body, headers), as ``submit`` returns a backend's answer."""
    return error.status.http, json.dumps(error.body()).encode(), {"Content-Type": "application/json",
                                                                   **(headers or {})}


def backend_error(failed: list[tuple[str, BaseException | str]]) -> bytes:
    """A 502's JSON body naming each backend that failed, and how."""
    return json.dumps({"error": describe_failures(failed)}).encode()
