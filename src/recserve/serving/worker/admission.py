"""A worker's admission queue: which queries are let in, which are shed, and which are fused into one pass.

- Queries wait in a local FIFO, bounded by the queries the model's workers hold together (``model_queue_limit``,
  counted from the loads each worker publishes: ``ModelHeld``), else by this worker's share.  A query is admitted
  only if it can still finish before its deadline (the client's ``timeout`` parameter, else the model's SLA) given
  the work queued ahead of it, as predicted by an online fit of this worker's compute time (``ServiceTime``) plus
  the lateness recently seen (``Lateness``); the rest are shed at once with 503 and ``Retry-After``, and a query
  whose deadline passed while it waited is answered 504 without computing it (Triton's queue policy with timeouts,
  made latency-aware).
- Queries already queued when the worker turns to compute are fused into one forward pass (up to ``fuse_items``
  samples; Triton's dynamic batching with no added delay): a forward pass costs ~1 ms of fixed overhead at batch 1
  on a 2-core host, so under load this is where a worker gains throughput.

The queue reads time from the clock it is given (``time.perf_counter`` in a worker), so its decisions are tested
without sockets or sleeps (``tests/test_admission.py``).  ``WorkerPlane`` (``worker/plane.py``) computes the passes.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from recserve.serving.wire.errors import InferError
from recserve.serving.worker.limits import PlaneLimits

Reply = Callable[[np.ndarray | None, InferError | None], None]  # (scores, None) or (None, error)


@dataclass
class Query:
    reply: Reply  # the transport's answer (HTTP bytes on a connection, a gRPC future)
    arrived: float
    deadline: float
    arrays: tuple  # (dense, values, lengths), validated
    items: int
    behind: bool  # admitted behind other queries (only those can miss their deadline by waiting here)
    predicted: float = 0.0  # when admission predicted it would be answered (``Lateness`` learns from the miss)


class ServiceTime:
    """Online least-squares fit of one forward pass: ``seconds = fixed + per_item * items``.

    Why: admission must know what the queries queued ahead will cost on *this* worker now (its model,
    cores, co-runners), so it learns from every pass it makes, forgetting old passes geometrically.
    """

    def __init__(self, forget: float = 0.98) -> None:
        self.forget = forget
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def observe(self, items: int, seconds: float) -> None:
        f = self.forget
        self.n, self.sx, self.sy = f * self.n + 1, f * self.sx + items, f * self.sy + seconds
        self.sxx, self.sxy = f * self.sxx + items * items, f * self.sxy + items * seconds

    def coefficients(self) -> tuple[float, float]:
        if self.n < 1:
            return 0.0, 0.0
        var = self.sxx / self.n - (self.sx / self.n) ** 2
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        slope = (self.sxy / self.n - mean_x * mean_y) / var if var > 1e-9 else 0.0
        if slope <= 0:  # one batch size seen so far (or noise): attribute everything to the fixed part
            return mean_y, 0.0
        return max(0.0, mean_y - slope * mean_x), slope

    def predict(self, items: int, passes: int = 1) -> float:
        fixed, per_item = self.coefficients()
        return passes * fixed + per_item * items


class Lateness:
    """How much later than predicted recent queries were answered: the headroom admission keeps.

    Why: the fit predicts a mean pass, and under overload a pass varies about 2x around it (the loop's reading
    and shedding share the core with the compute thread; measured at 5x on the 2-core host: actual/predicted p5
    0.5, p95 2.0), so admitting whatever the fit says finishes just before its deadline let one admitted query in
    four miss it.  Admission keeps the ``quantile`` (p99: the issue's bound is on admitted p99) of the last
    ``keep`` queries' lateness as headroom: it learns the host's noise instead of assuming it.
    """

    def __init__(self, keep: int = 256, quantile: float = 99.0, every: int = 16) -> None:
        self.late = np.zeros(keep)
        self.quantile, self.every = quantile, every
        self.n = 0
        self._headroom = 0.0

    def observe(self, late_s: float) -> None:
        self.late[self.n % len(self.late)] = late_s
        self.n += 1
        if self.n % self.every == 0:
            self._headroom = max(0.0, percentile(self.late[: min(self.n, len(self.late))], self.quantile))

    def headroom(self) -> float:
        return self._headroom


def percentile(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (linear interpolation) by a partial sort: ~10x cheaper on a few hundred values,
    which matters on a path run every 16 queries (np.percentile cost ~1% of a batch-1 worker's CPU)."""
    k = q / 100.0 * (values.size - 1)
    lo = int(k)
    hi = min(lo + 1, values.size - 1)
    part = np.partition(values, (lo, hi))
    return float(part[lo] + (part[hi] - part[lo]) * (k - lo))


class AdmissionQueue:
    """The admitted queries of one worker and the pass in flight: who is let in, who is shed, what is fused.

    ``fail(reply, arrived, error)`` answers and counts a query shed when it is dequeued (its deadline passed while
    it waited); ``clock`` is the time every decision reads.
    """

    def __init__(self, model_name: str, limits: PlaneLimits, fail: Callable[[Reply, float, InferError], None],
                 clock: Callable[[], float] = time.perf_counter,
                 others_held: Callable[[], int] | None = None) -> None:
        self.model_name = model_name
        self.limits = limits
        self.others_held = others_held  # queries the model's other workers hold (``ModelHeld``), if known
        self.fail = fail
        self.clock = clock
        self.service = ServiceTime()
        self.lateness = Lateness()
        self.queue: collections.deque[Query] = collections.deque()
        self.queued_items = 0
        self.running = False  # being worked through: a pass computes or the next turn is due (``WorkerPlane``)
        self.computing = 0  # queries in the pass in flight
        self.pass_started = 0.0  # a pass on the compute thread: when it started (0: none in flight)
        self.pass_end = 0.0  # and when the fit predicts it ends
        self.draining = False  # finish what is queued; refuse new queries with 503

    def deadline(self, timeout_s: float | None, arrived: float | None = None) -> float:
        """When a query must be answered: the transport's ``timeout_s``, else the model's default, counted from
        when its first byte arrived: the client's clock started before that, and counting from the whole request
        gave the upload time (milliseconds for a 1 MB query on a busy host) back to the node."""
        timeout_s = self.limits.deadline_s if timeout_s is None else timeout_s  # 0: a deadline already passed
        return (self.clock() if arrived is None else arrived) + timeout_s

    def passed(self, deadline: float) -> InferError | None:
        """504 for a query whose client's timeout passed before it was admitted (gRPC's deadline read as expired,
        a tiny ``parameters.timeout``): the client has stopped waiting, so even an idle worker does not compute it.
        The model's own deadline is not checked here: a query alone is always tried against it."""
        late = self.clock() - deadline
        if late < 0:
            return None
        return InferError("deadline", f"model {self.model_name!r}: deadline exceeded: the client's timeout passed "
                                      f"{late * 1e3:.1f} ms before the query was admitted. {self.deadline_hint()}")

    def check(self, items: int, deadline: float, admitted: bool = False) -> float:
        """Raise 503 unless a query of ``items`` can be answered by ``deadline``; return when it is predicted to be
        (the fit of the work ahead, plus ``Lateness`` headroom for the decision only).  ``admitted``: a query this
        worker took before and a sibling gave back: a drain begun since does not refuse it, the work ahead does (a
        sibling refuses a query it cannot answer in time, and this worker held more than it when it sent it;
        queued past admission, it waited for its deadline, the client's ``grpc-timeout`` of seconds)."""
        if self.draining and not admitted:
            raise InferError("unavailable", f"model {self.model_name!r} is not accepting queries (shutting down)")
        now = self.clock()
        full = self.queue_full()
        if full:
            raise InferError("unavailable", f"model {self.model_name!r} is overloaded: {full}; retry later")
        finish = now + self.backlog_s(items)
        if not self.busy():
            return finish  # alone, a query is always tried: only its own deadline at dequeue can refuse it
        headroom = self.lateness.headroom()
        if finish + headroom > deadline:
            raise InferError("unavailable", f"model {self.model_name!r} is overloaded: this query would finish "
                                            f"{(finish + headroom - deadline) * 1e3:.1f} ms after its deadline "
                                            f"behind {len(self.queue)} queued (with {headroom * 1e3:.1f} ms of "
                                            f"headroom for recent lateness); retry later. {self.deadline_hint()}")
        return finish

    def queue_full(self) -> str:
        """Why no query may join the queue now ("" if one may): the model's workers hold ``model_queue_limit``
        queries together, or, where no model-wide count is known, this worker's queue holds its share.  A model-wide
        bound lets one worker queue more while its siblings hold less (its connections' clients send more): an even
        split refused there with the model far from its limit.  An idle worker always takes a query."""
        limits, queued = self.limits, len(self.queue)
        if self.others_held is None or limits.model_queue_limit <= 0:
            if queued >= limits.queue_limit:
                return f"{queued} queries queued at this worker (limit {limits.queue_limit})"
            return ""
        if not self.busy():
            return ""
        held = self.held() + self.others_held()
        if held >= limits.model_queue_limit:
            return f"its workers hold {held} queries (queue_limit {limits.model_queue_limit})"
        return ""

    def refusal(self, items: int, deadline: float) -> InferError | None:
        """``check``'s verdict as a value: the error a query of ``items`` due by ``deadline`` is refused with, or
        None if it would be admitted."""
        try:
            self.check(items, deadline)
        except InferError as exc:  # without its traceback, whose frames (the caller's request) it would keep
            return exc.with_traceback(None)
        return None

    def push(self, reply: Reply, arrived: float, deadline: float, arrays: tuple, items: int,
             predicted: float) -> None:
        """Queue a query ``check`` admitted; it is ``behind`` if queries are queued or a pass computes."""
        queue = self.queue
        queue.append(Query(reply, arrived, deadline, arrays, items, bool(queue) or self.pass_started > 0.0,
                           predicted))
        self.queued_items += items

    def deadline_hint(self) -> str:
        """How a client or operator moves the deadline a refusal was judged against (said in every 503/504)."""
        return (f"A query's deadline is the client's timeout (HTTP parameters.timeout in us, gRPC deadline), else "
                f"the model's deadline_ms in the node config ({self.limits.deadline_s * 1e3:.0f} ms here)")

    def backlog_s(self, items: int = 0) -> float:
        """Predicted seconds until a query of ``items`` samples joining the queue now is answered: what is left
        of a pass in flight on the compute thread, then the queued passes and its own."""
        in_flight = max(0.0, self.pass_end - self.clock()) if self.pass_started else 0.0
        return in_flight + self.service.predict(self.queued_items + items, self.passes_with(items))

    def passes_with(self, items: int) -> int:
        """Forward passes the queue takes with a query of ``items`` at its end, grouped as ``next_group`` will
        (greedy, up to ``fuse_items``).  Not ``ceil(total / fuse_items)``: queries of ~190 items (the production
        mix's median) rarely pair under 256, so that count undercounts the passes, each with its fixed cost."""
        fuse = self.limits.fuse_items
        if fuse <= 0:
            return len(self.queue) + 1
        passes, group = 1, 0
        for size in [q.items for q in self.queue] + [items]:
            if group and group + size > fuse:
                passes, group = passes + 1, 0
            group += size
        return passes

    def busy(self) -> bool:
        """Queries are queued here, or a pass is computing on the compute thread (a new query waits behind it)."""
        return bool(self.queue) or self.pass_started > 0.0

    def held(self) -> int:
        """Queries this worker holds: queued, plus those in the pass in flight (its published load)."""
        return len(self.queue) + self.computing

    def busy_s(self) -> float:
        """How long the pass in flight on the compute thread has run (0 when none): a pass that never ends must
        look like a silent worker to the watchdog although the loop beats on."""
        return self.clock() - self.pass_started if self.pass_started else 0.0

    def retry_after(self) -> str:
        """Seconds a shed client should wait: the queue ahead, rounded up (at least 1, as the header needs)."""
        return str(max(1, int(self.backlog_s()) + 1))

    def next_group(self) -> list[Query]:
        """Queued queries for one forward pass: the head, and what follows it up to ``fuse_items`` samples.

        Queries that waited behind others past their deadline are answered 504 here without computing them (a
        query that found the queue empty is always computed: its wait is only the host's scheduling).
        """
        group: list[Query] = []
        total, now = 0, self.clock()
        while self.queue:
            q = self.queue[0]
            if q.behind and q.deadline < now:
                self._take(q)
                self._expired(q, now)
                continue
            if group and (self.limits.fuse_items <= 0 or total + q.items > self.limits.fuse_items):
                break
            self._take(q)
            group.append(q)
            total += q.items
        return group

    def expire_waiting(self) -> None:
        """While a pass runs on the compute thread: queries queued behind it whose deadline passed are answered 504
        now rather than when it ends (a pass that hangs would hold them until the node replaced the worker)."""
        if not self.pass_started:
            return
        now = self.clock()
        late = [q for q in self.queue if q.behind and q.deadline < now]
        if not late:
            return
        self.queue = collections.deque(q for q in self.queue if not (q.behind and q.deadline < now))
        for q in late:
            self.queued_items -= q.items
            self._expired(q, now)

    def _expired(self, q: Query, now: float) -> None:
        self.lateness.observe(now - q.predicted)
        waited = (now - q.arrived) * 1e3
        self.fail(q.reply, q.arrived, InferError(
            "deadline", f"model {self.model_name!r}: deadline exceeded: {waited:.1f} ms after the request "
                        f"arrived it was still queued. {self.deadline_hint()}"))

    def _take(self, q: Query) -> None:
        self.queue.popleft()
        self.queued_items -= q.items


class ModelHeld:
    """Queries the model's other workers hold, from the load each publishes in its shared slot (``Reporter.
    publish_load``: queued plus computing; -1 for a free slot, ``retiring`` for a retiring worker, which counts as
    none: it takes no new query).  Read only while this worker is busy (``AdmissionQueue.queue_full``)."""

    def __init__(self, loads: np.ndarray, slot: int, retiring: int) -> None:
        self.loads = loads
        self.slot = slot
        self.retiring = retiring

    def __call__(self) -> int:
        loads = self.loads.tolist()  # 64 slots: a list sum costs ~1.5 us, numpy's masked sum twice that
        if 0 <= self.slot < len(loads):
            loads[self.slot] = 0
        retiring = self.retiring
        return sum(load for load in loads if 0 < load < retiring)
