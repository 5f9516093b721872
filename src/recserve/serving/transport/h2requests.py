"""The request side of an HTTP/2 connection: DATA against our receive windows (replenished as a call takes its
request), request bytes held in incomplete messages against their budgets, and gRPC messages cut from the DATA,
checked against the largest message, assembled in place (``Method.land``) or joined, and inflated.  Sans-IO."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Any

from recserve.serving.transport.h2frames import (
    END_STREAM,
    FLOW_CONTROL_ERROR,
    INTERNAL,
    LAND_BYTES,
    LAND_LIMIT,
    PADDED,
    PROTOCOL_ERROR,
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    WINDOW_UPDATE,
    H2Error,
    frame,
    unpad,
)
from recserve.serving.transport.h2limits import FloodGuard, FloodLimits, LogBudget
from recserve.serving.transport.h2streams import Stream, StreamTable

log = logging.getLogger(__name__)
REFUSED_LOG = LogBudget()  # one line per 10 s for streams refused over the held-bytes budget


class RequestReader:
    """DATA frames in, complete messages out: to a streaming call's ``requests`` as they complete, or, for a unary
    call, to ``ready`` (started by the connection at the end of the read, so that a reset in the same read cancels
    it first)."""

    def __init__(self, streams: StreamTable, out: list[bytes], max_message: int, limits: FloodLimits,
                 guard: FloodGuard, calm: Callable[[str | None], None],
                 on_abuse: Callable[[str], None] | None) -> None:
        self.streams, self.open = streams, streams.open
        self.out = out
        self.max_message = max_message
        self.guard, self.calm, self.on_abuse = guard, calm, on_abuse
        self.stream_window, self.connection_window = limits.stream_window, limits.connection_window
        self.recv_window = limits.connection_window  # what the client may still send on the connection
        self.unacked = 0  # DATA read since the connection's window was last replenished
        self.ready: list[tuple[Stream, Any]] = []  # unary calls completed in this read, started at its end

    def data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        stream = self._taken(flags, stream_id, len(payload))
        if stream is None:
            return
        if not stream.call.done:  # type: ignore[union-attr]
            if flags & PADDED:
                payload = unpad(flags, payload, priority=False)
            if payload and stream.landing is not None:
                payload = self._land(stream, payload)
            if payload:
                if type(payload.obj) is not bytes:  # a view of the read buffer, which the next read reuses
                    payload = memoryview(payload.tobytes())
                stream.chunks.append(payload)
                stream.size += len(payload)
            if stream.size >= 5:
                self._messages(stream)
        self._after_data(stream, flags)

    def data_in_place(self, flags: int, stream_id: int, size: int) -> None:
        """``data`` for ``size`` bytes of an unpadded DATA frame that the socket read straight into the stream's
        message where ``_land`` would have copied them (``H2Connection.direct_buffer``): the same windows, budgets
        and ends, with no copy."""
        stream = self._taken(flags, stream_id, size)
        if stream is None:
            return
        if not stream.call.done:  # type: ignore[union-attr]
            stream.landed += size
        self._after_data(stream, flags)

    def in_place_room(self, stream_id: int) -> memoryview | None:
        """The rest of the message a live stream is assembling (``_start_landing``), where its next DATA goes."""
        stream = self.open.get(stream_id)
        if stream is None or stream.landing is None or stream.call is None or stream.call.done:
            return None
        return stream.landing[stream.landed:]

    def _taken(self, flags: int, stream_id: int, size: int) -> Stream | None:
        """DATA of ``size`` bytes counted against the guard and the windows (and the stream's replenished while its
        call takes its request); its stream, or None where the data is dropped."""
        if size:
            self.guard.empty_in_a_row = 0
        elif not flags & END_STREAM:
            self.calm(self.guard.empty_data())
        self._take_connection_window(size)
        stream = self.open.get(stream_id)
        if stream_id == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if stream is None or stream.call is None:
            if stream_id > self.streams.last_id:
                raise H2Error(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return None  # a stream already answered or reset: its data is dropped (the window was counted above)
        stream.recv_window -= size
        if stream.recv_window < 0:  # RFC 9113 6.9.1: a stream error
            self.streams.reset(stream, FLOW_CONTROL_ERROR)
            return None
        if not stream.call.done:
            self._replenish_stream(stream, size, flags)
        return stream

    def _after_data(self, stream: Stream, flags: int) -> None:
        if flags & END_STREAM:
            stream.ended = True
            self.request_ended(stream)
        self._check_held(stream)

    def _take_connection_window(self, size: int) -> None:
        """DATA of ``size`` bytes against the connection's receive window, replenished once half of it is read (a
        stream's own window and the byte budgets bound what is kept of it)."""
        self.recv_window -= size
        if self.recv_window < 0:
            raise H2Error(FLOW_CONTROL_ERROR, "DATA past the connection's receive window")
        self.unacked += size
        if self.unacked >= self.connection_window >> 1:
            self.out.append(frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
            self.recv_window += self.unacked
            self.unacked = 0

    def _replenish_stream(self, stream: Stream, size: int, flags: int) -> None:
        """A call still taking its request gets its stream window back once half of it is read; one answered,
        refused or reset gets none, so its client can send at most one more window of it."""
        stream.unacked += size
        if stream.unacked >= self.stream_window >> 1 and not flags & END_STREAM:
            self.out.append(frame(WINDOW_UPDATE, 0, stream.id, stream.unacked.to_bytes(4, "big")))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _check_held(self, stream: Stream) -> None:
        """Count what the stream holds of incomplete messages (a message handed to its call is not held); the
        stream that takes a budget past its limit is refused."""
        live = self.open.get(stream.id) is stream and not stream.call.done  # type: ignore[union-attr]
        self.streams.count_held(stream, stream.size + (stream.landed if stream.landing is not None else 0)
                                if live else 0)
        if stream.held and (budget := self.streams.over_budget()) is not None:
            self._refuse_held(stream, budget.used, budget.limit)

    def _refuse_held(self, stream: Stream, used: int, limit: int) -> None:
        """The stream whose DATA took a budget past its limit is answered RESOURCE_EXHAUSTED and its bytes let go;
        the connection serves on."""
        if (left_out := REFUSED_LOG.allow()) is not None:
            log.warning("gRPC stream %d refused: incomplete requests hold %d bytes, over %d (%d more such refusals "
                        "since the last line)", stream.id, used, limit, left_out)
        if self.on_abuse is not None:
            self.on_abuse("too_many_request_bytes")
        stream.chunks, stream.size, stream.landing, stream.landed = [], 0, None, 0
        self.streams.count_held(stream, 0)
        stream.call.finish(RESOURCE_EXHAUSTED, "incomplete requests on this server hold too many bytes: "  # type: ignore[union-attr]
                           "send each message whole before starting many more")

    def _messages(self, stream: Stream) -> None:
        """Complete messages of a streaming call go to its queue as they arrive; a unary call's size is checked
        as soon as its prefix is in, so an oversized request is refused without being held."""
        call = stream.call
        if stream.method is None or call.requests is None:  # type: ignore[union-attr]
            if stream.landing is None and (prefix := self._prefix(stream)) is not None:
                self._start_landing(stream, *prefix)
            return
        while not call.done and (message := self._next_message(stream)) is not None:  # type: ignore[union-attr]
            call.requests.put_nowait(message)  # type: ignore[union-attr]

    def _prefix(self, stream: Stream) -> tuple[int, int] | None:
        """The next message's (compressed flag, length); None (the call ended) if it is over the limit."""
        first = stream.chunks[0]
        if len(first) < 5:
            first = b"".join(stream.chunks)
            stream.chunks = [first]
        size = int.from_bytes(first[1:5], "big")
        if size > self.max_message:
            stream.call.finish(RESOURCE_EXHAUSTED,  # type: ignore[union-attr]
                               f"received message larger than max ({size} vs. {self.max_message})")
            stream.chunks, stream.size = [], 0
            return None
        return first[0], size

    def _start_landing(self, stream: Stream, compressed: int, size: int) -> None:
        """Assemble a large unary message as its DATA arrives in the buffer its method provides, instead of joining
        the pieces at its end: the same one copy, but into memory of the method's choosing (the workers' places a
        request's largest tensor 64-byte aligned)."""
        if compressed or size < LAND_BYTES or stream.method is None or stream.method.land is None:
            return
        landing = sum(len(s.landing) for s in self.open.values() if s.landing is not None)
        if landing + size > LAND_LIMIT * self.max_message:  # a buffer is taken at the declared size: bounded
            return  # joined at its end, as before
        first = memoryview(stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks))[5:]
        head = first[:size]
        stream.landing = stream.method.land(head, size)
        stream.landing[: len(head)] = head
        stream.landed = len(head)
        rest = first[len(head):]
        stream.chunks, stream.size = ([rest] if rest else []), len(rest)

    @staticmethod
    def _land(stream: Stream, payload: memoryview) -> memoryview:
        """Copy DATA into the message being assembled; returns what lies beyond the message."""
        landing, at = stream.landing, stream.landed
        take = min(len(payload), len(landing) - at)  # type: ignore[arg-type]
        landing[at : at + take] = payload[:take]  # type: ignore[index]
        stream.landed = at + take
        return payload[take:]

    def _next_message(self, stream: Stream) -> Any:
        """The next complete message (bytes-like: a view of the received bytes where it arrived in one piece, or
        of the buffer a large one was assembled in)."""
        if stream.landing is not None:
            if stream.landed < len(stream.landing):
                return None
            message, stream.landing = stream.landing, None
            return message
        if stream.size < 5 or (prefix := self._prefix(stream)) is None:
            return None
        compressed, size = prefix
        if stream.size < 5 + size:
            return None
        whole = memoryview(stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks))
        message, rest = whole[5:5 + size], whole[5 + size:]
        stream.chunks, stream.size = ([rest] if rest else []), len(rest)
        return self._inflate(stream, message) if compressed else message

    def _inflate(self, stream: Stream, message: Any) -> bytes | None:
        """A message whose compressed flag is set, inflated; None when the call was ended instead: no coding named
        (INTERNAL, as grpc-core answers), one not undone here (UNIMPLEMENTED), a stream that is corrupt, cut short or
        followed by more bytes (INTERNAL), or one that inflates past the limit (RESOURCE_EXHAUSTED)."""
        finish = stream.call.finish  # type: ignore[union-attr]
        if stream.encoding in (b"", b"identity"):
            finish(INTERNAL, "a message with its compressed flag set in a call whose grpc-encoding names no "
                   "compression (send gzip or deflate, or clear the flag)")
            return None
        if stream.encoding not in (b"gzip", b"deflate"):
            finish(UNIMPLEMENTED, f"message compressed with {stream.encoding.decode('latin-1')!r}: not supported "
                   "(gzip and deflate are)")
            return None
        inflater = zlib.decompressobj(wbits=31 if stream.encoding == b"gzip" else 15)
        try:
            message = inflater.decompress(message, self.max_message + 1)
        except zlib.error as exc:
            finish(INTERNAL, f"cannot decompress the message: {exc}")
            return None
        if len(message) > self.max_message:
            finish(RESOURCE_EXHAUSTED, "decompressed message larger than max")
            return None
        if not inflater.eof or inflater.unused_data:
            finish(INTERNAL, "cannot decompress the message: its stream "
                   + ("ends early" if not inflater.eof else "is followed by other bytes"))
            return None
        return message

    def request_ended(self, stream: Stream) -> None:
        """The client half-closed: a streaming call's sink is told; a unary call's one message is ``ready``."""
        call = stream.call
        if call is None or call.done:
            return
        if call.requests is not None:
            self._messages(stream)
            if stream.size and not call.done:
                call.finish(INTERNAL, "the request ended inside a message")
            call.requests.put_nowait(None)
            return
        message = self._next_message(stream)
        if call.done:
            return
        if message is None or stream.size:
            cut = message is None and (stream.size or stream.landing is not None)
            call.finish(INTERNAL, "the request ended inside its message (fewer bytes than its length prefix says)"
                        if cut else "a unary call takes exactly one request message")
            return
        self.ready.append((stream, message))

    def start_ready(self) -> None:
        """Start the unary calls this read completed, but those it also reset: a client that resets each call
        it sends (Rapid Reset) has them cancelled before they are admitted."""
        ready, self.ready = self.ready, []
        for stream, message in ready:
            if not stream.call.done:  # type: ignore[union-attr]
                stream.method.unary(stream.call, message)  # type: ignore[union-attr]
