"""What the control API changes in a served model version at run time: a stage's worker count (new workers ready
before old ones retire, retirees accepting no more connections first), the accelerator threshold, sub-batching,
whether it answers the unversioned path, and the live settings that carry each change to its workers.  The base
of ``runtime.ModelRuntime``, whose state these read and set; no query passes through it."""

from __future__ import annotations

import logging
from typing import Any

from recserve.serving.node.accelerators import AcceleratorPool
from recserve.serving.node.config import ModelConfig
from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.launch import WorkerSettings
from recserve.serving.node.live_settings import LiveSettings
from recserve.serving.node.pool import WorkerPool
from recserve.serving.wire.errors import InferError

log = logging.getLogger("recserve.serving")


class RuntimeControl:
    """Run-time changes to a model version (``ModelRuntime`` holds the state below and serves its queries)."""

    cfg: ModelConfig
    name: str
    pools: dict[str, WorkerPool]
    accel: AcceleratorPool | None
    settings: WorkerSettings
    live: LiveSettings
    withdrawn: str
    version: Any
    is_default: bool
    accepts_in_workers: bool
    state: Any  # ``ModelRuntime.state``: what a change answers with

    async def configure(self, changes: dict[str, Any], workers: list[WorkerHandle] | None = None,
                        strict: bool = True) -> None:
        """Live settings to the model workers (or to ``workers`` of them), returning once they are in effect
        (``live_settings.LiveSettings.apply``); nothing to send where the server process takes the queries.  A
        worker late past the bound is an ``InferError``, or with ``strict=False`` a warning: where the change is
        part of a step that goes on regardless (the worker applies it when its loop next runs)."""
        if not self.accepts_in_workers:
            return
        try:
            await self.live.apply(self.pools["model"].workers if workers is None else workers, changes)
        except InferError as exc:
            if strict:
                raise
            log.warning("%s", exc)

    def stage_for(self, stage: str | None) -> WorkerPool:
        stage = stage or ("model" if self.cfg.mode == "model" else "dense")
        if stage not in self.pools:
            raise InferError("invalid", f"model {self.name!r} has stages {sorted(self.pools)}, not {stage!r}", "stage")
        return self.pools[stage]

    async def set_workers(self, n: int, cores: Any = None, threads: int | None = None,
                          stage: str | None = None, replace: bool = False) -> dict[str, Any]:
        """Resize a stage's pool (``replace``: with fresh workers only).  New workers are ready before old ones
        retire; retirees finish their part."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InferError("invalid", f"workers must be an integer >= 1, got {n!r}", "workers")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InferError("invalid", f"threads must be an integer >= 1, got {threads!r}", "threads")
        pool = self.stage_for(stage)
        self.check_served("nothing was resized")

        async def retired(retirees: list[WorkerHandle]) -> None:
            if pool.stage == "model":
                await self.stop_accepting(retirees)
            if pool.stage == "accel":  # the CPU workers stop sending to retiring accelerator workers
                await self.configure({"accel_sockets": self.accel_sockets()}, strict=False)

        await pool.resize(n, cores, threads, retired, replace)
        if self.withdrawn:  # withdrawn while its workers started: none of them may take connections
            await self.stop_accepting()
        self.check_served("the workers it started retire with it")
        return self.state()

    def check_served(self, consequence: str) -> None:
        """A control request for a version withdrawn (unloaded, or replaced by a reload) since the request named
        it: a 404 saying so, never a 200 for a change to workers that are retiring."""
        if self.withdrawn:
            raise InferError("not_found", f"model {self.name!r} version {self.version} was {self.withdrawn} while "
                                          f"this request waited: {consequence}", "model_name")

    async def stop_accepting(self, workers: list[WorkerHandle] | None = None) -> None:
        """Its workers (or ``workers`` of them, about to retire) accept no more connections, acknowledged, before any
        of them closes one: a gRPC client sent GOAWAY reconnects at once, and the new connection must reach a
        worker that stays (docs/decisions/2026-11-29-retirees-stop-accepting-first.md)."""
        await self.configure({"accepting": False}, workers=workers, strict=False)

    def accel_sockets(self) -> list[str]:
        """Sockets of the accelerator workers the CPU workers may send to (not retiring)."""
        return self.accel.sockets() if self.accel is not None else []

    async def set_min_items(self, k: int) -> dict[str, Any]:
        """Queries with at least ``k`` items go to the accelerator workers (DeepRecSys' threshold, at run time)."""
        if self.accel is None:
            raise InferError("invalid", f"model {self.name!r} has no accelerator workers", "min_items")
        self.check_served("nothing was changed")
        self.accel.set_min_items(k)
        await self.configure({"min_items": k})
        log.info("model %s: queries of %d items or more go to the accelerator workers", self.name, k)
        return self.state()

    async def set_default(self, default: bool) -> None:
        """Whether this version answers the unversioned path.  A worker late to apply it is logged, not raised: the
        version load that moves it has succeeded, and the worker applies it when its loop next runs."""
        self.is_default = default
        await self.configure({"default": default}, strict=False)

    async def set_sub_batch(self, k: int) -> dict[str, Any]:
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise InferError("invalid", f"sub_batch must be an integer >= 0, got {k!r}", "sub_batch")
        self.check_served("nothing was changed")
        self.settings.sub_batch = k
        await self.configure({"sub_batch": k})
        log.info("model %s: sub_batch %d", self.name, k)
        return self.state()
