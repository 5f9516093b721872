"""Query dispatch policies for a heterogeneous instance pool (Kairos Sec. 5.1 and its baselines, Sec. 7).

One interface serves both the discrete-event simulator (``recserve.sim``) and the live router
(``recserve route``): the runtime keeps a central FIFO of queued :class:`Query` objects and a list
of :class:`Instance` objects, and calls

- ``policy.bind(instances)`` once,
- ``policy.assign(now_ms, queued, idle) -> [(query, instance), ...]`` whenever a query arrives or
  an instance frees up (only when ``idle`` is non-empty, unless ``per_instance_queues``),
- ``policy.on_complete(now_ms, query, instance, service_ms)`` when an instance finishes a query,
  so the latency predictor learns online.

A pair may name a busy instance only when the policy sets ``per_instance_queues`` (Clockwork);
the runtime then appends the query to that instance's local FIFO.  Times are milliseconds.

Policies: :class:`KairosPolicy` (min-cost bipartite matching, Eq. 2-8), :class:`FCFSPolicy`
(Ribbon), :class:`DRSPolicy` (DeepRecSys static batch threshold), :class:`ClockworkPolicy`
(per-instance queues, earliest predicted completion).  The Oracle of the Kairos paper knows the
whole future and is not an online policy: :func:`oracle_throughput` computes its throughput.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment

from recserve.errors import RecserveError
from recserve.policies.predictor import LatencyPredictor


class Query:
    """One inference request: ``size`` candidate items, arrived at ``arrival`` (ms)."""

    __slots__ = ("id", "size", "bucket", "arrival", "pred_ms", "start", "payload", "noise")

    def __init__(self, id: int, size: int, arrival: float, bucket: int = 0, payload: Any = None,
                 noise: Any = None) -> None:
        self.id = id
        self.size = size
        self.bucket = bucket
        self.arrival = arrival
        self.pred_ms = 0.0
        self.start = 0.0
        self.payload = payload
        self.noise = noise


class Instance:
    """One model copy on one machine; serves one query at a time (Kairos Sec. 6)."""

    __slots__ = ("index", "type_name", "type_idx", "busy", "local", "current", "endpoint", "served")

    def __init__(self, index: int, type_name: str, type_idx: int, endpoint: Any = None) -> None:
        self.index = index
        self.type_name = type_name
        self.type_idx = type_idx
        self.busy = False
        self.local: deque[Query] = deque()
        self.current: Query | None = None
        self.endpoint = endpoint
        self.served = 0

    def __repr__(self) -> str:
        return f"Instance({self.index}, {self.type_name})"


def make_instances(pool: Sequence[str], endpoints: Sequence[Any] | None = None) -> tuple[list[Instance], list[str]]:
    """Instances for a pool given as one type name per instance; returns (instances, distinct types)."""
    types = list(dict.fromkeys(pool))
    eps = list(endpoints) if endpoints is not None else [None] * len(pool)
    return [Instance(i, t, types.index(t), eps[i]) for i, t in enumerate(pool)], types


Pairs = list[tuple[Query, Instance]]


class DispatchPolicy:
    """Base class: owns the latency predictor and each instance's predicted free time."""

    name = "base"
    per_instance_queues = False

    def __init__(self, qos_ms: float, xi: float = 0.98, predictor: LatencyPredictor | None = None) -> None:
        if qos_ms <= 0:
            raise RecserveError(f"QoS target must be positive, got {qos_ms}")
        self.qos_ms = float(qos_ms)
        self.xi = float(xi)
        self.predictor = predictor
        self.instances: list[Instance] = []
        self.free_at: list[float] = []  # predicted time each instance finishes its assigned work (ms)

    def bind(self, instances: Sequence[Instance], types: Sequence[str] | None = None) -> None:
        self.instances = list(instances)
        names = list(types) if types is not None else list(dict.fromkeys(i.type_name for i in instances))
        if self.predictor is None:
            self.predictor = LatencyPredictor(names)
        elif self.predictor.types != names:
            raise RecserveError(f"predictor types {self.predictor.types} differ from pool types {names}")
        self.type_of = np.array([i.type_idx for i in self.instances], dtype=np.int64)
        self.free_at = [0.0] * len(self.instances)

    def assign(self, now: float, queued: Sequence[Query], idle: Sequence[Instance]) -> Pairs:
        raise NotImplementedError

    def commit(self, now: float, query: Query, inst: Instance) -> None:
        """Record a decision: predicted service time and the instance's predicted free time."""
        pred = self.predictor.rows[inst.type_idx][query.bucket]
        query.pred_ms = pred
        j = inst.index
        free = self.free_at[j]
        self.free_at[j] = (free if free > now else now) + pred

    def on_complete(self, now: float, query: Query, inst: Instance, service_ms: float) -> None:
        self.predictor.observe(inst.type_idx, query.bucket, service_ms)
        j = inst.index
        if inst.local:
            self.free_at[j] += service_ms - query.pred_ms  # later queued work shifts by the error
        else:
            self.free_at[j] = now

    def take_out(self, inst: Instance) -> None:
        """An instance leaves service (its machine unreachable): never free, so no policy picks it."""
        self.free_at[inst.index] = math.inf

    def put_back(self, now: float, inst: Instance) -> None:
        """An instance returns to service, free now."""
        self.free_at[inst.index] = now

    def in_service(self, inst: Instance) -> bool:
        return self.free_at[inst.index] != math.inf

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "qos_ms": self.qos_ms}


class FCFSPolicy(DispatchPolicy):
    """Ribbon: the first queued query goes to the best idle instance (lowest predicted latency,
    so the base type when it is free)."""

    name = "ribbon"

    def assign(self, now: float, queued: Sequence[Query], idle: Sequence[Instance]) -> Pairs:
        rows = self.predictor.rows
        free = list(idle)
        out: Pairs = []
        for q in queued:
            if not free:
                break
            if len(free) == 1:
                best = free[0]
            else:
                by_type: dict[int, Instance] = {}
                for inst in free:
                    by_type.setdefault(inst.type_idx, inst)
                if len(by_type) == 1:
                    best = free[0]
                else:
                    b = q.bucket
                    best = by_type[min(by_type, key=lambda t: rows[t][b])]
            free.remove(best)
            self.commit(now, q, best)
            out.append((q, best))
        return out


class DRSPolicy(DispatchPolicy):
    """DeepRecSys: queries larger than ``threshold`` go to base-type instances, the rest to auxiliary
    ones, each class served FCFS; the threshold is static (tuned offline by :func:`tune_threshold`)."""

    name = "drs"

    def __init__(self, qos_ms: float, threshold: int, base_types: Sequence[str], **kw: Any) -> None:
        super().__init__(qos_ms, **kw)
        self.threshold = int(threshold)
        self.base_types = set(base_types)

    def assign(self, now: float, queued: Sequence[Query], idle: Sequence[Instance]) -> Pairs:
        base = [i for i in idle if i.type_name in self.base_types]
        aux = [i for i in idle if i.type_name not in self.base_types]
        in_service = [i for i in self.instances if self.in_service(i)]
        has_aux = any(i.type_name not in self.base_types for i in in_service)
        has_base = any(i.type_name in self.base_types for i in in_service)  # else large queries go to aux ones
        if len(aux) > 1:
            pred = self.predictor.pred
            aux.sort(key=lambda i: pred[i.type_idx, -1])
        out: Pairs = []
        for q in queued:
            if not base and not aux:
                break
            pick = base if ((q.size > self.threshold and has_base) or not has_aux) else aux
            if pick:
                inst = pick.pop(0)
                self.commit(now, q, inst)
                out.append((q, inst))
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "threshold": self.threshold, "base_types": sorted(self.base_types)}


class ClockworkPolicy(DispatchPolicy):
    """Clockwork-style central controller: every query is sent at once to the instance queue with the
    earliest predicted completion (which meets QoS whenever any instance can)."""

    name = "clockwork"
    per_instance_queues = True

    def assign(self, now: float, queued: Sequence[Query], idle: Sequence[Instance]) -> Pairs:
        pred = self.predictor.pred
        out: Pairs = []
        for q in queued:
            finish = np.maximum(np.array(self.free_at), now) + pred[self.type_of, q.bucket]
            inst = self.instances[int(np.argmin(finish))]
            self.commit(now, q, inst)
            out.append((q, inst))
        return out


OUT_OF_SERVICE_COST = 1e12  # an instance out of service in Kairos' matching: finite, so the matching is feasible


class KairosPolicy(DispatchPolicy):
    """Kairos query distribution: min-cost bipartite matching of queued queries to instances with cost
    C_j * L_ij (Eq. 4), L_ij = remaining busy time of I_j + predicted latency of Q_i on I_j, and
    QoS-violating pairs (L_ij + W_i > xi * T_qos, Eq. 5) penalised to 10 * T_qos (Eq. 8).

    Busy instances take part in the matching through their remaining time, so a large query can be
    held for a soon-free fast instance rather than sent to a slow idle one; only pairs naming an idle
    instance are dispatched now.  The matching considers the oldest ``window`` queued queries.
    """

    name = "kairos"

    def __init__(self, qos_ms: float, window: int = 64, penalty: float = 10.0, **kw: Any) -> None:
        super().__init__(qos_ms, **kw)
        self.window = int(window)
        self.penalty = float(penalty)

    def cost_matrix(self, now: float, queued: Sequence[Query]) -> np.ndarray:
        qs = queued[: self.window]
        buckets = np.fromiter((q.bucket for q in qs), dtype=np.int64, count=len(qs))
        waits = now - np.fromiter((q.arrival for q in qs), dtype=float, count=len(qs))
        remaining = np.maximum(np.array(self.free_at) - now, 0.0)
        latency = self.predictor.pred.T[buckets][:, self.type_of]  # [n queries, m instances]
        latency += remaining
        violates = latency + waits[:, None] > self.xi * self.qos_ms
        latency[violates] = self.penalty * self.qos_ms
        latency *= self.predictor.coefficients()[self.type_of]
        latency[:, np.isinf(remaining)] = OUT_OF_SERVICE_COST  # never matched while another instance is in service
        return latency

    def assign(self, now: float, queued: Sequence[Query], idle: Sequence[Instance]) -> Pairs:
        if not queued or not idle:
            return []
        cost = self.cost_matrix(now, queued)
        rows, cols = linear_sum_assignment(cost)
        idle_ids = {i.index for i in idle}
        out: Pairs = []
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            if c in idle_ids:
                q, inst = queued[r], self.instances[c]
                self.commit(now, q, inst)
                out.append((q, inst))
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "xi": self.xi, "penalty_x_qos": self.penalty, "window": self.window}


POLICIES: dict[str, type[DispatchPolicy]] = {
    "kairos": KairosPolicy,
    "ribbon": FCFSPolicy,
    "fcfs": FCFSPolicy,
    "drs": DRSPolicy,
    "clockwork": ClockworkPolicy,
}


def make_policy(name: str, qos_ms: float, **kw: Any) -> DispatchPolicy:
    """A fresh policy by name (``drs`` needs ``threshold`` and ``base_types``)."""
    cls = POLICIES.get(name)
    if cls is None:
        raise RecserveError(f"unknown dispatch policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    if cls is not DRSPolicy:
        kw.pop("threshold", None)
        kw.pop("base_types", None)
    return cls(qos_ms, **kw)


# ---------------------------------------------------------------- offline helpers


def tune_threshold(evaluate: Callable[[int], float], start: int, step: int = 100, min_step: int = 10,
                   lo: int = 0, hi: int = 1000) -> tuple[int, float, list[tuple[int, float]]]:
    """DeepRecSys hill-climbing over the batch-size threshold: move while throughput improves, then halve
    the step.  ``evaluate(threshold)`` returns allowable throughput.  Returns (best, its value, trace)."""
    seen: dict[int, float] = {}

    def value(t: int) -> float:
        t = min(max(t, lo), hi)
        if t not in seen:
            seen[t] = evaluate(t)
        return seen[t]

    best = min(max(int(start), lo), hi)
    best_val = value(best)
    while step >= min_step:
        moved = False
        for direction in (1, -1):
            cand = min(max(best + direction * step, lo), hi)
            if cand != best and value(cand) > best_val:
                best, best_val, moved = cand, value(cand), True
                break
        if not moved:
            step //= 2
    return best, best_val, sorted(seen.items())


def oracle_throughput(sizes: np.ndarray, pool: Sequence[str], mean_ms: dict[str, np.ndarray],
                      tail_ms: dict[str, np.ndarray], qos_ms: float, bucket_of: Callable[[np.ndarray], np.ndarray],
                      max_unserved: float = 0.01) -> float:
    """Kairos' Oracle (Sec. 7): all queries known up front and sorted by size; a base instance (the type
    fastest on the largest query) always takes the next largest query, an auxiliary instance the next
    smallest one that it can serve within QoS; no waiting.  Returns queries per second over the
    makespan, or 0 when more than ``max_unserved`` of the queries fit no instance's QoS."""
    order = np.sort(np.asarray(sizes))
    buckets = bucket_of(order)
    types = list(dict.fromkeys(pool))
    base = min(types, key=lambda t: mean_ms[t][-1])
    fits = {t: tail_ms[t][buckets] <= qos_ms for t in types}
    servable = np.zeros(len(order), dtype=bool)
    for t in types:
        servable |= fits[t]
    if 1.0 - servable.mean() > max_unserved:
        return 0.0
    lo, hi = 0, len(order) - 1
    heap = [(0.0, k, t) for k, t in enumerate(pool)]
    heapq.heapify(heap)
    served, makespan = 0, 0.0
    while heap and lo <= hi:
        t_free, k, t = heapq.heappop(heap)
        if t == base:
            while hi >= lo and not servable[hi]:
                hi -= 1
            if hi < lo:
                break
            idx, hi = hi, hi - 1
        else:
            if not fits[t][lo]:
                continue  # even the smallest remaining query violates QoS here: this instance retires
            idx, lo = lo, lo + 1
        finish = t_free + float(mean_ms[t][buckets[idx]])
        makespan = max(makespan, finish)
        served += 1
        heapq.heappush(heap, (finish, k, t))
    return served / (makespan / 1000.0) if makespan > 0 else 0.0
