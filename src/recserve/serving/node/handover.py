"""The HTTP connections the server process takes itself (``OwnAccepts``): handed over by workers, or accepted on
the node's socket while no worker accepts or while the node stops; and their protocols: aiohttp's, made to answer
as the workers do; one given the bytes a worker already read; one refused (the node stopping, or past its cap)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import http_exceptions, web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import _ErrInfo  # aiohttp's queued parse error (no public name)

from recserve.serving.node.config import NodeConfig
from recserve.serving.node.http_bodies import UnreadableBody
from recserve.serving.transport.h2grpc import BACKLOG
from recserve.serving.transport.http1 import HTTP2_ON_HTTP1, MAX_HEAD_BYTES
from recserve.serving.transport.room import Room
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
    server error with its traceback.  ``waiting_since``: when it began waiting for a request (None: it is not)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.last_read = asyncio.get_running_loop().time()
        self._latest: StreamReader | None = None  # the body of the latest request parsed
        self._refused: tuple[StreamReader, UnreadableBody] | None = None

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        reading = self._latest if self._latest is not None and not self._latest.is_eof() else None
        super().data_received(data)
        if not self._messages:
            return
        message, payload = self._messages[-1]
        if not isinstance(message, _ErrInfo):
            self._latest = payload
        elif reading is not None:
            self._messages.pop()
            self._refuse_body(reading, message.exc)

    def _refuse_body(self, payload: StreamReader, exc: BaseException) -> None:
        """The parser refused what followed a head (a chunk-size line, a trailer section over the head's limits:
        more fields than ``max_headers``, head and trailers together, or one past ``max_field_size``).  aiohttp
        would queue that error behind the request, whose body then never ends: its handler waited for the read
        timeout (408).  The body ends now, its reader is told why (``body_error``: 431 for a section over the
        limits, else 400), and the connection closes after the answer."""
        code, said = _parse_error(exc)
        self._refused = payload, UnreadableBody(code, "request body: " + said)
        payload.feed_eof()  # not an exception: aiohttp itself may be draining the body (its lingering read)
        self.close()

    def body_error(self, payload: StreamReader) -> UnreadableBody | None:
        """Why ``payload`` (a request's body read whole) ended early, if the parser refused what followed its head."""
        return self._refused[1] if self._refused is not None and self._refused[0] is payload else None

    def waiting_since(self) -> float | None:
        """aiohttp's own test of a connection waiting for its next request (``_process_keepalive``): a request
        neither queued nor being handled, since the last bytes read (a head begun counts as waiting)."""
        waiter = getattr(self, "_waiter", None)
        if waiter is None or waiter.done() or getattr(self, "_request_in_progress", True):
            return None
        return self.last_read

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            return super().handle_error(request, status, exc, message)
        log.debug("unreadable request from %s: %s", request.remote, message or exc)
        code, said = _parse_error(exc, message)
        error = InferError(code, "request: " + (HTTP2_ON_HTTP1 if said.startswith("Pause on PRI") else said))
        response = web.json_response(error.body(), status=error.status.http,
                                     headers={"Server": "recserve", "Connection": "close"})
        response.force_close()
        return response


def _parse_error(exc: BaseException | None, message: str | None = None) -> tuple[str, str]:
    """(error code, first line of what it says) for what aiohttp's parser refused: ``head_too_large`` (431) for a
    line past ``max_field_size`` / ``max_line_size`` or more fields than ``max_headers``, else ``invalid``."""
    said = (getattr(exc, "message", None) or message or str(exc or "") or "malformed").split("\n", 1)[0]
    said = said.rstrip(": ")
    too_large = isinstance(exc, http_exceptions.LineTooLong) or said.startswith(("Too many headers",
                                                                                 "Too many trailers"))
    return ("head_too_large" if too_large else "invalid"), said


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

    def __init__(self, answer: bytes, on_lost: Callable[[Refused], None] = lambda _: None) -> None:
        self.answer, self.on_lost = answer, on_lost

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

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost(self)


def too_many_connections(limit: int) -> bytes:
    """The answer to a connection past the server process's ``max_connections``."""
    error = InferError("unavailable", f"the server process holds {limit} connections; retry")
    return error_response(error, close=True, extra={"Retry-After": "1"})


class OwnAccepts:
    """Where the server process's own HTTP connections come from and what protocol each gets (``protocol``).
    ``server`` is aiohttp's ``Server`` once the app runs, and None again once it stops: a connection taken then is
    answered 503 at once rather than left waiting for the end.  ``refused(reason)`` counts a connection past
    ``max_connections``."""

    def __init__(self, config: NodeConfig, refused: Callable[[str], None]) -> None:
        self.server: Any = None
        self.options = http_handler_options(config)
        self.max_connections = config.max_connections
        self._refused = refused
        self._listening: asyncio.Task | None = None  # this process's accept loop on the node's socket
        self._room = Room()  # which connections to close for a new one past ``max_connections``
        self._refusing: set[Refused] = set()  # connections being refused, until closed
        self._closing: set[asyncio.Task] = set()  # listeners ``stop_listening`` is closing

    def protocol(self) -> asyncio.Protocol:
        """aiohttp's protocol; past ``max_connections``, 503 with Retry-After; once stopping, 503."""
        server = self.server
        if server is None:
            return self._refuse(STOPPING)
        if len(server.connections) >= self.max_connections and not self._make_room(server.connections):
            self._refused("too_many_connections")
            return self._refuse(too_many_connections(self.max_connections))
        return JsonErrors(server, loop=asyncio.get_running_loop(), **self.options)

    def _refuse(self, answer: bytes) -> Refused:
        refused = Refused(answer, self._refusing.discard)
        self._refusing.add(refused)
        return refused

    async def refused_all(self, timeout_s: float = LINGER_S + 1.0) -> None:
        """Once nothing accepts any more (``close_listening``): wait until every connection taken has been refused and
        closed, so that none is left open and unanswered when the loop ends."""
        await asyncio.sleep(0)  # connections handed over just now (``serve`` tasks) get their protocols
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._refusing and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    def _make_room(self, handlers: list[Any]) -> bool:
        """Close the connections that have waited longest for a request (``transport/room.py``); whether any was."""
        waiting = ((since, h) for h in handlers
                   if isinstance(h, JsonErrors) and (since := h.waiting_since()) is not None)
        picked = self._room.pick(waiting, asyncio.get_running_loop().time())
        for handler in picked:
            handler.force_close()
        return bool(picked)

    async def serve(self, fd: int, prefix: bytes) -> None:
        """A connection a worker handed over, the bytes it read (``prefix``) fed first."""
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        protocol = Prefixed(self.protocol(), prefix)
        await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol, sock)

    @property
    def listening(self) -> bool:
        return self._listening is not None

    def listen(self, sock: socket.socket) -> None:
        """Accept on the node's listening socket too (a copy of it), until ``stop_listening``."""
        if self._listening is None:
            loop = asyncio.get_running_loop()
            # asyncio listens on it again: at the node's backlog, not its default 100, which the shared socket kept
            self._listening = loop.create_task(loop.create_server(self.protocol, sock=sock.dup(), backlog=BACKLOG))

    def stop_listening(self) -> None:
        """Stop accepting; the listener closes a loop turn later (``close_listener``), ``close_listening`` waits."""
        if self._listening is not None:
            listening, self._listening = self._listening, None
            closing = asyncio.get_running_loop().create_task(self._close(listening))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def close_listening(self) -> None:
        """Stop accepting: every listener closed, and every connection it took given its protocol, before this
        returns."""
        if self._listening is not None:
            listening, self._listening = self._listening, None
            await self._close(listening)
        await asyncio.gather(*self._closing)

    @staticmethod
    async def _close(listening: asyncio.Task) -> None:
        await asyncio.wait([listening])
        if not listening.cancelled() and listening.exception() is None:
            with contextlib.suppress(OSError):
                await close_listener(listening.result())


async def close_listener(server: asyncio.AbstractServer) -> None:
    """Close an asyncio listener without losing a connection it accepted.  asyncio's selector loop builds an
    accepted socket's transport in a task a loop turn after the accept; if the server closed in between,
    ``Server._attach`` fails (CPython gh-109564), silently: the socket stays open, unread and unanswered, its
    protocol never run, until a garbage collection.  So: stop watching the listening sockets, let the loop run the
    accepts already taken (one turn: their tasks were scheduled before this one resumes), then close."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, asyncio.SelectorEventLoop) and isinstance(server, asyncio.Server):
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())
        await asyncio.sleep(0)
    server.close()
