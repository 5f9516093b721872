"""Accelerator workers: large queries of a model computed on a GPU (or a many-threaded CPU worker), fused.

Why (issue #16, DeepRecSys' accelerator offload, Hercules' and Triton's query fusion): a batch-1 query costs
less on a CPU core than a kernel launch plus two copies, while a batch-4096 query runs 2-100x faster on a GPU.
So a model may have, beside its CPU workers, *accelerator workers* that accept no client connections.  A CPU
worker decodes and validates every query as before; one with at least ``min_items`` items is sent to an
accelerator worker over that worker's Unix socket (the one with the fewest outstanding queries) and answered
from its reply, while the CPU worker's loop keeps serving small queries.  The accelerator worker fuses the
queries waiting on all its connections into one pass of at most ``fuse_items`` items, waiting at most
``fuse_delay_us`` for more (Triton's ``max_queue_delay``), copies inputs to the device once per pass and the
scores back, and splits them per query.

Frames on the socket (little endian; raw array bytes, never pickled tensors):

- request: ``REQUEST`` header (id, items B, dense width D, tables T, ids N, microseconds left until the query's
  deadline) then dense f32 ``[B, D]``, values i64 ``[N]``, lengths i32 ``[T, B]``.
- reply: ``REPLY`` header (id, status, rows, columns) then f32 ``[rows, columns]`` scores (status 0) or
  ``columns`` bytes of UTF-8 error message (status: the error code's index in ``ERROR_CODES``, from 1).

The deadline travels with the query because the accelerator worker's queue is where a burst waits: a query
whose deadline passed is answered 504 without computing it, and one that cannot finish in time by the worker's
online fit of its pass time (``dataplane.ServiceTime``) is shed at once with 503, so an overload never leaves a
backlog of abandoned work in front of new queries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import struct
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.serving.dataplane import ServiceTime
from recserve.serving.errors import InferError

log = logging.getLogger("recserve.serving")

REQUEST = struct.Struct("<QIIIQQ")
REPLY = struct.Struct("<QBxxxII")
OK = 0
ERROR_CODES = ("internal", "unavailable", "deadline")  # reply status i + 1
# A large query is megabytes (hera-dlrm-a: 1.4 MB at 256 items): with asyncio's 64 KiB stream limit and the
# default socket buffers it crossed the socket in dozens of wake-ups (+2 ms); these let it cross in a few.
STREAM_LIMIT = 16 * 1024 * 1024
SOCKET_BUFFER = 4 * 1024 * 1024


def _widen(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError:
                pass  # the kernel's cap applies
STOP_GRACE_S = 10.0

Done = Callable[[np.ndarray | None, InferError | None], None]


def request_frame(request_id: int, arrays: tuple[np.ndarray, ...], budget_s: float) -> list[bytes | memoryview]:
    """A query as frame pieces (header, then each array's bytes without a copy where it is contiguous)."""
    dense, values, lengths = arrays
    lengths = lengths if lengths.dtype == np.int32 else lengths.astype(np.int32)  # sums fit: bounded by the body
    budget_us = max(0, int(budget_s * 1e6))
    header = REQUEST.pack(request_id, dense.shape[0], dense.shape[1], lengths.shape[0], values.shape[0], budget_us)
    return [header, *(memoryview(np.ascontiguousarray(a)).cast("B") for a in (dense, values, lengths))]


async def read_request(reader: asyncio.StreamReader) -> tuple[int, tuple[np.ndarray, ...], float]:
    """(id, arrays, deadline on this process's ``perf_counter``)."""
    request_id, items, width, tables, ids, budget_us = REQUEST.unpack(await reader.readexactly(REQUEST.size))
    deadline = time.perf_counter() + budget_us / 1e6
    dense = np.frombuffer(await reader.readexactly(items * width * 4), np.float32).reshape(items, width)
    values = np.frombuffer(await reader.readexactly(ids * 8), np.int64)
    lengths = np.frombuffer(await reader.readexactly(tables * items * 4), np.int32).reshape(tables, items)
    return request_id, (dense, values, lengths), deadline


def reply_frame(request_id: int, scores: np.ndarray | None, error: InferError | None = None) -> bytes:
    if scores is None:
        error = error or InferError("internal", "no scores")
        code = error.code if error.code in ERROR_CODES else "internal"
        message = str(error).encode()
        return REPLY.pack(request_id, ERROR_CODES.index(code) + 1, 0, len(message)) + message
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    return REPLY.pack(request_id, OK, scores.shape[0], scores.shape[1]) + scores.tobytes()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, np.ndarray | None, InferError | None]:
    request_id, status, rows, columns = REPLY.unpack(await reader.readexactly(REPLY.size))
    if status != OK:
        message = (await reader.readexactly(columns)).decode(errors="replace")
        code = ERROR_CODES[status - 1] if status <= len(ERROR_CODES) else "internal"
        return request_id, None, InferError(code, message)
    scores = np.frombuffer(await reader.readexactly(rows * columns * 4), np.float32).reshape(rows, columns)
    return request_id, scores, None


# ---------------------------------------------------------------------------------------- accelerator worker


@dataclass
class Waiting:
    writer: asyncio.StreamWriter
    request_id: int
    arrays: tuple[np.ndarray, ...]
    items: int
    arrived: float
    deadline: float


class AcceleratorServer:
    """The accelerator worker's loop: read framed queries from every CPU worker, fuse, compute, reply.

    ``compute`` is the model path's fused pass (``ModelPath.compute``: ``concat_arrays``, one forward pass on the
    device, scores split per query), so fusion has one implementation for both kinds of worker.
    """

    def __init__(self, compute: Callable[[list[tuple]], list[np.ndarray]], fuse_items: int, fuse_delay_us: int,
                 report: Callable[[int, int, float], None]) -> None:
        self.compute = compute
        self.fuse_items = fuse_items
        self.fuse_delay_s = fuse_delay_us / 1e6
        self.report = report  # (items, queries, seconds) of each pass, for the node's metrics
        self.service = ServiceTime()
        self.queue: deque[Waiting] = deque()
        self.queued_items = 0
        self.arrival = asyncio.Event()
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # torch only reads

    async def serve(self, path: str) -> asyncio.AbstractServer:
        if os.path.exists(path):
            os.unlink(path)  # a dead predecessor's socket file
        server = await asyncio.start_unix_server(self._connection, path=path, limit=STREAM_LIMIT)
        asyncio.get_running_loop().create_task(self._run())
        return server

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _widen(writer)
        try:
            while True:
                request_id, arrays, deadline = await read_request(reader)
                self._admit(Waiting(writer, request_id, arrays, arrays[0].shape[0], time.perf_counter(), deadline))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # closed, or the worker exits
            writer.close()

    def _admit(self, w: Waiting) -> None:
        """Queue a query if the work ahead of it, by this worker's fit, leaves it time to finish; else 503 now."""
        if self.queue:
            total = self.queued_items + w.items
            finish = w.arrived + self.service.predict(total, -(-total // self.fuse_items))
            if finish > w.deadline:
                self._write(w, reply_frame(w.request_id, None, InferError(
                    "unavailable", f"accelerator worker overloaded: the query would finish "
                                   f"{(finish - w.deadline) * 1e3:.1f} ms after its deadline; retry later")))
                return
        self.queue.append(w)
        self.queued_items += w.items
        self.arrival.set()

    async def _run(self) -> None:
        while True:
            if not self.queue:
                self.arrival.clear()
                await self.arrival.wait()
            await self._gather()
            self._pass(self._take())
            await asyncio.sleep(0)  # read what arrived during the pass before the next one

    async def _gather(self) -> None:
        """Wait for more queries until the pass is full or the oldest has waited ``fuse_delay_us``."""
        while self.queued_items < self.fuse_items:
            left = self.queue[0].arrived + self.fuse_delay_s - time.perf_counter()
            if left <= 0:
                return
            self.arrival.clear()
            try:
                await asyncio.wait_for(self.arrival.wait(), left)
            except TimeoutError:
                return

    def _take(self) -> list[Waiting]:
        """The next pass: queued queries up to ``fuse_items``; those past their deadline are answered 504 here."""
        group, total, now = [], 0, time.perf_counter()
        while self.queue and (not group or total + self.queue[0].items <= self.fuse_items):
            w = self.queue.popleft()
            self.queued_items -= w.items
            if w.deadline < now:
                self._write(w, reply_frame(w.request_id, None, InferError(
                    "deadline", f"deadline exceeded: {(now - w.arrived) * 1e3:.1f} ms queued at the accelerator")))
                continue
            group.append(w)
            total += w.items
        return group

    def _pass(self, group: list[Waiting]) -> None:
        if not group:
            return
        start = time.perf_counter()
        try:
            answers = self.compute([w.arrays for w in group])
        except Exception as exc:  # noqa: BLE001 - every query is answered; the worker lives on
            error = InferError("internal", f"accelerator pass failed: {type(exc).__name__}: {exc}")
            for w in group:
                self._write(w, reply_frame(w.request_id, None, error))
            return
        items, seconds = sum(w.items for w in group), time.perf_counter() - start
        self.service.observe(items, seconds)
        self.report(items, len(group), seconds)
        for w, scores in zip(group, answers, strict=True):
            self._write(w, reply_frame(w.request_id, scores))

    @staticmethod
    def _write(w: Waiting, frame: bytes) -> None:
        if not w.writer.is_closing():
            w.writer.write(frame)


# ---------------------------------------------------------------------------------------- CPU worker side


class Link:
    """One CPU worker's connection to one accelerator worker; queries outstanding on it by request id."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: asyncio.StreamWriter | None = None
        self.connecting: asyncio.Future | None = None
        self.outstanding: dict[int, Done] = {}

    async def connect(self) -> asyncio.StreamWriter:
        if self.writer is not None and not self.writer.is_closing():
            return self.writer
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(asyncio.open_unix_connection(self.path, limit=STREAM_LIMIT))
        try:
            reader, writer = await asyncio.shield(self.connecting)
        finally:
            self.connecting = None
        if self.writer is None or self.writer.is_closing():
            _widen(writer)
            self.writer = writer
            asyncio.get_running_loop().create_task(self._read(reader, writer))
        return self.writer

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_id, scores, error = await read_reply(reader)
                done = self.outstanding.pop(request_id, None)
                if done is not None:
                    done(scores, error)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        if self.writer is writer:
            self.writer = None
        writer.close()
        self.fail_all(f"accelerator worker at {self.path} closed the connection")

    def fail_all(self, why: str) -> None:
        waiting, self.outstanding = self.outstanding, {}
        for done in waiting.values():
            done(None, InferError("unavailable", f"{why}; the query was not answered, retry"))


class AcceleratorClient:
    """Sends a CPU worker's large queries to the accelerator workers and calls back with their scores.

    Never a hang: a dead or unreachable accelerator worker is 503 at once, a silent one 504 at the deadline.
    """

    def __init__(self, model_name: str, sockets: list[str], min_items: int, limit: int) -> None:
        self.model_name = model_name
        self.min_items = min_items
        self.limit = limit  # queries outstanding per accelerator worker from this CPU worker; more -> 503
        self.links: list[Link] = []
        self._ids = itertools.count(1)
        self.set_sockets(sockets)

    def set_sockets(self, sockets: list[str]) -> None:
        """The accelerator workers now running (the supervisor broadcasts them when their pool changes)."""
        keep = {link.path: link for link in self.links}
        self.links = [keep.get(path) or Link(path) for path in sockets]

    def takes(self, items: int) -> bool:
        return items >= self.min_items

    def submit(self, arrays: tuple[np.ndarray, ...], deadline: float, done: Done) -> None:
        """Send one validated query; ``done`` is called exactly once (scores, or the error)."""
        if not self.links:
            done(None, InferError("unavailable", f"model {self.model_name!r} has no accelerator worker running"))
            return
        link = min(self.links, key=lambda k: len(k.outstanding))
        if len(link.outstanding) >= self.limit:
            done(None, InferError("unavailable", f"model {self.model_name!r}: accelerator workers are overloaded "
                                                 f"({self.limit} queries outstanding each); retry later"))
            return
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(max(0.0, deadline - time.perf_counter()), self._expire, link, request_id)

        def finish(scores: np.ndarray | None, error: InferError | None) -> None:
            timer.cancel()
            done(scores, error)

        link.outstanding[request_id] = finish
        task = loop.create_task(self._send(link, request_id, arrays, deadline))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _send(self, link: Link, request_id: int, arrays: tuple[np.ndarray, ...], deadline: float) -> None:
        try:
            writer = await link.connect()
            writer.writelines(request_frame(request_id, arrays, deadline - time.perf_counter()))
        except (OSError, ConnectionError) as exc:
            done = link.outstanding.pop(request_id, None)
            if done is not None:
                done(None, InferError("unavailable", f"model {self.model_name!r}: accelerator worker at "
                                                     f"{link.path} is unreachable ({exc}); retry"))

    def _expire(self, link: Link, request_id: int) -> None:
        done = link.outstanding.pop(request_id, None)
        if done is not None:
            done(None, InferError("deadline", f"model {self.model_name!r}: deadline exceeded waiting for the "
                                              "accelerator worker"))


# ---------------------------------------------------------------------------------------- device pass


def device_runner(model: Any, device: str) -> Callable[[tuple], np.ndarray]:
    """One forward pass of a query on ``device``: inputs copied host -> device, scores back (numpy).

    The model is moved to the device once, here; on ``cpu`` nothing moves.
    """
    import torch

    from recserve.zoo.batch import QueryBatch

    target = torch.device(device)
    if target.type != "cpu":
        model.to(target)

    def run(arrays: tuple) -> np.ndarray:
        dense, values, lengths = (torch.from_numpy(a).to(target, non_blocking=True) for a in arrays)
        return model(QueryBatch(dense, values, lengths)).cpu().numpy()

    return run


async def serve_accelerator(conn: Any, args: Any, model: Any) -> None:
    """Entry of an accelerator worker (``worker_main`` with stage ``accel``): serve its socket until told to stop."""
    from recserve.serving.dataplane import make_model_path

    loop = asyncio.get_running_loop()
    accel = args.model_config.accelerator
    stop = asyncio.Event()

    def send(msg: Any) -> None:
        try:
            conn.send(msg)
        except (BrokenPipeError, OSError):
            stop.set()

    def report(items: int, queries: int, seconds: float) -> None:
        send(("stats", [("pass", items, queries, seconds)]))

    run = device_runner(model, accel.device)
    path = make_model_path(model, args.model_config.name, args.info, args.model_config.max_batch_size, run, 0)
    server = AcceleratorServer(path.compute, accel.fuse_items, accel.fuse_delay_us, report)
    listening = await server.serve(args.accel_socket)

    def on_pipe() -> None:
        try:
            while conn.poll():
                if conn.recv() is None:
                    stop.set()
        except (EOFError, OSError):
            stop.set()

    loop.add_reader(conn.fileno(), on_pipe)
    send(("ready", os.getpid(), []))
    await stop.wait()
    listening.close()
    end = time.monotonic() + STOP_GRACE_S
    while server.queue and time.monotonic() < end:  # queries already sent are answered before the exit
        await asyncio.sleep(0.005)
