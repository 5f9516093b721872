"""A model's hung and lost workers: found on the watchdog's tick, their queries answered, their connections moved.

A v2 worker silent for ``hang_timeout_s`` (no heartbeat), or any worker ``hang_timeout_s`` on one part of a query
the supervisor dispatched, is hung: what it holds is answered 504 and it is killed; its pool restarts it.  A worker
that died: the queries it held are answered 500, its idle connections go to another worker (``node/watchdog.py``
holds the descriptors and the one shared row per connection that says whether a request is unanswered)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from recserve.hostinfo import how_it_ended
from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.watchdog import answer_held, expire_in_transit, release
from recserve.serving.wire.errors import InferError

if TYPE_CHECKING:
    from recserve.serving.node.config import ModelConfig
    from recserve.serving.node.launch import FrontEnd
    from recserve.serving.node.metrics import ModelMetrics
    from recserve.serving.node.pool import WorkerPool

log = logging.getLogger("recserve.serving")


class WorkerWatch:
    def __init__(self, cfg: ModelConfig, metrics: ModelMetrics, pools: dict[str, WorkerPool],
                 front: FrontEnd) -> None:
        self.name = cfg.name
        self.hang_timeout_s = cfg.hang_timeout_s
        self.metrics = metrics
        self.pools = pools
        self.front = front

    def tick(self) -> None:
        """Watchdog tick: a v2 worker silent for ``hang_timeout_s`` is hung; answer its queries, replace it.  An
        accelerator worker holds no client connection: killing it closes its socket, so the CPU workers answer
        what they sent it with 503 at once instead of 504 at each query's deadline, and its pool restarts it."""
        if any(pool.stopping for pool in self.pools.values()):
            return
        self._watch_parts()
        if not self.front.in_workers:
            return
        now = time.monotonic()
        for w in list(self.pools["model"].workers):
            if w.working and not w.retiring and w.last_beat and now - w.last_beat > self.hang_timeout_s:
                self._replace_hung(w, now - w.last_beat)
            elif w.incoming and w.last_beat and now - w.last_beat < self.hang_timeout_s:
                expire_in_transit(w.incoming, self.hang_timeout_s)  # beating all along: it has read its pipe
        accel = self.pools.get("accel")
        for w in list(accel.workers) if accel is not None else []:
            if not w.hung and not w.retiring and w.last_beat and now - w.last_beat > self.hang_timeout_s:
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
                if part is None or w.hung or now - part.dispatched <= self.hang_timeout_s:
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
        handle.process.kill()  # its idle connections move on when it has exited (``rescue``)

    def _answer_held(self, handle: WorkerHandle, exc: InferError, waited_s: float, unread_too: bool) -> int:
        """Answer ``exc`` on the connections of a dead or hung worker that hold a query (see ``watchdog.py``)."""
        from recserve.serving.worker.http_connection import error_response

        if not handle.conns or handle.states is None:
            return 0
        answered = answer_held(handle.conns, handle.states, error_response(exc, close=True), unread_too)
        for _ in range(answered):
            self.metrics.arrived()
            self.metrics.error(exc.code)
            self.metrics.failed(waited_s)
        return answered

    def rescue(self, pool: WorkerPool, handle: WorkerHandle, code: int | None) -> None:
        """A v2 worker exited: its held queries get an explicit error, its idle connections and those still in
        transit to it another worker."""
        on_handoff = self.front.on_handoff
        in_transit = list(handle.incoming.values())
        handle.incoming.clear()
        for ours, prefix, _ in in_transit:  # never registered: it read nothing of them
            if pool.stopping or on_handoff is None:
                os.close(ours)
            else:
                on_handoff(ours, prefix, self.name)
        if not handle.conns:
            return
        if handle.retiring or pool.stopping or on_handoff is None:
            for theirs in list(handle.conns):
                release(handle.conns, theirs)
            return
        exc = InferError("internal", f"model {self.name!r}: worker pid {handle.pid} died ({how_it_ended(code)}) "
                                     "while holding this query; it was not answered")
        answered = self._answer_held(handle, exc, 0.0, unread_too=False)
        moved = len(handle.conns)
        for ours in handle.conns.values():
            on_handoff(ours, b"", self.name)  # routed to a live worker (or served here); takes the descriptor
        handle.conns.clear()
        log.warning("model %s: worker pid %s died: %d held queries answered with an error, %d idle connections "
                    "moved on, %d in transit to it moved on", self.name, handle.pid, answered, moved, len(in_transit))
