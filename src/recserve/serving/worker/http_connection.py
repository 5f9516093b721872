"""One client's HTTP/1.1 connection on a whole-query worker: requests read, handed to the plane, answers written.

A request ``POST /v2/models/<own model>[/versions/<own version>]/infer`` has its head parsed by llhttp
(``serving/transport/http1.py``) and goes to the worker's plane (``WorkerPlane.admit``): decoded, validated, queued,
computed and answered in this process.  The unversioned path is answered only by the model's default (newest
loaded) version.  Anything else (control, metrics, health, another model, chunked bodies, a model that
sub-batches) is *handed off* to the supervisor (``ConnectionManager.hand_off``, ``worker/connections.py``): only a
connection's first request pays that hop, and the connection then stays where it belongs.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass
from typing import Any

from recserve.serving.transport.h2grpc import WRITE_HIGH
from recserve.serving.transport.http1 import Head, HeadError, HeadReader, keep_alive
from recserve.serving.transport.tcp_counts import StreamCounts
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.http_closing import LINGER_S as LINGER_S  # node/handover.py's
from recserve.serving.worker.http_closing import ConnectionEnding
from recserve.serving.worker.http_responses import error_response as error_response  # node/ takes it from here
from recserve.serving.worker.large_body import LargeBody

NOTHING_YET = StreamCounts(0, 0)  # a connection this worker accepted: nothing read or written before it
PREALLOCATE_BYTES = 64 * 1024  # bodies from this size on are received in place
RECV_BYTES = 256 * 1024  # the most one read takes outside a large body (asyncio's own read size)
PIPELINE_BYTES = 64 * 1024  # a connection stops reading while a request is in flight and this much more is buffered
PAUSED_PIPELINE, PAUSED_WRITING = 1, 2  # why a connection's reading is paused (``Connection._pause``)
HEAD_ERRORS = {400: "invalid", 431: "head_too_large", 501: "unsupported"}  # ``HeadError.status`` -> error code
# A connection's shared state (``Connection.mark``), read by the supervisor if the worker dies or hangs
# (``node/watchdog.py``), two words: [MARK] idle, the bytes of it read so far (>= 0); holding a request, -1 - the
# bytes written so far.  [ANSWER_END] the bytes written once the answer being written is all given to the socket
# (0: none is, or the worker read past the request it answers: a clean end cannot be claimed).
MARK, ANSWER_END = 0, 1
READ_UNKNOWN = 2**63 - 1  # idle, bytes read unknown (the kernel did not say when this worker took the connection)
HELD_WRITTEN_UNKNOWN = -(2**63)  # holding a request, bytes written unknown


def held_state(written: int | None) -> int:
    """The shared state of a connection holding a request, ``written`` bytes of it written so far."""
    return HELD_WRITTEN_UNKNOWN if written is None else -1 - written


def written_at_hold(state: int) -> int | None:
    """The bytes written when a connection with ``state`` (< 0) was marked holding a request (None: unknown)."""
    return None if state == HELD_WRITTEN_UNKNOWN else -1 - state


@dataclass
class Request:
    method: str
    path: str
    version: str
    headers: dict[str, str]
    body: bytearray  # writable, so decoded inputs are viewed by torch without a copy
    arrived: float

    @property
    def keep_alive(self) -> bool:
        return keep_alive(self.version, self.headers)


def _encoded(headers: dict[str, str]) -> bool:
    """The body has a content coding (gzip, deflate: tritonclient's ``request_compression_algorithm``)."""
    coding = headers.get("content-encoding")
    return coding is not None and coding.strip().lower() != "identity"


class Connection(ConnectionEnding):
    """One client connection on a worker: reads requests, hands them to the plane, writes answers in order.

    The head of a request is parsed once.  A large body is received straight into a buffer of its size
    (``recv_into``: the kernel copies each byte once, into its place, and the decoded tensors view it); smaller
    reads land in the manager's one scratch buffer and are appended to the connection's buffer.
    """

    def __init__(self, manager: Any, sock: socket.socket, prefix: bytes = b"", shared: bool = False,
                 before: StreamCounts | None = NOTHING_YET) -> None:
        self.manager = manager  # the worker's ConnectionManager (``worker/connections.py``)
        self.plane = manager.plane  # the WorkerPlane (``worker/plane.py``) its requests go to
        # this process's own descriptor of the connection (its number is the slot the supervisor knows it by): the
        # transport reads and writes a duplicate, so the number stays this connection's until ``gone`` or a hand-off
        # closes it, whenever the event loop closes its copy (uvloop closes it before ``connection_lost``)
        self.sock = sock
        self.shared = shared  # the supervisor already holds this connection's descriptor (taken at accept)
        self.buf = bytearray(prefix)
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request of this connection is queued or computing (no pipelining: one at a time)
        self.requests = 0  # requests read since the manager last counted its active connections
        self.closed = False
        self.client_done = False  # the client half-closed: what it sent whole is answered, then the connection closes
        self.discarding = False  # refused: reading only to drop what the client still sends
        self.arrived = 0.0
        self._reader = HeadReader()
        self._head: tuple[int, Head] | None = None  # the pending request's (head_end, head)
        self._paused = 0  # why reading is paused: PAUSED_PIPELINE | PAUSED_WRITING
        self._needed = 0  # bytes the buffer must hold before the pending request is complete
        self._body: LargeBody | None = None  # a large body being received in place (``_start_body``)
        self._into_body = False  # the last ``get_buffer`` handed out the body's free part
        self.slot = sock.fileno()  # this connection's descriptor, its index in the manager's shared states
        states = manager.states  # this connection's row of them (``mark``), if its descriptor has one
        self._state = states[self.slot] if 0 <= self.slot < len(states) else None
        # bytes of the connection read and written before this worker took it (None: unknown), and since
        self.before = before
        self.read_here = self.written_here = 0
        self.handed_off = False
        self.leaving = False  # being handed off: no further request is read here
        self._skip = 0  # body bytes still to drop: the request was refused from its JSON header (``_shed_early``)
        self._skip_keep_alive = True
        self._closing_idle = False  # draining: closed once idle long enough (``close_idle``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        self.manager.open.add(self)
        self._publish_answer_end(-1)  # none: the row may hold an earlier connection's (as may its mark)
        self.mark(bool(self.buf))  # before the supervisor takes its copy
        self.manager.opened(self)
        self.arrived = time.perf_counter()  # of its first request, or since when it is idle
        if self.buf:
            self.manager.loop.call_soon(self._advance)

    def pause_writing(self) -> None:
        """Answers wait unsent past ``WRITE_HIGH``: the client pipelines requests but does not read the answers.
        Read no more until it does (TCP then holds it back), so that it cannot make the worker hold answers and
        requests without bound."""
        self._pause(PAUSED_WRITING)

    def resume_writing(self) -> None:
        self._resume(PAUSED_WRITING)

    def _pause(self, why: int) -> None:
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
            if why == PAUSED_PIPELINE:
                self.plane.reporter.paused_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        self._paused &= ~why
        if not self._paused and self.transport is not None and not (self.closed or self.leaving):
            self.transport.resume_reading()  # a hand-off keeps reading paused

    def _bound_pipeline(self) -> None:
        """A client that pipelines requests is read only while at most ``PIPELINE_BYTES`` wait behind the request
        being read or answered (uvicorn's flow control): TCP holds the rest back, not this process's memory."""
        if len(self.buf) > PIPELINE_BYTES + self._needed:
            self._pause(PAUSED_PIPELINE)
        elif self._paused & PAUSED_PIPELINE:
            self._resume(PAUSED_PIPELINE)

    def mark(self, in_request: bool, unanswered: int = 0) -> None:
        """Publish whether a request of this connection is read (in part or whole) and not yet answered: what the
        supervisor reads if this process dies (answer it with an error, or pass the idle connection on).  With it
        go the bytes written by then (holding a request) or read by then (idle, less ``unanswered`` ones that leave
        with it), so that the supervisor also sees a request read, or an answer written, after the last mark
        (``node/watchdog.py``)."""
        row, before = self._state, self.before
        if row is None:
            return
        if in_request:
            row[MARK] = held_state(None if before is None else before.written + self.written_here)
        else:
            row[MARK] = READ_UNKNOWN if before is None else before.read + self.read_here - unanswered

    def get_buffer(self, sizehint: int) -> memoryview:
        body = self._body
        self._into_body = body is not None and not body.whole and not self.discarding
        if self._into_body:
            return body.free()  # type: ignore[union-attr]
        return self.manager.scratch

    def buffer_updated(self, nbytes: int) -> None:
        self.read_here += nbytes
        if self._into_body:
            if self._body.received(nbytes) and not self.busy:  # type: ignore[union-attr]
                self._advance()
            return
        self.data_received(self.manager.scratch[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        """Bytes read outside a large body (request heads, small bodies, what follows a body)."""
        if self.discarding:
            return
        if self._skip:
            take = min(len(data), self._skip)
            self._skip -= take
            if self._skip:
                return
            self.buf += data[take:]  # what follows the refused body: the next request
            self.answered(self._skip_keep_alive)
            return
        if self._body is not None:  # the rest of a body started from bytes already buffered
            rest = self._body.take(data)
            if rest:
                self.buf += rest
            if self._body.whole and not self.busy:
                self._advance()
            return
        if not self.buf:
            self.arrived = time.perf_counter()
            self.mark(True)
        self.buf += data
        if self.busy:
            self._bound_pipeline()
        elif len(self.buf) >= self._needed:
            self._advance()

    def eof_received(self) -> bool:
        """The client half-closed after its requests (``nc -N`` does, and a proxy may): those it sent whole are still
        answered, then the connection closes (``_advance``); one it cut short is not waited for."""
        self.client_done = True
        if self.busy:
            return True
        if self.buf or self._body is not None:
            self.manager.loop.call_soon(self._advance)
            return True
        return False  # nothing to answer: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and (self._head is not None or self._body is not None):
            self.plane.refused("client_gone")  # it left before its request arrived whole
        if self._body is not None:  # a large body never completed: its memory is returned once the worker is idle
            self._body.release()
            self._body = None
            self.plane.reporter.trim_wanted = True
        self.closed = True
        self.manager.open.discard(self)
        self.mark(False)
        if not self.handed_off:
            self.manager.gone(self)
        self.plane.maybe_exit()

    def _advance(self) -> None:
        """Parse the next complete request, if any, and route it; then read on only if little more is buffered."""
        self._next_request()
        if self.client_done and not self.busy and not self.leaving:  # a half-closed client's requests are answered
            if self._head is not None or self._body is not None:
                self.plane.refused("client_gone")  # it left before its request arrived whole
            self.write(b"", close=True)
        if not self.closed:
            self._bound_pipeline()

    def _next_request(self) -> None:
        if self.closed or self.busy or self.leaving or self._skip or self.transport is None:
            return
        if self._head is None and not self._read_head():
            return
        head_end, head = self._head  # type: ignore[misc]
        headers = head.headers
        if self._body is not None:
            if not self._body.whole:
                return
            body, self._body = self._body.release(), None
        elif len(self.buf) < self._needed:
            waits = (head.version == "HTTP/1.1" and headers.get("expect", "").lower() == "100-continue"
                     and len(self.buf) == head_end)  # an HTTP/1.0 client's expectation is ignored (RFC 9110 10.1.1)
            if self._needed - head_end >= PREALLOCATE_BYTES and not self._shed_early(head_end, headers,
                                                                                     head.version):
                self._start_body(head_end, headers.get("inference-header-content-length", ""))
            if waits and not self.closed:  # not before a refusal: the client would send the body for nothing
                self._send(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.mark(True)  # what it wrote is no answer
            return
        else:
            body = self.buf[head_end : self._needed]
            del self.buf[: self._needed]
        self._head, self._needed = None, 0
        self.busy = True
        self.requests += 1
        self.plane.admit(self, Request(head.method, head.path, head.version, headers, body, self.arrived))

    def _start_body(self, head_end: int, json_length: str) -> None:
        """Receive the rest of a large body straight into a buffer of its size (``worker/large_body.py``), or
        refuse it (503) while the bodies being received hold the worker's budget."""
        size, bodies = self._needed - head_end, self.manager.bodies
        self._body = LargeBody.start(bodies, size, json_length, bytes(self.buf[:head_end]), self.buf[head_end:])
        if self._body is None:
            self.refuse(InferError("unavailable", f"request bodies being received hold {bodies.limit} bytes of this "
                                   "worker; retry"))
            return
        self.plane.reporter.took_large_input(size)
        self.buf.clear()

    def pending(self) -> bytes:
        """Everything read and not yet answered, as received (what a hand-off passes on)."""
        return bytes(self.buf) if self._body is None else self._body.pending() + bytes(self.buf)

    def _read_head(self) -> bool:
        """Parse the head; True if the request is ours to read on, False if answered, handed off or incomplete.

        A head llhttp refuses is answered 400 (431 past 64 KiB, 501 for a transfer coding other than chunked) and
        the connection closed.  A chunked body goes to the supervisor's aiohttp app, whose llhttp reads it: this
        reader frames bodies by their length only (its in-place receive needs the size up front)."""
        try:
            got = self._reader.read(self.buf)
        except HeadError as exc:
            self.refuse(InferError(HEAD_ERRORS.get(exc.status, "invalid"), f"request: {exc}"))
            return False
        if got is None:
            return False
        head_end, head = got
        if head.chunked or _encoded(head.headers) or not self.plane.serves(head.method, head.path):
            # the supervisor's aiohttp app reads chunked and compressed bodies (bounded as they inflate), and
            # every other route
            self.manager.hand_off(self)
            return False
        limit = self.plane.limits.max_body
        if head.length > limit:
            self.refuse(InferError("too_large", f"body: {head.length} bytes exceed the limit of {limit}", "body"))
            return False
        self._head, self._needed = got, head_end + head.length
        return True

    def _send(self, data: bytes) -> None:
        self.transport.write(data)  # type: ignore[union-attr]
        self.written_here += len(data)

    def _publish_answer_end(self, length: int) -> None:
        """Before an answer of ``length`` bytes is written: the written count at its end, so that the supervisor can
        tell an answer given whole to the socket from one cut off by this worker's death (none claimed with bytes
        read ahead, or with ``length`` -1)."""
        if self._state is not None:
            clean = length >= 0 and self.before is not None and not self.buf
            self._state[ANSWER_END] = self.before.written + self.written_here + length if clean else 0

    def write(self, data: bytes, close: bool = False) -> None:
        if self.transport is None or self.closed:
            return
        self._publish_answer_end(len(data))
        self._send(data)
        if close:
            self.transport.close()
            self.closed = True

    def answered(self, keep_alive: bool) -> None:
        """The current request is answered: read on, or close."""
        self.busy = False
        if not keep_alive:
            if self.plane.admission.draining:  # the client may have sent more: it reads this answer, not a reset
                self.linger_close()
            else:
                self.write(b"", close=True)
            return
        self.arrived = time.perf_counter()  # of the next request if it is here, else since when it is idle
        if self.client_done:  # no more will come: answer what it sent, then close (``_advance``)
            self.manager.loop.call_soon(self._advance)
            return
        if not self.buf:
            self.mark(False)
            if self.manager.maybe_move(self):
                return
        else:
            self.mark(True)  # the next request, pipelined: held with what is written now
        self.manager.loop.call_soon(self._advance)
