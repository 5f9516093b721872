"""Discrete-event simulation of a pool of instances behind one dispatch policy.

Events are query arrivals (pre-generated, sorted) and instance completions (a heap).  After every
event the runtime asks the policy for assignments, exactly as the live router does.  Each query's
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
            arrivals: np.ndarray | None = None, warmup: float = 0.02, abort_on_violation: bool = True) -> SimResult:
        """Simulate until every query completes (or, with ``abort_on_violation``, until more queries
        have missed the QoS target than the percentile allows, since the answer is then known)."""
        if arrivals is None:
            if qps is None:
                raise RecserveError("give qps or arrivals")
            arrivals = stream.arrivals(qps)
        n = len(arrivals)
        instances, types = make_instances(self.pool)
        policy.bind(instances, types)
        buckets = self.service.bucket(stream.sizes[:n])
        service = self.service.sample(types, buckets, stream.noise[:n]).tolist()
        return _event_loop(policy, instances, types, stream.sizes[:n].tolist(), buckets.tolist(),
                           arrivals.tolist(), service, self.qos_ms, self.percentile, warmup, abort_on_violation)


def _event_loop(policy: DispatchPolicy, instances: list[Instance], types: list[str], sizes: list[int],
                buckets: list[int], arrivals: list[float], service: list[list[float]], qos_ms: float,
                percentile: float, warmup: float, abort_on_violation: bool) -> SimResult:
    t0 = time.perf_counter()
    n = len(arrivals)
    first_measured = int(n * warmup)
    budget = (n - first_measured) * (1.0 - percentile / 100.0)
    heap: list[tuple[float, int, int]] = []
    queue: list[Query] = []
    idle: list[Instance] = list(instances)
    latencies: list[float] = []
    per_instance = policy.per_instance_queues
    assign, on_complete = policy.assign, policy.on_complete
    heappush, heappop = heapq.heappush, heapq.heappop
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
            svc = now - q.start
            if q.id >= first_measured:
                lat = now - q.arrival
                latencies.append(lat)
                if lat > qos_ms:
                    violations += 1
                    if abort_on_violation and violations > budget:
                        aborted = True
                        break
            inst.served += 1
            on_complete(now, q, inst, svc)
            if inst.local:
                nxt = inst.local.popleft()
                nxt.start = now
                inst.current = nxt
                heappush(heap, (now + service[nxt.id][inst.type_idx], nxt.id, j))
            else:
                inst.busy = False
                inst.current = None
                idle.append(inst)
        else:
            now = t_arr
            queue.append(Query(i, sizes[i], t_arr, buckets[i]))
            i += 1
        if queue and (idle or per_instance):
            pairs = assign(now, queue, idle)
            if pairs:
                _apply(pairs, queue, idle, heap, service, now)
    return SimResult(np.array(latencies), len(latencies), n - first_measured, violations, aborted, now,
                     time.perf_counter() - t0, {t: sum(x.served for x in instances if x.type_name == t)
                                                 for t in types}, events)


def _apply(pairs: list[tuple[Query, Instance]], queue: list[Query], idle: list[Instance],
           heap: list[tuple[float, int, int]], service: list[list[float]], now: float) -> None:
    taken = set()
    for q, inst in pairs:
        taken.add(q.id)
        if inst.busy:
            inst.local.append(q)
            continue
        inst.busy = True
        inst.current = q
        q.start = now
        idle.remove(inst)
        heapq.heappush(heap, (now + service[q.id][inst.type_idx], q.id, inst.index))
    k = len(taken)
    if k == len(queue):
        queue.clear()
    elif all(queue[x].id in taken for x in range(k)):
        del queue[:k]
    else:
        queue[:] = [q for q in queue if q.id not in taken]
