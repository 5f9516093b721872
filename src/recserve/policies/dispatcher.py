"""The one dispatcher every driver runs: live router, Ray Serve request router and simulator.

A dispatch policy (:mod:`recserve.policies.dispatch`) only *decides* (query, instance) pairs.  Applying
them is the same wherever queries come from: the central FIFO, each instance's local FIFO (Clockwork),
the idle list, starting a query on an instance and, on completion, teaching the policy and starting
the instance's next local query.  A driver supplies only time and transport:

- ``arrive(now, size, payload)`` when a query comes in,
- a ``start(query, instance, now)`` callback that sends the query (HTTP, a Ray replica, a heap event),
- ``complete(now, instance)`` when that instance answers,
- ``fail(instance)`` / ``park`` / ``restore`` when a live instance's machine cannot be reached (the live router).

``Query.bucket`` is always the policy's predictor bucket, computed here from the query size; a
simulator keeps its own service-time draws by query id.  ``decisions`` (optional) records every
start as ``(now_ms, query id, instance index)``, so two drivers can be compared decision by decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from recserve.policies.dispatch import DispatchPolicy, Instance, Query

StartFn = Callable[[Query, Instance, float], None]


class Dispatcher:
    """Central queue + idle list + per-instance FIFOs around one policy."""

    def __init__(self, policy: DispatchPolicy, instances: Sequence[Instance], types: Sequence[str],
                 start: StartFn, record: bool = False) -> None:
        self.policy = policy
        self.instances = list(instances)
        policy.bind(self.instances, types)
        self.queue: list[Query] = []
        self.idle: list[Instance] = list(self.instances)
        self.out_of_service: set[Instance] = set()  # its machine unreachable: given no query until ``restore``
        self._start_fn = start
        self._bucket = policy.predictor.bucket
        self._next_id = 0
        self.decisions: list[tuple[float, int, int]] | None = [] if record else None

    def new_query(self, now: float, size: int, payload: Any = None, query_id: int | None = None) -> Query:
        """A query whose bucket is the policy's bucket of its size (ids count up unless given)."""
        qid = self._next_id if query_id is None else query_id
        self._next_id = qid + 1
        return Query(qid, size, now, self._bucket(size), payload=payload)

    def arrive(self, now: float, size: int, payload: Any = None, query_id: int | None = None) -> Query:
        """Queue a new query and dispatch."""
        q = self.new_query(now, size, payload, query_id)
        self.queue.append(q)
        self.dispatch(now)
        return q

    def dispatch(self, now: float) -> None:
        """Ask the policy for pairs and apply them: idle instances start, busy ones queue locally."""
        queue = self.queue
        if not queue or not (self.idle or self.policy.per_instance_queues):
            return
        pairs = self.policy.assign(now, queue, self.idle)
        if not pairs:
            return
        taken = set()
        for q, inst in pairs:
            if inst in self.out_of_service:  # a policy that picks among all instances named one out of service
                continue
            taken.add(q.id)
            if inst.busy:
                inst.local.append(q)
            else:
                self.idle.remove(inst)
                self._start(q, inst, now)
        k = len(taken)
        if k == len(queue):
            queue.clear()
        elif all(queue[x].id in taken for x in range(k)):
            del queue[:k]
        else:
            queue[:] = [q for q in queue if q.id not in taken]

    def _start(self, q: Query, inst: Instance, now: float) -> None:
        inst.busy = True
        inst.current = q
        q.start = now
        if self.decisions is not None:
            self.decisions.append((now, q.id, inst.index))
        self._start_fn(q, inst, now)

    def finish(self, now: float, inst: Instance) -> Query:
        """``inst`` answered its current query: teach the policy, start its next local query or mark it
        idle.  Returns the finished query; the caller dispatches (after its own bookkeeping)."""
        q = inst.current
        inst.served += 1
        self.policy.on_complete(now, q, inst, now - q.start)
        if inst.local:
            self._start(inst.local.popleft(), inst, now)
        else:
            inst.busy = False
            inst.current = None
            if inst not in self.out_of_service:
                self.idle.append(inst)
        return q

    def fail(self, inst: Instance) -> Query:
        """``inst`` could not serve its current query (its machine unreachable): the policy is taught nothing, the
        instance leaves service until ``restore``, and its query, then those queued at it, return to the front of
        the central queue.  Returns that query; the caller answers or dispatches it."""
        q = inst.current
        inst.busy, inst.current = False, None
        self.queue[:0] = [q, *inst.local]
        inst.local.clear()
        self.park(inst)
        return q

    def park(self, inst: Instance) -> None:
        """Take ``inst`` out of service: an idle one at once, a busy one when its query ends."""
        self.out_of_service.add(inst)
        self.policy.take_out(inst)
        if inst in self.idle:
            self.idle.remove(inst)

    def restore(self, now: float, inst: Instance) -> None:
        """Put ``inst`` back in service and dispatch."""
        self.out_of_service.discard(inst)
        self.policy.put_back(now, inst)
        if not inst.busy and inst not in self.idle:
            self.idle.append(inst)
        self.dispatch(now)

    def withdraw(self, q: Query) -> bool:
        """Take ``q`` out of the central queue or an instance's own (its driver answers it instead); False if it
        waits in neither (started, or answered)."""
        before = len(self.queue)
        self.queue[:] = [other for other in self.queue if other is not q]
        if len(self.queue) < before:
            return True
        for inst in self.instances:
            if q in inst.local:
                inst.local.remove(q)
                return True
        return False

    def complete(self, now: float, inst: Instance) -> Query:
        """``finish`` then dispatch the central queue."""
        q = self.finish(now, inst)
        self.dispatch(now)
        return q
