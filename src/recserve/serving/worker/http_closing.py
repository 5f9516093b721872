"""How the server ends a worker's HTTP/1.1 connection, or a request on it: an unreadable request answered, then a
lingering close; a large query shed from its JSON header, its body dropped as it arrives; an idle connection let go
at a drain; the sweeps' tests for slow and idle connections.  The base of ``http_connection.Connection``, whose
state these read and set.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from recserve.serving.transport.http1 import digits, keep_alive
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.http_responses import error_response

LINGER_S = 2.0  # after refusing a request, drop what the client still sends for this long before closing
DRAIN_IDLE_S = 1.0  # draining: an idle keep-alive connection is closed once idle this long (``close_idle``)


class ConnectionEnding(asyncio.BufferedProtocol):
    """The ending of a connection (``Connection`` holds the state below and reads and answers requests)."""

    manager: Any
    plane: Any
    transport: asyncio.Transport | None
    buf: bytearray
    busy: bool
    closed: bool
    discarding: bool
    leaving: bool
    arrived: float
    _paused: int
    _body: Any
    _skip: int
    _closing_idle: bool
    _skip_keep_alive: bool
    _head: Any
    _needed: int
    _send: Any

    def refuse(self, exc: InferError) -> None:
        """Answer an unreadable request and close: what follows it on the connection cannot be trusted.

        A lingering close (RFC 9112 9.6): the write side is shut and what the client still sends is read and
        dropped for ``LINGER_S``, so a client still uploading a refused body reads the answer instead of a reset.
        """
        self.plane.refused(exc.code)
        if self.transport is None or self.closed:
            return
        self._send(error_response(exc, close=True))
        self.linger_close()

    def linger_close(self) -> None:
        """Close without a reset (RFC 9112 9.6): the write side is shut after what is written, and what the client
        still sends is read and dropped for ``LINGER_S`` or until it closes.  Closed with unread bytes, a socket
        sends RST, which can also discard an answer its client has not read yet."""
        if self.transport is None or self.closed:
            return
        if self._paused:  # read again, only to drop what follows
            self._paused = 0
            self.transport.resume_reading()
        self.closed = self.discarding = True
        self.buf.clear()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.manager.loop.call_later(LINGER_S, self.transport.close)

    def close_idle(self) -> None:
        """The node drains: close this idle connection once it has been idle ``DRAIN_IDLE_S``, without a reset.
        Its client may have sent a request it has not received yet (HTTP/1.1's keep-alive race): that request is
        answered (a query with 503, ``Connection: close``) and the connection closes after it."""
        if self._closing_idle or self.closed:
            return
        self._closing_idle = True
        wait = DRAIN_IDLE_S - (time.perf_counter() - self.arrived)
        self.manager.loop.call_later(max(0.0, wait), self._close_if_idle)

    def _close_if_idle(self) -> None:
        if not (self.busy or self._receiving() or self.leaving):
            self.linger_close()  # else a request came: its answer closes the connection (``answered``)

    def _receiving(self) -> bool:
        return bool(self.buf) or self._body is not None or self._skip > 0

    def too_slow(self, now: float, limit_s: float) -> bool:
        """A request has been arriving for longer than ``limit_s`` (a slow or stalled client)."""
        return not self.busy and not self.closed and self._receiving() and now - self.arrived > limit_s

    def idle_for(self, now: float) -> float:
        """How long the connection has had no request in progress (0 while one is; ``arrived`` marks when the
        last one was answered)."""
        return 0.0 if self.busy or self.closed or self._receiving() else now - self.arrived

    def _shed_early(self, head_end: int, headers: dict[str, str], version: str) -> bool:
        """Under overload, refuse a large query from its JSON header alone and drop its body as it arrives.

        Why: at 5x overload with ~1.8 MB queries, receiving and decoding the bodies of queries that are then shed
        took most of a worker's core, so the next requests waited in the socket before admission saw them."""
        length = headers.get("inference-header-content-length", "")
        if not digits(length) or len(self.buf) < head_end + int(length):
            return False
        error = self.plane.early.from_header(bytes(self.buf[head_end : head_end + int(length)]), self.arrived)
        if error is None:
            return False
        self._skip_keep_alive = self.plane.keeps(keep_alive(version, headers))
        self.plane.shed(self, error, self._skip_keep_alive, version)
        self._skip = self._needed - len(self.buf)
        self.buf.clear()
        self._head, self._needed = None, 0
        return True
