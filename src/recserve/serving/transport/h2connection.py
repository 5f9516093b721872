"""One HTTP/2 server connection as a sans-IO state machine: bytes in (``receive``), frames out to a ``Wire``, calls
of the methods served.  No sockets and no event loop: the clock is injected, and what must happen later (a
graceful close's timeout, frames left for the next turn) is asked of a ``Host``; ``h2grpc.GrpcConnection`` is the
asyncio one, and tests drive it with bytes alone.

Reading: the preface, then frames; DATA kept as views of the received bytes (``RequestReader``), a DATA frame
longer than the read handed on in parts as it arrives, at most ``FRAMES_PER_TURN`` frames per read.  Header blocks
go to ``CallOpener``, answers out through ``ReplyWriter``; control frames (SETTINGS, PING, RST_STREAM, GOAWAY,
WINDOW_UPDATE, PRIORITY) are handled here, each within its budget (``h2limits``).  The graceful close, and calls
ended for a slow or departed client, are the base class's (``h2closing.ConnectionClosing``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from recserve.serving.transport.h2closing import (  # noqa: F401 - GOAWAY_*, CLIENT_GONE: imported from here too
    CLIENT_GONE,
    GOAWAY_ACK_S,
    GOAWAY_QUIET_MAX_S,
    GOAWAY_QUIET_S,
    ConnectionClosing,
)
from recserve.serving.transport.h2frames import (
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    FRAMES_PER_TURN,
    GOAWAY,
    GOAWAY_PING,
    GOAWAY_PING_AGAIN,
    HEAD,
    HEADERS,
    HELD_CONNECTION,
    INTERNAL_ERROR,
    MAX_STREAMS,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RECEIVE_FRAME,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    WINDOW_UPDATE,
    H2Error,
    frame,
    goaway_frame,
)
from recserve.serving.transport.h2heads import CallOpener
from recserve.serving.transport.h2limits import Bucket, ByteBudget, FloodGuard, FloodLimits, LogBudget, StreamBudget
from recserve.serving.transport.h2replies import ReplyWriter, Wire
from recserve.serving.transport.h2requests import RequestReader
from recserve.serving.transport.h2streams import Call, MessageSink, Method, StreamTable

log = logging.getLogger(__name__)
BUG_LOG = LogBudget()  # one line per 10 s for connections failed by an unexpected error

DIRECT_BYTES = 16 * 1024  # a read of a message's DATA at least this long goes straight into the message


class Host(Protocol):
    """What a connection asks of whatever runs it."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in ``delay`` seconds."""

    def read_later(self) -> None:
        """A read left complete frames (``FRAMES_PER_TURN``): read no more now, and call ``receive_backlog`` soon."""


class H2Connection(ConnectionClosing):
    """One client connection.  ``methods`` maps ``/package.Service/Method`` to how it is served; ``new_call``
    makes the call a handler sees (``GrpcCall``'s signature), ``new_queue`` a streaming method's ``requests``."""

    def __init__(self, methods: Callable[[str], Method | None], max_message: int, host: Host,
                 new_call: Callable[..., Call], new_queue: Callable[[], MessageSink],
                 limits: FloodLimits | None = None, on_abuse: Callable[[str], None] | None = None,
                 held: ByteBudget | None = None, server_resets: Bucket | None = None,
                 clock: Callable[[], float] = time.monotonic, server_streams: StreamBudget | None = None) -> None:
        limits = limits or FloodLimits()
        self.host, self.clock, self.on_abuse = host, clock, on_abuse
        self.guard = FloodGuard(limits, clock, server_resets)  # frames with no request
        out: list[bytes] = []  # frames written at the end of this read: shared by the parts below
        # request bytes of incomplete messages: on this connection, and on every connection of the server (``held``)
        self.streams = StreamTable(out, ByteBudget(max(HELD_CONNECTION, 2 * max_message)), held, server_streams)
        self.replies = ReplyWriter(self.streams, out, max_message, self.guard)
        self.requests = RequestReader(self.streams, out, max_message, limits, self.guard, self._calm, on_abuse)
        self.opener = CallOpener(self.streams, self.replies, self.requests, methods, new_call, new_queue, clock,
                                 self.guard, self._calm, limits.stream_window, on_abuse)
        self._buf = bytearray()  # the start of a frame (or of the preface) that the next read completes
        self._partial: tuple[int, int, int] | None = None  # a DATA frame read in parts: stream, flags, bytes left
        self.preface_received = False
        self.backlog = False  # this read left complete frames for the next turn of the loop
        self._goaway_ping = False  # the first of a graceful close's two GOAWAYs is out
        self._acked_since: float | None = None  # when the client acknowledged the graceful close's second PING
        self._made = False  # connection_made has run
        self._close_when_made = False  # a graceful close asked for before it had (accepted, transport not made yet)
        self.last_read = clock()  # when the connection last read anything (``GrpcServer``'s timeouts)

    # ---- the connection's life ---------------------------------------------------------------------------
    def connection_made(self, wire: Wire) -> None:
        """Our SETTINGS, and the connection's receive window opened to its size (it starts at 65,535)."""
        self.replies.wire = wire
        stream_window, connection_window = self.requests.stream_window, self.requests.connection_window
        settings = (SETTINGS_MAX_CONCURRENT_STREAMS.to_bytes(2, "big") + MAX_STREAMS.to_bytes(4, "big")
                    + SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + stream_window.to_bytes(4, "big")
                    + SETTINGS_MAX_FRAME_SIZE.to_bytes(2, "big") + RECEIVE_FRAME.to_bytes(4, "big"))
        opening = connection_window - DEFAULT_WINDOW
        wire.write(frame(SETTINGS, 0, 0, settings)
                   + (frame(WINDOW_UPDATE, 0, 0, opening.to_bytes(4, "big")) if opening > 0 else b""))
        self._made = True
        if self._close_when_made:
            self.close_gracefully()

    def connection_lost(self) -> None:
        for stream in self.streams.open.values():
            self._left(stream)
        self.streams.drop_all()
        self.replies.wire = None

    @property
    def open_streams(self) -> int:
        return len(self.streams.open)

    @property
    def request_bytes_peak(self) -> int:
        """The most request bytes this connection's incomplete messages held at once."""
        return self.streams.held.peak

    @property
    def refused_streams(self) -> int:
        """New streams refused after GOAWAY (their clients retry them on another connection)."""
        return self.opener.refused

    def _fail(self, error: H2Error) -> None:
        wire, out = self.replies.wire, self.replies.out
        if wire is not None and not self.replies.eof_sent:
            log.debug("gRPC connection error: %s", error)
            wire.write(b"".join(out) + goaway_frame(self.streams.last_id, error.code, str(error).encode()))
            out.clear()
            wire.close()

    def _calm(self, reason: str | None) -> None:
        """A frame past its budget (``h2limits``): GOAWAY ENHANCE_YOUR_CALM with the reason, then close."""
        if reason is not None:
            if self.on_abuse is not None:
                self.on_abuse(reason)
            raise H2Error(ENHANCE_YOUR_CALM, reason)

    # ---- reading -------------------------------------------------------------------------------------------
    def receive(self, data: bytes | memoryview) -> None:
        """Bytes read from the client: every complete frame handled, answers and acknowledgements written.  A
        memoryview may be of a buffer the next read reuses: what outlives this call is copied out of it (a request
        message's DATA kept to be joined, ``RequestReader.data``; an incomplete frame), DATA landed in place is
        copied once, straight from it."""
        self.last_read = self.clock()
        if type(data) is not bytes and type(data) is not memoryview:
            data = bytes(data)
        if not self.preface_received and not (data := self._after_preface(data)):
            return
        view, pos = memoryview(data), 0

        def frames() -> None:
            nonlocal view, pos
            if self._partial is not None:
                pos = self._rest_of_data(view)
            if self._buf and pos < len(view):  # complete the frame begun in the last read
                self._buf += view[pos:]
                view, pos = memoryview(bytes(self._buf)), 0
                self._buf.clear()
            pos = self._frames(view, pos)

        if not self._handled(frames):
            return
        if pos < len(view):
            self._buf += view[pos:]
        self._answered()
        if self.backlog and self.replies.wire is not None:
            self.host.read_later()

    def _handled(self, handle: Callable[[], None]) -> bool:
        """Run ``handle`` (what one read brought) with the frames it writes held to the end of the read (one
        write); False where it failed the connection (GOAWAY sent, closed)."""
        replies = self.replies
        replies.reading = True
        try:
            handle()
        except H2Error as error:
            self.requests.ready.clear()
            self._fail(error)
            return False
        except Exception as exc:  # a bug a client's bytes reached: this connection ends, not with a log line each
            if (left_out := BUG_LOG.allow()) is not None:
                log.error("gRPC connection failed on what its client sent (%d more since the last line)", left_out,
                          exc_info=exc)
            self.requests.ready.clear()
            self._fail(H2Error(INTERNAL_ERROR, "internal error"))
            return False
        finally:
            replies.reading = False
        return True

    def _answered(self) -> None:
        """The end of a read: start the unary calls it completed, write what it queued."""
        if self.requests.ready:
            self.requests.start_ready()
        self.replies.flush()

    def direct_buffer(self, most: int) -> memoryview | None:
        """Where the next read may go straight, with no copy: the rest of a large message being assembled
        (``RequestReader.in_place_room``) when the read falls inside one of its DATA frames, at least
        ``DIRECT_BYTES`` of it and at most ``most`` bytes; else None (the read goes through ``receive``).
        ``received_into`` takes that read."""
        if self._partial is None or self._buf or self.backlog or self.replies.wire is None:
            return None
        stream_id, flags, left = self._partial
        if flags & PADDED:
            return None
        room = self.requests.in_place_room(stream_id)
        if room is None or min(left, len(room)) < DIRECT_BYTES:
            return None
        return room[:min(left, most)]

    def received_into(self, size: int) -> None:
        """``size`` bytes read into ``direct_buffer``: what ``receive`` would do with them, but the copy."""
        self.last_read = self.clock()
        stream, flags, left = self._partial  # type: ignore[misc]
        self._partial = (stream, flags, left - size) if size < left else None
        end = flags if size == left else flags & ~END_STREAM
        if self._handled(lambda: self.requests.data_in_place(end, stream, size)):
            self._answered()

    def receive_backlog(self) -> None:
        """The frames a read left (``FRAMES_PER_TURN``), handled on a later turn (``Host.read_later``)."""
        self.backlog = False
        if self.replies.wire is None:
            return
        data = bytes(self._buf)
        self._buf.clear()
        self.receive(data)

    def _after_preface(self, data: bytes) -> bytes:
        """The bytes after the client's connection preface (b"" while it is incomplete or wrong)."""
        self._buf += data
        if len(self._buf) < len(PREFACE) or self._buf[:len(PREFACE)] != PREFACE:
            if not PREFACE.startswith(bytes(self._buf[:len(PREFACE)])):
                self._fail(H2Error(PROTOCOL_ERROR, "not an HTTP/2 connection preface"))
            return b""
        data = bytes(self._buf[len(PREFACE):])
        self._buf.clear()
        self.preface_received = True
        return data

    def _frames(self, view: memoryview, pos: int) -> int:
        """Handle every complete frame in ``view`` from ``pos``; returns where the incomplete rest begins.  A DATA
        payload is handed on as a view (copied where it is kept); a DATA frame longer than this read is handed on in
        parts as it arrives (``_partial``) instead of being buffered."""
        size = len(view)
        unpack = HEAD.unpack_from
        data, opener, replies = self.requests.data, self.opener, self.replies
        handled = 0
        while size - pos >= 9:
            if handled == FRAMES_PER_TURN:
                self.backlog = True
                break
            handled += 1
            word, flags, stream = unpack(view, pos)
            length, kind, stream = word >> 8, word & 0xFF, stream & 0x7FFFFFFF
            if length > RECEIVE_FRAME:
                raise H2Error(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            end = pos + 9 + length
            if opener.continuing is not None and (kind != CONTINUATION or stream != opener.continuing.id):
                raise H2Error(PROTOCOL_ERROR, "a header block was interrupted")
            if end > size:
                if kind != DATA or flags & PADDED:
                    break
                self._partial = (stream, flags, end - size)
                data(flags & ~END_STREAM, stream, view[pos + 9:size])
                return size
            if kind == DATA:
                data(flags, stream, view[pos + 9:end])
            else:
                self._frame(kind, flags, stream, view[pos + 9:end].tobytes())
            pos = end
            if replies.wire is None:
                return size
        return pos

    def _rest_of_data(self, view: memoryview) -> int:
        stream, flags, left = self._partial  # type: ignore[misc]
        take = min(left, len(view))
        self._partial = (stream, flags, left - take) if take < left else None
        self.requests.data(flags if take == left else flags & ~END_STREAM, stream, view[:take])
        return take

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == HEADERS:
            self.opener.headers(flags, stream, payload)
        elif kind == WINDOW_UPDATE:  # grpcio sends two with every call
            self._not_idle(stream, "WINDOW_UPDATE")
            self._calm(self.guard.window_update())
            self.replies.window_update(stream, payload)
        elif kind == CONTINUATION:
            self.opener.continuation(flags, stream, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == PING:
            self._ping(flags, stream, payload)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise H2Error(FRAME_SIZE_ERROR, "bad RST_STREAM")
            self._not_idle(stream, "RST_STREAM")
            self._calm(self.guard.reset())
            stream_reset = self.streams.forget(stream)
            if stream_reset is not None and stream_reset.call is not None:
                self._left(stream_reset)
                stream_reset.call.cancel()
        elif kind == GOAWAY:
            self.replies.closing = True  # the client makes no new streams; ours finish, then we close
        elif kind == PUSH_PROMISE:
            raise H2Error(PROTOCOL_ERROR, "a client may not push")
        elif kind == PRIORITY and not stream:
            raise H2Error(PROTOCOL_ERROR, "PRIORITY on stream 0")
        else:  # PRIORITY (on an idle stream too) and unknown frame types are ignored (RFC 9113 5.5), within a budget
            self._calm(self.guard.glitch())

    def _not_idle(self, stream: int, kind: str) -> None:
        """RFC 9113 5.1 and 6.4: a frame other than HEADERS or PRIORITY on an idle stream (or RST_STREAM on stream 0)
        is a connection error (nghttp2 too; the h2 library ignores an idle stream's RST_STREAM)."""
        if (kind == "RST_STREAM" and not stream) or (stream and self.streams.idle(stream)):
            raise H2Error(PROTOCOL_ERROR, f"{kind} on idle stream {stream}")

    def _ping(self, flags: int, stream: int, payload: bytes) -> None:
        if len(payload) != 8 or stream:
            raise H2Error(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad PING")
        if not flags & ACK:
            self._calm(self.guard.ping())
            self.replies.out.append(frame(PING, ACK, 0, payload))
        elif payload == GOAWAY_PING and not self.replies.closing:  # the client has seen the first GOAWAY
            self.replies.out.append(frame(PING, 0, 0, GOAWAY_PING_AGAIN))  # after the streams it had numbered
        elif payload == GOAWAY_PING_AGAIN and self._acked_since is None:  # the streams it had numbered are coming
            self._acked_since = self.clock()
            self._quiet_check()

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream or len(payload) % 6 or (flags & ACK and payload):
            raise H2Error(PROTOCOL_ERROR if stream or flags & ACK else FRAME_SIZE_ERROR, "bad SETTINGS")
        if flags & ACK:
            return
        self._calm(self.guard.settings())
        self.replies.settings(payload)

