"""How a model's workers share the node's HTTP connections: one accepted per wake-up of the listening socket, and
idle ones moved from a worker serving ``ACTIVE_GAP`` more active connections than a sibling to it."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import numpy as np

from recserve.serving.worker.connections import ACTIVE_GAP, ConnectionManager
from recserve.serving.worker.limits import PlaneLimits
from recserve.serving.worker.reporter import RETIRING_LOAD


def manager(loads: list[int] | None = None, active: list[int] | None = None, slot: int = 0,
            loop: asyncio.AbstractEventLoop | None = None) -> ConnectionManager:
    plane = SimpleNamespace(loop=loop, retiring=False, admission=SimpleNamespace(queue=[]), limits=PlaneLimits(),
                            model_name="m")
    return ConnectionManager(plane, send=lambda msg: None, hand_off=lambda *a: None,
                             loads=None if loads is None else np.array(loads, np.int32), slot=slot,
                             active=None if active is None else np.array(active, np.int32))


class Served:
    def __init__(self, requests: int) -> None:
        self.requests = requests


def serving(m: ConnectionManager, requests: list[int]) -> None:
    """``m`` serves connections that carried these many requests since its last sweep."""
    m.open = {Served(n) for n in requests}  # type: ignore[misc]


def test_a_worker_accepts_one_connection_a_wake_up_and_leaves_the_rest_queued():
    loop = asyncio.new_event_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    clients = [socket.create_connection(listener.getsockname()) for _ in range(3)]
    m = manager(loop=loop)
    taken: list[socket.socket] = []

    async def connect(sock: socket.socket, early: bool) -> None:
        taken.append(sock)

    m._connect = connect  # type: ignore[method-assign]
    m._listener = listener
    listener.setblocking(False)
    try:
        m._accept()
        loop.run_until_complete(asyncio.sleep(0))
        assert len(taken) == 1 and m.connecting == 1
        m._accept()
        m._accept()
        m._accept()  # nothing queued: returns
        loop.run_until_complete(asyncio.sleep(0))
        assert len(taken) == 3
    finally:
        for s in clients + taken:
            s.close()
        listener.close()
        loop.close()


def test_the_sweep_publishes_active_connections_and_notes_the_live_sibling_with_fewest():
    m = manager(loads=[0, 2, RETIRING_LOAD, 0, -1], active=[0, 3, 0, 1, 0], slot=0)
    serving(m, [2, 1, 0, 5])
    m._count_active()
    assert m.active[0] == 3  # connections with a request since the last sweep
    assert all(c.requests == 0 for c in m.open)  # counted afresh from now
    assert m._fewest == 3  # not the retiring slot 2 nor the empty slot 4, though both show 0


def test_an_idle_connection_moves_to_the_sibling_with_two_fewer_active_and_the_counts_follow():
    moved: list[int | None] = []
    m = manager(loads=[1, 0, -1], active=[0, 0, 0], slot=0)
    m.hand_off = lambda conn, to_slot=None: moved.append(to_slot)  # type: ignore[method-assign]
    serving(m, [1] * (ACTIVE_GAP + 1))
    m._count_active()  # 3 here, 0 at slot 1
    assert m.fewer_active() == 1
    assert m.maybe_move(object())  # type: ignore[arg-type]
    assert moved == [1] and list(m.active[:2]) == [ACTIVE_GAP, 1]
    m._moved_at = 0.0
    assert m.fewer_active() == -1 and not m.maybe_move(object())  # within ACTIVE_GAP - 1: stays
    m.active[1] = 0
    m.loads[1] = RETIRING_LOAD
    assert m.fewer_active() == -1  # a sibling that began retiring takes nothing


def test_without_shared_counts_nothing_moves_for_counts():
    m = manager(loads=[1, 0], active=None, slot=0)
    serving(m, [1, 1, 1, 1])
    m._count_active()
    assert m.fewer_active() == -1
