"""The bytes of a worker's HTTP/1.1 answers: heads remembered by shape, the ``Date`` made once a second, and the one
JSON error answer (status from ``serving/wire/errors.py``'s table)."""

from __future__ import annotations

import email.utils
import functools
import json
import time

from recserve.serving.wire.errors import InferError

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 408: "Request Timeout", 413: "Payload Too Large",
           431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
           503: "Service Unavailable", 504: "Gateway Timeout"}


def response_bytes(status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None,
                   close: bool = False, version: str = "HTTP/1.1") -> bytes:
    """An answer's bytes; ``close`` says the connection ends after it.  An HTTP/1.0 client (``version``) whose
    connection stays open is told so, as it assumes that only when told (RFC 9112 9.3)."""
    fields = tuple(extra.items()) if extra else ()
    if version == "HTTP/1.0" and not close:
        fields += (("Connection", "keep-alive"),)
    return b"".join((_response_head(status, content_type, len(body), fields, close), _date_end(), body))


@functools.lru_cache(maxsize=1024)
def _response_head(status: int, content_type: str, length: int, extra: tuple[tuple[str, str], ...],
                   close: bool) -> bytes:
    """A response's head but its ``Date``, remembered: answers of one shape repeat it call after call (~3 µs of a
    batch-1 query)."""
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", "Server: recserve", f"Content-Type: {content_type}",
            f"Content-Length: {length}"]
    head += [f"{k}: {v}" for k, v in extra]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n").encode("latin-1")


_date = [0, b""]  # the second and the Date field (with the head's end) last written


def _date_end() -> bytes:
    """``Date`` (RFC 9110 6.6.1: an origin server with a clock sends it) and the blank line ending a head, made
    once a second."""
    now = int(time.time())
    if now != _date[0]:
        _date[:] = now, f"Date: {email.utils.formatdate(now, usegmt=True)}\r\n\r\n".encode("ascii")
    return _date[1]  # type: ignore[return-value]


def error_response(exc: InferError, close: bool = False, extra: dict[str, str] | None = None,
                   version: str = "HTTP/1.1") -> bytes:
    """The one JSON error answer (status from ``serving/wire/errors.py``'s table)."""
    return response_bytes(exc.status.http, json.dumps(exc.body()).encode(), "application/json", extra, close,
                          version)
