"""A lean gRPC server over HTTP/2 on an asyncio ``Protocol``: what the workers answer gRPC with (data plane v2).

Why not grpc.aio: its server cost ~0.5 ms of CPU per unary call (its completion-queue callbacks and loop wake-ups),
this one ~0.1 ms, and a batch-1 query's model ~0.5 ms (docs/decisions/2026-11-28-h2grpc-not-grpc-aio.md).

What it implements (RFC 9113 and the gRPC-over-HTTP2 protocol, server side, cleartext "h2c" with prior knowledge,
which is what gRPC clients speak without TLS, or TLS with ALPN h2):
- frames: SETTINGS, PING, WINDOW_UPDATE, HEADERS + CONTINUATION (padding and priority fields skipped), DATA,
  RST_STREAM, GOAWAY; PRIORITY ignored; anything a client may not send is a connection error (GOAWAY, close);
- flow control both ways: receive windows per stream and per connection (``FloodLimits``), replenished as a call
  takes its request, DATA past them a FLOW_CONTROL_ERROR; replies wait for the client's windows and its
  ``SETTINGS_MAX_FRAME_SIZE``;
- HPACK through ``hpack`` (pure Python): request header blocks made only of indexed fields are decoded once and
  remembered until the table can change; replies use constant blocks that never touch the dynamic table;
- gRPC: length-prefixed messages (gzip and deflate requests inflated), ``grpc-timeout``, status and
  percent-encoded ``grpc-message`` in trailers (trailers-only for an error before any reply), RST_STREAM as
  cancellation, unary and bidirectional-streaming methods;
- a graceful stop: two GOAWAYs, calls in flight answered, then our side half-closed and the client closes;
- bounds on what a client can make a worker hold or do (``h2limits``, and the limits below).

The protocol is a sans-IO state machine (``h2connection.H2Connection`` and the parts it is made of: ``h2frames``,
``h2streams``, ``h2heads``, ``h2requests``, ``h2replies``); this module is its asyncio adapter: the transport, reading
paused and resumed, ``TCP_NODELAY``, the timers, handlers' tasks, and the listening server.  It knows nothing of
recserve: ``grpc_worker.py`` maps methods to handlers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

from recserve.serving.transport.h2connection import H2Connection
from recserve.serving.transport.h2frames import (
    ENHANCE_YOUR_CALM,
    FRAMES_PER_TURN,
    GOAWAY_PING,
    GOAWAY_PING_AGAIN,
    HELD_WORKER,
    INTERNAL,
    INVALID_ARGUMENT,
    OK,
    PREFACE,
    RESOURCE_EXHAUSTED,
    RESPONSE_HEADERS,
    SERVER_STREAMS,
    SETTINGS,
    UNIMPLEMENTED,
    Metadata,
    frame,
    goaway_frame,
)
from recserve.serving.transport.h2limits import Bucket, ByteBudget, FloodLimits, StreamBudget
from recserve.serving.transport.h2replies import ReplyWriter
from recserve.serving.transport.h2streams import MessageSink, Method, Stream
from recserve.serving.transport.room import Room

__all__ = ["ENHANCE_YOUR_CALM", "FRAMES_PER_TURN", "GOAWAY_PING", "GOAWAY_PING_AGAIN", "INTERNAL", "INVALID_ARGUMENT",
           "OK", "PREFACE", "RESOURCE_EXHAUSTED", "RESPONSE_HEADERS", "UNIMPLEMENTED", "WRITE_HIGH", "GrpcCall",
           "GrpcConnection", "GrpcServer", "MessageSink", "Metadata", "Method"]

log = logging.getLogger(__name__)

BACKLOG = 4096  # every listening socket of the node, HTTP and gRPC (asyncio would set 100)
MAX_CONNECTIONS = 1024  # per server (a worker): past it a new connection gets GOAWAY and is closed
PREFACE_TIMEOUT_S = 10.0  # a connection that has not sent the HTTP/2 preface by then is closed
RELEASE_BYTES = 16 << 20  # a connection whose incomplete requests once held this much: free memory returned after
STALLED_S = 10.0  # at the connection cap, a connection with calls open that read nothing this long makes room
IDLE_TIMEOUT_S = 300.0  # a connection with no call open that read nothing this long gets GOAWAY (clients reconnect)
REQUEST_TIMEOUT_S = 30.0  # a unary call's request must arrive whole within this (``H2Connection.expire_requests``)
WRITE_HIGH = 1 << 20  # answers a connection may hold unsent before its requests stop being read (pause_writing)
READ_BYTES = 256 * 1024  # one read's most, as uvloop reads for a plain Protocol
# the most one read takes straight into a large message (``h2.direct_buffer``): under load a megabyte query waits in
# the socket while a pass runs, and each read costs the loop a frame's bookkeeping.  Capped at a quarter of the
# stream window, so DATA meets the windows in pieces small enough for a client that sends on before our
# WINDOW_UPDATEs.
DIRECT_READ_BYTES = 1 << 20
PAUSED_WRITES, PAUSED_BACKLOG = 1, 2


class GrpcCall:
    """One call (an HTTP/2 stream) as its handler sees it: reply once (unary), or send messages then finish."""

    __slots__ = ("_conn", "_stream", "method", "deadline", "metadata", "done", "requests", "on_cancel", "_task")

    def __init__(self, conn: ReplyWriter, stream: Stream, method: str, deadline: float | None,
                 metadata: Metadata = ()) -> None:
        self._conn = conn
        self._stream: Stream | None = stream  # let go of as the call ends (``_let_go``)
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
            self._conn.send_reply(self._let_go(), message)

    def send(self, message: bytes) -> None:
        """One message of a streaming reply."""
        if not self.done:
            self._conn.send_message(self._stream, message)  # type: ignore[arg-type]

    def finish(self, code: int = OK, message: str = "") -> None:
        """End the call with a status (an error before any message is a trailers-only reply)."""
        if not self.done:
            self.done = True
            self._conn.send_trailers(self._let_go(), code, message)

    def _let_go(self) -> Stream:
        """The call's stream, which the ending call lets go of: the stream refers to its call too, and a call that
        ended is freed once its handler drops it, not only by the cyclic garbage collector."""
        stream, self._stream = self._stream, None
        return stream  # type: ignore[return-value]

    def run(self, work: Any) -> asyncio.Task:
        """Run a coroutine for this call; it is cancelled with the call.  An exception it lets out is INTERNAL."""
        self._task = asyncio.ensure_future(work)
        self._task.add_done_callback(self._ran)
        return self._task

    def _ran(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("gRPC handler for %s failed", self.method, exc_info=task.exception())
            self.finish(INTERNAL, "internal error")

    def cancel(self) -> None:
        self.done = True
        self._stream = None
        if self.requests is not None:
            self.requests.put_nowait(None)
        if self._task is not None:
            self._task.cancel()
        if self.on_cancel is not None:
            self.on_cancel()


class GrpcConnection(asyncio.BufferedProtocol):
    """One client connection on asyncio: an ``H2Connection`` (``h2``) given the transport's reads, writing to it,
    and run by the loop (``Host``).  ``methods`` maps ``/package.Service/Method`` to how it is served.

    Reads go into its server's one read buffer and on to ``h2.receive`` as bytes, except a read that falls inside
    a DATA frame of a large message being assembled: that one goes straight into the message
    (``h2.direct_buffer``), which spares a large request two copies of most of its bytes (and the cache they
    take from the model's pass after them)."""

    def __init__(self, methods: Callable[[str], Method | None], max_message: int,
                 on_close: Callable[[GrpcConnection], None] | None = None, limits: FloodLimits | None = None,
                 on_abuse: Callable[[str], None] | None = None, held: ByteBudget | None = None,
                 server_resets: Bucket | None = None, reads: memoryview | None = None,
                 streams: StreamBudget | None = None) -> None:
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self._paused = 0  # why reading is paused: PAUSED_WRITES (answers not taken), PAUSED_BACKLOG (frames left)
        self.h2 = H2Connection(methods, max_message, self, GrpcCall, asyncio.Queue, limits, on_abuse, held,
                               server_resets, server_streams=streams)
        self.data_received = self.h2.receive  # type: ignore[method-assign]  # for a transport that hands bytes
        # where reads go but those into a message: the server's one buffer (a read is copied out before the next)
        self._reads = reads if reads is not None else memoryview(bytearray(READ_BYTES))
        self._direct = False  # the buffer last given out is a message's (``get_buffer``)
        self.direct_most = min(DIRECT_READ_BYTES, self.h2.requests.stream_window // 4)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self.h2.direct_buffer(self.direct_most)
        self._direct = direct is not None
        return direct if direct is not None else self._reads

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self.h2.received_into(nbytes)
        else:
            self.h2.receive(self._reads[:nbytes])  # what outlives the read is copied out (``H2Connection.receive``)

    @property
    def preface_received(self) -> bool:
        return self.h2.preface_received

    @property
    def last_read(self) -> float:
        """When the connection last read anything (``time.monotonic()``)."""
        return self.h2.last_read

    @property
    def open_streams(self) -> int:
        return self.h2.open_streams

    @property
    def request_bytes_peak(self) -> int:
        return self.h2.request_bytes_peak

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # asyncio sets TCP_NODELAY only when the socket's protocol field says TCP; a PING or SETTINGS
            # acknowledgement still unacknowledged by the client would hold the next answer under Nagle's
            # algorithm until the client's delayed ACK (~40 ms)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.h2.connection_made(transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.h2.connection_lost()
        self.transport = None
        if self.on_close is not None:
            self.on_close(self)

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def close_gracefully(self) -> None:
        """Stop taking calls, answer those in flight, then close (``H2Connection.close_gracefully``)."""
        self.h2.close_gracefully()

    def close_idle(self) -> None:
        """Closed to make room for a new connection (``GrpcServer``): GOAWAY naming the last stream (a call
        crossing it is retried elsewhere by its client), then the close (its open calls cancelled)."""
        if self.transport is not None:
            if self.preface_received:
                self.transport.write(goaway_frame(self.h2.streams.last_id))
            self.transport.close()

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

    # ---- Host: what the protocol machine asks of the loop ----
    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_later(delay, callback)

    def read_later(self) -> None:
        self._pause(PAUSED_BACKLOG)
        asyncio.get_running_loop().call_soon(self._read_backlog)

    def _read_backlog(self) -> None:
        """The frames a read left (``FRAMES_PER_TURN``), handled on a later turn of the loop, then reading again."""
        self.h2.receive_backlog()
        if not self.h2.backlog:
            self._resume(PAUSED_BACKLOG)


class _Refused(asyncio.Protocol):
    """A connection past the server's cap: our SETTINGS and GOAWAY ENHANCE_YOUR_CALM, then close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        goaway = goaway_frame(0, ENHANCE_YOUR_CALM, b"too_many_connections")
        transport.write(frame(SETTINGS, 0, 0) + goaway)  # type: ignore[attr-defined]
        transport.close()


class GrpcServer:
    """Connections accepted on one listening socket: at most ``max_connections`` and ``SERVER_STREAMS`` calls open
    over them, timed out when silent before their preface or idle, a unary request that does not arrive whole
    within ``request_timeout_s`` answered DEADLINE_EXCEEDED, and stopped gracefully."""

    def __init__(self, methods: Callable[[str], Method | None], max_message: int,
                 limits: FloodLimits | None = None, on_abuse: Callable[[str], None] | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 preface_timeout_s: float = PREFACE_TIMEOUT_S, on_release: Callable[[], None] | None = None,
                 request_timeout_s: float = REQUEST_TIMEOUT_S, max_streams: int = SERVER_STREAMS) -> None:
        self.methods = methods
        self.max_message = max_message
        self.limits, self.on_abuse = limits, on_abuse
        self.on_release = on_release  # a connection that held large incomplete requests is gone (return memory)
        self.max_connections, self.idle_timeout_s, self.preface_timeout_s = \
            max_connections, idle_timeout_s, preface_timeout_s
        self.request_timeout_s = request_timeout_s
        self.streams = StreamBudget(max_streams)  # calls open over its connections
        self.held = ByteBudget(max(HELD_WORKER, 4 * max_message))  # incomplete requests over its connections
        self.resets = Bucket((limits or FloodLimits()).server_resets, time.monotonic())  # RST_STREAM, all of them
        self.connections: set[GrpcConnection] = set()
        self._room = Room()  # which connections to close for a new one past ``max_connections``
        self._reads = memoryview(bytearray(READ_BYTES))  # every connection's reads but those into a message
        self._server: asyncio.Server | None = None
        self._sweep: asyncio.TimerHandle | None = None

    connection_type = GrpcConnection  # what each accepted connection is served by

    def _connection(self) -> asyncio.Protocol:
        if len(self.connections) >= self.max_connections and not self._make_room():
            if self.on_abuse is not None:
                self.on_abuse("too_many_connections")
            return _Refused()
        conn = self.connection_type(self.methods, self.max_message, self._closed, self.limits,
                                    self.on_abuse, self.held, self.resets, self._reads, self.streams)
        self.connections.add(conn)
        return conn

    def _make_room(self) -> bool:
        """At ``max_connections``: close the connections with no call open that read nothing for longest, else
        those with calls open that read nothing for ``STALLED_S`` (a call opened and left there holds its
        connection past the idle timeout) (``transport/room.py``); whether any was (the new one takes their room)."""
        now = time.monotonic()
        waiting = (((0 if not c.open_streams else 1, c.last_read), c) for c in self.connections
                   if c.transport is not None and (not c.open_streams or now - c.last_read > STALLED_S))
        picked = self._room.pick(waiting, now)
        for conn in picked:
            conn.close_idle()
        return bool(picked)

    def _closed(self, conn: GrpcConnection) -> None:
        self.connections.discard(conn)
        if self.on_release is not None and conn.request_bytes_peak >= RELEASE_BYTES:
            self.on_release()

    def _sweep_silent(self) -> None:
        """Close connections that sent no preface in time; send GOAWAY to those idle with no call open; end unary
        calls whose request is late."""
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.transport is None:
                continue
            if not conn.preface_received and now - conn.last_read > self.preface_timeout_s:
                conn.transport.close()
            elif conn.preface_received and not conn.open_streams and now - conn.last_read > self.idle_timeout_s:
                conn.close_gracefully()
            elif conn.open_streams:
                conn.h2.expire_requests(now - self.request_timeout_s, self.request_timeout_s)
        self._sweep = asyncio.get_running_loop().call_later(min(1.0, self.preface_timeout_s / 2), self._sweep_silent)

    async def start(self, sock: Any, ssl: Any = None) -> None:
        """Accept on ``sock`` (asyncio calls ``listen`` on it again: the backlog is kept at the node's); ``ssl``:
        a server context offering ALPN ``h2`` (gRPC clients insist on it), or None for h2c."""
        self._server = await asyncio.get_running_loop().create_server(self._connection, sock=sock, backlog=BACKLOG,
                                                                      ssl=ssl)
        self._sweep_silent()

    def stop_accepting(self) -> None:
        """Close the listening socket; the connections open are served on."""
        if self._server is not None:
            self._server.close()
            self._server = None

    async def stop(self, grace: float) -> None:
        """Stop listening, send every connection GOAWAY, wait up to ``grace`` s for their calls, then close."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self.stop_accepting()
        for conn in list(self.connections):
            conn.close_gracefully()
        deadline = time.monotonic() + grace
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
