"""The streams of one HTTP/2 connection: each stream's state (``Stream``), the table of open ones with the request
bytes they hold and the ids of those we reset (``StreamTable``), and what a served method and its call look like
to the connection (``Method``, ``Call``).  Sans-IO."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from recserve.serving.transport.h2frames import FEW_STREAMS, MAX_STREAMS, RESETS_REMEMBERED, RST_STREAM, frame
from recserve.serving.transport.h2limits import ByteBudget, StreamBudget


class MessageSink(Protocol):
    """Where a streaming call's messages go as they arrive: each message, then None once the client half-closes
    (or the call is cancelled).  An ``asyncio.Queue`` is one; a handler may take them without a task instead."""

    def put_nowait(self, message: Any) -> None: ...


class Call(Protocol):
    """What the connection asks of a call (``h2grpc.GrpcCall`` is the one served)."""

    method: str
    done: bool
    requests: MessageSink | None

    def finish(self, code: int = 0, message: str = "") -> None: ...

    def cancel(self) -> None: ...


@dataclass(frozen=True)
class Method:
    """How a method is served: ``unary(call, request)`` once the request is complete, or ``stream(call)`` at once
    with the messages arriving on ``call.requests`` (a queue), or ``sink(call)`` at once, returning what takes the
    messages as they are read (no task: the handler answers from its callbacks)."""

    unary: Callable[[Any, memoryview], None] | None = None
    stream: Callable[[Any], None] | None = None
    sink: Callable[[Any], MessageSink] | None = None
    # a buffer of ``size`` bytes for a large unary request, given its first bytes (as many as have arrived); None:
    # joined from its pieces at its end
    land: Callable[[memoryview, int], memoryview] | None = None


class Stream:
    __slots__ = ("id", "call", "ended", "chunks", "size", "unacked", "recv_window", "send_window", "pending",
                 "pending_end", "headers_sent", "encoding", "method", "landing", "landed", "held", "opened")

    def __init__(self, stream_id: int, send_window: int, recv_window: int = 0, opened: float = 0.0) -> None:
        self.id = stream_id
        self.opened = opened  # when its HEADERS arrived (the connection's clock): a request must arrive whole in time
        self.call: Call | None = None
        self.ended = False  # the client half-closed
        self.chunks: list[Any] = []  # DATA not yet split into messages: views of the received bytes, not copies
        self.size = 0  # their total length
        self.unacked = 0  # DATA read since its receive window was last replenished
        self.recv_window = recv_window  # what the client may still send on it
        self.send_window = send_window
        self.pending = bytearray()  # reply DATA the client's windows do not admit yet
        self.pending_end: bytes | None = None  # trailers to send once ``pending`` is out
        self.headers_sent = False
        self.encoding = b""
        self.method: Method | None = None
        self.landing: memoryview | None = None  # a large unary message's buffer, filled as DATA arrives
        self.landed = 0  # its bytes filled so far
        self.held = 0  # request bytes counted against the budgets (``StreamTable.count_held``)


class StreamTable:
    """The connection's open streams by id, the request bytes of incomplete messages they hold (against this
    connection's budget and the server's shared one), and the streams we reset, whose late frames are ignored."""

    __slots__ = ("open", "reset_ids", "last_id", "out", "held", "shared_held", "shared_open")

    def __init__(self, out: list[bytes], held: ByteBudget, shared_held: ByteBudget | None,
                 shared_open: StreamBudget | None = None) -> None:
        self.open: dict[int, Stream] = {}
        self.shared_open = shared_open  # streams open over the server's connections
        self.reset_ids: dict[int, None] = {}  # oldest first (``RESETS_REMEMBERED``)
        self.last_id = 0  # the highest stream id the client opened
        self.out = out  # frames to write at the end of this read (``ReplyWriter.out``)
        self.held, self.shared_held = held, shared_held

    def idle(self, stream_id: int) -> bool:
        """Whether ``stream_id`` (not 0) names a stream still idle (RFC 9113 5.1): one the client has not opened, or
        an even one (we push none)."""
        return stream_id > self.last_id or stream_id % 2 == 0

    def add(self, stream: Stream) -> None:
        self.open[stream.id] = stream
        if self.shared_open is not None:
            self.shared_open.open += 1

    def too_many(self) -> bool:
        """More streams are open than the connection advertised, or than the server's budget while this
        connection holds more than ``FEW_STREAMS``."""
        open_here = len(self.open)
        return open_here > MAX_STREAMS or (open_here > FEW_STREAMS and self.shared_open is not None
                                           and self.shared_open.over())

    def forget(self, stream_id: int) -> Stream | None:
        stream = self.open.pop(stream_id, None)
        if stream is not None:
            self.count_held(stream, 0)
            if self.shared_open is not None:
                self.shared_open.open -= 1
        return stream

    def count_held(self, stream: Stream, held: int) -> None:
        """``stream`` now holds ``held`` request bytes: the budgets follow."""
        delta, stream.held = held - stream.held, held
        if delta:
            self.held.add(delta)
            if self.shared_held is not None:
                self.shared_held.add(delta)

    def over_budget(self) -> ByteBudget | None:
        """The budget that incomplete requests now hold more than their limit of, if any."""
        if self.held.over():
            return self.held
        shared = self.shared_held
        return shared if shared is not None and shared.over() else None

    def reset(self, stream: Stream, code: int) -> None:
        """RST_STREAM with ``code``; the stream is forgotten, and frames the client sent before it saw the reset
        are ignored (RFC 9113 5.1), not taken for a protocol error."""
        self.forget(stream.id)
        self.out.append(frame(RST_STREAM, 0, stream.id, code.to_bytes(4, "big")))
        self.reset_ids[stream.id] = None
        if len(self.reset_ids) > RESETS_REMEMBERED:
            del self.reset_ids[next(iter(self.reset_ids))]
        if stream.call is not None and not stream.call.done:
            stream.call.cancel()

    def drop_all(self) -> None:
        """The connection is gone: every stream let go, its call cancelled (streams and calls refer to each other)."""
        streams = list(self.open.values())
        self.open.clear()  # in place: the reader and the writer share this dict
        if self.shared_open is not None:
            self.shared_open.open -= len(streams)
        for stream in streams:
            self.count_held(stream, 0)
            stream.chunks, stream.landing = [], None
            if stream.call is not None and not stream.call.done:
                stream.call.cancel()
