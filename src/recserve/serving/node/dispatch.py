"""Queries the supervisor computes through its workers' pipes: sub-batches and pipeline stages.

A query is validated, split into sub-batches of at most ``sub_batch`` items (DeepRecSys-style: parts run on
different workers in parallel and are concatenated in order), and the parts wait in a per-stage FIFO.  A worker
holds at most one part at a time, so the supervisor always knows which queries a worker holds: if it dies they get
an explicit error; if it is retired it finishes its part first.  Everything runs on the supervisor's event loop, so
no locks guard the queues."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.hostinfo import how_it_ended
from recserve.serving.node.handle import WorkerHandle, next_id
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.main import flatten, pack, unpack
from recserve.zoo.batch import BatchError, QueryBatch

if TYPE_CHECKING:
    from recserve.serving.node.config import ModelConfig
    from recserve.serving.node.launch import WorkerSettings
    from recserve.serving.node.metrics import ModelMetrics
    from recserve.serving.node.pool import WorkerPool
    from recserve.serving.wire.model_info import ModelInfo


class Query:
    """One admitted request: its parts' results and its timing."""

    def __init__(self, items: int, parts: int, loop: asyncio.AbstractEventLoop) -> None:
        self.items = items
        self.results: list[Any] = [None] * parts
        self.remaining = parts
        self.future: asyncio.Future = loop.create_future()
        self.started = False  # a part of it reached a worker (from then on it is not shed at its deadline)
        self.queue_s: dict[str, float] = {}
        self.compute_s: dict[str, float] = {}

    def note(self, stage: str, waited: float, computed: float) -> None:
        self.queue_s[stage] = max(self.queue_s.get(stage, 0.0), waited)
        self.compute_s[stage] = max(self.compute_s.get(stage, 0.0), computed)

    def fail(self, error: InferError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass
class Part:
    query: Query
    index: int
    payload: Any
    dense: np.ndarray
    enqueued: float = field(default_factory=time.perf_counter)
    dispatched: float = 0.0
    item_id: int = 0


class QueryDispatcher:
    """Admits a query, queues its parts per stage, feeds idle workers, assembles the answer."""

    def __init__(self, cfg: ModelConfig, info: ModelInfo, metrics: ModelMetrics, settings: WorkerSettings,
                 pools: dict[str, WorkerPool]) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.info = info
        self.metrics = metrics
        self.settings = settings  # its sub_batch splits queries
        self.pools = pools
        self.queues: defaultdict[str, deque[Part]] = defaultdict(deque)  # parts waiting, per stage
        self.next_stage = {"sparse": "dense"} if cfg.mode == "pipeline" else {}
        self.in_flight = 0
        self.accepting = True

    # ------------------------------------------------------------------ a query
    def decode(self, arrays: dict[str, np.ndarray]) -> QueryBatch:
        try:
            with warnings.catch_warnings():  # inputs are read-only views of the request body; only read
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                batch = QueryBatch.from_arrays(arrays)
            batch.validate(self.info.dense_in, self.info.rows, self.info.seq_lens, self.cfg.max_batch_size)
        except BatchError as exc:
            raise InferError("invalid", str(exc), exc.field) from exc
        return batch

    def split(self, batch: QueryBatch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        size, k = batch.size, self.settings.sub_batch
        bounds = [(0, size)] if k <= 0 or size <= k else [(a, min(a + k, size)) for a in range(0, size, k)]
        parts = []
        for a, b in bounds:
            piece = batch if (a, b) == (0, size) else batch.slice(a, b)
            parts.append((piece.dense.numpy(), piece.values.numpy(), piece.lengths.numpy()))
        return parts

    async def infer(self, arrays: dict[str, np.ndarray], timeout_s: float | None = None) -> np.ndarray:
        """Scores ``[B, towers]`` for one query, or :class:`InferError`; ``timeout_s`` is the client's deadline
        (else the model's ``deadline_ms``)."""
        self.metrics.arrived()
        start = time.perf_counter()
        try:
            batch = self._admit(arrays)
        except InferError as exc:
            self.metrics.error(exc.code)
            self.metrics.failed(time.perf_counter() - start)
            raise
        self.in_flight += 1
        try:
            payloads = self.split(batch)
            query = Query(batch.size, len(payloads), asyncio.get_running_loop())
            first = next(iter(self.pools.values()))
            for i, payload in enumerate(payloads):
                self.queues[first.stage].append(Part(query, i, payload, payload[0]))
            first.pump()
            try:
                scores = await self._answer(query, start + (timeout_s or self.cfg.deadline_ms / 1e3), start)
            except InferError as exc:
                self.metrics.error(exc.code)
                self.metrics.failed(time.perf_counter() - start)
                raise
            self.metrics.done(batch.size, time.perf_counter() - start, sum(query.queue_s.values()),
                              sum(query.compute_s.values()), len(payloads))
            return scores
        finally:
            self.in_flight -= 1

    def _admit(self, arrays: dict[str, np.ndarray]) -> QueryBatch:
        if not self.accepting:
            raise InferError("unavailable", f"model {self.name!r} is not accepting queries (shutting down)")
        batch = self.decode(arrays)
        empty = [stage for stage, pool in self.pools.items()
                 if not pool.workers and (not pool.restarting or pool.crash_looping)]
        if empty:
            raise InferError("unavailable", f"model {self.name!r} has no {empty[0]} workers (they died and "
                                            "restarting them fails; the node keeps trying, see its log)")
        if self.in_flight >= self.cfg.queue_limit:
            raise InferError("unavailable", f"model {self.name!r} is overloaded: {self.in_flight} queries "
                                            f"in flight (queue_limit {self.cfg.queue_limit}); retry later")
        return batch

    async def _answer(self, query: Query, deadline: float, arrived: float) -> np.ndarray:
        """The query's scores.  One that no worker has started by its deadline is answered 504 and its parts are
        skipped when they reach the head of the queue (as the workers' own queues shed late queries), so a
        stalled pool does not hold clients past their deadline; once a part runs the query waits for it, and
        the watchdog (``worker_watch.WorkerWatch``) bounds a worker that never returns."""
        timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.perf_counter()), self._shed_late,
                                                      query, arrived)
        try:
            return await query.future
        finally:
            timer.cancel()

    def _shed_late(self, query: Query, arrived: float) -> None:
        if not query.started:
            query.fail(InferError("deadline", f"model {self.name!r}: deadline exceeded: "
                                              f"{(time.perf_counter() - arrived) * 1e3:.1f} ms after the request "
                                              "arrived it was still queued"))

    # ------------------------------------------------------------------ parts and workers
    def feed(self, pool: WorkerPool) -> None:
        """Queued parts of ``pool``'s stage go to its idle workers, one each."""
        queue = self.queues[pool.stage]
        if not queue:
            return
        idle = [w for w in pool.workers if w.current is None and not w.retiring
                and w.ready.done() and not w.ready.exception()]
        while queue and idle:
            part = queue.popleft()
            if part.query.future.done():
                continue  # failed or abandoned: do not spend a worker on it
            worker = idle.pop(0)
            part.dispatched = time.perf_counter()
            part.query.started = True
            part.item_id = next_id()
            worker.current = part
            arrays = flatten(pool.stage, part.payload)
            descriptors = pack(arrays, worker.io[: worker.io_split])  # type: ignore[index]
            worker.outbox.post((part.item_id, None if descriptors else part.payload, descriptors))  # type: ignore[union-attr]

    def on_reply(self, pool: WorkerPool, handle: WorkerHandle, msg: tuple) -> None:
        """A worker's ``(item_id, ok, result, compute_s)``: the part it held is done."""
        item_id, ok, result, compute_s = msg
        if ok and isinstance(result, tuple) and result[0] == "shm":
            outputs = unpack(result[1], handle.io[handle.io_split :], copy=True)  # type: ignore[index]
            result = outputs if pool.stage == "sparse" else outputs[0]
        part = handle.current
        handle.current = None
        handle.items_done += 1
        if part is not None and part.item_id == item_id:
            self._on_result(pool.stage, part, ok, result, compute_s)
        pool.pump()

    def _on_result(self, stage: str, part: Part, ok: bool, result: Any, compute_s: float) -> None:
        query = part.query
        query.note(stage, part.dispatched - part.enqueued, compute_s)
        if not ok:
            query.fail(InferError("internal", f"model {self.name!r} {stage} worker failed: {result}"))
            return
        nxt = self.next_stage.get(stage)
        if nxt is not None:
            self.queues[nxt].append(Part(query, part.index, (part.dense, result), part.dense))
            self.pools[nxt].pump()
            return
        query.results[part.index] = result
        query.remaining -= 1
        if query.remaining == 0 and not query.future.done():
            out = query.results[0] if len(query.results) == 1 else np.concatenate(query.results)
            query.future.set_result(out)

    def fail_current(self, handle: WorkerHandle, code: int | None) -> None:
        """A worker died holding a part: its query is answered."""
        if handle.current is not None:
            handle.current.query.fail(InferError(
                "internal", f"model {self.name!r}: worker pid {handle.pid} died ({how_it_ended(code)}) "
                            "while computing this query"))
            handle.current = None

    def fail_pending(self, stage: str, message: str) -> None:
        queue = self.queues[stage]
        while queue:
            queue.popleft().query.fail(InferError("unavailable", message))

    def abandon(self, message: str) -> int:
        """Answer every query still held (queued, or on a worker) with 503; returns how many."""
        queued = {id(p.query): p.query for queue in self.queues.values() for p in queue}
        running = {id(w.current.query): w.current.query for pool in self.pools.values() for w in pool.workers
                   if w.current is not None}
        live = sum(not q.future.done() for q in (queued | running).values())
        for stage in self.queues:
            self.fail_pending(stage, message)
        for q in running.values():
            q.fail(InferError("unavailable", message))
        return live
