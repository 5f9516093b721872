"""A lean gRPC server over HTTP/2 on an asyncio ``Protocol``: what the workers answer gRPC with (data plane v2).

Why not grpc.aio: measured per unary call with a grpcio client on the 2-core dev host, grpc.aio's server spent
~0.43-0.58 ms of CPU (its completion-queue callbacks and loop wake-ups) and this one ~0.06-0.11 ms (p50 0.50-0.70
vs 0.23-0.33 ms end to end).  A query at batch 1 costs ~0.5 ms of model, so grpc.aio doubled it.

What it implements (RFC 9113 and the gRPC-over-HTTP2 protocol, server side, cleartext "h2c" with prior knowledge,
which is what gRPC clients speak without TLS):
- frames: SETTINGS, PING, WINDOW_UPDATE, HEADERS + CONTINUATION (padding and priority fields skipped), DATA,
  RST_STREAM, GOAWAY; PRIORITY ignored; anything a client may not send is a connection error (GOAWAY, close);
- flow control both ways: receive windows per stream and per connection (``FloodLimits``), replenished as a call
  takes its request, DATA past them a FLOW_CONTROL_ERROR; replies wait for the client's windows
  (``_Stream.pending``) and its ``SETTINGS_MAX_FRAME_SIZE``;
- HPACK through ``hpack`` (pure Python): request header blocks made only of indexed fields (what a client sends
  once its dynamic table holds its headers) are decoded once and remembered until the table can change; replies
  use constant blocks that never touch the dynamic table;
- gRPC: length-prefixed messages (gzip and deflate requests inflated), ``grpc-timeout``, status and
  percent-encoded ``grpc-message`` in trailers (trailers-only for an error before any reply), RST_STREAM as
  cancellation, unary and bidirectional-streaming methods;
- reads: DATA kept as views of the received bytes (a message is joined once), a header block bounded; a large
  unary request is assembled as it arrives in a buffer its method provides (``Method.land``);
- a graceful stop: two GOAWAYs (the second, naming the last stream, once two PINGs in a row, the first sent
  with the first GOAWAY, are acknowledged), calls in flight answered, then our side half-closed and the client
  closes;
- ``TCP_NODELAY`` on every connection (asyncio sets it only on sockets made with ``IPPROTO_TCP``).

It knows nothing of recserve: ``grpc_worker.py`` maps methods to handlers.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from hpack import Decoder
from hpack.exceptions import HPACKError

from recserve.serving.transport.h2limits import Bucket, ByteBudget, FloodGuard, FloodLimits

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x9, 0xB
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x1, 0x3, 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
RECEIVE_FRAME = 1 << 20  # the largest frame we accept (advertised): fewer frames for a large query
BACKLOG = 4096  # the listening socket's, as the node's HTTP socket (asyncio would set 100)
HOLD_BYTES = 16 << 20  # answers held for closed client windows (at least two largest messages): then a reset
HELD_CONNECTION = 16 << 20  # request bytes of incomplete messages a connection holds (at least two largest ones)
HELD_WORKER = 64 << 20  # the same, over a server's connections (at least four largest messages)
MAX_CONNECTIONS = 1024  # per server (a worker): past it a new connection gets GOAWAY and is closed
PREFACE_TIMEOUT_S = 10.0  # a connection that has not sent the HTTP/2 preface by then is closed
FRAMES_PER_TURN = 256  # frames handled per read before the loop runs other work: the rest waits, reading paused
RELEASE_BYTES = 16 << 20  # a connection whose incomplete requests once held this much: free memory returned after
IDLE_TIMEOUT_S = 300.0  # a connection with no call open that read nothing this long gets GOAWAY (clients reconnect)
WRITE_HIGH = 1 << 20  # answers a connection may hold unsent before its requests stop being read (pause_writing)
MAX_STREAMS = 4096  # concurrent calls per connection (advertised); admission proper is the worker's queue
MAX_HEADER_BLOCK = 64 << 10  # a header block's encoded bytes (HEADERS + CONTINUATION): a CONTINUATION flood ends here
LAND_BYTES = 64 << 10  # a unary request message from this size on is assembled in place (``_land``)
LAND_LIMIT = 2  # messages being assembled at once on a connection hold at most this many max messages
MAX_INDEXED_BLOCKS = 64  # header blocks of indexed fields remembered per connection (a client repeats a few)
RESERVED_HEADERS = frozenset({b"content-type", b"te", b"user-agent"})  # HTTP/2 and gRPC's own, not metadata
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"})  # HTTP/1.1 fields a request over HTTP/2 must not carry (RFC 9113 8.2.2)
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
RESETS_REMEMBERED = 1024  # streams we reset whose late frames are ignored (RFC 9113 5.1), the most recent ones
Metadata = tuple[tuple[str, "str | bytes"], ...]
PAUSED_WRITES, PAUSED_BACKLOG = 1, 2
# the PINGs of a graceful close: the first goes with the first GOAWAY; its acknowledgement sends the second, and
# the second's allows the final GOAWAY (``close_gracefully`` says why two)
GOAWAY_PING, GOAWAY_PING_AGAIN = b"goaway\x00\x01", b"goaway\x00\x02"
GOAWAY_ACK_S = 1.0  # a client that has not acknowledged them by then gets the final GOAWAY anyway

# gRPC status codes (grpc.StatusCode values), named here so that this module needs no grpc import
OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 3, 8, 12, 13
TIMEOUT_UNITS = {ord("H"): 3600.0, ord("M"): 60.0, ord("S"): 1.0, ord("m"): 1e-3, ord("u"): 1e-6, ord("n"): 1e-9}


_HEAD = struct.Struct(">IBI")  # a frame's 9-byte header: length << 8 | type, flags, stream id


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(len(payload) << 8 | kind, flags, stream) + payload


def _goaway_frame(last_id: int, code: int = NO_ERROR, reason: bytes = b"") -> bytes:
    return _frame(GOAWAY, 0, 0, last_id.to_bytes(4, "big") + code.to_bytes(4, "big") + reason)


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries ``first`` in the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out, value = bytearray((first | limit,)), value - limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field as a literal without indexing, new name, no Huffman: no HPACK state on either side."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


def _percent_encoded(message: str) -> bytes:
    """``grpc-message``: UTF-8, with every byte outside printable ASCII (and '%') as %XX (gRPC's rule)."""
    return b"".join(bytes((b,)) if 0x20 <= b <= 0x7E and b != 0x25 else b"%%%02X" % b for b in message.encode())


RESPONSE_HEADERS = b"\x88" + _literal(b"content-type", b"application/grpc")  # 0x88: ":status: 200", static index 8
TRAILERS_OK = _literal(b"grpc-status", b"0")
# a unary answer that the windows admit whole, as one write: HEADERS frame and block, DATA frame header and the
# message's 5-byte prefix (packed in one call), the message, then the trailers' HEADERS frame
_REPLY_HEAD = struct.Struct(f">IBI{len(RESPONSE_HEADERS)}sIBIBI")
_REPLY_TAIL = struct.Struct(f">IBI{len(TRAILERS_OK)}s")
_MESSAGE_HEAD = struct.Struct(">IBIBI")  # a DATA frame's header and its message's prefix
_HEADERS_WORD, _TRAILERS_WORD = len(RESPONSE_HEADERS) << 8 | HEADERS, len(TRAILERS_OK) << 8 | HEADERS


def _trailers(code: int, message: str) -> bytes:
    if code == OK and not message:
        return TRAILERS_OK
    block = _literal(b"grpc-status", str(code).encode())
    return block + _literal(b"grpc-message", _percent_encoded(message)) if message else block


def _metadatum(name: bytes, value: bytes) -> tuple[str, str | bytes]:
    """One metadata entry as grpc.aio takes it: a ``-bin`` value base64-decoded to bytes (undecodable: kept as sent,
    so the forwarded call fails where the client's would), any other as text."""
    key = name.decode("latin-1")
    if key.endswith("-bin"):
        try:
            return key, base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            return key, value
    return key, value.decode("latin-1")


def _malformed(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why a request's header fields are malformed (RFC 9113 8.1.1, 8.2, 8.3.1), or None."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name.startswith(b":"):
            if regular:
                return "a pseudo-header after a regular field"
            if name not in REQUEST_PSEUDO or name in seen:
                return f"pseudo-header {name.decode('latin-1')!r} unknown or repeated"
            seen.add(name)
        else:
            regular = True
            if name != name.lower():
                return "an uppercase field name"
            if name in CONNECTION_SPECIFIC or (name == b"te" and value != b"trailers"):
                return f"connection-specific field {name.decode('latin-1')!r}"
    if not {b":method", b":scheme", b":path"} <= seen:
        return "a missing :method, :scheme or :path"
    return None


def _timeout_s(value: bytes) -> float | None:
    """``grpc-timeout`` (up to 8 digits and a unit) in seconds; None when absent or malformed."""
    if len(value) < 2 or value[-1] not in TIMEOUT_UNITS or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * TIMEOUT_UNITS[value[-1]]


class GrpcCall:
    """One call (an HTTP/2 stream) as its handler sees it: reply once (unary), or send messages then finish."""

    __slots__ = ("_conn", "_stream", "method", "deadline", "metadata", "done", "requests", "on_cancel", "_task")

    def __init__(self, conn: GrpcConnection, stream: _Stream, method: str, deadline: float | None,
                 metadata: Metadata = ()) -> None:
        self._conn, self._stream = conn, stream
        self.method = method
        self.metadata = metadata  # the client's own metadata (``authorization``, ...), as grpc.aio takes it
        self.deadline = deadline  # time.monotonic() by which the client stops waiting; None = no deadline
        self.done = False  # trailers sent, or the client cancelled: nothing more is written
        self.requests: MessageSink | None = None  # a streaming call's messages; None = half-closed
        self.on_cancel: Callable[[], None] | None = None
        self._task: asyncio.Task | None = None

    def time_remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def reply(self, message: bytes) -> None:
        """A unary call's answer: headers, the message and an OK status in one write."""
        if not self.done:
            self.done = True
            self._conn.send_reply(self._stream, message)

    def send(self, message: bytes) -> None:
        """One message of a streaming reply."""
        if not self.done:
            self._conn.send_message(self._stream, message)

    def finish(self, code: int = OK, message: str = "") -> None:
        """End the call with a status (an error before any message is a trailers-only reply)."""
        if not self.done:
            self.done = True
            self._conn.send_trailers(self._stream, code, message)

    def run(self, work: Any) -> None:
        """Run a coroutine for this call; it is cancelled with the call.  An exception it lets out is INTERNAL."""
        self._task = asyncio.ensure_future(work)
        self._task.add_done_callback(self._ran)

    def _ran(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("gRPC handler for %s failed", self.method, exc_info=task.exception())
            self.finish(INTERNAL, "internal error")

    def cancel(self) -> None:
        self.done = True
        if self.requests is not None:
            self.requests.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
        if self.on_cancel is not None:
            self.on_cancel()


class MessageSink(Protocol):
    """Where a streaming call's messages go as they arrive: each message, then None once the client half-closes
    (or the call is cancelled).  An ``asyncio.Queue`` is one; a handler may take them without a task instead."""

    def put_nowait(self, message: Any) -> None: ...


@dataclass(frozen=True)
class Method:
    """How a method is served: ``unary(call, request)`` once the request is complete, or ``stream(call)`` at once
    with the messages arriving on ``call.requests`` (a queue), or ``sink(call)`` at once, returning what takes the
    messages as they are read (no task: the handler answers from its callbacks)."""

    unary: Callable[[GrpcCall, memoryview], None] | None = None
    stream: Callable[[GrpcCall], None] | None = None
    sink: Callable[[GrpcCall], MessageSink] | None = None
    # a buffer of ``size`` bytes for a large unary request, given its first bytes (as many as have arrived); None:
    # joined from its pieces at its end
    land: Callable[[memoryview, int], memoryview] | None = None


class _Stream:
    __slots__ = ("id", "call", "block", "ended", "chunks", "size", "unacked", "recv_window", "send_window", "pending",
                 "pending_end", "headers_sent", "encoding", "method", "landing", "landed", "held")

    def __init__(self, stream_id: int, send_window: int, recv_window: int = 0) -> None:
        self.id = stream_id
        self.call: GrpcCall | None = None
        self.block = bytearray()  # a header block still waiting for its CONTINUATION frames
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
        self.held = 0  # request bytes counted against the budgets (``GrpcConnection._count_held``)


class ConnectionError_(Exception):
    """A connection-level protocol error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class GrpcConnection(asyncio.Protocol):
    """One client connection.  ``methods`` maps ``/package.Service/Method`` to how it is served."""

    def __init__(self, methods: Callable[[str], Method | None], max_message: int,
                 on_close: Callable[[GrpcConnection], None] | None = None, limits: FloodLimits | None = None,
                 on_abuse: Callable[[str], None] | None = None, held: ByteBudget | None = None,
                 server_resets: Bucket | None = None) -> None:
        self.methods = methods
        self.max_message = max_message
        limits = limits or FloodLimits()
        self._guard = FloodGuard(limits, server_resets=server_resets)  # frames with no request
        self._stream_window, self._connection_window = limits.stream_window, limits.connection_window
        self._recv_window = limits.connection_window  # what the client may still send on the connection
        # request bytes of incomplete messages: on this connection, and on every connection of the server
        self._request_bytes = ByteBudget(max(HELD_CONNECTION, 2 * max_message))
        self._request_bytes_shared = held
        self.on_abuse = on_abuse  # told the reason when a budget is spent (counted in /metrics)
        # answers held for a client whose windows stay closed, past which the stream adding to them is reset
        self._hold_limit = max(HOLD_BYTES, 2 * max_message)
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()  # the start of a frame (or of the preface) that the next read completes
        self._partial: tuple[int, int, int] | None = None  # a DATA frame read in parts: stream, flags, bytes left
        self._preface = False
        self._decoder = Decoder()
        self._indexed: dict[bytes, tuple[bytes, ...]] = {}  # header blocks of indexed fields: ``_request_head``
        self._streams: dict[int, _Stream] = {}
        self._last_id = 0
        self._continuing: _Stream | None = None  # a HEADERS frame without END_HEADERS: only CONTINUATION may follow
        self._send_window = DEFAULT_WINDOW
        self._blocked = False  # a stream may have reply data waiting for the client's windows (``_flush_pending``)
        self._initial_send_window = DEFAULT_WINDOW
        self._max_frame = DEFAULT_FRAME
        self._unacked = 0
        self._out: list[bytes] = []  # frames written at the end of this read (one write, one syscall)
        self._closing = False  # GOAWAY sent or received: no new streams; close when the last call ends
        self._eof_sent = False
        self._goaway_ping = False  # the first of a graceful close's two GOAWAYs is out
        self._reading = False
        self._ready: list[tuple[_Stream, Any]] = []  # unary calls completed in this read, started at its end
        self.last_read = time.monotonic()  # when the connection last read anything (``GrpcServer``'s timeouts)
        self._paused = 0  # why reading is paused: PAUSED_WRITES (answers not taken), PAUSED_BACKLOG (frames left)
        self._backlog = False  # this read left complete frames for the next turn of the loop
        self._reset_ids: dict[int, None] = {}  # streams we reset, oldest first (``RESETS_REMEMBERED``)

    # ---- connection ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets TCP_NODELAY only when the socket's protocol field says TCP; a PING or SETTINGS
            # acknowledgement still unacknowledged by the client would hold the next answer under Nagle's
            # algorithm until the client's delayed ACK (~40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = (SETTINGS_MAX_CONCURRENT_STREAMS.to_bytes(2, "big") + MAX_STREAMS.to_bytes(4, "big")
                    + SETTINGS_INITIAL_WINDOW_SIZE.to_bytes(2, "big") + self._stream_window.to_bytes(4, "big")
                    + SETTINGS_MAX_FRAME_SIZE.to_bytes(2, "big") + RECEIVE_FRAME.to_bytes(4, "big"))
        opening = self._connection_window - DEFAULT_WINDOW  # the connection's window starts at 65,535
        self.transport.write(_frame(SETTINGS, 0, 0, settings)
                             + (_frame(WINDOW_UPDATE, 0, 0, opening.to_bytes(4, "big")) if opening > 0 else b""))

    def pause_writing(self) -> None:
        """Answers wait in our write buffer past ``WRITE_HIGH``: the client is not reading them.  Read none of its
        requests until it does (TCP then stops its sending), so that a client cannot make a worker hold answers
        without bound (our receive windows are replenished as requests are read, so they would not stop it)."""
        self._pause(PAUSED_WRITES)

    def resume_writing(self) -> None:
        self._resume(PAUSED_WRITES)

    def _pause(self, reason: int) -> None:
        if self.transport is not None and not self._paused:
            self.transport.pause_reading()
        self._paused |= reason

    def _resume(self, reason: int) -> None:
        was, self._paused = self._paused, self._paused & ~reason
        if was and not self._paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: Exception | None) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            self._count_held(stream, 0)
            stream.chunks, stream.landing = [], None  # let go now: streams and calls refer to each other
            if stream.call is not None and not stream.call.done:
                stream.call.cancel()
        self.transport = None
        if self.on_close is not None:
            self.on_close(self)

    def close_gracefully(self) -> None:
        """Stop taking calls, answer those in flight, then close.  Two GOAWAYs, as grpc-core's server does: the
        first (any stream id) tells the client to open no more streams here, and the second names the last stream
        that arrived.  A single GOAWAY would fail, UNAVAILABLE, a call whose HEADERS were on the wire as it went
        out.  The second waits for two PING round trips, not one as grpc-core's: grpc-core writes a PING's
        acknowledgement before the HEADERS of a stream it had numbered just before it read the first GOAWAY, so
        after one round trip such a stream could still cross the final GOAWAY.  grpc-core retries a crossed
        call once, transparently; a connection closed again before the retry was seen (a worker retired while
        the node's cover was closing) failed the call, "Stream removed (GOAWAY received)".

        A client that does not acknowledge (seen: grpc-core given the first GOAWAY as it connects, its calls then
        waiting for their deadline on a connection that never closed) gets the final GOAWAY after
        ``GOAWAY_ACK_S``, and our side ends once its calls have."""
        if self._closing or self._goaway_ping or self.transport is None:
            return
        self._goaway_ping = True
        self._write([_goaway_frame(MAX_WINDOW), _frame(PING, 0, 0, GOAWAY_PING)])
        asyncio.get_running_loop().call_later(GOAWAY_ACK_S, self._final_goaway)

    def _final_goaway(self) -> None:
        """The second GOAWAY, naming the last stream that arrived; our side ends when the calls in flight have."""
        if self._closing or self.transport is None:
            return
        self._closing = True
        self._write([_goaway_frame(self._last_id)])


    def _flush(self) -> None:
        """Write the frames queued (one write: one syscall), and after GOAWAY and the last call end our side and
        let the client close.  Closing outright could reset the connection over a frame the client sent
        meanwhile (a WINDOW_UPDATE) and lose our last answers."""
        if self.transport is None or self._eof_sent:
            self._out = []
            return
        if self._out:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))
        if self._closing and not self._streams:
            self._eof_sent = True
            try:
                self.transport.write_eof()
            except OSError:  # the client has gone already
                self.transport.close()

    def _fail(self, error: ConnectionError_) -> None:
        if self.transport is not None and not self._eof_sent:
            log.debug("gRPC connection error: %s", error)
            self.transport.write(b"".join(self._out) + _goaway_frame(self._last_id, error.code, str(error).encode()))
            self._out = []
            self.transport.close()

    # ---- reading -------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if type(data) is not bytes:
            data = bytes(data)
        if not self._preface and not (data := self._after_preface(data)):
            return
        view, pos = memoryview(data), 0
        self._reading = True  # frames written meanwhile go out together at the end
        try:
            if self._partial is not None:
                pos = self._rest_of_data(view)
            if self._buf and pos < len(view):  # complete the frame begun in the last read
                self._buf += view[pos:]
                view, pos = memoryview(bytes(self._buf)), 0
                self._buf.clear()
            pos = self._frames(view, pos)
        except ConnectionError_ as error:
            self._ready.clear()
            self._fail(error)
            return
        finally:
            self._reading = False
        if pos < len(view):
            self._buf += view[pos:]
        if self._ready:
            self._start_ready()
        self._flush()
        if self._backlog and self.transport is not None:
            self._pause(PAUSED_BACKLOG)
            asyncio.get_running_loop().call_soon(self._read_backlog)

    def _read_backlog(self) -> None:
        """The frames a read left (``FRAMES_PER_TURN``), handled on a later turn of the loop, then reading again."""
        self._backlog = False
        if self.transport is None:
            return
        data = bytes(self._buf)
        self._buf.clear()
        self.data_received(data)
        if not self._backlog:
            self._resume(PAUSED_BACKLOG)

    def _start_ready(self) -> None:
        """Start the unary calls this read completed, but those it also reset: a client that resets each call
        it sends (Rapid Reset) has them cancelled before they are admitted."""
        ready, self._ready = self._ready, []
        for stream, message in ready:
            if not stream.call.done:
                stream.method.unary(stream.call, message)

    def _after_preface(self, data: bytes) -> bytes:
        """The bytes after the client's connection preface (b"" while it is incomplete or wrong)."""
        self._buf += data
        if len(self._buf) < len(PREFACE) or self._buf[:len(PREFACE)] != PREFACE:
            if not PREFACE.startswith(bytes(self._buf[:len(PREFACE)])):
                self._fail(ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface"))
            return b""
        data = bytes(self._buf[len(PREFACE):])
        self._buf.clear()
        self._preface = True
        return data

    def _frames(self, view: memoryview, pos: int) -> int:
        """Handle every complete frame in ``view`` from ``pos``; returns where the incomplete rest begins.  The
        view is of immutable received bytes, so a DATA payload is kept as a view, not copied; a DATA frame longer
        than this read is handed on in parts as it arrives (``_partial``) instead of being buffered."""
        size = len(view)
        unpack = _HEAD.unpack_from
        handled = 0
        while size - pos >= 9:
            if handled == FRAMES_PER_TURN:
                self._backlog = True
                break
            handled += 1
            word, flags, stream = unpack(view, pos)
            length, kind, stream = word >> 8, word & 0xFF, stream & 0x7FFFFFFF
            if length > RECEIVE_FRAME:
                raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            end = pos + 9 + length
            if self._continuing is not None and (kind != CONTINUATION or stream != self._continuing.id):
                raise ConnectionError_(PROTOCOL_ERROR, "a header block was interrupted")
            if end > size:
                if kind != DATA or flags & PADDED:
                    break
                self._partial = (stream, flags, end - size)
                self._data(flags & ~END_STREAM, stream, view[pos + 9:size])
                return size
            if kind == DATA:
                self._data(flags, stream, view[pos + 9:end])
            else:
                self._frame(kind, flags, stream, view[pos + 9:end].tobytes())
            pos = end
            if self.transport is None:
                return size
        return pos

    def _rest_of_data(self, view: memoryview) -> int:
        stream, flags, left = self._partial  # type: ignore[misc]
        take = min(left, len(view))
        self._partial = (stream, flags, left - take) if take < left else None
        self._data(flags if take == left else flags & ~END_STREAM, stream, view[:take])
        return take

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == HEADERS:
            self._headers(flags, stream, payload)
        elif kind == WINDOW_UPDATE:  # grpcio sends two with every call
            self._window_update(stream, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == PING:
            if len(payload) != 8 or stream:
                raise ConnectionError_(FRAME_SIZE_ERROR if len(payload) != 8 else PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                self._calm(self._guard.ping())
                self._out.append(_frame(PING, ACK, 0, payload))
            elif payload == GOAWAY_PING and not self._closing:  # the client has seen the first GOAWAY
                self._out.append(_frame(PING, 0, 0, GOAWAY_PING_AGAIN))  # after the streams it had numbered
            elif payload == GOAWAY_PING_AGAIN:  # every stream it opened has arrived
                self._final_goaway()
        elif kind == RST_STREAM:
            self._calm(self._guard.reset())
            self._reset(stream)
        elif kind == GOAWAY:
            self._closing = True  # the client makes no new streams; ours finish, then we close
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client may not push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _calm(self, reason: str | None) -> None:
        """A frame past its budget (``h2limits``): GOAWAY ENHANCE_YOUR_CALM with the reason, then close."""
        if reason is not None:
            if self.on_abuse is not None:
                self.on_abuse(reason)
            raise ConnectionError_(ENHANCE_YOUR_CALM, reason)

    def _settings(self, flags: int, stream: int, payload: bytes) -> None:
        if stream or len(payload) % 6 or (flags & ACK and payload):
            raise ConnectionError_(PROTOCOL_ERROR if stream or flags & ACK else FRAME_SIZE_ERROR, "bad SETTINGS")
        if flags & ACK:
            return
        self._calm(self._guard.settings())
        for at in range(0, len(payload), 6):
            key, value = int.from_bytes(payload[at:at + 2], "big"), int.from_bytes(payload[at + 2:at + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "initial window too large")
                delta, self._initial_send_window = value - self._initial_send_window, value
                for open_stream in self._streams.values():
                    open_stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "bad max frame size")
                self._max_frame = value
        self._out.append(_frame(SETTINGS, ACK, 0))
        self._flush_pending()

    def _window_update(self, stream: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream == 0:
            if increment == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
        elif stream in self._streams:
            target = self._streams[stream]
            target.send_window += increment
            if increment == 0 or target.send_window > MAX_WINDOW:  # RFC 9113 6.9, 6.9.1: a stream error
                self._reset_stream(target, PROTOCOL_ERROR if increment == 0 else FLOW_CONTROL_ERROR)
                return
        self._flush_pending()

    def _reset(self, stream_id: int) -> None:
        stream = self._forget(stream_id)
        if stream is not None and stream.call is not None:
            stream.call.cancel()

    @staticmethod
    def _unpad(flags: int, payload: Any, priority: bool) -> Any:
        start = 0
        pad = 0
        if flags & PADDED:
            if not payload:
                raise ConnectionError_(PROTOCOL_ERROR, "padded frame without its pad length")
            pad, start = payload[0], 1
        if priority and flags & PRIORITY_FLAG:
            start += 5
        if start + pad > len(payload):
            raise ConnectionError_(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[start:len(payload) - pad] if start or pad else payload

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._unpad(flags, payload, priority=True) if flags & (PADDED | PRIORITY_FLAG) else payload
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers from the client: they end the request
            if not flags & END_STREAM:
                raise ConnectionError_(PROTOCOL_ERROR, "a second header block that does not end the stream")
            stream.ended = True
        elif stream_id in self._reset_ids:  # sent before our reset reached the client: read (HPACK) and ignored
            stream = _Stream(stream_id, 0)
            stream.ended = True
        else:
            if stream_id % 2 == 0 or stream_id <= self._last_id:
                raise ConnectionError_(PROTOCOL_ERROR, f"stream {stream_id} is not a new client stream")
            self._last_id = stream_id
            stream = _Stream(stream_id, self._initial_send_window, self._stream_window)
            stream.ended = bool(flags & END_STREAM)
            self._streams[stream_id] = stream
        if flags & END_HEADERS:  # the whole block in this frame (the usual case): no copy into ``stream.block``
            if len(block) > MAX_HEADER_BLOCK:
                raise ConnectionError_(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")
            self._header_block(stream, block)
        else:
            self._add_to_block(stream, block)
            self._continuing = stream
            self._guard.continuations = 0

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self._continuing
        if stream is None or stream.id != stream_id:
            raise ConnectionError_(PROTOCOL_ERROR, "CONTINUATION without a header block")
        self._calm(self._guard.continuation())
        self._add_to_block(stream, payload)
        if flags & END_HEADERS:
            self._continuing = None
            block, stream.block = bytes(stream.block), bytearray()
            self._header_block(stream, block)

    @staticmethod
    def _add_to_block(stream: _Stream, fragment: bytes) -> None:
        stream.block += fragment
        if len(stream.block) > MAX_HEADER_BLOCK:
            raise ConnectionError_(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")

    def _reset_stream(self, stream: _Stream, code: int) -> None:
        """RST_STREAM with ``code``; the stream is forgotten, and frames the client sent before it saw the reset
        are ignored (RFC 9113 5.1), not taken for a protocol error."""
        self._forget(stream.id)
        self._out.append(_frame(RST_STREAM, 0, stream.id, code.to_bytes(4, "big")))
        self._reset_ids[stream.id] = None
        if len(self._reset_ids) > RESETS_REMEMBERED:
            del self._reset_ids[next(iter(self._reset_ids))]
        if stream.call is not None and not stream.call.done:
            stream.call.cancel()

    def _request_head(self, block: bytes) -> tuple[str, float | None, bytes | None, bytes, Metadata, str | None]:
        """What a call needs of its header block: the method's path, ``grpc-timeout`` in seconds (None if absent),
        the HTTP status refusing a request that is not gRPC (None if it is), ``grpc-encoding`` and the client's own
        metadata (a forwarded call carries it on: the control token's ``authorization``).  A block made
        only of single-byte indexed fields cannot change the dynamic table, so what it says stays valid until a
        block that could change the table arrives: a client sends the same few such blocks call after call
        (tritonclient's and grpcio's: 8-9 bytes), each decoded once."""
        head = self._indexed.get(block)
        if head is not None:  # only blocks of indexed fields are kept
            return head
        try:
            headers = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"header block: {exc}") from exc
        path = timeout = method = content_type = encoding = b""
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b":method":
                method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
            elif not name.startswith(b":") and name not in RESERVED_HEADERS and not name.startswith(b"grpc-"):
                metadata.append(_metadatum(name, value))
        refusal = (None if method == b"POST" and content_type.startswith(b"application/grpc")
                   else b"415" if method == b"POST" else b"405")
        head = (path.decode("latin-1"), _timeout_s(timeout) if timeout else None, refusal, encoding, tuple(metadata),
                _malformed(headers))
        if all(byte >= 0x80 for byte in block):
            if len(self._indexed) >= MAX_INDEXED_BLOCKS:  # a client sending ever new combinations: bounded
                self._indexed.clear()
            self._indexed[block] = head
        else:
            self._indexed.clear()
        return head

    def _header_block(self, stream: _Stream, block: bytes) -> None:
        path, seconds, refusal, encoding, metadata, malformed = self._request_head(block)
        if self._streams.get(stream.id) is not stream:  # a stream we reset: its block kept HPACK in step, no more
            return
        if stream.call is not None:  # request trailers: ignored, the stream has ended
            self._request_ended(stream)
            return
        if malformed is not None:  # RFC 9113 8.1.1: a stream error, the connection serves on
            log.debug("gRPC stream %d reset: malformed request (%s)", stream.id, malformed)
            self._reset_stream(stream, PROTOCOL_ERROR)
            return
        if self._closing or len(self._streams) > MAX_STREAMS:  # retried by gRPC clients on another connection
            self._reset_stream(stream, REFUSED_STREAM)
            return
        call = GrpcCall(self, stream, path, None if seconds is None else time.monotonic() + seconds, metadata)
        stream.call = call
        stream.encoding = encoding
        if refusal is not None:
            self._http_error(stream, refusal)
            return
        served = self.methods(path)
        stream.method = served
        if served is None:
            call.finish(UNIMPLEMENTED, f"method {call.method} is not implemented")
        elif served.sink is not None:
            call.requests = served.sink(call)
        elif served.stream is not None:
            call.requests = asyncio.Queue()
            served.stream(call)
        if stream.ended:
            self._request_ended(stream)

    def _http_error(self, stream: _Stream, status: bytes) -> None:
        """A request that is not gRPC: an HTTP status, as gRPC's rules ask for a bad method or content type."""
        stream.call.done = True  # type: ignore[union-attr]
        block = b"\x08" + _integer(len(status), 7) + status  # ":status" (static name 8), literal value
        self._out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, block))
        self._end(stream)

    def _data(self, flags: int, stream_id: int, payload: memoryview) -> None:
        size = len(payload)
        if size:
            self._guard.empty_in_a_row = 0
        elif not flags & END_STREAM:
            self._calm(self._guard.empty_data())
        self._take_connection_window(size)
        stream = self._streams.get(stream_id)
        if stream_id == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        if stream is None or stream.call is None:
            if stream_id > self._last_id:
                raise ConnectionError_(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream already answered or reset: its data is dropped (the window was counted above)
        stream.recv_window -= size
        if stream.recv_window < 0:  # RFC 9113 6.9.1: a stream error
            self._reset_stream(stream, FLOW_CONTROL_ERROR)
            return
        if not stream.call.done:
            self._replenish_stream(stream, size, flags)
            if flags & PADDED:
                payload = self._unpad(flags, payload, priority=False)
            if payload and stream.landing is not None:
                payload = self._land(stream, payload)
            if payload:
                stream.chunks.append(payload)
                stream.size += len(payload)
            if stream.size >= 5:
                self._messages(stream)
        if flags & END_STREAM:
            stream.ended = True
            self._request_ended(stream)
        self._check_held(stream)

    def _take_connection_window(self, size: int) -> None:
        """DATA of ``size`` bytes against the connection's receive window, replenished once half of it is read (a
        stream's own window and the byte budgets bound what is kept of it)."""
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA past the connection's receive window")
        self._unacked += size
        if self._unacked >= self._connection_window >> 1:
            self._out.append(_frame(WINDOW_UPDATE, 0, 0, self._unacked.to_bytes(4, "big")))
            self._recv_window += self._unacked
            self._unacked = 0

    def _replenish_stream(self, stream: _Stream, size: int, flags: int) -> None:
        """A call still taking its request gets its stream window back once half of it is read; one answered,
        refused or reset gets none, so its client can send at most one more window of it."""
        stream.unacked += size
        if stream.unacked >= self._stream_window >> 1 and not flags & END_STREAM:
            self._out.append(_frame(WINDOW_UPDATE, 0, stream.id, stream.unacked.to_bytes(4, "big")))
            stream.recv_window += stream.unacked
            stream.unacked = 0

    def _check_held(self, stream: _Stream) -> None:
        """Count what the stream holds of incomplete messages (a message handed to its call is not held); the
        stream that takes a budget past its limit is refused."""
        live = self._streams.get(stream.id) is stream and not stream.call.done  # type: ignore[union-attr]
        self._count_held(stream, stream.size + (stream.landed if stream.landing is not None else 0) if live else 0)
        shared = self._request_bytes_shared
        if stream.held and (self._request_bytes.over() or (shared is not None and shared.over())):
            self._refuse_held(stream)

    def _forget(self, stream_id: int) -> _Stream | None:
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            self._count_held(stream, 0)
        return stream

    def _count_held(self, stream: _Stream, held: int) -> None:
        """``stream`` now holds ``held`` request bytes: the budgets follow."""
        delta, stream.held = held - stream.held, held
        if delta:
            self._request_bytes.add(delta)
            if self._request_bytes_shared is not None:
                self._request_bytes_shared.add(delta)

    def _refuse_held(self, stream: _Stream) -> None:
        """The stream whose DATA took a budget past its limit is answered RESOURCE_EXHAUSTED and its bytes let go;
        the connection serves on."""
        budget = self._request_bytes if self._request_bytes.over() else self._request_bytes_shared
        log.warning("gRPC stream %d refused: incomplete requests hold %d bytes, over %d", stream.id,
                    budget.used, budget.limit)  # type: ignore[union-attr]
        if self.on_abuse is not None:
            self.on_abuse("too_many_request_bytes")
        stream.chunks, stream.size, stream.landing, stream.landed = [], 0, None, 0
        self._count_held(stream, 0)
        stream.call.finish(RESOURCE_EXHAUSTED, "incomplete requests on this server hold too many bytes: "  # type: ignore[union-attr]
                           "send each message whole before starting many more")

    def _messages(self, stream: _Stream) -> None:
        """Complete messages of a streaming call go to its queue as they arrive; a unary call's size is checked
        as soon as its prefix is in, so an oversized request is refused without being held."""
        call = stream.call
        if stream.method is None or call.requests is None:
            if stream.landing is None and (prefix := self._prefix(stream)) is not None:
                self._start_landing(stream, *prefix)
            return
        while not call.done and (message := self._next_message(stream)) is not None:  # type: ignore[union-attr]
            call.requests.put_nowait(message)  # type: ignore[union-attr]

    def _prefix(self, stream: _Stream) -> tuple[int, int] | None:
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

    def _start_landing(self, stream: _Stream, compressed: int, size: int) -> None:
        """Assemble a large unary message as its DATA arrives in the buffer its method provides, instead of joining
        the pieces at its end: the same one copy, but into memory of the method's choosing (the workers' places a
        request's largest tensor 64-byte aligned: a batch-256 query's bounds check and model took 0.14 ms longer
        unaligned)."""
        if compressed or size < LAND_BYTES or stream.method is None or stream.method.land is None:
            return
        landing = sum(len(s.landing) for s in self._streams.values() if s.landing is not None)
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
    def _land(stream: _Stream, payload: memoryview) -> memoryview:
        """Copy DATA into the message being assembled; returns what lies beyond the message."""
        landing, at = stream.landing, stream.landed
        take = min(len(payload), len(landing) - at)  # type: ignore[arg-type]
        landing[at : at + take] = payload[:take]  # type: ignore[index]
        stream.landed = at + take
        return payload[take:]

    def _next_message(self, stream: _Stream) -> Any:
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

    def _inflate(self, stream: _Stream, message: Any) -> bytes | None:
        if stream.encoding not in (b"gzip", b"deflate"):
            stream.call.finish(UNIMPLEMENTED,  # type: ignore[union-attr]
                               f"message compressed with {stream.encoding.decode('latin-1')!r}: not supported")
            return None
        try:
            inflater = zlib.decompressobj(wbits=31 if stream.encoding == b"gzip" else 15)
            message = inflater.decompress(message, self.max_message + 1)
        except zlib.error as exc:
            stream.call.finish(INTERNAL, f"cannot decompress the message: {exc}")  # type: ignore[union-attr]
            return None
        if len(message) > self.max_message:
            stream.call.finish(RESOURCE_EXHAUSTED, "decompressed message larger than max")  # type: ignore[union-attr]
            return None
        return message

    def _request_ended(self, stream: _Stream) -> None:
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
            call.finish(INTERNAL, "a unary call takes exactly one request message")
            return
        if self._reading:
            self._ready.append((stream, message))
        else:
            stream.method.unary(call, message)  # type: ignore[union-attr]

    # ---- writing -------------------------------------------------------------------------------
    def send_reply(self, stream: _Stream, message: bytes) -> None:
        size = len(message) + 5
        if stream.headers_sent or not self._admits_whole(stream, size):
            self._send(stream, self._message(message), TRAILERS_OK)
            return
        # the usual unary answer, which the windows admit whole: its three frames built at once (``_send`` and
        # ``_drain_stream`` would write the same bytes) and written now, with what is queued before them, even in
        # the middle of a read: an answer computed inline would otherwise wait for the worker's bookkeeping after
        # the pass and the rest of the read (the client's WINDOW_UPDATE), and a pass (~0.5 ms at least) dwarfs a
        # write's syscall
        stream.headers_sent = True
        self._send_window -= size
        stream.send_window -= size
        sid = stream.id
        self._out += (_REPLY_HEAD.pack(_HEADERS_WORD, END_HEADERS, sid, RESPONSE_HEADERS, size << 8 | DATA, 0, sid, 0,
                                       size - 5),
                      message, _REPLY_TAIL.pack(_TRAILERS_WORD, END_HEADERS | END_STREAM, sid, TRAILERS_OK))
        out, self._out = self._out, []
        self.transport.write(b"".join(out))
        self._end(stream)

    def _admits_whole(self, stream: _Stream, size: int) -> bool:
        """A frame of ``size`` bytes for ``stream`` can be written now: one frame, within both windows, on a live
        stream of a live connection (what ``send_reply`` and ``send_message`` write at once)."""
        return (size <= self._max_frame and size <= self._send_window and size <= stream.send_window
                and self.transport is not None and self._streams.get(stream.id) is stream)

    def send_message(self, stream: _Stream, message: bytes) -> None:
        size = len(message) + 5
        if not stream.headers_sent or stream.pending or not self._admits_whole(stream, size):
            self._send(stream, self._message(message), None)
            return
        # a streamed answer after the first, which the windows admit whole: its DATA frame written now, as
        # ``send_reply`` writes a unary answer (a worker's stream answers from the read that brought the request)
        self._send_window -= size
        stream.send_window -= size
        self._out += (_MESSAGE_HEAD.pack(size << 8 | DATA, 0, stream.id, 0, size - 5), message)
        out, self._out = self._out, []
        self.transport.write(b"".join(out))

    def send_trailers(self, stream: _Stream, code: int, message: str) -> None:
        self._send(stream, b"", _trailers(code, message))

    @staticmethod
    def _message(message: bytes) -> bytes:
        return b"\x00" + len(message).to_bytes(4, "big") + message

    def _send(self, stream: _Stream, data: bytes, trailers: bytes | None) -> None:
        if self.transport is None or self._streams.get(stream.id) is not stream:
            return  # the client reset the stream or left
        frames: list[bytes] = []
        if not stream.headers_sent:
            stream.headers_sent = True
            if not data and trailers is not None:  # trailers-only
                frames.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, RESPONSE_HEADERS + trailers))
                self._out.extend(frames)
                self._end(stream)
                return
            frames.append(_frame(HEADERS, END_HEADERS, stream.id, RESPONSE_HEADERS))
        stream.pending += data
        if trailers is not None:
            stream.pending_end = trailers
        self._drain_stream(stream, frames)

    def _drain_stream(self, stream: _Stream, frames: list[bytes]) -> None:
        """Send what the windows admit of the stream's pending data, then its trailers if all data is out."""
        pending = stream.pending
        while pending:
            size = min(len(pending), self._max_frame, self._send_window, stream.send_window)
            if size <= 0:
                break
            frames.append(_frame(DATA, 0, stream.id, bytes(pending[:size])))
            del pending[:size]
            self._send_window -= size
            stream.send_window -= size
        finished = not pending and stream.pending_end is not None
        if finished:
            frames.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.id, stream.pending_end))
            stream.pending_end = None
        elif pending:
            self._blocked = True
            if (held := self._held()) > self._hold_limit:
                self._out.extend(frames)
                self._drop_unread(stream, held)
                return
        self._out.extend(frames)
        if finished:
            self._end(stream)
        elif not self._reading:
            self._flush()

    def _held(self) -> int:
        """Answer bytes waiting for the client's windows, over every stream (counted only when some wait)."""
        return sum(len(s.pending) for s in self._streams.values())

    def _drop_unread(self, stream: _Stream, held: int) -> None:
        """The client asks faster than its windows let it take the answers (a stream that keeps sending while its
        reader is stuck): rather than hold answers without bound, reset the stream that added the last of them
        (ENHANCE_YOUR_CALM; its call is cancelled, the client sees the reset) and keep the connection."""
        log.warning("gRPC stream %d reset: %d bytes of answers held for the client's closed flow-control windows",
                    stream.id, held)
        stream.pending.clear()
        stream.pending_end = None
        self._reset_stream(stream, ENHANCE_YOUR_CALM)
        if not self._reading:
            self._flush()

    def _flush_pending(self) -> None:
        """Send what the windows now admit of every stream's waiting data (``_blocked``: some stream may have)."""
        if not self._blocked:
            return
        self._blocked = False  # set again by a stream that still has data the windows do not admit
        for stream in list(self._streams.values()):
            if stream.pending or stream.pending_end is not None:
                self._drain_stream(stream, [])

    def _write(self, frames: list[bytes]) -> None:
        self._out.extend(frames)
        if not self._reading:
            self._flush()

    def _end(self, stream: _Stream) -> None:
        """Our side of the stream is closed: forget it (a client still sending data gets it dropped)."""
        if stream.ended:
            self._forget(stream.id)
        else:
            self._reset_stream(stream, NO_ERROR)
        if not self._reading:
            self._flush()


class _Refused(asyncio.Protocol):
    """A connection past the server's cap: our SETTINGS and GOAWAY ENHANCE_YOUR_CALM, then close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        goaway = _goaway_frame(0, ENHANCE_YOUR_CALM, b"too_many_connections")
        transport.write(_frame(SETTINGS, 0, 0) + goaway)  # type: ignore[attr-defined]
        transport.close()


class GrpcServer:
    """Connections accepted on one listening socket: at most ``max_connections``, timed out when silent before
    their preface or idle, and stopped gracefully."""

    def __init__(self, methods: Callable[[str], Method | None], max_message: int,
                 limits: FloodLimits | None = None, on_abuse: Callable[[str], None] | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 preface_timeout_s: float = PREFACE_TIMEOUT_S, on_release: Callable[[], None] | None = None) -> None:
        self.methods = methods
        self.max_message = max_message
        self.limits, self.on_abuse = limits, on_abuse
        self.on_release = on_release  # a connection that held large incomplete requests is gone (return memory)
        self.max_connections, self.idle_timeout_s, self.preface_timeout_s = \
            max_connections, idle_timeout_s, preface_timeout_s
        self.held = ByteBudget(max(HELD_WORKER, 4 * max_message))  # incomplete requests over its connections
        self.resets = Bucket((limits or FloodLimits()).server_resets, time.monotonic())  # RST_STREAM, all of them
        self.connections: set[GrpcConnection] = set()
        self._server: asyncio.Server | None = None
        self._sweep: asyncio.TimerHandle | None = None

    connection_type = GrpcConnection  # what each accepted connection is served by

    def _connection(self) -> asyncio.Protocol:
        if len(self.connections) >= self.max_connections:
            if self.on_abuse is not None:
                self.on_abuse("too_many_connections")
            return _Refused()
        conn = self.connection_type(self.methods, self.max_message, self._closed, self.limits,
                                    self.on_abuse, self.held, self.resets)
        self.connections.add(conn)
        return conn

    def _closed(self, conn: GrpcConnection) -> None:
        self.connections.discard(conn)
        if self.on_release is not None and conn._request_bytes.peak >= RELEASE_BYTES:
            self.on_release()

    def _sweep_silent(self) -> None:
        """Close connections that sent no preface in time; send GOAWAY to those idle with no call open."""
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.transport is None:
                continue
            if not conn._preface and now - conn.last_read > self.preface_timeout_s:
                conn.transport.close()
            elif conn._preface and not conn._streams and now - conn.last_read > self.idle_timeout_s:
                conn.close_gracefully()
        self._sweep = asyncio.get_running_loop().call_later(min(1.0, self.preface_timeout_s / 2), self._sweep_silent)

    async def start(self, sock: Any, ssl: Any = None) -> None:
        """Accept on ``sock`` (asyncio calls ``listen`` on it again: the backlog is kept at the node's); ``ssl``:
        a server context offering ALPN ``h2`` (gRPC clients insist on it), or None for h2c."""
        self._server = await asyncio.get_running_loop().create_server(self._connection, sock=sock, backlog=BACKLOG,
                                                                      ssl=ssl)
        self._sweep_silent()

    async def stop(self, grace: float) -> None:
        """Stop listening, send every connection GOAWAY, wait up to ``grace`` s for their calls, then close."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            conn.close_gracefully()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
