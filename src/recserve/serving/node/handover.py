"""Protocols for HTTP connections the server process takes itself: aiohttp's, made to answer as the workers do;
one a worker handed over with the bytes it already read; one refused (the node stopping, or past its cap)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import http_exceptions, web

from recserve.serving.node.config import NodeConfig
from recserve.serving.transport.http1 import HTTP2_ON_HTTP1, MAX_HEAD_BYTES
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.http_connection import LINGER_S, error_response

log = logging.getLogger("recserve.serving.clients")

STOPPING = error_response(InferError("unavailable", "the node server is shutting down"), close=True)


def http_handler_options(config: NodeConfig) -> dict[str, Any]:
    """aiohttp's per-connection settings, made the workers' (``worker/http_connection.py``): the same idle timeout,
    the same head limit (a head a worker read and handed over is never refused here), bodies decoded by
    ``node/http_bodies.py``, and a refused body drained for at most ``LINGER_S``."""
    return {"access_log": None, "keepalive_timeout": config.keep_alive_timeout_s, "max_line_size": MAX_HEAD_BYTES,
            "max_field_size": MAX_HEAD_BYTES, "max_headers": MAX_HEAD_BYTES // 4, "auto_decompress": False,
            "lingering_time": LINGER_S}


class JsonErrors(web.RequestHandler):
    """aiohttp's connection protocol, answering a request it cannot parse as every front end answers errors (JSON,
    ``Server: recserve``; 431 for a head line over the limit) and logging it at debug: the client's fault, not a
    server error with its traceback."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        log.debug("unreadable request from %s: %s", request.remote, message or exc)
        code = "head_too_large" if isinstance(exc, http_exceptions.LineTooLong) else "invalid"
        said = (getattr(exc, "message", None) or message or "malformed").split("\n", 1)[0].rstrip(": ")
        error = InferError(code, "request: " + (HTTP2_ON_HTTP1 if said.startswith("Pause on PRI") else said))
        response = web.json_response(error.body(), status=error.status.http,
                                     headers={"Server": "recserve", "Connection": "close"})
        response.force_close()
        return response


class Prefixed(asyncio.Protocol):
    """A handed-over connection's protocol, given the bytes a worker already read (``prefix``) as its first data in
    ``connection_made``: feeding them after ``connect_accepted_socket`` returns let uvloop (which starts reading at
    once) deliver the body first, and aiohttp answered 400 "Invalid method"."""

    __slots__ = ("inner", "prefix")

    def __init__(self, inner: asyncio.Protocol, prefix: bytes) -> None:
        self.inner, self.prefix = inner, prefix

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.inner.connection_made(transport)
        if self.prefix:
            prefix, self.prefix = self.prefix, b""
            self.inner.data_received(prefix)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class Refused(asyncio.Protocol):
    """An error answer and close, whatever the client sent.  A lingering close (RFC 9112 9.6): the write side is
    shut and what still arrives is dropped for ``LINGER_S``, so the client reads the answer rather than a reset."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        asyncio.get_running_loop().call_later(LINGER_S, transport.close)
        try:
            transport.write(self.answer)
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # the client left already (ENOTCONN): nothing to answer
            transport.abort()

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool:
        return False  # the transport closes itself


def too_many_connections(limit: int) -> bytes:
    """The answer to a connection past the server process's ``max_connections``."""
    error = InferError("unavailable", f"the server process holds {limit} connections; retry")
    return error_response(error, close=True, extra={"Retry-After": "1"})
