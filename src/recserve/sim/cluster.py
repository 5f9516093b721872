"""Discrete-event simulation of a pool of instances behind one dispatch policy.

Events are query arrivals (pre-generated, sorted) and instance completions (a heap).  After every
event the one :class:`~recserve.policies.dispatcher.Dispatcher` asks the policy for assignments, the same
object the live router and the Ray Serve request router drive.  Each query's
service time on each server type is drawn up front from the :class:`ServiceModel` with common
random numbers, so different policies and rates see the same queries.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.policies.dispatch import DispatchPolicy, Instance, Query, make_instances
from recserve.policies.dispatcher import Dispatcher
from recserve.sim.latency import ServiceModel
from recserve.sim.queries import QueryStream


@dataclass
class SimResult:
    latencies_ms: np.ndarray  # per completed, measured query (after warm-up)
    completed: int
    offered: int
    violations: int
    aborted: bool
    sim_ms: float
    wall_s: float
    served_by_type: dict[str, int] = field(default_factory=dict)
    events: int = 0
    decisions: list[tuple[float, int, int]] | None = None  # (ms, query id, instance) when recorded

    def tail(self, percentile: float) -> float:
        """Tail latency; unfinished queries count as infinitely late."""
        if self.aborted:
            return math.inf
        missing = self.offered - self.completed
        if missing > 0:
            lat = np.concatenate([self.latencies_ms, np.full(missing, np.inf)])
        else:
            lat = self.latencies_ms
        return float(np.percentile(lat, percentile, method="higher")) if len(lat) else math.inf

    def summary(self, percentile: float = 99.0) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "offered": self.offered,
            "completed": self.completed,
            "aborted": self.aborted,
            f"p{percentile:g}_ms": self.tail(percentile),
            "mean_ms": float(lat.mean()) if len(lat) else None,
            "violations": self.violations,
            "served_by_type": self.served_by_type,
            "queries_per_wall_s": self.offered / self.wall_s if self.wall_s > 0 else None,
        }


def parse_pool(text: str) -> list[str]:
    """``g4dn.xlarge=1,c5n.2xlarge=2`` -> one type name per instance."""
    pool: list[str] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, count = part.partition("=")
        try:
            n = int(count) if count else 1
        except ValueError as exc:
            raise RecserveError(f"pool entry {part!r}: count must be an integer") from exc
        if n < 0:
            raise RecserveError(f"pool entry {part!r}: count must be >= 0")
        pool += [name.strip()] * n
    if not pool:
        raise RecserveError(f"pool {text!r} has no instances")
    return pool


def pool_text(pool: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for t in pool:
        counts[t] = counts.get(t, 0) + 1
    return ",".join(f"{t}={n}" for t, n in counts.items())


class ClusterSim:
    """One model served by a heterogeneous pool; ``run`` replays a query stream under a policy."""

    def __init__(self, service: ServiceModel, pool: Sequence[str], qos_ms: float, percentile: float = 99.0) -> None:
        self.service = service
        self.pool = list(pool)
        self.qos_ms = float(qos_ms)
        self.percentile = float(percentile)
        for t in dict.fromkeys(self.pool):
            service.type_index(t)

    def run(self, policy: DispatchPolicy, stream: QueryStream, qps: float | None = None,
            arrivals: np.ndarray | None = None, warmup: float = 0.02, abort_on_violation: bool = True,
            record: bool = False) -> SimResult:
        """Simulate until every query completes (or, with ``abort_on_violation``, until more queries
        have missed the QoS target than the percentile allows, since the answer is then known).
        With ``record`` the result carries the dispatcher's decisions (time, query id, instance)."""
        if arrivals is None:
            if qps is None:
                raise RecserveError("give qps or arrivals")
            arrivals = stream.arrivals(qps)
        n = len(arrivals)
        grid = self.service.bucket(stream.sizes[:n])  # service-grid index: only for drawing service times
        service = self.service.sample(list(dict.fromkeys(self.pool)), grid, stream.noise[:n]).tolist()
        return replay(policy, self.pool, stream.sizes[:n].tolist(), arrivals.tolist(), service, self.qos_ms,
                      self.percentile, warmup, abort_on_violation, record)


def replay(policy: DispatchPolicy, pool: Sequence[str], sizes: list[int], arrivals: list[float],
           service: list[list[float]], qos_ms: float, percentile: float = 99.0, warmup: float = 0.0,
           abort_on_violation: bool = False, record: bool = False) -> SimResult:
    """Discrete-event replay of a recorded query trace through the one :class:`Dispatcher`.

    ``service[i][t]`` is query ``i``'s service time on the ``t``-th distinct type of ``pool``."""
    t0 = time.perf_counter()
    n = len(arrivals)
    first_measured = int(n * warmup)
    budget = (n - first_measured) * (1.0 - percentile / 100.0)
    heap: list[tuple[float, int, int]] = []
    heappush = heapq.heappush

    def start(q: Query, inst: Instance, now: float) -> None:
        heappush(heap, (now + service[q.id][inst.type_idx], q.id, inst.index))

    instances, types = make_instances(pool)
    dispatcher = Dispatcher(policy, instances, types, start, record=record)
    latencies, violations, aborted, now, events = _run_events(
        dispatcher, instances, heap, sizes, arrivals, qos_ms, first_measured, budget if abort_on_violation else None)
    result = SimResult(np.array(latencies), len(latencies), n - first_measured, violations, aborted, now,
                       time.perf_counter() - t0, {t: sum(x.served for x in instances if x.type_name == t)
                                                   for t in types}, events)
    result.decisions = dispatcher.decisions
    return result


def _run_events(dispatcher: Dispatcher, instances: list[Instance], heap: list[tuple[float, int, int]],
                sizes: list[int], arrivals: list[float], qos_ms: float, first_measured: int,
                budget: float | None) -> tuple[list[float], int, bool, float, int]:
    """The event loop: the next completion (``heap``, filled by the dispatcher's start) or the next arrival, in time
    order, until both run out, or the violations pass ``budget`` (None: never stop early).  Returns the measured
    latencies, the violations among them, whether it stopped early, the last event's time and the events."""
    heappop = heapq.heappop
    arrive, finish, dispatch = dispatcher.arrive, dispatcher.finish, dispatcher.dispatch
    abort_on_violation = budget is not None
    n = len(arrivals)
    latencies: list[float] = []
    violations = events = 0
    aborted = False
    now = 0.0
    i = 0
    inf = math.inf
    while i < n or heap:
        t_arr = arrivals[i] if i < n else inf
        events += 1
        if heap and heap[0][0] <= t_arr:
            now, _, j = heappop(heap)
            inst = instances[j]
            q = inst.current
            if q.id >= first_measured:
                lat = now - q.arrival
                latencies.append(lat)
                if lat > qos_ms:
                    violations += 1
                    if abort_on_violation and violations > budget:
                        aborted = True
                        break
            finish(now, inst)
            dispatch(now)
        else:
            now = t_arr
            arrive(now, sizes[i], query_id=i)
            i += 1
    return latencies, violations, aborted, now, events
