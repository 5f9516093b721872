"""The supervisor's view of a dead worker's connections (``node/watchdog.py``) on real loopback TCP sockets.

A worker publishes a connection's state with its bytes read or written only at its marks; one killed between a
read or a write and its next mark left a stale row.  The kernel's own counts of bytes read and written tell."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from recserve.serving.node.watchdog import CUT, HELD, IDLE, answer_held, verdict
from recserve.serving.transport.tcp_counts import stream_counts
from recserve.serving.worker.http_connection import HELD_WRITTEN_UNKNOWN, READ_UNKNOWN, held_state

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
ERROR = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.fixture
def pair():
    """(client, the worker's descriptor of the connection) over loopback TCP."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    worker, _ = listener.accept()
    listener.close()
    client.settimeout(5.0)
    yield client, worker
    client.close()
    worker.close()


def arrived(sock: socket.socket, n: int) -> None:
    """Wait until ``n`` bytes sent to ``sock`` are in its receive queue."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if len(sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT) or b"") >= n:
            return
        time.sleep(0.001)
    raise AssertionError("the bytes did not arrive")


def request_read(client: socket.socket, worker: socket.socket) -> None:
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    assert worker.recv(65536) == REQUEST  # the (dead) worker's read


def after_death(worker: socket.socket, state: int, answer_end: int = 0) -> tuple[int, dict[int, int]]:
    """What ``answer_held`` does to the connection once its worker is gone: (answered, descriptors left)."""
    conns = {worker.fileno(): os.dup(worker.fileno())}
    states = np.zeros((4096, 2), np.int64)
    states[worker.fileno()] = state, answer_end
    answered = answer_held(conns, states, ERROR, unread_too=False)
    for ours in conns.values():
        os.close(ours)
    return answered, conns


def rest_of(client: socket.socket) -> bytes:
    """What the client reads until the connection closes."""
    out = b""
    while chunk := client.recv(65536):
        out += chunk
    return out


def test_stream_counts_are_what_was_taken_from_and_given_to_the_socket(pair):
    client, worker = pair
    assert stream_counts(worker) == (0, 0)
    client.sendall(b"x" * 1000)
    arrived(worker, 1000)
    assert stream_counts(worker).read == 0
    worker.recv(300)
    assert stream_counts(worker).read == 300
    worker.recv(10_000)
    worker.sendall(b"y" * 700)
    assert stream_counts(worker) == (1000, 700)  # written: acknowledged or still queued, either way given


def test_stream_counts_are_unknown_off_tcp():
    a, b = socket.socketpair()
    try:
        assert stream_counts(a) is None
    finally:
        a.close()
        b.close()


def test_a_request_read_but_not_yet_marked_is_answered_not_moved(pair):
    """The worker read the request, then died before its mark: the slot says idle, nothing read."""
    client, worker = pair
    request_read(client, worker)
    assert verdict(worker, 0, 0) == HELD
    answered, left = after_death(worker, 0)
    assert answered == 1 and not left
    assert rest_of(client) == ERROR


def test_an_idle_connection_whose_requests_were_answered_moves_on(pair):
    client, worker = pair
    request_read(client, worker)
    worker.sendall(ANSWER)
    assert verdict(worker, len(REQUEST), 0) == IDLE  # published when it went idle
    answered, left = after_death(worker, len(REQUEST))
    assert answered == 0 and list(left) == [worker.fileno()]


def test_a_request_nobody_read_moves_with_its_connection(pair):
    """Unread bytes stay in the kernel: the next worker reads them."""
    client, worker = pair
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    answered, left = after_death(worker, 0)
    assert answered == 0 and left
    assert worker.recv(65536) == REQUEST


def test_a_held_request_whose_answer_is_unwritten_gets_the_error(pair):
    client, worker = pair
    request_read(client, worker)
    assert verdict(worker, held_state(0), 0) == HELD
    answered, left = after_death(worker, held_state(0))
    assert answered == 1 and not left
    assert rest_of(client) == ERROR


def test_an_answer_cut_off_by_the_workers_death_is_not_followed_by_an_error(pair):
    """The worker had written part of its answer (the end it published is further): the client reads what came
    and the close, not an error that its next request would take for its own answer."""
    client, worker = pair
    request_read(client, worker)
    worker.sendall(ANSWER[:20])
    assert verdict(worker, held_state(0), len(ANSWER)) == CUT
    assert verdict(worker, held_state(0), 0) == CUT  # no end claimed (bytes read ahead): cut too
    answered, left = after_death(worker, held_state(0), len(ANSWER))
    assert answered == 0 and not left
    assert rest_of(client) == ANSWER[:20]


def test_an_answer_written_whole_before_the_idle_mark_leaves_the_connection_idle(pair):
    """The worker wrote its whole answer and died before marking the connection idle; the client has already
    sent its next request: that request is unread, so the connection moves on with it."""
    client, worker = pair
    request_read(client, worker)
    worker.sendall(ANSWER)
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    assert verdict(worker, held_state(0), len(ANSWER)) == IDLE
    answered, left = after_death(worker, held_state(0), len(ANSWER))
    assert answered == 0 and list(left) == [worker.fileno()]
    assert worker.recv(65536) == REQUEST  # for the next worker


def test_unknown_counts_fall_back_to_the_mark_alone(pair):
    client, worker = pair
    request_read(client, worker)
    worker.sendall(ANSWER)
    assert verdict(worker, READ_UNKNOWN, 0) == IDLE
    assert verdict(worker, HELD_WRITTEN_UNKNOWN, 0) == HELD


def test_a_connection_in_transit_is_held_until_registered_and_moves_on_if_its_worker_dies(pair):
    """A connection moved between workers is in the supervisor's hands only until it posts it: kept as a copy
    (``hold_in_transit``) until the new worker registers it, it survives that worker dying first."""
    from types import SimpleNamespace

    from recserve.serving.node.watchdog import hold_in_transit, registered
    from recserve.serving.node.worker_watch import WorkerWatch

    client, worker = pair
    moved: list[tuple[int, bytes, str]] = []
    front = SimpleNamespace(on_handoff=lambda fd, prefix, name: moved.append((fd, prefix, name)))
    watch = WorkerWatch(SimpleNamespace(name="m", hang_timeout_s=10.0), None, {}, front)
    dead = SimpleNamespace(conns={}, incoming={}, retiring=False, pid=1)
    hold_in_transit(dead.incoming, worker.fileno(), b"GET")
    worker.close()  # the caller's descriptor: posted, closed (the copy in the pipe is the worker's)
    watch.rescue(SimpleNamespace(stopping=False), dead, -9)
    assert not dead.incoming and len(moved) == 1 and moved[0][1:] == (b"GET", "m")
    with socket.socket(fileno=moved[0][0]) as kept:  # the connection is still open: the next worker gets it
        client.sendall(b"x")
        assert kept.recv(1) == b"x"

    second = socket.socket(fileno=os.dup(client.fileno()))
    try:
        incoming: dict = {}
        hold_in_transit(incoming, second.fileno(), b"")
        registered(incoming, os.dup(second.fileno()))  # the worker's own copy, sent back with its ``Conn``
        assert incoming == {}
    finally:
        second.close()


def test_in_transit_copies_are_closed_when_the_node_stops_or_a_live_worker_kept_them_long(pair):
    from types import SimpleNamespace

    from recserve.serving.node.watchdog import expire_in_transit, hold_in_transit
    from recserve.serving.node.worker_watch import WorkerWatch

    client, worker = pair
    watch = WorkerWatch(SimpleNamespace(name="m", hang_timeout_s=10.0), None, {},
                        SimpleNamespace(on_handoff=lambda *a: pytest.fail("moved while stopping")))
    dead = SimpleNamespace(conns={}, incoming={}, retiring=False, pid=1)
    hold_in_transit(dead.incoming, worker.fileno(), b"")
    ours = next(iter(dead.incoming.values()))[0]
    watch.rescue(SimpleNamespace(stopping=True), dead, 0)
    with pytest.raises(OSError):
        os.fstat(ours)  # closed
    incoming: dict = {}
    hold_in_transit(incoming, worker.fileno(), b"")
    expire_in_transit(incoming, 60.0)
    assert len(incoming) == 1
    expire_in_transit(incoming, 0.0)
    assert incoming == {}


def test_a_hand_off_drops_the_supervisors_copy_only_once_the_descriptor_has_come(pair):
    """A worker handing a connection over sends one message, then the descriptor: its copy in the supervisor goes
    when the descriptor is in, so a worker that dies between the two leaves the copy there to be moved on."""
    import multiprocessing
    from multiprocessing.reduction import send_handle
    from types import SimpleNamespace

    from recserve.serving.node.inbox import PipeInbox
    from recserve.serving.wire import pipe

    client, worker = pair
    routed: list[int] = []
    front = SimpleNamespace(on_handoff=lambda fd, prefix, model: routed.append(fd))
    inbox = PipeInbox("m", None, front, None, lambda fd, prefix, to_slot: False)
    for dies_first in (True, False):
        ours, theirs = multiprocessing.Pipe()
        handle = SimpleNamespace(conn=ours, conns={7: os.dup(worker.fileno())})
        if dies_first:
            theirs.close()  # the message came, the descriptor never will
            with pytest.raises(EOFError):
                inbox._handoff(handle, pipe.Handoff(b"", "m", None, 7))
            assert 7 in handle.conns and not routed  # still held: the worker's exit moves it on
            os.close(handle.conns.pop(7))
        else:
            send_handle(theirs, worker.fileno(), os.getpid())
            inbox._handoff(handle, pipe.Handoff(b"", "m", None, 7))
            assert handle.conns == {} and len(routed) == 1
            os.close(routed[0])
            theirs.close()
        ours.close()


def test_a_dead_workers_held_query_hears_how_the_worker_ended(pair):
    """The 500 for a query a dead worker held names its end in the one wording (``hostinfo.how_it_ended``)."""
    from types import SimpleNamespace

    from recserve.serving.node.worker_watch import WorkerWatch

    client, worker = pair
    request_read(client, worker)
    states = np.zeros((4096, 2), np.int64)
    states[worker.fileno()] = held_state(0), 0
    metrics = SimpleNamespace(arrived=lambda: None, error=lambda code: None, failed=lambda s: None)
    watch = WorkerWatch(SimpleNamespace(name="m", hang_timeout_s=10.0), metrics, {},
                        SimpleNamespace(on_handoff=lambda *a: None))
    dead = SimpleNamespace(conns={worker.fileno(): os.dup(worker.fileno())}, incoming={}, retiring=False, pid=7,
                           states=states)
    watch.rescue(SimpleNamespace(stopping=False), dead, -9)
    answer = rest_of(client)
    assert answer.startswith(b"HTTP/1.1 500") and b"worker pid 7 died (killed by SIGKILL (signal 9))" in answer
