"""Which sibling a busy worker forwards a query to (``SiblingClient.less_loaded``): the policy alone, no sockets.

A link is made (not connected) the first time its sibling is chosen; queries outstanding on it are entries in its
``outstanding`` map, so each case sets the loads the siblings publish and what this worker has sent them.
"""

from __future__ import annotations

import numpy as np

from recserve.serving.dataplane import RETIRING_LOAD
from recserve.serving.siblings import SiblingClient, socket_path


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
