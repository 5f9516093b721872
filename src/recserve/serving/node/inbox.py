"""What a model's workers send the supervisor over their pipes, routed to the part of the runtime it concerns.

The messages (``serving/wire/pipe.py``): ready, heartbeats, batched query records, connection descriptors
(SCM_RIGHTS), hand-offs, and the replies to the items the dispatcher sent."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.watchdog import registered, release
from recserve.serving.wire import pipe

if TYPE_CHECKING:
    from recserve.serving.node.dispatch import QueryDispatcher
    from recserve.serving.node.launch import FrontEnd
    from recserve.serving.node.metrics import ModelMetrics
    from recserve.serving.node.pool import WorkerPool

log = logging.getLogger("recserve.serving")


class PipeInbox:
    def __init__(self, name: str, metrics: ModelMetrics, front: FrontEnd, dispatch: QueryDispatcher,
                 adopt: Callable[[int, bytes, int | None], bool]) -> None:
        self.name = name
        self.metrics = metrics
        self.front = front
        self.dispatch = dispatch
        self.adopt = adopt  # a connection to the model worker in a load slot (``ModelRuntime.adopt``)
        self.tier_io: list[dict[str, str]] = []  # tiered tables' read path, from the first ready worker
        # queries busy workers sent to idle ones; given back; sent by a copy, not read in place (siblings.py)
        self.siblings = {"forwarded": 0, "returned": 0, "copied": 0}

    def on_readable(self, pool: WorkerPool, handle: WorkerHandle) -> None:
        try:
            while handle.waiting():
                self.on_message(pool, handle, handle.conn.recv())
        except (EOFError, OSError):
            pool.on_exit(handle)

    def on_message(self, pool: WorkerPool, handle: WorkerHandle, raw: Any) -> None:
        if not pipe.tagged(raw):  # the reply to an item the dispatcher sent (per query part: kept untyped)
            self.dispatch.on_reply(pool, handle, raw)
            return
        msg = pipe.decode(raw)
        if isinstance(msg, pipe.Stats):
            handle.queries_done += sum(rec[0] == "done" for rec in msg.records)
            self._worker_stats(msg.records)
        elif isinstance(msg, pipe.Beat):  # dated back by its pass in flight: a pass that never ends is a hang
            handle.last_beat = time.monotonic() - float(msg.busy_s)
        elif isinstance(msg, pipe.Conn):
            from multiprocessing.reduction import recv_handle

            release(handle.conns, msg.fd)
            handle.conns[msg.fd] = recv_handle(handle.conn)
            registered(handle.incoming, handle.conns[msg.fd])
        elif isinstance(msg, pipe.Gone):
            release(handle.conns, msg.fd)
        elif isinstance(msg, pipe.Handoff):
            self._handoff(handle, msg)
        elif isinstance(msg, pipe.Applied):
            handle.config_seq = max(handle.config_seq, int(msg.seq))
        elif isinstance(msg, pipe.Ready):
            self._ready(pool, handle, msg)
        elif isinstance(msg, pipe.Failed):
            pool.on_failed(handle, msg.reason)

    def _handoff(self, handle: WorkerHandle, msg: pipe.Handoff) -> None:
        """A connection its worker does not serve (the descriptor follows on the pipe)."""
        from multiprocessing.reduction import recv_handle

        fd = recv_handle(handle.conn)
        if msg.fd >= 0:  # its copy goes only now: had the worker died before sending the descriptor, it would stay
            release(handle.conns, msg.fd)
        # moved to the idle sibling it named, with whatever was read of it (none today: only idle connections
        # move; a future move of a partly read request must not lose its bytes)
        if msg.to_slot is not None and self.adopt(fd, msg.prefix, msg.to_slot):
            os.close(fd)
        elif self.front.on_handoff is None:
            os.close(fd)
        else:
            self.front.on_handoff(fd, msg.prefix, msg.model)

    def _ready(self, pool: WorkerPool, handle: WorkerHandle, msg: pipe.Ready) -> None:
        """The worker built its model (and listens, a v2 worker)."""
        if msg.tier_io and not self.tier_io:
            self.tier_io = msg.tier_io
            for t in self.tier_io:
                log.info("model %s: tiered table %s (%s) reads %s with %s: %s", self.name, t["table"],
                         t["file"], t["mode"], t["engine"], t["why"])
        pool.on_ready(handle, int(msg.pid))

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
            if rec[0] == "tier":  # its SSD tier since the last beat: ("tier", lookups, hits, misses, ios, ...)
                self.metrics.tier(rec[1:])
                continue
            if rec[0] == "sibling":  # a query sent to an idle sibling worker, given back by it, or copied to it
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
