"""One stage's worker processes: start, watch the pipe, restart after a death, resize, retire.

Runs on the supervisor's event loop.  What the workers compute is not this module's business: the pool tells its
model (``PoolEvents``) when a worker may take work (``feed``), when one is lost (``lost``) and when none is left to
serve what is queued (``unserved``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from recserve.hostinfo import how_it_ended
from recserve.serving.node.config import expand_cores
from recserve.serving.node.handle import WorkerHandle
from recserve.serving.wire.errors import InferError

if TYPE_CHECKING:
    from recserve.serving.node.launch import WorkerLauncher
    from recserve.serving.node.llc import LlcAllocator
    from recserve.serving.node.metrics import ModelMetrics

log = logging.getLogger("recserve.serving")

WORKER_START_TIMEOUT_S = 120.0
WORKER_STOP_TIMEOUT_S = 10.0
MAX_RESTARTS_IN_A_ROW = 5  # failed restarts after which queries are refused at once (restarts go on)
RESTART_MOST_S = 30.0  # the longest wait between two restart attempts


class PoolEvents(Protocol):
    def feed(self, pool: WorkerPool) -> None: ...  # give idle workers queued work

    def lost(self, pool: WorkerPool, handle: WorkerHandle, code: int | None) -> None: ...  # what it held

    def unserved(self, pool: WorkerPool, message: str) -> None: ...  # no worker left: answer the queue


def flat_cores(cores: Any) -> Any:
    if cores and all(isinstance(c, list | tuple) for c in cores):
        return list(dict.fromkeys(int(x) for c in cores for x in c))
    return cores


class WorkerPool:
    """The workers of one stage (``model``, ``sparse``, ``dense`` or ``accel``) of one model."""

    def __init__(self, name: str, stage: str, threads: int, cores_spec: Any, launcher: WorkerLauncher,
                 events: PoolEvents, reader: Callable[[WorkerPool, WorkerHandle], None],
                 metrics: ModelMetrics, llc: LlcAllocator | None = None) -> None:
        self.name = name  # the model's
        self.stage = stage
        self.threads = threads
        self.cores_spec = flat_cores(cores_spec)
        self.workers: list[WorkerHandle] = []
        self.restarting = 0
        self.crash_looping = 0  # restarts that failed MAX_RESTARTS_IN_A_ROW times and go on trying
        self.stopping = False
        self._launcher = launcher
        self._events = events
        self._reader = reader  # called when a worker's pipe is readable (``inbox.PipeInbox.on_readable``)
        self._metrics = metrics
        self._llc = llc
        self._control = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()

    def active(self) -> list[WorkerHandle]:
        """Workers not being retired, in start order."""
        return sorted((w for w in self.workers if not w.retiring), key=lambda w: w.worker_id)

    def ready_count(self) -> int:
        return sum(1 for w in self.active() if w.working)

    # ------------------------------------------------------------------ start and stop
    async def start_worker(self, cores: list[int], threads: int) -> WorkerHandle:
        """Start one worker and wait until it is ready."""
        loop = asyncio.get_running_loop()
        handle = await self._launcher.launch(self.stage, cores, threads)
        self.workers.append(handle)
        loop.add_reader(handle.conn.fileno(), self._reader, self, handle)
        try:
            await asyncio.wait_for(asyncio.shield(handle.ready), WORKER_START_TIMEOUT_S)
        except TimeoutError as exc:
            handle.process.kill()
            raise InferError("internal", f"model {self.name!r}: worker did not start in time") from exc
        return handle

    def pump(self) -> None:
        """Idle workers take queued work; idle retirees are told to exit."""
        self._events.feed(self)
        for w in self.workers:
            if w.retiring and w.current is None and not w.stop_sent:
                w.stop_sent = True
                w.outbox.post(None)  # type: ignore[union-attr]

    async def stop(self, timeout_s: float = WORKER_STOP_TIMEOUT_S) -> None:
        """Retire every worker and wait for them (killed after ``timeout_s``), and for the restarts in flight (each
        stops what it started)."""
        self.stopping = True
        workers = list(self.workers)
        for w in workers:
            w.retiring = True
        self.pump()
        await await_exit(workers, timeout_s)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=WORKER_START_TIMEOUT_S + WORKER_STOP_TIMEOUT_S)

    async def resize(self, n: int, cores: Any, threads: int | None,
                     retired: Callable[[list[WorkerHandle]], Awaitable[None]], replace: bool = False) -> None:
        """``n`` workers of ``threads`` threads (``replace``: all of them new); new workers are ready before old ones
        retire, retirees finish their part.  ``retired`` runs once the retirees are marked, before they are told to
        go."""
        async with self._control:
            threads = threads or self.threads
            current = self.active()
            try:
                if replace or cores is not None or threads != self.threads:
                    spec = cores if cores is not None else self.cores_spec
                    sets = expand_cores(spec, n, threads, f"model {self.name!r} cores")
                    keep, start_sets = [], sets
                else:
                    sets = expand_cores(self.cores_spec, n, threads, f"model {self.name!r} cores")
                    keep, start_sets = current[:n], sets[len(current):n]
            except Exception as exc:
                raise InferError("invalid", str(exc), "cores") from exc
            retire = [w for w in current if w not in keep]
            log.info("model %s: %s workers %d -> %d%s: starting %d, retiring pids %s", self.name, self.stage,
                     len(current), n, " (all replaced)" if not keep else "", len(start_sets), [w.pid for w in retire])
            started = await asyncio.gather(*(self.start_worker(s, threads) for s in start_sets))
            if self.stopping:  # the model stopped while they started: its stop did not see them
                await self._retire_now(list(started))
                raise InferError("not_found", f"model {self.name!r} stopped (unloaded, or the node stops) while "
                                              "this resize started workers: nothing was resized", "model_name")
            self.threads = threads
            if cores is not None:
                self.cores_spec = flat_cores(cores)
            for w in retire:
                w.retiring = True
            await retired(retire)
            self.pump()
            await await_exit(retire, WORKER_STOP_TIMEOUT_S + 60)
            log.info("model %s: %s workers now pids %s", self.name, self.stage, [w.pid for w in self.active()])

    async def _retire_now(self, workers: list[WorkerHandle]) -> None:
        for w in workers:
            w.retiring = True
        self.pump()
        await await_exit(workers, WORKER_STOP_TIMEOUT_S)

    # ------------------------------------------------------------------ worker events (from its pipe)
    def on_failed(self, handle: WorkerHandle, reason: str) -> None:
        """The worker could not build its model and exits: its start fails with the worker's own reason."""
        if not handle.ready.done():
            handle.ready.set_exception(InferError("invalid", f"model {self.name!r}: {reason}"))
            handle.ready.exception()  # mark retrieved

    def on_ready(self, handle: WorkerHandle, pid: int) -> None:
        handle.pid = pid
        if self._llc is not None:
            self._llc.add_pid(self.name, pid)
        if not handle.ready.done():
            handle.ready.set_result(pid)
        handle.last_beat = time.monotonic()
        self.pump()

    def on_exit(self, handle: WorkerHandle) -> None:
        """Its pipe closed: take back what it held, answer what it computed, and restart it unless it was retired."""
        loop = asyncio.get_running_loop()
        if handle.outbox is not None:
            handle.outbox.close()
        self._launcher.release(handle)
        loop.remove_reader(handle.conn.fileno())
        handle.conn.close()
        if handle in self.workers:
            self.workers.remove(handle)
        handle.process.join(timeout=0.5)
        code = handle.process.exitcode
        self._events.lost(self, handle, code)
        if not handle.ready.done():
            handle.ready.set_exception(InferError(
                "internal", f"model {self.name!r}: worker {how_it_ended(code)} before it was ready"))
            handle.ready.exception()  # mark retrieved
        if not handle.exited.done():
            handle.exited.set_result(code)
        if self._llc is not None and handle.pid:
            self._llc.forget_pid(self.name, handle.pid)
        if handle.retiring or self.stopping or not handle.pid:
            return  # retired, shutting down, or never started (the starter sees the error)
        log.warning("model %s: %s worker pid %s died (%s); restarting", self.name, self.stage, handle.pid,
                    how_it_ended(code))
        self._metrics.worker_restarts += 1
        task = loop.create_task(self._restart(handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, dead: WorkerHandle) -> None:
        """Start a worker in the dead one's place; keep trying while it fails (what it needs may come back: a
        table file rebuilt), backing off to ``RESTART_MOST_S``.  After ``MAX_RESTARTS_IN_A_ROW`` failures with no
        worker left, queries are answered 503 at once rather than held for a worker that may never come."""
        self.restarting += 1
        attempt = 0
        try:
            while not self.stopping:
                try:
                    handle = await self.start_worker(dead.cores, dead.threads)
                except Exception as exc:  # noqa: BLE001 - an OSError (fork, pipe, memory) is a failed attempt too
                    attempt += 1
                    wait_s = min(RESTART_MOST_S, 0.5 * attempt)
                    log.error("model %s: %s worker restart attempt %d failed: %s; next attempt in %.1f s", self.name,
                              self.stage, attempt, exc, wait_s)
                    if attempt == MAX_RESTARTS_IN_A_ROW:
                        self.crash_looping += 1
                        if not self.workers:  # nobody will take the queued parts: answer, never hang
                            self._events.unserved(self, f"model {self.name!r}: no {self.stage} worker could be "
                                                        "restarted")
                    await self._pause(wait_s)
                    continue
                if attempt:
                    log.warning("model %s: %s worker restarted as pid %s after %d failed attempts", self.name,
                                self.stage, handle.pid, attempt)
                else:
                    log.info("model %s: %s worker pid %s replaced by pid %s", self.name, self.stage, dead.pid,
                             handle.pid)
                if self.stopping:  # the model stopped while this worker started
                    await self._retire_now([handle])
                return
        finally:
            self.restarting -= 1
            if attempt >= MAX_RESTARTS_IN_A_ROW:
                self.crash_looping -= 1

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the pool stops meanwhile (a stop does not wait out a restart's back-off)."""
        end = time.monotonic() + seconds
        while not self.stopping and time.monotonic() < end:
            await asyncio.sleep(min(0.1, end - time.monotonic()))


async def await_exit(workers: list[WorkerHandle], timeout_s: float) -> None:
    """Wait for ``workers`` to exit; kill those still running after ``timeout_s``."""
    if not workers:
        return
    done, pending = await asyncio.wait([w.exited for w in workers], timeout=timeout_s)
    for w in workers:
        if not w.exited.done():
            w.process.kill()
    if pending:
        await asyncio.wait(pending, timeout=5.0)
