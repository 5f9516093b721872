"""Data plane v2: a model worker accepts, decodes, computes and answers its own model's queries.

Why (issue #14, measured with ``benchmarks/bench_serving_overhead.py`` on a 2-core host): with one front-end
process decoding every query and shipping it to the workers over pipes, the pipe hop alone cost 0.63 ms at
batch 1 and the front end 0.8–2.9 ms of CPU per query, so a node served about one core's worth of queries
whatever its worker count.  Here every worker of a whole-query (``mode: model``) model runs this loop:

- The node's HTTP listening socket is created once by the supervisor and inherited by every such worker; they
  all ``accept`` from its one queue (no SO_REUSEPORT: a worker that retires or dies drops no backlog).
- A request ``POST /v2/models/<own model>[/versions/<own version>]/infer`` is parsed with a minimal HTTP/1.1
  reader, decoded and validated with the shared protocol codec, computed in this process and answered: no other
  process touches it.  The unversioned path is answered only by the model's default (newest loaded) version.
- Anything else (control, metrics, health, another model, chunked bodies, a model that sub-batches) is *handed
  off*: the connection's descriptor and the bytes already read go to the supervisor over the worker's socket
  pair (SCM_RIGHTS), which passes it to a worker of the right model or serves it in its own aiohttp app.  A
  connection is handed off once and then stays where it belongs: only its first request pays the hop.
- Queries wait in a bounded local FIFO (``queue_limit`` split over the workers); past it they get 503.
- Completed queries are reported to the supervisor in small batches (one ``/stats`` and Prometheus view per
  node, whatever the process layout).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("recserve.serving")

MAX_HEAD_BYTES = 64 * 1024
STATS_FLUSH_S = 0.005  # completed-query records reach the supervisor within this delay
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable"}


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
        conn = self.headers.get("connection", "").lower()
        return conn != "close" if self.version == "HTTP/1.1" else conn == "keep-alive"


class ParseError(Exception):
    """The bytes on a connection are not an HTTP/1.x request we can read; answered with 400 and closed."""


def parse_head(buf: bytearray) -> tuple[int, str, str, str, dict[str, str]] | None:
    """``(head_end, method, path, version, headers)`` once the head is complete, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise ParseError(f"request head longer than {MAX_HEAD_BYTES} bytes")
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise ParseError(f"not an HTTP/1.x request line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ParseError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return end + 4, parts[0], parts[1], parts[2], headers


def response_bytes(status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None,
                   close: bool = False) -> bytes:
    head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in (extra or {}).items()]
    if close:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def error_bytes(status: int, message: str, field: str | None = None, close: bool = False) -> bytes:
    body: dict[str, Any] = {"error": message}
    if field:
        body["field"] = field
    return response_bytes(status, json.dumps(body).encode(), "application/json", close=close)


class Connection(asyncio.Protocol):
    """One client connection on a worker: reads requests, hands them to the plane, writes answers in order."""

    def __init__(self, plane: WorkerPlane, prefix: bytes = b"") -> None:
        self.plane = plane
        self.buf = bytearray(prefix)
        self.transport: asyncio.Transport | None = None
        self.busy = False  # a request of this connection is queued or computing (no pipelining: one at a time)
        self.closed = False
        self.arrived = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.plane.connections.add(self)
        if self.buf:
            self.arrived = time.perf_counter()
            self.plane.loop.call_soon(self._advance)

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.arrived = time.perf_counter()
        self.buf += data
        if not self.busy:
            self._advance()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.plane.connections.discard(self)
        self.plane.maybe_exit()

    def _advance(self) -> None:
        """Parse the next complete request, if any, and route it."""
        if self.closed or self.busy or self.transport is None:
            return
        try:
            head = parse_head(self.buf)
        except ParseError as exc:
            self.write(error_bytes(400, f"request: {exc}", close=True), close=True)
            return
        if head is None:
            return
        head_end, method, path, version, headers = head
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.plane.hand_off(self)  # rare for inference clients: aiohttp in the supervisor reads it
            return
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            self.write(error_bytes(400, "Content-Length: not an integer", "Content-Length", close=True), close=True)
            return
        if not self.plane.serves(method, path):
            self.plane.hand_off(self)
            return
        if length > self.plane.max_body:
            self.write(error_bytes(413, f"body: {length} bytes exceed the limit of {self.plane.max_body}", "body",
                                   close=True), close=True)
            return
        if len(self.buf) < head_end + length:
            if headers.get("expect", "").lower() == "100-continue" and len(self.buf) == head_end:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        end = head_end + length
        body = self.buf[head_end:end]
        del self.buf[:end]
        self.busy = True
        self.plane.admit(self, Request(method, path, version, headers, body, self.arrived))

    def write(self, data: bytes, close: bool = False) -> None:
        if self.transport is None or self.closed:
            return
        self.transport.write(data)
        if close:
            self.transport.close()
            self.closed = True

    def answered(self, keep_alive: bool) -> None:
        """The current request is answered: read on, or close."""
        self.busy = False
        if not keep_alive:
            self.write(b"", close=True)
            return
        if self.buf:
            self.arrived = time.perf_counter()
        self.plane.loop.call_soon(self._advance)


class WorkerPlane:
    """The worker's event loop side: listening socket, connections, local FIFO, stats and hand-offs."""

    def __init__(self, loop: asyncio.AbstractEventLoop, model_name: str, infer: Callable[[bytearray, str | None, dict],
                 tuple[bytes, dict[str, str]]], send: Callable[[Any], None], hand_off: Callable[[int, bytes], None],
                 max_body: int, queue_limit: int, sub_batch: int, version: str = "1", default: bool = True) -> None:
        self.loop = loop
        self.model_name = model_name
        self.infer = infer
        self.send = send
        self._hand_off = hand_off
        self.max_body = max_body
        self.queue_limit = max(1, queue_limit)
        self.sub_batch = sub_batch
        self.connections: set[Connection] = set()
        self.queue: collections.deque[tuple[Connection, Request]] = collections.deque()
        self.server: asyncio.base_events.Server | None = None
        self.draining = False  # finish what is queued; answer 503 to new requests
        self.retiring = False  # hand every connection to the supervisor, then exit
        self.exit_event = asyncio.Event()
        self._records: list[tuple] = []
        self._flush_at: asyncio.TimerHandle | None = None
        self._running = False
        self.version = version
        self._paths: set[str] = set()
        self.set_default(default)

    # ---- set-up ------------------------------------------------------------------------------------
    async def listen(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.server = await self.loop.create_server(lambda: Connection(self), sock=sock, start_serving=True)

    async def adopt(self, fd: int, prefix: bytes) -> None:
        """Serve a connection handed over by the supervisor (``prefix``: bytes already read from it)."""
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        await self.loop.connect_accepted_socket(lambda: Connection(self, prefix), sock)

    def set_default(self, default: bool) -> None:
        """The unversioned path is answered only by the model's default (newest loaded) version."""
        prefix = f"/v2/models/{self.model_name}"
        self._paths = {f"{prefix}/versions/{self.version}/infer"} | ({prefix + "/infer"} if default else set())

    def serves(self, method: str, path: str) -> bool:
        return (method == "POST" and path.partition("?")[0] in self._paths and self.sub_batch <= 0
                and not self.retiring)

    # ---- queries -----------------------------------------------------------------------------------
    def admit(self, conn: Connection, req: Request) -> None:
        if self.draining:
            self._answer_error(conn, req, 503, f"model {self.model_name!r} is not accepting queries (shutting down)",
                               "unavailable")
            return
        if len(self.queue) >= self.queue_limit:
            self._answer_error(conn, req, 503, f"model {self.model_name!r} is overloaded: {len(self.queue)} queries "
                                               f"queued at this worker (limit {self.queue_limit}); retry later",
                               "unavailable")
            return
        self.queue.append((conn, req))
        if not self._running:
            self._running = True
            self.loop.call_soon(self._run_next)

    def _run_next(self) -> None:
        """Compute one queued query, then yield to the loop so new requests are read (and admitted) in between."""
        if not self.queue:
            self._running = False
            self.maybe_exit()
            return
        conn, req = self.queue.popleft()
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                payload, headers = self.infer(req.body, req.headers.get("inference-header-content-length"),
                                              req.headers)
        except Exception as exc:  # noqa: BLE001 - every failure is answered; the worker lives on
            status, code, field = _status_of(exc)
            self._answer_error(conn, req, status, str(exc), code, field, start)
        else:
            done = time.perf_counter()
            items = int(headers.pop("X-Recserve-Items", "0"))
            content_type = headers.pop("Content-Type")
            conn.write(response_bytes(200, payload, content_type, headers, close=not req.keep_alive))
            self._record(("done", items, done - req.arrived, start - req.arrived, done - start))
            conn.answered(req.keep_alive)
        self.loop.call_soon(self._run_next)

    def _answer_error(self, conn: Connection, req: Request, status: int, message: str, code: str,
                      field: str | None = None, start: float | None = None) -> None:
        conn.write(error_bytes(status, message, field, close=not req.keep_alive))
        self._record(("failed", code, time.perf_counter() - req.arrived, start is not None))
        conn.answered(req.keep_alive)

    # ---- stats to the supervisor -----------------------------------------------------------------------
    def _record(self, record: tuple) -> None:
        self._records.append(record)
        if self._flush_at is None:
            self._flush_at = self.loop.call_later(STATS_FLUSH_S, self.flush)

    def flush(self) -> None:
        self._flush_at = None
        if self._records:
            records, self._records = self._records, []
            self.send(("stats", records))

    # ---- hand-off, drain, retire ---------------------------------------------------------------------
    def hand_off(self, conn: Connection) -> None:
        """Give the connection (and what was read of it) to the supervisor; once its writes are flushed."""
        transport = conn.transport
        if transport is None or conn.closed:
            return
        if transport.get_write_buffer_size():
            self.loop.call_later(0.001, self.hand_off, conn)
            return
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        fd = os.dup(sock.fileno())
        prefix = bytes(conn.buf)
        conn.closed = True
        transport.abort()  # closes this process's descriptor; the dup keeps the connection open
        self.connections.discard(conn)
        try:
            self._hand_off(fd, prefix)
        finally:
            os.close(fd)

    def drain(self) -> None:
        """Shutdown: stop accepting, finish what is queued, refuse the rest with 503."""
        self.draining = True
        self._stop_listening()

    def retire(self) -> None:
        """Resize down: stop accepting, finish what is queued, hand idle connections on, then exit."""
        self.retiring = True
        self._stop_listening()
        self.maybe_exit()

    def _stop_listening(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def maybe_exit(self) -> None:
        if not self.retiring:
            return
        for conn in list(self.connections):
            if not conn.busy and not conn.closed:
                if self.draining:  # the node is shutting down: nobody to hand it to
                    conn.write(b"", close=True)
                    self.connections.discard(conn)
                else:
                    self.hand_off(conn)
        if not self.queue and not self.connections:
            self.flush()
            self.exit_event.set()


def _status_of(exc: Exception) -> tuple[int, str, str | None]:
    """HTTP status, error code and field of a failed query (the one table in ``serving/errors.py``)."""
    from recserve.serving.errors import STATUS

    code = getattr(exc, "code", "internal") if isinstance(getattr(exc, "code", None), str) else "internal"
    return STATUS.get(code, STATUS["internal"]).http, code, getattr(exc, "field", None)


def make_infer(model: Any, model_name: str, info: Any, max_batch_size: int, run: Callable[[tuple], np.ndarray],
               version: str = "1"):
    """The worker's whole-query path: decode → validate → model → encode (the same codec as the supervisor's)."""
    from recserve.serving import protocol
    from recserve.serving.runtime import InferError
    from recserve.zoo.batch import BatchError, QueryBatch

    def infer(body: bytes | bytearray, header_length: str | None, _headers: dict) -> tuple[bytes, dict[str, str]]:
        req, arrays = protocol.parse_http_infer(body, header_length)
        protocol.check_outputs([o.get("name") for o in req.get("outputs") or [] if isinstance(o, dict)])
        try:
            batch = QueryBatch.from_arrays(arrays)
            batch.validate(info.dense_in, info.rows, info.seq_lens, max_batch_size)
        except BatchError as exc:
            raise InferError("invalid", str(exc), exc.field) from exc
        scores = run((batch.dense.numpy(), batch.values.numpy(), batch.lengths.numpy()))
        payload, headers = protocol.http_infer_response(model_name, req, scores, version)
        headers["X-Recserve-Items"] = str(batch.size)
        return payload, headers

    return infer
