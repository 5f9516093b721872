"""Which sibling a busy worker forwards a query to (``SiblingClient.less_loaded``): the policy alone, no sockets;
and what a worker does with a query a sibling gave back (its own admission, on one plane).

A link is made (not connected) the first time its sibling is chosen; queries outstanding on it are entries in its
``outstanding`` map, so each case sets the loads the siblings publish and what this worker has sent them.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from recserve.serving.worker.limits import PlaneLimits
from recserve.serving.worker.plane import WorkerPlane
from recserve.serving.worker.reporter import RETIRING_LOAD
from recserve.serving.worker.siblings import LoopLoad, SiblingClient, socket_path
from tests.support.wait import run_until


def client(loads: list[int], slot: int = 0) -> SiblingClient:
    return SiblingClient("m", "/nonexistent", slot, np.array(loads, np.int32), limit=8)


def chosen(siblings: SiblingClient, own: int) -> int | None:
    link = siblings.less_loaded(own)
    if link is None:
        return None
    return next(slot for slot, known in siblings.by_slot.items() if known is link)


def outstanding(siblings: SiblingClient, slot: int, n: int) -> None:
    link = siblings.less_loaded(1 << 20)  # makes the links of every live sibling
    assert link is not None
    siblings.by_slot[slot].outstanding = {k: (lambda *_: None) for k in range(n)}


def test_a_worker_holding_nothing_or_one_query_forwards_only_to_an_idle_sibling():
    siblings = client([0, 0])
    assert chosen(siblings, 0) is None  # not busy: nothing to gain
    assert chosen(siblings, 1) == 1
    siblings.loads[1] = 1
    assert chosen(siblings, 1) is None


def test_a_query_joins_the_shorter_queue_not_only_an_idle_one():
    """Four queued here, the sibling holds two: the query goes there (the former rule, load 0 only, kept it)."""
    siblings = client([4, 2])
    assert chosen(siblings, 4) == 1
    assert chosen(siblings, 2) is None  # as many there as here: kept (no hop for nothing)
    assert chosen(siblings, 3) == 1


def test_the_least_loaded_sibling_is_chosen_and_equal_ones_in_turn():
    siblings = client([5, 3, 1, 4])
    assert {chosen(siblings, 5) for _ in range(6)} == {2}
    siblings.loads[:] = [5, 1, 1, 1]
    assert {chosen(siblings, 5) for _ in range(6)} == {1, 2, 3}


def test_queries_on_their_way_count_against_a_sibling_that_has_not_published_them_yet():
    siblings = client([3, 0, 0])
    outstanding(siblings, 1, 2)  # sent to slot 1, not yet queued there: it still publishes 0
    assert chosen(siblings, 3) == 2
    outstanding(siblings, 2, 3)  # slot 2 now holds as many as this worker
    assert chosen(siblings, 3) == 1
    assert chosen(siblings, 2) is None


def test_this_worker_free_slots_and_retiring_siblings_are_never_chosen():
    siblings = client([0, -1, RETIRING_LOAD, 0], slot=3)
    assert {chosen(siblings, 1) for _ in range(4)} == {0}
    siblings.loads[0] = RETIRING_LOAD
    assert chosen(siblings, 1 << 20) is None
    assert set(siblings.by_slot) <= {0}  # no link made to a free slot or to itself
    assert siblings.by_slot[0].path == socket_path("/nonexistent", 0)


def fronting(siblings: SiblingClient, share: float) -> SiblingClient:
    """This worker's loop takes ``share`` of its core besides computing (a still clock: the estimate stays)."""
    siblings.loop_load = LoopLoad(clock=lambda: 0.0, cpu=lambda: 0.0)
    siblings.loop_load.share = share
    return siblings


def test_a_worker_whose_loop_takes_most_of_its_core_counts_its_queue_longer():
    """Fronting a gRPC channel, its loop takes 60% of its core: its own passes get 40%, so its queue drains at 0.4x
    a sibling's.  Holding none, it sends the query to an idle sibling; holding one, to a sibling of up to three."""
    siblings = fronting(client([0, 0]), 0.6)
    assert chosen(siblings, 0) == 1
    siblings.loads[:] = [1, 3]
    assert chosen(siblings, 1) == 1  # (1 + 1) / 0.4 = 5 counts as 4 besides the query itself
    siblings.loads[1] = 4
    assert chosen(siblings, 1) is None
    fronting(siblings, 0.3)  # under half its core: holding none it keeps the query; one counts one (2 / 0.7)
    siblings.loads[1] = 0
    assert chosen(siblings, 0) is None and chosen(siblings, 1) == 1
    siblings.loads[1] = 1
    assert chosen(siblings, 1) is None
    assert chosen(fronting(siblings, 0.4), 1) == 1  # one counts two (2 / 0.6)
    assert chosen(fronting(siblings, 0.0), 1) is None


def test_the_loop_load_is_its_cpu_less_inline_passes_over_windows_and_an_idle_window_lowers_it():
    now, cpu = [0.0], [0.0]
    load = LoopLoad(clock=lambda: now[0], cpu=lambda: cpu[0])
    now[0], cpu[0] = 0.05, 0.05
    assert load.left() == 1.0  # under a window: not read yet
    now[0], cpu[0] = 0.1, 0.08
    load.computed(0.02)  # of which an inline pass: 0.06 s of fronting in 0.1 s
    assert load.left() == pytest.approx(1 - 0.3) and load.share == pytest.approx(0.3)
    now[0], cpu[0] = 0.2, 0.14
    assert load.share == pytest.approx(0.3) and load.left() == pytest.approx(1 - 0.45)
    now[0] = 1.2  # a second with nothing to do
    assert load.left() == pytest.approx(1 - 0.225)
    now[0], cpu[0] = 1.3, 1.0  # more CPU than wall time (a stale clock read): counted as the whole core
    assert load.left() == pytest.approx(max(0.1, 1 - (0.225 + 0.5 * (1 - 0.225))))


class SlowPath:
    """A pass of 20 ms a query (the plane's fit is taught so before any query)."""

    def compute(self, queries):
        time.sleep(0.02 * len(queries))
        return [np.zeros((q[0].shape[0], 1), np.float32) for q in queries]


def test_a_query_a_sibling_gave_back_meets_this_workers_admission_but_not_its_drain():
    """A sibling refuses a query it cannot answer in time; back here, behind this worker's own queue, it is shed at
    once (503) when it would be late, not queued to wait for its deadline (a client's seconds-long grpc-timeout).
    A drain begun since it arrived does not refuse it: it was taken before."""
    loop = asyncio.new_event_loop()
    try:
        plane = WorkerPlane(loop, "m", SlowPath(), lambda msg: None, lambda *handoff: None,
                            PlaneLimits(queue_limit=8, deadline_s=10.0, fuse_items=0, compute_thread_ms=-1),
                            sub_batch=0)
        for _ in range(20):
            plane.admission.service.observe(4, 0.02)
        answers: list[str] = []

        def reply(scores, error):
            answers.append(str(error) if error is not None else "ok")

        query = (np.zeros((4, 1), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))
        now = time.perf_counter()
        plane.enqueue(query, 4, now, 10.0, reply)  # computed at once
        plane.enqueue(query, 4, now, 10.0, reply)  # queued: the worker is busy from now on
        plane.enqueue_at(query, 4, now, time.perf_counter() + 0.005, reply, returned=True)
        assert len(answers) == 2 and "after its deadline" in answers[1]
        plane.admission.draining = True
        plane.enqueue_at(query, 4, now, time.perf_counter() + 10.0, reply, returned=True)
        assert len(answers) == 2 and len(plane.admission.queue) == 2  # queued behind the 2nd, drain or not
        run_until(loop, lambda: len(answers) == 4)  # the two queued are answered
        assert answers.count("ok") == 3 and len(answers) == 4
    finally:
        loop.close()
