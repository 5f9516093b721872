"""Room for a new connection at a server's connection cap (``transport/room.py``)."""

from __future__ import annotations

from recserve.serving.transport.room import DRAIN_MAX, RESCAN_S, Room


def test_the_longest_waiting_eighth_is_picked_at_most_drain_max_and_at_least_one():
    room = Room()
    assert room.pick([(5.0, "a"), (1.0, "b"), (3.0, "c")], now=10.0) == ["b"]
    many = [(float(i), i) for i in range(1000)]
    assert room.pick(many, now=10.0) == list(range(DRAIN_MAX))
    assert room.pick([(float(i), i) for i in range(80)], now=10.0) == list(range(10))
    assert room.pick([((1, 0.0), "slow"), ((0, -9.0), "idle")], now=10.0) == ["idle"]  # ranks by kind first


def test_finding_none_waiting_stops_looking_for_a_while():
    room = Room()
    assert room.pick([], now=10.0) == []
    assert room.pick([(1.0, "a")], now=10.0 + RESCAN_S / 2) == []
    assert room.pick([(1.0, "a")], now=10.0 + RESCAN_S) == ["a"]
