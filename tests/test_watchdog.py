"""The supervisor's view of a dead worker's connections (``node/watchdog.py``) on real loopback TCP sockets.

A worker marks a connection as holding a request only after its read returns; one killed in between took the
request's bytes with it while its slot still read idle.  The kernel's own count of bytes read tells them apart."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest

from recserve.serving.node.watchdog import answer_held, holds_request
from recserve.serving.transport.tcp_reads import bytes_read
from recserve.serving.worker.http_connection import HELD, READ_UNKNOWN

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
ANSWER = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


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


def supervisor_view(worker: socket.socket, state: int) -> tuple[int, dict[int, int]]:
    """What ``answer_held`` does to the connection once its worker is gone: (answered, descriptors left)."""
    conns = {worker.fileno(): os.dup(worker.fileno())}
    states = np.zeros(4096, np.int64)
    states[worker.fileno()] = state
    answered = answer_held(conns, states, ANSWER, unread_too=False)
    for ours in conns.values():
        os.close(ours)
    return answered, conns


def test_bytes_read_counts_what_was_taken_from_the_socket_not_what_waits(pair):
    client, worker = pair
    assert bytes_read(worker) == 0
    client.sendall(b"x" * 1000)
    arrived(worker, 1000)
    assert bytes_read(worker) == 0
    worker.recv(300)
    assert bytes_read(worker) == 300
    worker.recv(10_000)
    assert bytes_read(worker) == 1000


def test_bytes_read_is_unknown_off_tcp():
    a, b = socket.socketpair()
    try:
        assert bytes_read(a) is None
    finally:
        a.close()
        b.close()


def test_a_request_read_but_not_yet_marked_is_answered_not_moved(pair):
    """The worker read the request, then died before its mark: the slot reads idle with 0 bytes read."""
    client, worker = pair
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    worker.recv(65536)  # the dead worker's read
    answered, left = supervisor_view(worker, 0)
    assert answered == 1 and not left
    assert client.recv(65536) == ANSWER


def test_an_idle_connection_whose_requests_were_answered_moves_on(pair):
    client, worker = pair
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    worker.recv(65536)
    answered, left = supervisor_view(worker, len(REQUEST))  # published when it went idle
    assert answered == 0 and list(left) == [worker.fileno()]


def test_a_request_nobody_read_moves_with_its_connection(pair):
    """Unread bytes stay in the kernel: the next worker reads them."""
    client, worker = pair
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    answered, left = supervisor_view(worker, 0)
    assert answered == 0 and left
    assert worker.recv(65536) == REQUEST


def test_a_marked_request_is_answered_and_an_unknown_count_falls_back_to_the_mark(pair):
    client, worker = pair
    client.sendall(REQUEST)
    arrived(worker, len(REQUEST))
    worker.recv(65536)
    assert holds_request(worker, HELD)
    assert not holds_request(worker, READ_UNKNOWN)  # a worker that could not count: its mark alone decides
