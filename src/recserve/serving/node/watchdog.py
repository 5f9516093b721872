"""Answer the queries a dead or hung worker holds, from the supervisor, and keep its idle clients connected.

With data plane v2 a worker owns its clients' connections, so when it dies (a crash, the OOM killer) or stops
(SIGSTOP, a deadlock) nobody else could answer them, and its kernel descriptors would close with it.  So the
supervisor holds its own descriptor of every connection a worker serves (sent by SCM_RIGHTS when the worker
takes the connection, dropped when the worker lets it go), and the worker keeps one shared row per descriptor
saying whether a request of that connection is read and not yet answered, with the bytes written by then (else the
bytes read by then), and where the answer it writes ends (``http_connection.Connection.mark``).  A worker can die
between a read or a write and its next mark, so the supervisor compares the row with the kernel's counts
(``transport/tcp_counts.py``, ``verdict``).
When the worker is gone:

- a connection holding a query is answered with an error naming the worker (500 if it died, 504 if it hung)
  and closed: only the worker's own queries are lost, each with an explicit error;
- an idle keep-alive connection moves to another worker (or the supervisor), so its client sees nothing, and
  a request the worker never started reading is served there.
- a connection whose answer the worker had begun to write is only shut down (an error written after it would be
  read as the answer to the client's next request), unless the answer was written whole: then it is idle.
- a connection posted to the worker and not yet registered by it (a move between workers) moves on too: the
  supervisor keeps a copy of it until the worker registers it (``hold_in_transit``).

A hung worker is still alive and may wake: its held connections are shut down as they are answered (it can no
longer write into them), a request it has not read yet is answered too (consumed, so that closing the socket
does not reset the client before it reads the answer), and the worker is killed before its idle connections
move on.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import numpy as np

from recserve.serving.transport.tcp_counts import stream_counts
from recserve.serving.worker.http_connection import written_at_hold

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


IDLE, HELD, CUT = "idle", "held", "cut"


def verdict(sock: socket.socket, mark: int, answer_end: int) -> str:
    """What a gone worker left on a connection whose shared state is ``mark``, ``answer_end``
    (``Connection.mark``, ``Connection._publish_answer_end``):

    - ``HELD``: a request read and unanswered: marked so with nothing written since, or idle but the kernel says
      more was read since (the worker died between a read and its mark);
    - ``CUT``: marked holding a request and more written since, but not exactly the answer's end: an answer cut
      off (or one whose read-ahead died with the worker): no error may follow it, the connection is only shut;
    - ``IDLE``: nothing read past the last answer, or the answer given whole to the socket before the worker could
      mark the connection idle (a request sent after it is unread: it stays for the next worker)."""
    counts = stream_counts(sock)
    if mark >= 0:
        return HELD if counts is not None and counts.read > mark else IDLE
    written = written_at_hold(mark)
    if counts is None or written is None or counts.written <= written:
        return HELD
    return IDLE if counts.written == answer_end else CUT


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def answer_held(conns: dict[int, int], states: np.ndarray, response: bytes, unread_too: bool) -> int:
    """Answer ``response`` on each connection (``conns``: the worker's descriptor -> ours) holding a request
    (``verdict``; or, with ``unread_too``, that has an unread request waiting), shut it down and close our
    descriptor; one whose answer the worker cut off is only shut down and closed.  Those leave ``conns``; the idle rest
    stay.  Returns how many were answered here."""
    answered = 0
    for theirs, ours in list(conns.items()):
        sock = socket.socket(fileno=os.dup(ours))
        try:
            found = verdict(sock, *map(int, states[theirs])) if 0 <= theirs < len(states) else IDLE
            if found == CUT:
                _shut(sock)
                os.close(conns.pop(theirs))
                continue
            if found == IDLE and not (unread_too and _read_unread(sock)):
                continue
            if found == HELD:
                _read_unread(sock)
            sock.settimeout(1.0)
            try:
                sock.sendall(response)
            except OSError:
                pass
            _shut(sock)
            answered += 1
            os.close(conns.pop(theirs))
        finally:
            sock.close()
    return answered


def hold_in_transit(incoming: dict[int, tuple[int, bytes, float]], fd: int, prefix: bytes) -> None:
    """Keep a copy of connection ``fd`` (read of it: ``prefix``) posted to a worker, until the worker registers it
    (``registered``): a worker that dies with the connection still in its pipe or not yet registered would close
    it with no answer, so its exit moves it on instead (``WorkerWatch.rescue``).  Keyed by the socket's inode,
    which every descriptor of it shares."""
    incoming[os.fstat(fd).st_ino] = (os.dup(fd), prefix, time.monotonic())


def registered(incoming: dict[int, tuple[int, bytes, float]], ours: int) -> None:
    """The worker registered a connection (``ours``: the copy it sent): its in-transit copy goes."""
    entry = incoming.pop(os.fstat(ours).st_ino, None)
    if entry is not None:
        os.close(entry[0])


def expire_in_transit(incoming: dict[int, tuple[int, bytes, float]], older_than_s: float) -> None:
    """Drop in-transit copies a live worker has had this long: it took the connection without registering it
    (a descriptor past ``CONN_SLOTS``) or closed it."""
    now = time.monotonic()
    for key, (ours, _, posted) in list(incoming.items()):
        if now - posted > older_than_s:
            os.close(ours)
            del incoming[key]


def release(conns: dict[int, int], theirs: int) -> None:
    """The worker no longer serves descriptor ``theirs``: close ours."""
    ours = conns.pop(theirs, None)
    if ours is not None:
        os.close(ours)
