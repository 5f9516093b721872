"""How an HTTP/2 server connection's calls and the connection itself end, short of an error: the graceful close
(two GOAWAYs, PING round trips and a quiet wait between them), unary calls whose request is too slow to arrive
(``expire_requests``), and unary calls whose client left part way through the request.  The base of
``h2connection.H2Connection``, whose state these read and set; none of it runs for a frame of a call in flight."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recserve.serving.transport.h2frames import DEADLINE_EXCEEDED, GOAWAY_PING, MAX_WINDOW, PING, frame, goaway_frame
from recserve.serving.transport.h2replies import ReplyWriter
from recserve.serving.transport.h2streams import Stream, StreamTable

CLIENT_GONE = "client_gone"  # ``on_abuse``'s one reason that is no abuse: a unary call's client left mid-request
GOAWAY_ACK_S = 1.0  # a client that has not acknowledged a graceful close's PINGs by then gets the final GOAWAY
GOAWAY_QUIET_S = 0.1  # ... one that has gets it once no new stream has arrived for this long
GOAWAY_QUIET_MAX_S = 2.0  # ... or this long after its second acknowledgement, whichever comes first


class ConnectionClosing:
    """The ending of a connection and of its slow or abandoned calls (``H2Connection`` holds the state below)."""

    host: Any  # ``h2connection.Host``
    clock: Callable[[], float]
    on_abuse: Callable[[str], None] | None
    streams: StreamTable
    replies: ReplyWriter
    _goaway_ping: bool
    _acked_since: float | None
    _made: bool
    _close_when_made: bool

    def _left(self, stream: Stream) -> None:
        """Report a unary call whose client left (reset it or closed the connection) part way through sending its
        request (a stream reset before any of it, as Rapid Reset's, is the reset budget's business)."""
        call = stream.call
        if (call is not None and not call.done and not stream.ended and call.requests is None and self.on_abuse
                and (stream.size or stream.landing is not None)):
            self.on_abuse(CLIENT_GONE)

    def expire_requests(self, before: float, timeout_s: float) -> None:
        """Unary calls whose request has not arrived whole since ``before`` (opened ``timeout_s`` earlier) end with
        DEADLINE_EXCEEDED, as a slow HTTP request gets 408 (a stream not ended by the client is then reset
        NO_ERROR): open calls that never finish their request would hold the worker's streams for ever.  A
        streaming call's stream stays open as long as its client wants (the server's stream budget bounds them)."""
        late = [s for s in self.streams.open.values() if s.opened < before and not s.ended and s.call is not None
                and not s.call.done and s.call.requests is None and s.method is not None and s.method.unary]
        for stream in late:
            if self.on_abuse is not None:
                self.on_abuse("slow_client")
            stream.call.finish(DEADLINE_EXCEEDED,  # type: ignore[union-attr]
                               f"request not received within {timeout_s:g} s")

    def close_gracefully(self) -> None:
        """Stop taking calls, answer those in flight, then close.  Two GOAWAYs, as grpc-core's server does: the
        first (any stream id) tells the client to open no more streams here, and the second names the last stream
        that arrived.  A single GOAWAY would fail, UNAVAILABLE, a call whose HEADERS were on the wire as it went
        out.  The second waits for two PING round trips, not one as grpc-core's (grpc-core writes a PING's
        acknowledgement before the HEADERS of a stream it had numbered just before it read the first GOAWAY), and
        then until no new stream has arrived for ``GOAWAY_QUIET_S`` (``_when_quiet``).  A client that does not
        acknowledge gets the final GOAWAY after ``GOAWAY_ACK_S``, and our side ends once its calls have.  A
        connection accepted but not yet made closes so once it is: its client may already have sent calls, which
        would otherwise wait for the server's grace and fail."""
        if not self._made:
            self._close_when_made = True
            return
        if self.replies.closing or self._goaway_ping or self.replies.wire is None:
            return
        self._goaway_ping = True
        self.replies.write([goaway_frame(MAX_WINDOW), frame(PING, 0, 0, GOAWAY_PING)])
        self.host.call_later(GOAWAY_ACK_S, self._unacknowledged)

    def _unacknowledged(self) -> None:
        if self._acked_since is None:
            self._final_goaway()

    def _when_quiet(self, last_id: int) -> None:
        """The final GOAWAY once no stream has arrived for ``GOAWAY_QUIET_S``.  Two PING round trips are not always
        enough: a client writing a large message can queue the HEADERS of a stream it numbered before the first
        GOAWAY behind it, while its PING acknowledgements (control frames) go first.  Such a stream crossing the
        final GOAWAY is retried by grpc-core only if its message fits the retry buffer (256 KiB by default): a
        larger call fails UNAVAILABLE."""
        if self.streams.last_id == last_id or self.clock() - self._acked_since >= GOAWAY_QUIET_MAX_S:
            self._final_goaway()
        else:
            self._quiet_check()

    def _quiet_check(self) -> None:
        """``_when_quiet`` after ``GOAWAY_QUIET_S``, with the last stream that had arrived by now."""
        last_id = self.streams.last_id
        self.host.call_later(GOAWAY_QUIET_S, lambda: self._when_quiet(last_id))

    def _final_goaway(self) -> None:
        """The second GOAWAY, naming the last stream that arrived; our side ends when the calls in flight have."""
        if self.replies.closing or self.replies.wire is None:
            return
        self.replies.closing = True
        self.replies.write([goaway_frame(self.streams.last_id)])
