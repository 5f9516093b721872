"""Answer the queries a dead or hung worker holds, from the supervisor, and keep its idle clients connected.

With data plane v2 a worker owns its clients' connections, so when it dies (a crash, the OOM killer) or stops
(SIGSTOP, a deadlock) nobody else could answer them, and its kernel descriptors would close with it.  So the
supervisor holds its own descriptor of every connection a worker serves (sent by SCM_RIGHTS when the worker
takes the connection, dropped when the worker lets it go), and the worker keeps one shared slot per descriptor
saying whether a request of that connection is read and not yet answered, and if not, how many of its bytes it had
read by then (``http_connection.Connection.mark``).  A worker can die between a read and its mark, so a connection
whose kernel says more was read than its slot (``transport/tcp_reads.py``) holds a request too.  When the worker is
gone:

- a connection holding a query is answered with an error naming the worker (500 if it died, 504 if it hung)
  and closed: only the worker's own queries are lost, each with an explicit error;
- an idle keep-alive connection moves to another worker (or the supervisor), so its client sees nothing, and
  a request the worker never started reading is served there.

A hung worker is still alive and may wake: its held connections are shut down as they are answered (it can no
longer write into them), a request it has not read yet is answered too (consumed, so that closing the socket
does not reset the client before it reads the answer), and the worker is killed before its idle connections
move on.
"""

from __future__ import annotations

import logging
import os
import socket

import numpy as np

from recserve.serving.transport.tcp_reads import bytes_read
from recserve.serving.worker.http_connection import HELD

log = logging.getLogger("recserve.serving")

CONN_SLOTS = 4096  # descriptors a worker's shared state covers; a connection on a higher one is reset if it dies


def _read_unread(sock: socket.socket) -> bool:
    """Consume what the client sent that nobody read; True if there was any (a request is waiting)."""
    got = False
    while True:
        try:
            chunk = sock.recv(65536, socket.MSG_DONTWAIT)
        except OSError:
            return got
        if not chunk:
            return got
        got = True


def holds_request(sock: socket.socket, state: int) -> bool:
    """Whether a connection whose worker published ``state`` holds a request it read: one it marked
    (``HELD``), or bytes read past what the worker last published as read when the connection went idle."""
    if state == HELD:
        return True
    read = bytes_read(sock)
    return read is not None and read > state


def answer_held(conns: dict[int, int], states: np.ndarray, response: bytes, unread_too: bool) -> int:
    """Answer ``response`` on each held connection (``conns``: the worker's descriptor -> ours) whose state says
    a request is read and unanswered (``holds_request``; or, with ``unread_too``, that has an unread request
    waiting), shut it down and close our descriptor.  Answered connections leave ``conns``; the idle rest stay.
    Returns how many."""
    answered = 0
    for theirs, ours in list(conns.items()):
        sock = socket.socket(fileno=os.dup(ours))
        try:
            held = holds_request(sock, int(states[theirs])) if 0 <= theirs < len(states) else False
            if not held and not (unread_too and _read_unread(sock)):
                continue
            if held:
                _read_unread(sock)
            sock.settimeout(1.0)
            try:
                sock.sendall(response)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            answered += 1
            os.close(conns.pop(theirs))
        finally:
            sock.close()
    return answered


def release(conns: dict[int, int], theirs: int) -> None:
    """The worker no longer serves descriptor ``theirs``: close ours."""
    ours = conns.pop(theirs, None)
    if ours is not None:
        os.close(ours)
