"""A model's accelerator workers (``serving/worker/accel.py``) as the supervisor keeps them: their Unix sockets,
the size from which CPU workers send them a query, and their counters for the control API."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from typing import TYPE_CHECKING, Any

from recserve.hostinfo import private_folder
from recserve.serving.wire.errors import InferError

if TYPE_CHECKING:
    from recserve.serving.node.config import AcceleratorConfig
    from recserve.serving.node.metrics import ModelMetrics
    from recserve.serving.node.pool import WorkerPool


class AcceleratorPool:
    """Sockets and routing threshold of one model's accelerator workers; ``pool`` starts and restarts them."""

    def __init__(self, name: str, config: AcceleratorConfig, metrics: ModelMetrics) -> None:
        self.name = name  # the model's
        self.config = config
        self.metrics = metrics
        self.min_items = config.min_items
        self.directory = private_folder("accel")  # their sockets; removed at stop
        self.pool: WorkerPool | None = None  # set by the runtime once the pool exists
        self._taken: set[str] = set()
        metrics.routed_queries = {"cpu": 0, "accelerator": 0}
        metrics.routed_items = {"cpu": 0, "accelerator": 0}

    async def start(self) -> None:
        pool = self.pool
        assert pool is not None
        await asyncio.gather(*(pool.start_worker(cores, pool.threads) for cores in self.config.core_sets()))

    def sockets(self) -> list[str]:
        """Sockets of the accelerator workers the CPU workers may send to (not retiring)."""
        return [w.accel_socket for w in self.pool.active()] if self.pool is not None else []

    def claim_socket(self) -> str:
        """The first socket path no live accelerator worker serves (a replacement takes its predecessor's)."""
        for i in itertools.count():
            path = os.path.join(self.directory, f"accel-{i}.sock")
            if path not in self._taken:
                self._taken.add(path)
                return path
        raise AssertionError("unreachable")

    def release_socket(self, path: str) -> None:
        self._taken.discard(path)

    def set_min_items(self, k: int) -> None:
        """Queries with at least ``k`` items go to the accelerator workers (DeepRecSys' threshold, at run time)."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise InferError("invalid", f"min_items must be an integer >= 1, got {k!r}", "min_items")
        self.min_items = k

    def state(self) -> dict[str, Any]:
        m, c = self.metrics, self.config
        active = self.pool.active() if self.pool is not None else []
        return {"device": c.device, "workers": len(active),
                "threads": self.pool.threads if self.pool is not None else c.threads, "min_items": self.min_items,
                "fuse_items": c.fuse_items, "fuse_delay_us": c.fuse_delay_us,
                "queries": dict(m.routed_queries), "items": dict(m.routed_items), "passes": m.accel_passes,
                "pass_items": m.accel_pass_items, "pass_seconds": round(m.accel_pass_s, 6),
                "device_cache": None if c.device_table_mb is None else {
                    "budget_mb": c.device_table_mb, "lookups": m.cache_lookups, "hits": m.cache_hits,
                    "hit_rate": m.cache_hits / m.cache_lookups if m.cache_lookups else None}}

    def cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
