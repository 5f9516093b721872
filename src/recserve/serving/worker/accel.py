"""Accelerator workers: large queries of a model computed on a GPU (or a many-threaded CPU worker), fused.

Why (DeepRecSys' accelerator offload, Hercules' and Triton's query fusion;
docs/decisions/2026-11-22-accelerator-workers-over-unix-sockets.md): a batch-1 query costs less on a CPU core than a
kernel launch plus two copies, while a batch-4096 query runs 2-100x faster on a GPU.  So a model may have, beside its
CPU workers, *accelerator workers* that accept no client connections.  A CPU worker decodes and validates every query
as before; one with at least ``min_items`` items is sent to an accelerator worker over that worker's Unix socket (the
one with the fewest outstanding queries) and answered from its reply, while the CPU worker's loop keeps serving small
queries.  The accelerator worker fuses the queries waiting on all its connections into one pass of at most
``fuse_items`` items, waiting at most ``fuse_delay_us`` for more (Triton's ``max_queue_delay``), copies inputs to the
device once per pass and the scores back, and splits them per query.

Queries reach an accelerator worker over a link (``worker/links.py``: frames, staging arena, deadlines).  A query
whose deadline passed is answered 504 without computing it, and one that cannot finish in time by the worker's online
fit of its pass time (``admission.ServiceTime``) is shed at once with 503, so an overload never leaves a backlog of
abandoned work in front of new queries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.serving.wire import pipe
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.admission import ServiceTime
from recserve.serving.worker.links import (
    LinkClient,
    reply_frame,
    serve_links,
)

log = logging.getLogger("recserve.serving")

STOP_GRACE_S = 10.0  # an accelerator worker told to stop finishes its passes this long at most


# ---------------------------------------------------------------------------------------- accelerator worker


@dataclass
class Waiting:
    """A query read from a link, waiting for its fused pass."""

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
                 report: Callable[[int, int, float], None],
                 adopt: Callable[[np.ndarray], None] = lambda arena: None,
                 forget: Callable[[np.ndarray], None] = lambda arena: None, pass_thread: bool = False) -> None:
        self.compute = compute
        self.pass_thread = pass_thread  # passes off the loop (``ComputeThread``), so it reads and answers meanwhile
        self._thread: Any = None
        self.pass_started = 0.0  # perf_counter of the pass in flight, 0 when none (the heartbeat reports its age)
        self.adopt = adopt  # called with each mapped arena (a GPU worker registers it as pinned memory) ...
        self.forget = forget  # ... and this when its connection ends (queued views of it stay valid: mapped)
        self.fuse_items = fuse_items
        self.fuse_delay_s = fuse_delay_us / 1e6
        self.report = report  # (items, queries, seconds) of each pass, for the node's metrics
        self.service = ServiceTime()
        self.queue: deque[Waiting] = deque()
        self.queued_items = 0
        self.arrival = asyncio.Event()
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # torch only reads

    async def serve(self, path: str) -> asyncio.AbstractServer:
        server = await serve_links(path, self._request, lambda arena: self.adopt(arena),
                                   lambda arena: self.forget(arena))
        asyncio.get_running_loop().create_task(self._run())
        return server

    def _request(self, writer: asyncio.StreamWriter, request_id: int, arrays: tuple[np.ndarray, ...],
                 deadline: float) -> None:
        self._admit(Waiting(writer, request_id, arrays, arrays[0].shape[0], time.perf_counter(), deadline))

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
            await self._pass(self._take())
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

    def pass_age(self) -> float:
        """Seconds the pass in flight has run (0: none), for the heartbeat: a pass that never ends is a hang."""
        return time.perf_counter() - self.pass_started if self.pass_started else 0.0

    async def _compute(self, arrays: list[tuple]) -> list[np.ndarray]:
        """One pass, inline or (``pass_thread``) on a compute thread at the loop's priority: torch releases the GIL
        while the device works, so the loop reads and answers meanwhile.  Off by default: on a GPU host neither setting
        was better beyond the run-to-run spread (docs/decisions/2026-11-22-accelerator-workers-over-unix-sockets.md)."""
        if not self.pass_thread:
            return self.compute(arrays)
        if self._thread is None:
            from recserve.serving.worker.compute_thread import ComputeThread

            self._thread = ComputeThread(asyncio.get_running_loop(), self.compute, threading.Lock())
        future: asyncio.Future = asyncio.get_running_loop().create_future()

        def done(scores: list[np.ndarray] | None, error: Exception | None, _seconds: float) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(scores)

        self._thread.submit(arrays, done)
        return await future

    async def _pass(self, group: list[Waiting]) -> None:
        if not group:
            return
        start = self.pass_started = time.perf_counter()
        try:
            answers = await self._compute([w.arrays for w in group])
        except Exception as exc:  # noqa: BLE001 - every query is answered; the worker lives on
            error = InferError("internal", f"accelerator pass failed: {type(exc).__name__}: {exc}")
            for w in group:
                self._write(w, reply_frame(w.request_id, None, error))
            return
        finally:
            self.pass_started = 0.0
        items, seconds = sum(w.items for w in group), time.perf_counter() - start
        self.service.observe(items, seconds)
        self.report(items, len(group), seconds)
        for w, scores in zip(group, answers, strict=True):
            failed = isinstance(scores, InferError)  # failed when run alone after its fused pass failed
            self._write(w, reply_frame(w.request_id, None, scores) if failed else reply_frame(w.request_id, scores))

    @staticmethod
    def _write(w: Waiting, frame: bytes) -> None:
        if not w.writer.is_closing():
            w.writer.write(frame)


class AcceleratorClient(LinkClient):
    """Sends a CPU worker's large queries (``min_items`` items or more) to the accelerator workers, the one with the
    fewest outstanding first, and calls back with their scores."""

    peer = "accelerator worker"

    def __init__(self, model_name: str, sockets: list[str], min_items: int, limit: int,
                 staging_bytes: int = 0) -> None:
        super().__init__(model_name, sockets, limit, staging_bytes)
        self.min_items = min_items

    def takes(self, items: int) -> bool:
        return items >= self.min_items


# ---------------------------------------------------------------------------------------- device pass


@dataclass(frozen=True)
class DeviceRunner:
    """A forward pass on a device, called with a query's arrays; ``cache`` is the device row cache whose counters
    the worker reports (None where the tables are whole on the device)."""

    run: Callable[[tuple], np.ndarray]
    cache: Any = None

    def __call__(self, arrays: tuple) -> np.ndarray:
        return self.run(arrays)


def device_runner(model: Any, device: str, pinned: bool = True, table_mb: float | None = None) -> DeviceRunner:
    """One forward pass of a query on ``device``: inputs copied host -> device, scores back (numpy).

    On a GPU a zoo model runs with its tables fused (``zoo.fused``: one lookup kernel for all tables instead of
    one per table) and its inputs go through pinned host memory, so the copies are real DMA rather than a staged
    pageable copy.  The weights move to the device once, here; on ``cpu`` nothing moves and the model runs as the
    node built it (its tables fused unless the model's ``fuse_tables`` is false).

    ``table_mb`` (``accelerator.device_table_mb``): the tables stay on the host and at most this many MiB of
    their hottest rows are cached on the device (``zoo.device_cache``), on any device, ``cpu`` included.
    """
    import torch

    from recserve.zoo.batch import QueryBatch
    from recserve.zoo.fused import FusedModel, fusable

    target = torch.device(device)

    def host(a: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(a)
        if target.type == "cpu" or not pinned or tensor.is_pinned():  # arena views are pinned
            return tensor
        return tensor.pin_memory()

    if table_mb is not None:
        from recserve.zoo.device_cache import CachedModel

        if not fusable(model):
            raise ValueError("accelerator device_table_mb needs a zoo model whose tables are all in memory "
                             f"(DramTable); {type(model).__name__} is not one")
        cached = CachedModel(model, target, table_mb * 2**20, pinned=pinned and target.type == "cuda")
        return DeviceRunner(lambda arrays: cached.run(arrays, host), cached.cache)
    if target.type == "cpu":
        return DeviceRunner(lambda arrays: model(QueryBatch(*(torch.from_numpy(a) for a in arrays))).numpy())
    if fusable(model):
        model = FusedModel(model).to_device(target)
    else:
        model.to(target)

    def run(arrays: tuple) -> np.ndarray:
        dense, values, lengths = (host(a).to(target, non_blocking=True) for a in arrays)
        return model(QueryBatch(dense, values, lengths)).cpu().numpy()

    return DeviceRunner(run)


def arena_pinning(device: str) -> tuple[Callable[[np.ndarray], None], Callable[[np.ndarray], None]]:
    """(adopt, forget) for ``AcceleratorServer``: on a GPU, register each staging arena as pinned host memory
    (``cudaHostRegister``), so a query's host-to-device copy is DMA from where the CPU worker wrote it."""
    if not device.startswith("cuda"):
        return (lambda arena: None), (lambda arena: None)
    import torch

    cudart = torch.cuda.cudart()

    def adopt(arena: np.ndarray) -> None:
        error = cudart.cudaHostRegister(arena.ctypes.data, arena.nbytes, 0)
        if int(error) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {error}")

    def forget(arena: np.ndarray) -> None:
        cudart.cudaHostUnregister(arena.ctypes.data)

    return adopt, forget


async def serve_accelerator(conn: Any, args: Any, model: Any) -> None:
    """Entry of an accelerator worker (``worker_main`` with stage ``accel``): serve its socket until told to stop."""
    from recserve.serving.worker.model_path import ModelPath
    from recserve.serving.worker.reporter import BEAT_S

    loop = asyncio.get_running_loop()
    accel = args.model_config.accelerator
    stop = asyncio.Event()

    def send(msg: Any) -> None:
        try:
            conn.send(msg)
        except (BrokenPipeError, OSError):
            stop.set()

    device_run = device_runner(model, accel.device, table_mb=accel.device_table_mb)
    cache = device_run.cache

    def run(arrays: tuple) -> np.ndarray:
        import torch

        with torch.inference_mode():  # thread-local, and passes run on the pass thread
            return device_run(arrays)

    counted = [0, 0]  # the cache's lookups and hits already reported

    def report(items: int, queries: int, seconds: float) -> None:
        stats: list[tuple] = [("pass", items, queries, seconds)]
        if cache is not None:  # the device row cache's lookups and hits since the last pass
            stats.append(("cache", cache.lookups - counted[0], cache.hits - counted[1]))
            counted[:] = cache.lookups, cache.hits
        send(pipe.encode(pipe.Stats(stats)))

    path = ModelPath(args.model_config.name, args.info, args.model_config.max_batch_size, run, 0)
    server = AcceleratorServer(path.compute, accel.fuse_items, accel.fuse_delay_us, report,
                               *arena_pinning(accel.device), pass_thread=accel.pass_thread)
    listening = await server.serve(args.accel_socket)

    waiting = pipe.waiting(conn)

    def on_pipe() -> None:
        try:
            while waiting():
                if conn.recv() is None:
                    stop.set()
        except (EOFError, OSError):
            stop.set()

    def beat() -> None:  # the supervisor's watchdog replaces a worker whose loop stays silent (a stuck pass)
        if not stop.is_set():
            send(pipe.encode(pipe.Beat(server.pass_age())))
            loop.call_later(BEAT_S, beat)

    loop.add_reader(conn.fileno(), on_pipe)
    send(pipe.encode(pipe.Ready(os.getpid(), [])))
    beat()
    await stop.wait()
    listening.close()
    end = time.monotonic() + STOP_GRACE_S
    while (server.queue or server.pass_started) and time.monotonic() < end:  # answer what was sent, then exit
        await asyncio.sleep(0.005)
