"""The reply side of an HTTP/2 connection: answers framed within the client's flow-control windows and
``SETTINGS_MAX_FRAME_SIZE``, what they do not admit held per stream up to a limit, and every frame queued during a
read written in one write at its end.  Sans-IO: bytes go to a ``Wire`` (an asyncio transport is one)."""

from __future__ import annotations

import logging
from typing import Protocol

from recserve.serving.transport.h2frames import (
    ACK,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    HEADERS,
    HEADERS_WORD,
    HOLD_BYTES,
    MAX_WINDOW,
    MESSAGE_HEAD,
    NO_ERROR,
    PROTOCOL_ERROR,
    REPLY_HEAD,
    REPLY_TAIL,
    RESPONSE_HEADERS,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    TRAILERS_OK,
    TRAILERS_WORD,
    H2Error,
    frame,
    prefixed,
    status_block,
    trailers,
)
from recserve.serving.transport.h2limits import FloodGuard, LogBudget
from recserve.serving.transport.h2streams import Stream, StreamTable

log = logging.getLogger(__name__)
# a DATA frame cut below this by a window the client keeps small earns no WINDOW_UPDATE (``FloodGuard.earned_updates``)
# unless it ends the data: CVE-2019-9511's data dribble, a few bytes a frame, each update earning the next
DRIBBLE_BYTES = 1024
DROPPED_LOG = LogBudget()  # one line per 10 s for streams reset over the held-answers budget


class Wire(Protocol):
    """Where a connection's bytes go: an ``asyncio.Transport`` is one."""

    def write(self, data: bytes) -> None: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...


class ReplyWriter:
    """Answers of one connection's calls (``GrpcCall`` writes through it) and the frames its reader queues."""

    def __init__(self, streams: StreamTable, out: list[bytes], max_message: int, guard: FloodGuard) -> None:
        self.streams, self.open = streams, streams.open
        self.guard = guard  # the connection's budgets: each DATA frame sent earns WINDOW_UPDATEs there
        self.out = out  # frames written at the end of this read (one write, one syscall)
        self.wire: Wire | None = None  # None before the connection is made and once it is lost
        self.reading = False  # within a read: frames queued go out together at its end
        self.closing = False  # GOAWAY sent or received: no new streams; our side ends when the last call has
        self.eof_sent = False
        self.send_window = DEFAULT_WINDOW  # the connection's, as the client's WINDOW_UPDATEs open it
        self.initial_send_window = DEFAULT_WINDOW  # each new stream's (the client's SETTINGS)
        self.max_frame = DEFAULT_FRAME
        self.blocked = False  # a stream may have reply data waiting for the client's windows (``flush_pending``)
        # answers held for a client whose windows stay closed, past which the stream adding to them is reset
        self.hold_limit = max(HOLD_BYTES, 2 * max_message)

    # ---- answers ------------------------------------------------------------------------------
    def send_reply(self, stream: Stream, message: bytes) -> None:
        size = len(message) + 5
        if stream.headers_sent or not self._admits_whole(stream, size):
            self._send(stream, prefixed(message), TRAILERS_OK)
            return
        # the usual unary answer, which the windows admit whole: its three frames built at once (``_send`` and
        # ``_drain_stream`` would write the same bytes) and written now, with what is queued before them, even in
        # the middle of a read: an answer computed inline would otherwise wait for the worker's bookkeeping after
        # the pass and the rest of the read (the client's WINDOW_UPDATE), and a pass (~0.5 ms at least) dwarfs a
        # write's syscall
        stream.headers_sent = True
        self.send_window -= size
        stream.send_window -= size
        self.guard.earned_updates()
        sid = stream.id
        out = self.out
        out += (REPLY_HEAD.pack(HEADERS_WORD, END_HEADERS, sid, RESPONSE_HEADERS, size << 8 | DATA, 0, sid, 0,
                                size - 5),
                message, REPLY_TAIL.pack(TRAILERS_WORD, END_HEADERS | END_STREAM, sid, TRAILERS_OK))
        data = b"".join(out)
        out.clear()
        self.wire.write(data)  # type: ignore[union-attr]
        self.end(stream)

    def _admits_whole(self, stream: Stream, size: int) -> bool:
        """A frame of ``size`` bytes for ``stream`` can be written now: one frame, within both windows, on a live
        stream of a live connection (what ``send_reply`` and ``send_message`` write at once)."""
        return (size <= self.max_frame and size <= self.send_window and size <= stream.send_window
                and self.wire is not None and self.open.get(stream.id) is stream)

    def send_message(self, stream: Stream, message: bytes) -> None:
        size = len(message) + 5
        if not stream.headers_sent or stream.pending or not self._admits_whole(stream, size):
            self._send(stream, prefixed(message), None)
            return
        # a streamed answer after the first, which the windows admit whole: its DATA frame written now, as
        # ``send_reply`` writes a unary answer (a worker's stream answers from the read that brought the request)
        self.send_window -= size
        stream.send_window -= size
        self.guard.earned_updates()
        out = self.out
        out += (MESSAGE_HEAD.pack(size << 8 | DATA, 0, stream.id, 0, size - 5), message)
        data = b"".join(out)
        out.clear()
        self.wire.write(data)  # type: ignore[union-attr]

    def send_trailers(self, stream: Stream, code: int, message: str) -> None:
        self._send(stream, b"", trailers(code, message))

    def send_status(self, stream: Stream, status: bytes) -> None:
        """A request that is not gRPC: an HTTP status, as gRPC's rules ask for a bad method or content type."""
        stream.call.done = True  # type: ignore[union-attr]
        self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, status_block(status)))
        self.end(stream)

    def _send(self, stream: Stream, data: bytes, end: bytes | None) -> None:
        if self.wire is None or self.open.get(stream.id) is not stream:
            return  # the client reset the stream or left
        frames: list[bytes] = []
        if not stream.headers_sent:
            stream.headers_sent = True
            if not data and end is not None:  # trailers-only
                self.out.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, RESPONSE_HEADERS + end))
                self.end(stream)
                return
            frames.append(frame(HEADERS, END_HEADERS, stream.id, RESPONSE_HEADERS))
        stream.pending += data
        if end is not None:
            stream.pending_end = end
        self._drain_stream(stream, frames)

    def _drain_stream(self, stream: Stream, frames: list[bytes]) -> None:
        """Send what the windows admit of the stream's pending data, then its trailers if all data is out."""
        pending = stream.pending
        while pending:
            size = min(len(pending), self.max_frame, self.send_window, stream.send_window)
            if size <= 0:
                break
            frames.append(frame(DATA, 0, stream.id, bytes(pending[:size])))
            del pending[:size]
            self.send_window -= size
            stream.send_window -= size
            if size >= DRIBBLE_BYTES or not pending:
                self.guard.earned_updates()
        finished = not pending and stream.pending_end is not None
        if finished:
            frames.append(frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.pending_end))
            stream.pending_end = None
        elif pending:
            self.blocked = True
            if (held := self.held()) > self.hold_limit:
                self.out.extend(frames)
                self._drop_unread(stream, held)
                return
        self.out.extend(frames)
        if finished:
            self.end(stream)
        elif not self.reading:
            self.flush()

    def held(self) -> int:
        """Answer bytes waiting for the client's windows, over every stream (counted only when some wait)."""
        return sum(len(s.pending) for s in self.open.values())

    def _drop_unread(self, stream: Stream, held: int) -> None:
        """The client asks faster than its windows let it take the answers (a stream that keeps sending while its
        reader is stuck): rather than hold answers without bound, reset the stream that added the last of them
        (ENHANCE_YOUR_CALM; its call is cancelled, the client sees the reset) and keep the connection."""
        if (left_out := DROPPED_LOG.allow()) is not None:
            log.warning("gRPC stream %d reset: %d bytes of answers held for the client's closed flow-control windows "
                        "(%d more such resets since the last line)", stream.id, held, left_out)
        stream.pending.clear()
        stream.pending_end = None
        self.streams.reset(stream, ENHANCE_YOUR_CALM)
        if not self.reading:
            self.flush()

    # ---- the client's windows -------------------------------------------------------------------
    def settings(self, payload: bytes) -> None:
        """The client's SETTINGS (a valid frame, within its budget): their effects on our sending, acknowledged."""
        for at in range(0, len(payload), 6):
            key, value = int.from_bytes(payload[at:at + 2], "big"), int.from_bytes(payload[at + 2:at + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "initial window too large")
                delta, self.initial_send_window = value - self.initial_send_window, value
                for open_stream in self.open.values():
                    open_stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise H2Error(PROTOCOL_ERROR, "bad max frame size")
                self.max_frame = value
        self.out.append(frame(SETTINGS, ACK, 0))
        self.flush_pending()

    def window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream == 0:
            if increment == 0:
                raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2Error(FLOW_CONTROL_ERROR, "connection window overflow")
        elif stream in self.open:
            target = self.open[stream]
            target.send_window += increment
            if increment == 0 or target.send_window > MAX_WINDOW:  # RFC 9113 6.9, 6.9.1: a stream error
                self.streams.reset(target, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                return
        self.flush_pending()

    def flush_pending(self) -> None:
        """Send what the windows now admit of every stream's waiting data (``blocked``: some stream may have)."""
        if not self.blocked:
            return
        self.blocked = False  # set again by a stream that still has data the windows do not admit
        for stream in list(self.open.values()):
            if stream.pending or stream.pending_end is not None:
                self._drain_stream(stream, [])

    # ---- out ------------------------------------------------------------------------------------
    def write(self, frames: list[bytes]) -> None:
        self.out.extend(frames)
        if not self.reading:
            self.flush()

    def end(self, stream: Stream) -> None:
        """Our side of the stream is closed: forget it (a client still sending data gets it dropped)."""
        if stream.ended:
            self.streams.forget(stream.id)
        else:
            self.streams.reset(stream, NO_ERROR)
        if not self.reading:
            self.flush()

    def flush(self) -> None:
        """Write the frames queued (one write: one syscall), and after GOAWAY and the last call end our side and
        let the client close.  Closing outright could reset the connection over a frame the client sent
        meanwhile (a WINDOW_UPDATE) and lose our last answers."""
        out, wire = self.out, self.wire
        if wire is None or self.eof_sent:
            out.clear()
            return
        if out:
            data = b"".join(out)
            out.clear()
            wire.write(data)
        if self.closing and not self.open:
            self.eof_sent = True
            try:
                wire.write_eof()
            except OSError:  # the client has gone already
                wire.close()
