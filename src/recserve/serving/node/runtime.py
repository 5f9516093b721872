"""One served model version on a node: the façade NodeCore and the HTTP and gRPC front ends call.

Its jobs live beside it: ``pool.WorkerPool`` (one stage's processes: start, restart, resize, retire),
``launch.WorkerLauncher`` (a worker's arguments and shared buffers), ``inbox.PipeInbox`` (the workers' pipe
messages), ``dispatch.QueryDispatcher`` (sub-batched and pipelined queries), ``worker_watch.WorkerWatch`` (hung and
lost workers), ``accelerators.AcceleratorPool``; ``runtime_control.RuntimeControl``, its base, makes the control
API's changes (resize, sub-batching, the accelerator threshold, the default version).  Everything runs on the
supervisor's event loop (one thread).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import numpy as np

from recserve.serving.node.accelerators import AcceleratorPool
from recserve.serving.node.config import ModelConfig
from recserve.serving.node.dispatch import QueryDispatcher
from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.inbox import PipeInbox
from recserve.serving.node.launch import FrontEnd, WorkerLauncher, WorkerSettings
from recserve.serving.node.live_settings import LiveSettings
from recserve.serving.node.llc import LlcAllocator
from recserve.serving.node.metrics import ModelMetrics
from recserve.serving.node.overload_log import OverloadLog
from recserve.serving.node.pool import WORKER_STOP_TIMEOUT_S, WorkerPool
from recserve.serving.node.runtime_control import RuntimeControl
from recserve.serving.node.upstreams import Upstreams
from recserve.serving.node.watchdog import hold_in_transit
from recserve.serving.node.worker_watch import WorkerWatch
from recserve.serving.wire import json_numbers, pipe
from recserve.serving.wire.model_info import ModelInfo
from recserve.zoo.batch import QueryBatch

log = logging.getLogger("recserve.serving")

RESPONSIVE_S = 1.0  # a v2 worker silent longer than this is not counted on to accept connections


IO_BUFFER_CAP = 256 * 1024 * 1024


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



class ModelRuntime(RuntimeControl):
    """Workers, queues and counters of one served model version."""

    def __init__(self, cfg: ModelConfig, ctx: Any, llc: LlcAllocator | None = None,
                 metrics: ModelMetrics | None = None) -> None:
        """``metrics``: the counters of the runtime this one replaces (a reloaded version: one series goes on)."""
        self.cfg = cfg
        self.name = cfg.name
        self.llc = llc
        self.info = model_info(cfg)
        self.sla = cfg.model_spec().sla
        self.metrics = metrics or ModelMetrics()
        self.settings = WorkerSettings(str(cfg.version), True, cfg.sub_batch)
        # data plane v2: the node fills it before start() when this model's workers accept queries themselves
        self.front = FrontEnd(whole_query=cfg.mode == "model")
        self.accel = AcceleratorPool(cfg.name, cfg.accelerator, self.metrics) if cfg.accelerator is not None \
            else None
        self.launcher = WorkerLauncher(cfg, ctx, self.info, self.front, self.settings, self.accel)
        self.pools: dict[str, WorkerPool] = {}
        self.dispatch = QueryDispatcher(cfg, self.info, self.metrics, self.settings, self.pools)
        self.worker_watch = WorkerWatch(cfg, self.metrics, self.pools, self.front)
        self.overload_log = OverloadLog(cfg.name, self.metrics)
        self.inbox = PipeInbox(cfg.name, self.metrics, self.front, self.dispatch, self.adopt)
        self._next_adopter = 0
        self.live = LiveSettings(cfg.name)  # settings changed at run time, acknowledged by the workers
        self.files: tuple = ()  # a repository version's files when it loaded (``Repository.stamp``)
        self.withdrawn = ""  # why this version serves no more ("unloaded", ...): control requests then fail
        self.upstreams: Upstreams | None = None  # the shard services its workers call (``options.endpoints``)
        for stage in cfg.stages():
            self.pools[stage] = self._pool(stage, cfg.threads, cfg.sparse_cores if stage == "sparse" else cfg.cores)
        if self.accel is not None:  # accelerator workers (serving/worker/accel.py)
            self.accel.pool = self.pools["accel"] = self._pool("accel", self.accel.config.threads,
                                                               self.accel.config.cores)

    def _pool(self, stage: str, threads: int, cores: Any) -> WorkerPool:
        return WorkerPool(self.name, stage, threads, cores, self.launcher, self, self.inbox.on_readable,
                          self.metrics, self.llc)

    # ------------------------------------------------------------------ what the pools tell their model
    def feed(self, pool: WorkerPool) -> None:
        self.dispatch.feed(pool)

    def lost(self, pool: WorkerPool, handle: WorkerHandle, code: int | None) -> None:
        self.dispatch.fail_current(handle, code)
        self.worker_watch.rescue(pool, handle, code)

    def unserved(self, pool: WorkerPool, message: str) -> None:
        self.dispatch.fail_pending(pool.stage, message)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self.accel is not None:  # first: the CPU workers send large queries to them from their first query
            if not self.accepts_in_workers:
                from recserve.errors import SpecError

                raise SpecError(f"model {self.name!r}: an accelerator needs the node's front_end: workers")
            await self.accel.start()
        if oversubscribed := self.cfg.oversubscribed():
            log.warning("%s", oversubscribed)
        starts = []
        for stage, (n, core_sets) in self.cfg.stages().items():
            pool = self.pools[stage]
            starts += [pool.start_worker(core_sets[i], pool.threads) for i in range(n)]
        log.info("model %s version %s: starting %d workers", self.name, self.version, len(starts))
        self.upstreams = Upstreams.of(self.cfg.options)
        began = time.monotonic()
        await asyncio.gather(*starts)
        log.info("model %s version %s: workers ready in %.1f s: %s", self.name, self.version,
                 time.monotonic() - began, "; ".join(f"{stage} pids {[w.pid for w in pool.active()]}"
                                                     for stage, pool in self.pools.items() if stage != "accel"))

    @property
    def ready(self) -> bool:
        """Accepting, a working worker in every stage, and a reachable replica of every shard service it calls."""
        return (self.accepting and all(p.ready_count() > 0 for p in self.pools.values())
                and not (self.upstreams is not None and self.upstreams.missing()))

    async def drain(self, timeout_s: float) -> None:
        """Refuse new queries and wait for admitted ones to finish."""
        self.accepting = False
        self._broadcast(pipe.encode(pipe.Drain()))
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def stop(self, timeout_s: float = WORKER_STOP_TIMEOUT_S) -> None:
        """Stop every worker: those not gone within ``timeout_s`` are killed."""
        self.accepting = False
        for pool in self.pools.values():
            pool.stopping = True
        await asyncio.gather(*(pool.stop(timeout_s) for pool in self.pools.values()))
        for stage in self.pools:
            self.dispatch.fail_pending(stage, f"model {self.name!r} stopped")
        self.launcher.cleanup()
        if self.upstreams is not None:
            self.upstreams.close()
        if self.accel is not None:
            self.accel.cleanup()

    def abandon(self, message: str) -> int:
        """Answer every query the server still holds for this model (queued, or on a worker) with 503; returns how
        many.  The node calls it when it stops after its drain: a client should hear that now, not wait for a
        worker that shutdown will stop anyway (their sockets would hold the HTTP server's shutdown)."""
        return self.dispatch.abandon(message)

    def watch(self) -> None:
        """Watchdog tick (``worker_watch.WorkerWatch.tick``, ``overload_log.OverloadLog.tick``, ``Upstreams.poke``)."""
        self.worker_watch.tick()
        self.overload_log.tick()
        if self.upstreams is not None:
            self.upstreams.poke()

    # ------------------------------------------------------------------ queries through the supervisor
    def decode(self, arrays: dict[str, np.ndarray]) -> QueryBatch:
        return self.dispatch.decode(arrays)

    def split(self, batch: QueryBatch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return self.dispatch.split(batch)

    async def infer(self, arrays: dict[str, np.ndarray], timeout_s: float | None = None) -> np.ndarray:
        """Scores ``[B, towers]`` for one query, or :class:`InferError`; ``timeout_s`` is the client's deadline
        (else the model's ``deadline_ms``)."""
        return await self.dispatch.infer(arrays, timeout_s)

    # ------------------------------------------------------------------ connections (data plane v2)
    @property
    def accepts_in_workers(self) -> bool:
        return self.front.in_workers

    def accepting_now(self) -> bool:
        """A worker of this model is taking new connections on the node's socket (beat within ``RESPONSIVE_S``)."""
        if not self.accepts_in_workers:
            return False
        now = time.monotonic()
        return any(w.working and not w.retiring and now - w.last_beat < RESPONSIVE_S
                   for w in self.pools["model"].workers)

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
        worker.outbox.post(pipe.encode(pipe.Adopt(prefix)), fd)  # type: ignore[union-attr]
        hold_in_transit(worker.incoming, fd, prefix)
        return True

    def _broadcast(self, msg: Any) -> None:
        if not self.accepts_in_workers:
            return
        for w in self.pools["model"].workers:
            w.outbox.post(msg)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ state
    version = property(lambda self: self.settings.version)
    sub_batch = property(lambda self: self.settings.sub_batch)
    sla_percentile = property(lambda self: self.sla.percentile)
    in_flight = property(lambda self: self.dispatch.in_flight)
    min_items = property(lambda self: self.accel.min_items if self.accel is not None else 0)
    stopping = property(lambda self: any(pool.stopping for pool in self.pools.values()))
    tier_io = property(lambda self: self.inbox.tier_io)  # tiered tables' read path, from the first ready worker
    siblings = property(lambda self: self.inbox.siblings)
    sibling_dir = property(lambda self: self.launcher.sibling_dir)
    event_loop = property(lambda self: self.launcher.event_loop)
    shared_model = property(lambda self: self.launcher.shared_model)

    @property
    def is_default(self) -> bool:
        """Answers the unversioned path (the node moves it to the newest loaded version)."""
        return self.settings.default

    @is_default.setter
    def is_default(self, default: bool) -> None:
        self.settings.default = default

    @property
    def accepting(self) -> bool:
        return self.dispatch.accepting

    @accepting.setter
    def accepting(self, accepting: bool) -> None:
        self.dispatch.accepting = accepting

    def accel_state(self) -> dict[str, Any] | None:
        return self.accel.state() if self.accel is not None else None

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
                        "cores": [w.cores for w in pool.active()], "pending_parts": len(self.dispatch.queues[stage]),
                        "worker_detail": [w.describe() for w in pool.workers]}
                for stage, pool in self.pools.items()
            },
            "worker_restarts": self.metrics.worker_restarts,
            "tier_io": self.tier_io,
            "accelerator": self.accel_state(),
            "siblings": dict(self.siblings),
            "event_loop": self.event_loop,
            "json_reader": "+".join(json_numbers.readers()) or "lists",
            "server_pid": os.getpid(),
        }
