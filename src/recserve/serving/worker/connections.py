"""A whole-query worker's HTTP/1.1 connections: accepted, shared with the supervisor, swept, moved, handed off.

- The node's HTTP listening socket is created once by the supervisor and inherited by every such worker; they all
  ``accept`` from its one queue (no SO_REUSEPORT: a worker that retires or dies drops no backlog).
- The supervisor holds its own descriptor of every connection a worker serves, and a shared row per connection
  says whether a request of it is read and unanswered (else how many of its bytes were read by then).  A worker
  that dies costs only its own queries: those connections are answered 500 naming the worker, its idle ones move
  to another worker.  A worker that stops beating (hung or stopped) gets the same, with 504, and is replaced.
- A connection goes to the supervisor over the worker's socket pair (SCM_RIGHTS) with the bytes already read from
  it when its request is not this worker's (``hand_off``), when it goes idle while queries wait here and a sibling
  is idle, or while this worker serves more active connections than a sibling (``maybe_move``), and when the worker
  retires.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.serving.transport.h2frames import HELD_WORKER
from recserve.serving.transport.h2limits import ByteBudget, LogBudget
from recserve.serving.transport.room import Room
from recserve.serving.transport.tcp_counts import StreamCounts, stream_counts
from recserve.serving.wire import pipe
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.http_connection import NOTHING_YET, RECV_BYTES, Connection
from recserve.serving.worker.http_responses import error_response
from recserve.serving.worker.reporter import RETIRING_LOAD

log = logging.getLogger("recserve.serving")

SWEEP_S = 1.0  # how often connections are checked for a request that arrives too slowly
MOVE_BACKLOG = 1  # queries waiting at a worker before it moves an idle connection to an idle sibling
MOVE_GAP_S = 0.005  # at most one such move per worker this often
ACTIVE_GAP = 2  # active connections over a sibling's at which a worker moves one there as it goes idle
FORWARDED_RECENTLY_S = 0.05  # a worker that forwarded a query this recently moves a connection that goes idle
ACCEPT_PAUSE_S = 1.0  # out of descriptors (EMFILE): stop accepting this long, as asyncio does
ROOM_PAUSE_S = 0.01  # ... or this long where idle connections were closed to give theirs back
ACCEPT_FAILED_LOG = LogBudget()  # one line per 10 s for failed accepts
SLOW_FOR_S = 1.0  # at the connection cap, a request arriving for this long makes room for a new connection


def in_service(loads: Any) -> Any:
    """Whether each worker of ``loads`` (the model's shared load slots, or one of them) is live and not retiring: a
    slot of -1 is free, ``RETIRING_LOAD`` a worker on its way out."""
    return (loads >= 0) & (loads < RETIRING_LOAD)


class ConnectionManager:
    """The worker's listening socket and HTTP/1.1 connections (``Connection``), for its ``WorkerPlane``.

    ``hand_off(fd, prefix, to_slot)`` gives a connection to the supervisor; ``share(fd)`` gives it a copy of a
    connection's descriptor; ``states`` holds one shared row per descriptor (``Connection.mark``), ``loads`` one
    slot per sibling.
    """

    def __init__(self, plane: Any, send: Callable[[Any], None], hand_off: Callable[..., None],
                 share: Callable[[int], None] | None = None, states: np.ndarray | None = None,
                 loads: np.ndarray | None = None, slot: int = -1, active: np.ndarray | None = None) -> None:
        self.plane = plane  # the WorkerPlane (``worker/plane.py``): limits, admission, retiring, maybe_exit
        self.loop = plane.loop
        self.send = send
        self._hand_off = hand_off
        self._share = share  # gives the supervisor its own descriptor of a connection (``opened``)
        self.states = states if states is not None else np.zeros((0, 2), np.int64)  # shared: one row per descriptor
        # shared with the model's other workers: queries each holds (-1 = no worker in that slot); see ``maybe_move``
        self.loads = loads if loads is not None and 0 <= slot < len(loads) else None
        self.slot = slot
        # shared likewise: the connections each worker served a request on over its last sweep (``fewer_active``)
        self.active = active if active is not None and self.loads is not None else None
        self._fewest = -1  # the sibling slot that published the fewest at this worker's last sweep
        self.scratch = memoryview(bytearray(RECV_BYTES))  # every connection's small reads (one loop: one at a time)
        self.open: set[Connection] = set()
        self.on_stop_listening: list[Callable[[], None]] = []  # other transports (gRPC) stop taking calls too
        self.on_stop_accepting: list[Callable[[], None]] = []  # ... and stop accepting connections
        self._listener: socket.socket | None = None
        self.connecting = 0  # accepted connections whose transport is not made yet
        self._moved_at = 0.0
        self.forwarded_at = 0.0  # when a query last went to a sibling (``maybe_move``)
        # the large bodies its connections are receiving in place (``Connection._start_body``): past this, refused
        self.bodies = ByteBudget(max(HELD_WORKER, 4 * plane.limits.max_body))
        self._room = Room()  # which connections to close for a new one past ``max_connections`` (``_make_room``)

    # ---- accepting ----------------------------------------------------------------------------------------
    def listen(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._listener = sock
        self.loop.add_reader(sock.fileno(), self._accept)
        self.loop.call_later(SWEEP_S, self._sweep)

    def _accept(self) -> None:
        """Accept one queued connection and give the supervisor its descriptor at once, in this callback.

        One a wake-up, as nginx's ``multi_accept off``: the listening socket wakes every worker, each takes one and
        the rest stay queued for the next turn, so a burst of connections spreads over the model's workers instead
        of landing on whichever woke first (docs/decisions/2026-11-30-connections-spread-over-workers.md).

        asyncio's own server makes the transport (and so ``connection_made``) a loop turn or two after
        ``accept``; a worker killed in between would take the only descriptor of a connection whose client may
        already have sent its request, and that client would see a reset instead of an answer."""
        listener = self._listener
        if listener is None:
            return
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: no descriptor for it now; the client stays queued
            # idle connections give theirs back (as past ``max_connections``): accept again once they are closed
            pause = ROOM_PAUSE_S if self._make_room() else ACCEPT_PAUSE_S
            if (left_out := ACCEPT_FAILED_LOG.allow()) is not None:
                log.warning("worker for %s: accept failed (%s); pausing accepts for %g s (%d more failures since the "
                            "last line)", self.plane.model_name, exc, pause, left_out)
            self.loop.remove_reader(listener.fileno())
            self.loop.call_later(pause, self._resume_accepting)
            return
        if len(self.open) + self.connecting >= self.plane.limits.max_connections and not self._make_room():
            self._refuse_connection(sock)
            return
        sock.setblocking(False)
        early = self._holds(sock.fileno())
        if early:
            self.states[sock.fileno()] = 0  # idle, nothing read, no answer being written
            self._share(sock.fileno())  # type: ignore[misc]
        self.connecting += 1
        self.loop.create_task(self._connect(sock, early))

    def _make_room(self) -> bool:
        """At ``max_connections``: close the connections idle longest (``transport/room.py``), else those whose
        request has been arriving for ``SLOW_FOR_S`` (408); whether any was (the new connection takes their room)."""
        now = time.perf_counter()
        waiting = []
        for conn in self.open:
            if (idle := conn.idle_for(now)) > 0:
                waiting.append(((0, -idle), conn))
            elif conn.too_slow(now, SLOW_FOR_S):
                waiting.append(((1, conn.arrived), conn))
        picked = self._room.pick(waiting, now)
        for conn in picked:
            if conn.idle_for(now) > 0:
                conn.write(b"", close=True)
            else:
                conn.refuse(InferError("slow_client", "request arriving too slowly while the worker is at its "
                                       "connection limit"))
        return bool(picked)

    def _refuse_connection(self, sock: socket.socket) -> None:
        """Past ``max_connections``: 503 and close, before the connection costs more than its descriptor."""
        limit = self.plane.limits.max_connections
        self.plane.refused("too_many_connections")
        error = InferError("unavailable", f"this worker holds {limit} connections; retry")
        try:
            sock.setblocking(False)
            sock.send(error_response(error, close=True, extra={"Retry-After": "1"}))
        except OSError:
            pass
        sock.close()

    def _resume_accepting(self) -> None:
        if self._listener is not None:
            self.loop.add_reader(self._listener.fileno(), self._accept)

    async def _connect(self, sock: socket.socket, shared: bool) -> None:
        try:
            await self._serve(sock, b"", shared)
        finally:
            self.connecting -= 1
            if self.plane.retiring:
                self.plane.maybe_exit()  # it was waiting for this connection: hand it on

    async def _serve(self, sock: socket.socket, prefix: bytes, shared: bool,
                     before: StreamCounts | None = NOTHING_YET) -> None:
        """Serve ``sock`` (kept as the connection's own descriptor) through a transport on a duplicate of it;
        ``before``: bytes of it read and written before it came here (None: unknown)."""
        copy = sock.dup()
        try:
            await self.loop.connect_accepted_socket(lambda: Connection(self, sock, prefix, shared, before), copy)
        except OSError:  # the client went away before its transport was made
            if shared:
                self.send(pipe.encode(pipe.Gone(sock.fileno())))
            sock.close()
            copy.close()

    async def adopt(self, fd: int, prefix: bytes) -> None:
        """Serve a connection handed over by the supervisor (``prefix``: bytes already read from it)."""
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        await self._serve(sock, prefix, False, stream_counts(sock) if self._holds(fd) else None)

    def stop_accepting(self) -> None:
        """Accept no more connections (every transport); those open are served on.  A retiring worker does this
        before any retiree sends GOAWAY, so that the clients it moves reconnect to a worker that stays."""
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for hook in self.on_stop_accepting:
            hook()
        self.on_stop_accepting = []

    def stop_listening(self) -> None:
        """Accept no more connections and stop taking calls on them (gRPC: GOAWAY)."""
        self.stop_accepting()
        for hook in self.on_stop_listening:
            hook()
        self.on_stop_listening = []

    # ---- connections the supervisor holds too ----------------------------------------------------------
    def _holds(self, fd: int) -> bool:
        """Whether the supervisor holds a copy of descriptor ``fd`` (the descriptor has a state row)."""
        return self._share is not None and 0 <= fd < len(self.states)

    def _shared(self, conn: Connection) -> bool:
        return self._holds(conn.slot)

    def opened(self, conn: Connection) -> None:
        """The supervisor keeps its own descriptor of every connection this worker serves (with the shared
        state row), so if this process dies its clients get an error for a query it held, and an idle
        connection lives on in another worker, instead of a reset."""
        if self._shared(conn) and not conn.shared:
            self._share(conn.slot)  # type: ignore[misc]

    def gone(self, conn: Connection) -> None:
        """The connection is closed here: shut it down (the supervisor's descriptor would keep it open) and tell
        the supervisor to drop its descriptor."""
        if self._shared(conn):
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.send(pipe.encode(pipe.Gone(conn.slot)))
        conn.sock.close()  # only now may the number name another descriptor

    def _sweep(self) -> None:
        """Close connections whose request has been arriving for too long (slow or stalled clients)."""
        if self.plane.exit_event.is_set():
            return
        now = time.perf_counter()
        limits = self.plane.limits
        for conn in [c for c in self.open if c.too_slow(now, limits.read_timeout_s)]:
            conn.refuse(InferError("slow_client", f"request not received within {limits.read_timeout_s:g} s"))
        for conn in [c for c in self.open if c.idle_for(now) > limits.keep_alive_s]:
            conn.linger_close()  # an idle keep-alive connection: the client opens another when it needs
        self._count_active()
        self.loop.call_later(SWEEP_S, self._sweep)

    def _count_active(self) -> None:
        """Publish how many connections carried a request since the last sweep, and note the live sibling that
        published the fewest (``fewer_active`` moves connections there)."""
        if self.active is None:
            return
        count = 0
        for conn in self.open:
            count += conn.requests > 0
            conn.requests = 0
        self.active[self.slot] = count
        live = np.flatnonzero(in_service(self.loads))
        live = live[live != self.slot]
        self._fewest = int(live[np.argmin(self.active[live])]) if live.size else -1

    # ---- moving connections: to an idle sibling, to the supervisor ----------------------------------------
    def maybe_move(self, conn: Connection) -> bool:
        """Move a keep-alive connection that just went idle to a sibling: to an idle one while queries wait here (or
        were just forwarded to a sibling for want of this worker: moving the connection saves its next queries that
        hop), else to one serving ``ACTIVE_GAP`` fewer active connections than this worker (``fewer_active``).

        Why: a worker keeps the connections it accepted, and a client that reuses few connections (a router, a
        pooled HTTP client reusing its most recent one) would keep a model's other workers idle while queries
        queue at one (measured: 2:1 CPU split and p95 8x higher at 150 qps on two workers).  A client that spreads
        its queries over all its connections loads each worker by the connections it accepted, and which worker
        accepts a connection is the kernel's choice: the backlog rule moves none while no queue forms, and the
        worker holding most reaches its limit first (docs/decisions/2026-11-30-connections-spread-over-workers.md)."""
        if self.loads is None or self.plane.retiring:
            return False
        now = time.perf_counter()
        if now - self._moved_at < MOVE_GAP_S:
            return False
        to = self._idle_sibling(now)
        if to < 0:
            to = self.fewer_active()
        if to < 0:
            return False
        self._moved_at = now
        if self.active is not None:  # until the next sweeps count them again
            self.active[self.slot] -= 1
            self.active[to] += 1
        self.hand_off(conn, to_slot=to)
        return True

    def _idle_sibling(self, now: float) -> int:
        """An idle sibling's slot while queries wait here or one was forwarded just now (-1 if none)."""
        if len(self.plane.admission.queue) < MOVE_BACKLOG and now - self.forwarded_at > FORWARDED_RECENTLY_S:
            return -1
        idle = np.flatnonzero(self.loads == 0)
        idle = idle[idle != self.slot]
        return int(idle[0]) if idle.size else -1

    def fewer_active(self) -> int:
        """The slot of the live sibling that serves ``ACTIVE_GAP`` or more fewer active connections than this worker
        (-1 if none): the one that had the fewest at the last sweep, as its count stands now."""
        to = self._fewest
        if self.active is None or to < 0 or not in_service(self.loads[to]):
            return -1
        return to if self.active[self.slot] - self.active[to] >= ACTIVE_GAP else -1

    def hand_off(self, conn: Connection, to_slot: int | None = None) -> None:
        """Give the connection (and what was read of it) to the supervisor; once its writes are flushed."""
        transport = conn.transport
        if transport is None or conn.closed:
            return
        conn.leaving = True  # from now on bytes stay unread or buffered: they travel with the connection
        transport.pause_reading()
        if transport.get_write_buffer_size():
            self.loop.call_later(0.001, self.hand_off, conn, to_slot)
            return
        prefix = conn.pending()
        conn.closed = conn.handed_off = True
        transport.abort()  # closes the transport's duplicate; the connection's own descriptor keeps it open
        self.open.discard(conn)
        conn.mark(False, unanswered=len(prefix))
        try:  # the supervisor drops its copy once it has this one: a death in between loses nothing
            self._hand_off(conn.sock.fileno(), prefix, to_slot, self._shared(conn))
        finally:
            conn.sock.close()

    def let_idle_go(self, close: bool) -> bool:
        """Hand every connection with no request in progress to the supervisor (``close``: the node is shutting
        down, nobody to hand it to: close it once idle a moment, ``Connection.close_idle``); whether none is left
        here, nor any accepted one still to come."""
        for conn in list(self.open):
            if not conn.busy and not conn.closed:
                if close:
                    conn.close_idle()
                else:
                    self.hand_off(conn)
        return not (self.open or self.connecting)
