"""Per-model execution on one node: worker pools, the dispatcher and run-time reconfiguration.

Everything here runs on the server's asyncio event loop (one thread), so no locks guard the
queues: each worker's pipe is watched with ``loop.add_reader`` and results resolve futures
directly.  A query is validated, split into sub-batches of at most ``sub_batch`` items
(DeepRecSys-style: parts run on different workers in parallel and are concatenated in order),
and the parts wait in a per-stage FIFO.  A worker holds at most one part at a time, so the
server always knows which queries a worker holds: if it dies they get an explicit error and a
replacement worker is started; if it is retired it finishes its part first.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import popen_forkserver, spawn
from multiprocessing.context import ForkServerProcess
from typing import Any

import numpy as np
import torch

from recserve.serving.config import ModelConfig, expand_cores
from recserve.serving.errors import InferError
from recserve.serving.llc import LlcAllocator
from recserve.serving.metrics import ModelMetrics
from recserve.serving.watchdog import CONN_SLOTS, answer_held, release
from recserve.serving.worker import (
    WorkerArgs,
    build_worker_model,
    flatten,
    pack,
    share_model,
    unpack,
    worker_main,
)
from recserve.zoo.batch import BatchError, QueryBatch

log = logging.getLogger("recserve.serving")

WORKER_START_TIMEOUT_S = 120.0
WORKER_STOP_TIMEOUT_S = 10.0
MAX_RESTARTS_IN_A_ROW = 5
LOAD_SLOTS = 64  # model workers that share connections by load; more are served but never take moved connections
RESPONSIVE_S = 1.0  # a v2 worker silent longer than this is not counted on to accept connections


_PREP_LOCK = threading.Lock()


class _NoMainPopen(popen_forkserver.Popen):
    """Forkserver launch that does not re-import the parent's ``__main__`` in the worker.

    Workers only run :func:`worker_main`, so scripts and REPLs that start a NodeServer need no
    ``if __name__ == "__main__"`` guard.
    """

    def _launch(self, process_obj: Any) -> None:
        with _PREP_LOCK:
            original = spawn.get_preparation_data

            def prep(name: str) -> dict:
                data = original(name)
                data.pop("init_main_from_path", None)
                data.pop("init_main_from_name", None)
                return data

            spawn.get_preparation_data = prep
            try:
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = original


class WorkerProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _NoMainPopen:  # noqa: N802 (multiprocessing's name)
        return _NoMainPopen(process_obj)


class WorkerContext:
    """Forkserver with torch preloaded: fast, thread-safe worker starts that can receive shared tensors."""

    def __init__(self) -> None:
        import torch.multiprocessing  # noqa: F401  registers the reductions that share tensors by fd

        from recserve.zoo.allocator import worker_tunables

        # read by glibc when the forkserver starts (the first worker's start): the workers reuse freed activations
        os.environ["GLIBC_TUNABLES"] = worker_tunables(os.environ.get("GLIBC_TUNABLES", ""))
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(["recserve.serving.worker"])
        self.Process = WorkerProcess

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:  # noqa: N802
        return self.ctx.Pipe(duplex)


def mp_context() -> WorkerContext:
    return WorkerContext()


@dataclass
class ModelInfo:
    """What the front end needs to validate a query without touching a worker."""

    dense_in: int
    rows: tuple[int, ...]
    seq_lens: dict[int, int]
    towers: int
    io_in_bytes: int = 0
    io_out_bytes: int = 0


IO_BUFFER_CAP = 256 * 1024 * 1024


def io_uring_verdict(cfg: ModelConfig) -> str:
    """For a tiered model, probe io_uring once here (in a child process) and hand the verdict to every worker:
    the forkserver's environment predates it, and one probe per node beats one per worker."""
    if not (cfg.options or {}).get("tier"):
        return ""
    from recserve.embedding import uring

    ok, why = uring.probe()
    return "ok" if ok else f"unavailable: {why}"


def model_info(cfg: ModelConfig) -> ModelInfo:
    """Validation facts, and I/O buffer sizes for a ``max_batch_size`` query (bags up to 2x pooling)."""
    spec = cfg.model_spec()
    b = cfg.max_batch_size
    embedded = sum(t.dim * (t.pooling if t.kind == "sequence" else 1) for t in spec.tables) * 4
    query_in = b * (spec.dense_in * 4 + len(spec.tables) * 4 + 2 * spec.lookups_per_item * 8)
    dense_in = b * (spec.dense_in * 4 + embedded)
    out = b * (embedded if cfg.mode == "pipeline" else spec.towers * 4)
    pad = 64 * (len(spec.tables) + 4)
    return ModelInfo(
        dense_in=spec.dense_in,
        rows=cfg.served_rows(),
        seq_lens={i: t.pooling for i, t in enumerate(spec.tables) if t.kind == "sequence"},
        towers=spec.towers,
        io_in_bytes=min(IO_BUFFER_CAP, max(query_in, dense_in) + pad),
        io_out_bytes=min(IO_BUFFER_CAP, out + pad),
    )


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


class Outbox:
    """What the supervisor sends one worker, written by a thread of its own, in order.

    Why: a blocking write to a worker that is not reading (busy computing, or itself blocked writing to the
    supervisor) would stop the supervisor's loop; once both directions of the pipe were full, neither would read
    again (seen live: a retiring worker's few hundred connections handed to a sibling that registered each one
    back, and the node stopped accepting).  The loop only queues; this thread waits for the worker."""

    def __init__(self, conn: Any, name: str) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-outbox", daemon=True)
        self._thread.start()

    def post(self, msg: Any, fd: int | None = None) -> None:
        """Send ``msg`` (then a duplicate of descriptor ``fd``, which the caller keeps) to the worker."""
        self._queue.put((msg, os.dup(fd) if fd is not None else None))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        from multiprocessing.reduction import send_handle

        broken = False
        while (item := self._queue.get()) is not None:
            msg, fd = item
            try:
                if not broken:
                    self._conn.send(msg)
                    if fd is not None:
                        send_handle(self._conn, fd, 0)
            except OSError:
                broken = True  # the worker is gone: its reader on the supervisor's side sees EOF
            finally:
                if fd is not None:
                    os.close(fd)


@dataclass
class WorkerHandle:
    worker_id: int
    stage: str
    cores: list[int]
    threads: int
    process: Any
    conn: Any
    ready: asyncio.Future
    exited: asyncio.Future
    io: np.ndarray | None = None  # this worker's shared I/O buffer (numpy view)
    io_split: int = 0
    pid: int = 0
    retiring: bool = False
    stop_sent: bool = False
    current: Part | None = None
    items_done: int = 0
    queries_done: int = 0  # v2: queries this worker computed and answered (forwarded ones included: it computed them)
    last_beat: float = 0.0  # data plane v2: monotonic time of the worker's last heartbeat
    conns: dict[int, int] = field(default_factory=dict)  # v2: the worker's connection descriptors -> ours
    slot: int = -1  # v2: its index in the model's shared load array
    outbox: Outbox | None = None
    states: np.ndarray | None = None  # v2: shared, one byte per worker descriptor: a request is unanswered
    hung: bool = False
    accel_socket: str = ""  # an accelerator worker's Unix socket (serving/accel.py)

    @property
    def working(self) -> bool:
        return self.ready.done() and not self.ready.exception() and not self.hung

    def describe(self) -> dict[str, Any]:
        return {"id": self.worker_id, "pid": self.pid, "cores": self.cores, "threads": self.threads,
                "ready": self.ready.done() and not self.ready.exception(), "retiring": self.retiring,
                "busy": self.current is not None, "items_done": self.items_done, "queries_done": self.queries_done,
                **memory_of(self.pid)}


def memory_of(pid: int) -> dict[str, float]:
    """RSS and PSS of a process in MB (PSS splits shared pages among the processes mapping them)."""
    out = {"rss_mb": 0.0, "pss_mb": 0.0}
    if not pid:
        return out
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[f"{key.lower()}_mb"] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return out


@dataclass
class StagePool:
    stage: str
    threads: int
    cores_spec: Any
    workers: list[WorkerHandle] = field(default_factory=list)
    pending: deque = field(default_factory=deque)
    next_stage: StagePool | None = None
    restarting: int = 0

    def active(self) -> list[WorkerHandle]:
        """Workers not being retired, in start order."""
        return sorted((w for w in self.workers if not w.retiring), key=lambda w: w.worker_id)

    def ready_count(self) -> int:
        return sum(1 for w in self.active() if w.working)


def _flat_cores(cores: Any) -> Any:
    if cores and all(isinstance(c, list | tuple) for c in cores):
        return list(dict.fromkeys(int(x) for c in cores for x in c))
    return cores


class ModelRuntime:
    """Workers, queues and counters of one served model."""

    _ids = itertools.count(1)

    def __init__(self, cfg: ModelConfig, ctx: Any, llc: LlcAllocator | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.ctx = ctx
        self.llc = llc
        self.info = model_info(cfg)
        self.version = str(cfg.version)
        self.is_default = True  # answers the unversioned path (the node moves it to the newest loaded version)
        self.sla = cfg.model_spec().sla
        self.sla_percentile = self.sla.percentile
        self.metrics = ModelMetrics()
        self.sub_batch = cfg.sub_batch
        self.in_flight = 0
        self.tier_io: list[dict[str, str]] = []  # tiered tables' read path, from the first ready worker
        self.io_uring_verdict = io_uring_verdict(cfg)
        self.accepting = True
        self.stopping = False
        # Artifacts are loaded by each worker: safetensors tables are memory-mapped (the page cache is the one
        # shared copy; share_memory_() would copy them), and programs are opaque.
        share = cfg.share_tables and not cfg.artifact
        self.shared_model = share_model(build_worker_model(cfg)) if share else None
        self.pools: dict[str, StagePool] = {}
        for stage, (_n, _cores) in cfg.stages().items():
            cores = cfg.sparse_cores if stage == "sparse" else cfg.cores
            self.pools[stage] = StagePool(stage, cfg.threads, _flat_cores(cores))
        if cfg.mode == "pipeline":
            self.pools["sparse"].next_stage = self.pools["dense"]
        # Accelerator workers (serving/accel.py): their sockets live in a directory removed at stop.
        self.accel = cfg.accelerator
        self.accel_dir = tempfile.mkdtemp(prefix="recserve-accel-") if self.accel is not None else ""
        self._accel_taken: set[str] = set()
        self.min_items = self.accel.min_items if self.accel is not None else 0
        if self.accel is not None:
            self.pools["accel"] = StagePool("accel", self.accel.threads, _flat_cores(self.accel.cores))
            self.metrics.routed_queries = {"cpu": 0, "accelerator": 0}
            self.metrics.routed_items = {"cpu": 0, "accelerator": 0}
        self._control = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        # Data plane v2: set by the node before start() when this model's workers accept queries themselves.
        self.listen_sock: Any = None
        self.node: Any = None  # the NodeConfig whose body, JSON and read-time bounds the workers apply
        self.grpc_listen: Any = None  # set with grpc_upstream when the workers answer gRPC too (grpc_worker.py)
        self.grpc_upstream = ""
        self.shm_dir = ""  # the node's shared-memory registry (serving/shm.py) the workers follow
        self.on_handoff: Callable[[int, bytes, str], None] | None = None
        self._next_adopter = 0
        # v2: queries each model worker holds, one shared slot per live worker (-1 = free): idle siblings take
        # connections from a worker with a backlog (``WorkerPlane.maybe_move``)
        self.loads = torch.full((LOAD_SLOTS,), -1, dtype=torch.int32).share_memory_()
        # and each serves a socket there for the queries busy siblings forward (``serving/siblings.py``)
        self.sibling_dir = tempfile.mkdtemp(prefix="recserve-siblings-") \
            if cfg.forward_to_idle and cfg.mode == "model" else ""
        self.siblings = {"forwarded": 0, "returned": 0}  # queries busy workers sent to idle ones; given back
        self.event_loop: dict[str, str] | None = None  # the loop the v2 workers run, and why not the one asked
        self._slots: set[int] = set()

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.accel is not None:  # first: the CPU workers send large queries to them from their first query
            if not self.accepts_in_workers:
                from recserve.errors import SpecError

                raise SpecError(f"model {self.name!r}: an accelerator needs the node's front_end: workers")
            pool = self.pools["accel"]
            await asyncio.gather(*(self._start_worker(pool, cores, pool.threads) for cores in self.accel.core_sets()))
        starts = []
        for stage, (n, core_sets) in self.cfg.stages().items():
            pool = self.pools[stage]
            starts += [self._start_worker(pool, core_sets[i], pool.threads) for i in range(n)]
        await asyncio.gather(*starts)

    @property
    def ready(self) -> bool:
        return self.accepting and all(p.ready_count() > 0 for p in self.pools.values())

    async def drain(self, timeout_s: float) -> None:
        """Refuse new queries and wait for admitted ones to finish."""
        self.accepting = False
        self._broadcast(("drain",))
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.accepting = False
        self.stopping = True
        workers = [w for p in self.pools.values() for w in p.workers]
        for pool in self.pools.values():
            for w in pool.workers:
                w.retiring = True
            self._pump(pool)
        await self._await_exit(workers, WORKER_STOP_TIMEOUT_S)
        if self._tasks:  # restarts in flight: each stops the worker it started (else it would outlive the node)
            await asyncio.wait(list(self._tasks), timeout=WORKER_START_TIMEOUT_S + WORKER_STOP_TIMEOUT_S)
        for pool in self.pools.values():
            self._fail_pending(pool, f"model {self.name!r} stopped")
        for directory in (self.accel_dir, self.sibling_dir):
            if directory:
                shutil.rmtree(directory, ignore_errors=True)

    # ------------------------------------------------------------------ workers
    async def _event_loop(self) -> str:
        """The loop this model's v2 workers run (``serving/eventloop.py``), chosen once: the probe runs a child
        process, off this loop."""
        if self.event_loop is None:
            from recserve.serving import eventloop

            setting = getattr(self.node, "event_loop", "auto")
            chosen, why = await asyncio.get_running_loop().run_in_executor(None, eventloop.choose, setting)
            if why and setting == "uvloop":
                log.warning("model %s: event_loop uvloop asked, workers run asyncio: %s", self.name, why)
            self.event_loop = {"loop": chosen, "asked": setting, "why": why}
        return self.event_loop["loop"]

    async def _start_worker(self, pool: StagePool, cores: list[int], threads: int) -> WorkerHandle:
        loop = asyncio.get_running_loop()
        parent, child = self.ctx.Pipe(duplex=True)
        wid = next(self._ids)
        split = self.info.io_in_bytes
        io = torch.empty(split + self.info.io_out_bytes, dtype=torch.uint8).share_memory_()
        args = WorkerArgs(wid, pool.stage, list(cores), threads, self.cfg, split, self.io_uring_verdict)
        states = None
        if self.accepts_in_workers and pool.stage == "model":
            args.listen, args.info, args.limits, args.sub_batch = self.listen_sock, self.info, self._limits(), \
                self.sub_batch
            args.grpc_listen, args.grpc_upstream = self.grpc_listen, self.grpc_upstream
            args.shm_dir = self.shm_dir
            args.version, args.default = self.version, self.is_default
            states = torch.zeros(CONN_SLOTS, dtype=torch.uint8).share_memory_()
            args.slot = self._free_slot()
            args.sibling_dir = self.sibling_dir if args.slot >= 0 else ""
            args.accel_sockets, args.accel_min_items = tuple(self.accel_sockets()), self.min_items
            args.event_loop = await self._event_loop()
        if pool.stage == "accel":
            args.accel_socket, args.info = self._free_accel_socket(), self.info
        proc = self.ctx.Process(target=worker_main, args=(child, args, self.shared_model, io, states, self.loads),
                                daemon=True, name=f"recserve-{self.name}-{pool.stage}-{wid}")
        try:
            await loop.run_in_executor(None, proc.start)
        except BaseException:
            self._slots.discard(args.slot)
            raise
        child.close()
        handle = WorkerHandle(wid, pool.stage, list(cores), threads, proc, parent,
                              loop.create_future(), loop.create_future(), io.numpy(), split,
                              states=states.numpy() if states is not None else None, slot=args.slot,
                              accel_socket=args.accel_socket)
        handle.outbox = Outbox(parent, proc.name)
        pool.workers.append(handle)
        loop.add_reader(parent.fileno(), self._on_readable, pool, handle)
        try:
            await asyncio.wait_for(asyncio.shield(handle.ready), WORKER_START_TIMEOUT_S)
        except TimeoutError as exc:
            proc.kill()
            raise InferError("internal", f"model {self.name!r}: worker did not start in time") from exc
        return handle

    def _on_readable(self, pool: StagePool, handle: WorkerHandle) -> None:
        try:
            while handle.conn.poll():
                self._on_message(pool, handle, handle.conn.recv())
        except (EOFError, OSError):
            self._on_worker_exit(pool, handle)

    def _on_message(self, pool: StagePool, handle: WorkerHandle, msg: Any) -> None:
        if msg[0] == "stats":
            handle.queries_done += sum(rec[0] == "done" for rec in msg[1])
            self._worker_stats(msg[1])
            return
        if msg[0] == "beat":  # ("beat", seconds its pass in flight has run): a pass that never ends is a hang
            handle.last_beat = time.monotonic() - (float(msg[1]) if len(msg) > 1 else 0.0)
            return
        if msg[0] == "conn":
            from multiprocessing.reduction import recv_handle

            release(handle.conns, msg[1])
            handle.conns[msg[1]] = recv_handle(handle.conn)
            return
        if msg[0] == "gone":
            release(handle.conns, msg[1])
            return
        if msg[0] == "handoff":
            from multiprocessing.reduction import recv_handle

            fd = recv_handle(handle.conn)
            # moved to the idle sibling it named, with whatever was read of it (none today: only idle connections
            # move; a future move of a partly read request must not lose its bytes)
            if len(msg) > 3 and msg[3] is not None and self.adopt(fd, msg[1], to_slot=msg[3]):
                os.close(fd)
            elif self.on_handoff is None:
                os.close(fd)
            else:
                self.on_handoff(fd, msg[1], msg[2])
            return
        if msg[0] == "ready":
            handle.pid = int(msg[1])
            if msg[2] and not self.tier_io:
                self.tier_io = msg[2]
                for t in self.tier_io:
                    log.info("model %s: tiered table %s (%s) reads %s with %s: %s", self.name, t["table"],
                             t["file"], t["mode"], t["engine"], t["why"])
            if self.llc is not None:
                self.llc.add_pid(self.name, handle.pid)
            if not handle.ready.done():
                handle.ready.set_result(handle.pid)
            handle.last_beat = time.monotonic()
            self._pump(pool)
            return
        item_id, ok, result, compute_s = msg
        if ok and isinstance(result, tuple) and result[0] == "shm":
            outputs = unpack(result[1], handle.io[handle.io_split :], copy=True)
            result = outputs if pool.stage == "sparse" else outputs[0]
        part = handle.current
        handle.current = None
        handle.items_done += 1
        if part is not None and part.item_id == item_id:
            self._on_result(pool, part, ok, result, compute_s)
        self._pump(pool)

    def _worker_stats(self, records: list[tuple]) -> None:
        """Queries a v2 worker answered itself, into the node's one metrics view."""
        for rec in records:
            if rec[0] == "kind":  # where a query of a model with accelerator workers went: ("kind", kind, items)
                self.metrics.routed(rec[1], rec[2])
                continue
            if rec[0] == "pass":  # an accelerator worker's fused pass: ("pass", items, queries, seconds)
                self.metrics.accel_pass(rec[1], rec[2], rec[3])
                continue
            if rec[0] == "cache":  # its device row cache during that pass: ("cache", lookups, hits)
                self.metrics.device_cache(rec[1], rec[2])
                continue
            if rec[0] == "sibling":  # a query sent to an idle sibling worker, or given back by it (siblings.py)
                self.siblings[rec[1]] += 1
                continue
            if rec[0] == "refused":  # not a query: an unreadable, oversized or too-slow request
                self.metrics.refused(rec[1])
                continue
            if rec[0] == "read_paused":  # an HTTP/1.1 connection held back for pipelining too far ahead
                self.metrics.read_pauses += 1
                continue
            self.metrics.arrived()
            if rec[0] == "done":
                _, items, e2e_s, queue_s, compute_s, executions = rec
                self.metrics.done(items, e2e_s, queue_s, compute_s, executions)
            else:
                self.metrics.error(rec[1])
                self.metrics.failed(rec[2])

    def _limits(self) -> Any:
        """One worker's share of this model's admission limits (data plane v2)."""
        from recserve.serving.dataplane import PlaneLimits

        share = max(1, -(-self.cfg.queue_limit // self.cfg.workers))
        return PlaneLimits(max_body=self.node.max_body_bytes, max_json=self.node.max_json_bytes, queue_limit=share,
                           deadline_s=self.cfg.deadline_ms / 1e3, fuse_items=self.cfg.fuse_items,
                           read_timeout_s=self.node.read_timeout_s, keep_alive_s=self.node.keep_alive_timeout_s,
                           max_connections=self.node.max_connections, flood=self.node.grpc_limits)

    def accepting_now(self) -> bool:
        """A worker of this model is taking new connections on the node's socket (beat within ``RESPONSIVE_S``)."""
        if not self.accepts_in_workers:
            return False
        now = time.monotonic()
        return any(w.working and not w.retiring and now - w.last_beat < RESPONSIVE_S
                   for w in self.pools["model"].workers)

    def watch(self) -> None:
        """Watchdog tick: a v2 worker silent for ``hang_timeout_s`` is hung; answer its queries, replace it.  An
        accelerator worker holds no client connection: killing it closes its socket, so the CPU workers answer
        what they sent it with 503 at once instead of 504 at each query's deadline, and its pool restarts it."""
        if self.stopping:
            return
        self._watch_parts()
        if not self.accepts_in_workers:
            return
        now = time.monotonic()
        for w in list(self.pools["model"].workers):
            if w.working and not w.retiring and w.last_beat and now - w.last_beat > self.cfg.hang_timeout_s:
                self._replace_hung(w, now - w.last_beat)
        accel = self.pools.get("accel")
        for w in list(accel.workers) if accel is not None else []:
            if not w.hung and not w.retiring and w.last_beat and now - w.last_beat > self.cfg.hang_timeout_s:
                w.hung = True
                log.error("model %s: accelerator worker pid %s hung (%.1f s silent); replacing it", self.name,
                          w.pid, now - w.last_beat)
                w.process.kill()

    def _watch_parts(self) -> None:
        """A worker that has computed one part of a query through the server for ``hang_timeout_s`` is hung (such a
        worker sends no heartbeat of its own): its query is answered 504 and the worker killed, then restarted."""
        now = time.perf_counter()
        for pool in self.pools.values():
            for w in list(pool.workers):
                part = w.current
                if part is None or w.hung or now - part.dispatched <= self.cfg.hang_timeout_s:
                    continue
                w.hung = True
                part.query.fail(InferError("deadline", f"model {self.name!r}: {pool.stage} worker pid {w.pid} "
                                                       f"stopped responding ({now - part.dispatched:.1f} s on one "
                                                       "part of this query)"))
                log.error("model %s: %s worker pid %s hung (%.1f s on one part); replacing it", self.name,
                          pool.stage, w.pid, now - part.dispatched)
                w.process.kill()

    def _replace_hung(self, handle: WorkerHandle, silent_s: float) -> None:
        handle.hung = True
        exc = InferError("deadline", f"model {self.name!r}: worker pid {handle.pid} stopped responding "
                                     f"({silent_s:.1f} s without a heartbeat) while holding this query")
        answered = self._answer_held(handle, exc, silent_s, unread_too=True)
        log.error("model %s: worker pid %s hung (%.1f s silent): answered %d held queries with 504; replacing it",
                  self.name, handle.pid, silent_s, answered)
        handle.process.kill()  # its idle connections move on when it has exited (``_on_worker_exit``)

    def _answer_held(self, handle: WorkerHandle, exc: InferError, waited_s: float, unread_too: bool) -> int:
        """Answer ``exc`` on the connections of a dead or hung worker that hold a query (see ``watchdog.py``)."""
        from recserve.serving.dataplane import error_response

        if not handle.conns or handle.states is None:
            return 0
        answered = answer_held(handle.conns, handle.states, error_response(exc, close=True), unread_too)
        for _ in range(answered):
            self.metrics.arrived()
            self.metrics.error(exc.code)
            self.metrics.failed(waited_s)
        return answered

    def _rescue_connections(self, handle: WorkerHandle, code: int | None) -> None:
        """A v2 worker exited: its held queries get an explicit error, its idle connections another worker."""
        if not handle.conns:
            return
        if handle.retiring or self.stopping or self.on_handoff is None:
            for theirs in list(handle.conns):
                release(handle.conns, theirs)
            return
        exc = InferError("internal", f"model {self.name!r}: worker pid {handle.pid} died (exit code {code}) while "
                                     "holding this query; it was not answered")
        answered = self._answer_held(handle, exc, 0.0, unread_too=False)
        moved = len(handle.conns)
        for ours in handle.conns.values():
            self.on_handoff(ours, b"", self.name)  # routed to a live worker (or served here); takes the descriptor
        handle.conns.clear()
        log.warning("model %s: worker pid %s died: %d held queries answered with an error, %d idle connections "
                    "moved on", self.name, handle.pid, answered, moved)

    # ------------------------------------------------------------------ data plane v2
    @property
    def accepts_in_workers(self) -> bool:
        return self.listen_sock is not None and self.cfg.mode == "model"

    def adopters(self) -> list[WorkerHandle]:
        """Workers that take a connection for this model now (whole-query mode, no sub-batching)."""
        if not self.accepts_in_workers or self.sub_batch > 0 or not self.accepting:
            return []
        return [w for w in self.pools["model"].workers if not w.retiring and w.working]

    def adopt(self, fd: int, prefix: bytes, to_slot: int | None = None) -> bool:
        """Pass a connection to one of this model's workers (round robin, or the one in load slot ``to_slot``);
        False if none can take it."""
        workers = self.adopters()
        if to_slot is not None:
            workers = [w for w in workers if w.slot == to_slot]
        if not workers:
            return False
        self._next_adopter = (self._next_adopter + 1) % len(workers)
        worker = workers[self._next_adopter]
        worker.outbox.post(("adopt", prefix), fd)  # type: ignore[union-attr]
        return True

    def _broadcast(self, msg: Any) -> None:
        if not self.accepts_in_workers:
            return
        for w in self.pools["model"].workers:
            w.outbox.post(msg)  # type: ignore[union-attr]

    def _on_result(self, pool: StagePool, part: Part, ok: bool, result: Any, compute_s: float) -> None:
        query = part.query
        query.note(pool.stage, part.dispatched - part.enqueued, compute_s)
        if not ok:
            query.fail(InferError("internal", f"model {self.name!r} {pool.stage} worker failed: {result}"))
            return
        if pool.next_stage is not None:
            nxt = Part(query, part.index, (part.dense, result), part.dense)
            pool.next_stage.pending.append(nxt)
            self._pump(pool.next_stage)
            return
        query.results[part.index] = result
        query.remaining -= 1
        if query.remaining == 0 and not query.future.done():
            out = query.results[0] if len(query.results) == 1 else np.concatenate(query.results)
            query.future.set_result(out)

    def _free_slot(self) -> int:
        """Take the lowest load slot no worker of this model holds (-1 if every slot is taken)."""
        slot = next((i for i in range(LOAD_SLOTS) if i not in self._slots), -1)
        if slot >= 0:
            self._slots.add(slot)
        return slot

    def _on_worker_exit(self, pool: StagePool, handle: WorkerHandle) -> None:
        loop = asyncio.get_running_loop()
        if handle.outbox is not None:
            handle.outbox.close()
        if 0 <= handle.slot < LOAD_SLOTS:
            self.loads[handle.slot] = -1
            self._slots.discard(handle.slot)
        loop.remove_reader(handle.conn.fileno())
        handle.conn.close()
        if handle in pool.workers:
            pool.workers.remove(handle)
        handle.process.join(timeout=0.5)
        code = handle.process.exitcode
        if handle.current is not None:
            handle.current.query.fail(InferError(
                "internal", f"model {self.name!r}: worker pid {handle.pid} died (exit code {code}) "
                            "while computing this query"))
            handle.current = None
        self._rescue_connections(handle, code)
        if not handle.ready.done():
            handle.ready.set_exception(InferError(
                "internal", f"model {self.name!r}: worker exited with code {code} before it was ready"))
            handle.ready.exception()  # mark retrieved
        if not handle.exited.done():
            handle.exited.set_result(code)
        if self.llc is not None and handle.pid:
            self.llc.forget_pid(self.name, handle.pid)
        self._accel_taken.discard(handle.accel_socket)  # a replacement serves the same path
        if handle.retiring or self.stopping or not handle.pid:
            return  # retired, shutting down, or never started (the starter sees the error)
        log.warning("model %s: %s worker pid %s died (exit %s); restarting", self.name, pool.stage, handle.pid, code)
        self.metrics.worker_restarts += 1
        task = loop.create_task(self._restart(pool, handle))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart(self, pool: StagePool, dead: WorkerHandle) -> None:
        pool.restarting += 1
        try:
            for attempt in range(MAX_RESTARTS_IN_A_ROW):
                if self.stopping:
                    return
                try:
                    handle = await self._start_worker(pool, dead.cores, dead.threads)
                    if self.stopping:  # the model stopped while this worker started
                        handle.retiring = True
                        self._pump(pool)
                        await self._await_exit([handle], WORKER_STOP_TIMEOUT_S)
                    return
                except Exception as exc:  # noqa: BLE001 - an OSError (fork, pipe, memory) is a failed attempt too
                    log.error("model %s: %s (restart attempt %d)", self.name, exc, attempt + 1)
                    await asyncio.sleep(0.5 * (attempt + 1))
        finally:
            pool.restarting -= 1
        if not pool.workers and not pool.restarting:  # nobody will take the queued parts: answer, never hang
            self._fail_pending(pool, f"model {self.name!r}: no {pool.stage} worker could be restarted")

    def _fail_pending(self, pool: StagePool, message: str) -> None:
        while pool.pending:
            pool.pending.popleft().query.fail(InferError("unavailable", message))

    def abandon(self, message: str) -> int:
        """Answer every query the server still holds for this model (queued, or on a worker) with 503; returns how
        many.  The node calls it when it stops after its drain: a client should hear that now, not wait for a
        worker that shutdown will stop anyway (their sockets would hold the HTTP server's shutdown)."""
        queued = {id(p.query): p.query for pool in self.pools.values() for p in pool.pending}
        running = {id(w.current.query): w.current.query for pool in self.pools.values() for w in pool.workers
                   if w.current is not None}
        live = sum(not q.future.done() for q in (queued | running).values())
        for pool in self.pools.values():
            self._fail_pending(pool, message)
        for q in running.values():
            q.fail(InferError("unavailable", message))
        return live

    async def _await_exit(self, workers: list[WorkerHandle], timeout_s: float) -> None:
        if not workers:
            return
        done, pending = await asyncio.wait([w.exited for w in workers], timeout=timeout_s)
        for w in workers:
            if not w.exited.done():
                w.process.kill()
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    # ------------------------------------------------------------------ dispatch
    def _pump(self, pool: StagePool) -> None:
        idle = [w for w in pool.workers if w.current is None and not w.retiring
                and w.ready.done() and not w.ready.exception()]
        while pool.pending and idle:
            part = pool.pending.popleft()
            if part.query.future.done():
                continue  # failed or abandoned: do not spend a worker on it
            worker = idle.pop(0)
            part.dispatched = time.perf_counter()
            part.query.started = True
            part.item_id = next(self._ids)
            worker.current = part
            arrays = flatten(pool.stage, part.payload)
            descriptors = pack(arrays, worker.io[: worker.io_split])
            worker.outbox.post((part.item_id, None if descriptors else part.payload, descriptors))  # type: ignore[union-attr]
        for w in pool.workers:
            if w.retiring and w.current is None and not w.stop_sent:
                w.stop_sent = True
                w.outbox.post(None)  # type: ignore[union-attr]

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
        size, k = batch.size, self.sub_batch
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
            if not self.accepting:
                raise InferError("unavailable", f"model {self.name!r} is not accepting queries (shutting down)")
            batch = self.decode(arrays)
            empty = [stage for stage, pool in self.pools.items() if not pool.workers and not pool.restarting]
            if empty:
                raise InferError("unavailable", f"model {self.name!r} has no {empty[0]} workers (they died and "
                                                "could not be restarted)")
            if self.in_flight >= self.cfg.queue_limit:
                raise InferError("unavailable", f"model {self.name!r} is overloaded: {self.in_flight} queries "
                                                f"in flight (queue_limit {self.cfg.queue_limit}); retry later")
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
                first.pending.append(Part(query, i, payload, payload[0]))
            self._pump(first)
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

    async def _answer(self, query: Query, deadline: float, arrived: float) -> np.ndarray:
        """The query's scores.  One that no worker has started by its deadline is answered 504 and its parts are
        skipped when they reach the head of the queue (as the workers' own queues shed late queries), so a
        stalled pool does not hold clients past their deadline; once a part runs the query waits for it, and
        ``_watch_parts`` bounds a worker that never returns."""
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

    # ------------------------------------------------------------------ control
    def stage_for(self, stage: str | None) -> StagePool:
        stage = stage or ("model" if self.cfg.mode == "model" else "dense")
        if stage not in self.pools:
            raise InferError("invalid", f"model {self.name!r} has stages {sorted(self.pools)}, not {stage!r}", "stage")
        return self.pools[stage]

    async def set_workers(self, n: int, cores: Any = None, threads: int | None = None,
                          stage: str | None = None) -> dict[str, Any]:
        """Resize a stage's pool.  New workers are ready before old ones retire; retirees finish their part."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InferError("invalid", f"workers must be an integer >= 1, got {n!r}", "workers")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InferError("invalid", f"threads must be an integer >= 1, got {threads!r}", "threads")
        pool = self.stage_for(stage)
        async with self._control:
            threads = threads or pool.threads
            current = pool.active()
            try:
                if cores is not None or threads != pool.threads:
                    spec = cores if cores is not None else pool.cores_spec
                    sets = expand_cores(spec, n, threads, f"model {self.name!r} cores")
                    keep, start_sets = [], sets
                else:
                    sets = expand_cores(pool.cores_spec, n, threads, f"model {self.name!r} cores")
                    keep, start_sets = current[:n], sets[len(current):n]
            except Exception as exc:
                raise InferError("invalid", str(exc), "cores") from exc
            retire = [w for w in current if w not in keep]
            await asyncio.gather(*(self._start_worker(pool, s, threads) for s in start_sets))
            pool.threads = threads
            if cores is not None:
                pool.cores_spec = _flat_cores(cores)
            for w in retire:
                w.retiring = True
            if pool.stage == "accel":  # before they exit: the CPU workers stop sending to the retirees
                self._broadcast(("config", {"accel_sockets": self.accel_sockets()}))
            self._pump(pool)
            await self._await_exit(retire, WORKER_STOP_TIMEOUT_S + 60)
        return self.state()

    # ------------------------------------------------------------------ accelerator workers
    def accel_sockets(self) -> list[str]:
        """Sockets of the accelerator workers the CPU workers may send to (not retiring)."""
        pool = self.pools.get("accel")
        return [w.accel_socket for w in pool.active()] if pool is not None else []

    def _free_accel_socket(self) -> str:
        """The first socket path no live accelerator worker serves (a replacement takes its predecessor's)."""
        for i in itertools.count():
            path = os.path.join(self.accel_dir, f"accel-{i}.sock")
            if path not in self._accel_taken:
                self._accel_taken.add(path)
                return path
        raise AssertionError("unreachable")

    def set_min_items(self, k: int) -> dict[str, Any]:
        """Queries with at least ``k`` items go to the accelerator workers (DeepRecSys' threshold, at run time)."""
        if self.accel is None:
            raise InferError("invalid", f"model {self.name!r} has no accelerator workers", "min_items")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InferError("invalid", f"min_items must be an integer >= 1, got {k!r}", "min_items")
        self.min_items = k
        self._broadcast(("config", {"min_items": k}))
        return self.state()

    def accel_state(self) -> dict[str, Any] | None:
        if self.accel is None:
            return None
        m = self.metrics
        return {"device": self.accel.device, "workers": len(self.pools["accel"].active()),
                "threads": self.pools["accel"].threads, "min_items": self.min_items,
                "fuse_items": self.accel.fuse_items, "fuse_delay_us": self.accel.fuse_delay_us,
                "queries": dict(m.routed_queries), "items": dict(m.routed_items), "passes": m.accel_passes,
                "pass_items": m.accel_pass_items, "pass_seconds": round(m.accel_pass_s, 6),
                "device_cache": None if self.accel.device_table_mb is None else {
                    "budget_mb": self.accel.device_table_mb, "lookups": m.cache_lookups, "hits": m.cache_hits,
                    "hit_rate": m.cache_hits / m.cache_lookups if m.cache_lookups else None}}

    def set_default(self, default: bool) -> None:
        self.is_default = default
        self._broadcast(("config", {"default": default}))

    def set_sub_batch(self, k: int) -> dict[str, Any]:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise InferError("invalid", f"sub_batch must be an integer >= 0, got {k!r}", "sub_batch")
        self.sub_batch = k
        self._broadcast(("config", {"sub_batch": k}))
        return self.state()

    def tables_fused(self) -> bool | None:
        """Whether the served tables are pooled in one lookup per width (None: each worker built its own copy)."""
        return None if self.shared_model is None else getattr(self.shared_model, "fused", None) is not None

    def state(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.cfg.model,
            "version": self.version,
            "artifact": self.cfg.artifact,
            "sla": {"target_ms": self.sla.target_ms, "percentile": self.sla_percentile},
            "scale": self.cfg.scale,
            "mode": self.cfg.mode,
            "sub_batch": self.sub_batch,
            "max_batch_size": self.cfg.max_batch_size,
            "queue_limit": self.cfg.queue_limit,
            "share_tables": self.cfg.share_tables,
            "fuse_tables": self.cfg.fuse_tables,
            "tables_fused": self.tables_fused(),
            "in_flight": self.in_flight,
            "ready": self.ready,
            "llc_ways": self.llc.ways_of(self.name) if self.llc is not None else None,
            "stages": {
                stage: {"workers": len(pool.active()), "threads": pool.threads,
                        "cores": [w.cores for w in pool.active()], "pending_parts": len(pool.pending),
                        "worker_detail": [w.describe() for w in pool.workers]}
                for stage, pool in self.pools.items()
            },
            "worker_restarts": self.metrics.worker_restarts,
            "tier_io": self.tier_io,
            "accelerator": self.accel_state(),
            "siblings": dict(self.siblings),
            "event_loop": self.event_loop,
            "server_pid": os.getpid(),
        }
