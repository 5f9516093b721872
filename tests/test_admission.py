"""The admission queue (``serving/worker/admission.py``) on a fake clock: no sockets, no event loop, no sleeps.

Each case teaches the queue's fit a pass time, queues queries and moves the clock, then checks who is admitted,
who is shed at dequeue, how queries are fused and what backlog admission predicts.
"""

from __future__ import annotations

import numpy as np
import pytest

from recserve.serving.wire.errors import InferError
from recserve.serving.worker.admission import AdmissionQueue, ModelHeld, ServiceTime
from recserve.serving.worker.limits import PlaneLimits


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def queue_of(clock: Clock, pass_s: float = 0.010, others_held=None, **limits) -> tuple[AdmissionQueue, list[tuple]]:
    """A queue whose fit says every pass takes ``pass_s`` whatever its size; ``failed`` collects what it sheds."""
    failed: list[tuple] = []
    q = AdmissionQueue("m", PlaneLimits(**{"deadline_s": 1.0, **limits}),
                       lambda reply, arrived, error: failed.append((arrived, error)), clock, others_held)
    for _ in range(20):
        q.service.observe(4, pass_s)
    return q, failed


def admit(q: AdmissionQueue, items: int, timeout_s: float | None = None, arrived: float | None = None) -> None:
    """What ``WorkerPlane.enqueue_at`` does: check, then push (raises the refusal)."""
    arrived = q.clock() if arrived is None else arrived
    deadline = q.deadline(timeout_s, arrived)
    q.push(lambda scores, error: None, arrived, deadline, (), items, q.check(items, deadline))


def test_the_deadline_is_the_clients_timeout_else_the_models_counted_from_arrival():
    clock = Clock()
    q, _ = queue_of(clock, deadline_s=0.5)
    assert q.deadline(0.2, arrived=90.0) == pytest.approx(90.2)
    assert q.deadline(0.0, arrived=90.0) == 90.0  # a gRPC deadline already passed stays passed
    assert q.deadline(None, arrived=90.0) == pytest.approx(90.5)
    assert q.deadline(None) == pytest.approx(100.5)  # no arrival known: from now


def test_a_query_alone_is_always_tried_and_one_behind_others_is_shed_if_it_would_be_late():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.010, fuse_items=0)
    admit(q, 4, timeout_s=0.001)  # alone: tried although its own pass takes longer than its deadline
    assert len(q.queue) == 1 and not q.queue[0].behind
    admit(q, 4, timeout_s=0.030)  # two passes (20 ms) ahead of its 30 ms deadline: in
    assert len(q.queue) == 2 and q.queue[1].behind
    assert q.queue[1].predicted == pytest.approx(clock.now + 0.020)
    with pytest.raises(InferError, match="after its deadline") as refused:
        admit(q, 4, timeout_s=0.025)  # three passes (30 ms) > 25 ms
    assert refused.value.code == "unavailable" and "deadline_ms in the node config (1000 ms here)" in str(refused.value)
    assert len(q.queue) == 2


def test_a_client_timeout_that_passed_before_admission_is_a_504_even_for_an_idle_worker():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.010, fuse_items=0)
    for arrived, timeout_s in ((clock.now - 0.002, 0.001), (clock.now, 0.0)):  # 0: a gRPC deadline read as passed
        late = q.passed(q.deadline(timeout_s, arrived))
        assert late is not None and late.code == "deadline" and "timeout passed" in str(late)
    assert q.passed(q.deadline(0.001, clock.now)) is None


def test_the_queue_limit_refuses_whatever_the_deadline():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.0001, queue_limit=3)
    for _ in range(3):
        admit(q, 1, timeout_s=60.0)
    with pytest.raises(InferError, match=r"3 queries queued at this worker \(limit 3\)"):
        admit(q, 1, timeout_s=60.0)
    assert q.refusal(1, clock.now + 60.0) is not None
    q.next_group()  # one pass taken: room again
    assert q.refusal(1, clock.now + 60.0) is None


def test_the_models_queue_limit_counts_every_workers_queries_not_an_even_share():
    """With the model's workers' loads known, one worker may queue past its even share while the model holds fewer
    than ``model_queue_limit`` queries; once the workers hold that many together, a busy worker refuses (an idle
    one still tries a query)."""
    clock = Clock()
    others = [0]
    q, _ = queue_of(clock, pass_s=0.0001, others_held=lambda: others[0], queue_limit=2, model_queue_limit=8)
    for _ in range(6):  # three times its share of 2: the siblings hold nothing
        admit(q, 1, timeout_s=60.0)
    assert len(q.queue) == 6
    others[0] = 2  # 6 here and 2 there: the model's 8
    with pytest.raises(InferError, match=r"its workers hold 8 queries \(queue_limit 8\)"):
        admit(q, 1, timeout_s=60.0)
    q.next_group()  # a pass taken (fuse_items 256: every queued query): room again
    assert q.refusal(1, clock.now + 60.0) is None
    idle, _ = queue_of(clock, pass_s=0.0001, others_held=lambda: 100, queue_limit=2, model_queue_limit=8)
    assert idle.refusal(1, clock.now + 60.0) is None  # alone, a query is always tried
    admit(idle, 1, timeout_s=60.0)
    assert "its workers hold 101 queries" in str(idle.refusal(1, clock.now + 60.0))


def test_without_the_models_loads_a_worker_keeps_to_its_share():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.0001, queue_limit=2, model_queue_limit=8)  # no loads to count
    for _ in range(2):
        admit(q, 1, timeout_s=60.0)
    assert "2 queries queued at this worker (limit 2)" in str(q.refusal(1, clock.now + 60.0))


def test_model_held_sums_the_other_workers_published_loads():
    """Free slots (-1), this worker's own slot and a retiring worker (which takes no new query) count as none."""
    retiring = 1 << 30
    loads = np.array([3, -1, 5, retiring, 0, 7], np.int32)
    assert ModelHeld(loads, slot=2, retiring=retiring)() == 10
    loads[1] = 4  # a worker that started since: read live from the shared slots
    assert ModelHeld(loads, slot=2, retiring=retiring)() == 14
    assert ModelHeld(loads, slot=-1, retiring=retiring)() == 19


def test_lateness_headroom_tightens_admission():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.002, fuse_items=0)
    admit(q, 4)
    deadline = clock.now + 0.010  # two passes (4 ms) fit in 10 ms...
    assert q.refusal(4, deadline) is None
    for _ in range(16):
        q.lateness.observe(0.008)  # ...but not with 8 ms of recent lateness on top
    assert "headroom for recent lateness" in str(q.refusal(4, deadline))


def test_queries_past_their_deadline_are_shed_at_dequeue_but_not_one_that_found_the_queue_empty():
    clock = Clock()
    q, failed = queue_of(clock, pass_s=0.001, fuse_items=0)
    admit(q, 4, timeout_s=0.050)  # found the queue empty: computed whatever its wait
    admit(q, 4, timeout_s=0.050)  # behind: shed if still queued at its deadline
    admit(q, 4, timeout_s=5.0)
    clock.now += 0.100  # the host stalled past both short deadlines
    first = q.next_group()  # the 1st, 50 ms late, is computed; the 2nd, 50 ms late, is answered 504 instead
    assert [g.items for g in first] == [4] and not first[0].behind
    assert len(failed) == 1 and failed[0][1].code == "deadline" and "still queued" in str(failed[0][1])
    second = q.next_group()  # the 3rd is in time
    assert len(second) == 1 and second[0].deadline == pytest.approx(100.0 + 5.0)
    assert len(failed) == 1
    assert q.lateness.n == 1  # the miss taught the headroom
    assert q.next_group() == [] and q.queued_items == 0


def test_queries_behind_a_long_pass_are_answered_504_at_their_deadline_not_when_it_ends():
    """A pass on the compute thread leaves the loop free: each beat answers the queries behind it whose deadline
    passed (a hung pass would hold them until the node replaced the worker); the others wait on."""
    clock = Clock()
    q, failed = queue_of(clock, pass_s=0.001, fuse_items=0)
    admit(q, 4, timeout_s=0.050)
    assert [g.items for g in q.next_group()] == [4]
    q.pass_started = clock.now  # on the compute thread
    admit(q, 4, timeout_s=0.050)
    admit(q, 8, timeout_s=5.0)
    admit(q, 2, timeout_s=0.050)
    q.expire_waiting()
    assert failed == []
    clock.now += 0.100  # the pass still runs
    q.expire_waiting()
    assert [(e.code, "still queued" in str(e)) for _, e in failed] == [("deadline", True)] * 2
    assert [g.items for g in q.queue] == [8] and q.queued_items == 8
    q.pass_started = 0.0
    clock.now += 10.0  # no pass in flight: dequeue decides (a query alone is always tried)
    q.expire_waiting()
    assert len(failed) == 2


def test_queued_queries_are_fused_up_to_fuse_items_in_arrival_order():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.0001, fuse_items=256, queue_limit=100)
    for items in (100, 100, 100, 30, 200, 300, 10):
        admit(q, items, timeout_s=60.0)
    groups = []
    while q.queue:
        groups.append([g.items for g in q.next_group()])
    # greedy from the head; a query larger than the limit is a pass of its own
    assert groups == [[100, 100], [100, 30], [200], [300], [10]]
    for items in (100, 100, 100):
        admit(q, items, timeout_s=60.0)
    q.limits.fuse_items = 0  # no fusion: one query a pass
    assert [len(q.next_group()) for _ in range(3)] == [1, 1, 1]


def test_the_backlog_counts_the_passes_the_queue_takes_and_what_is_left_of_the_pass_in_flight():
    clock = Clock()
    q, _ = queue_of(clock, fuse_items=256, queue_limit=100)
    q.service = ServiceTime()  # a fit with a fixed and a per-item cost: 1 ms + 10 us an item
    for items in (1, 10, 100, 1000) * 5:
        q.service.observe(items, 0.001 + 1e-5 * items)
    assert q.backlog_s(10) == pytest.approx(0.001 + 1e-5 * 10)
    for _ in range(3):
        admit(q, 130, timeout_s=60.0)
    assert q.passes_with(130) == 4  # 130s never pair under 256: four passes, not ceil(520 / 256) = 3
    assert q.backlog_s(130) == pytest.approx(4 * 0.001 + 1e-5 * 520)
    q.pass_started, q.pass_end = clock.now, clock.now + 0.050  # a pass on the compute thread, 50 ms predicted
    clock.now += 0.020
    assert q.backlog_s(130) == pytest.approx(0.030 + 4 * 0.001 + 1e-5 * 520)
    assert q.busy_s() == pytest.approx(0.020)
    clock.now += 0.100  # overran its prediction: nothing more is counted for it
    assert q.backlog_s(130) == pytest.approx(4 * 0.001 + 1e-5 * 520)
    assert q.retry_after() == "1"


def test_a_pass_in_flight_makes_the_worker_busy_with_an_empty_queue():
    clock = Clock()
    q, _ = queue_of(clock, pass_s=0.010)
    assert not q.busy() and q.busy_s() == 0.0
    q.pass_started, q.pass_end = clock.now, clock.now + 0.010
    assert q.busy()
    assert q.refusal(4, clock.now + 0.005) is not None  # behind the pass in flight: late, shed
    admit(q, 4, timeout_s=1.0)
    assert q.queue[0].behind  # so it can be shed at dequeue if it waits past its deadline


def test_a_drain_refuses_new_queries_but_not_one_taken_before():
    clock = Clock()
    q, _ = queue_of(clock)
    q.draining = True
    with pytest.raises(InferError, match="shutting down"):
        q.check(4, clock.now + 1.0)
    assert q.check(4, clock.now + 1.0, admitted=True) > clock.now  # a sibling gave it back: still queued
