"""Links between a model's workers: a CPU worker sends a decoded query to another worker (an accelerator worker, or a
sibling CPU worker with an idle core) over that worker's Unix socket and is answered from its reply.

Why (docs/decisions/2026-11-22-accelerator-workers-over-unix-sockets.md): one implementation of "send a decoded query
to another worker" for both kinds of receiver; the receiving end (``serve_links``) hands each query to its owner.

Frames on the socket (little endian; raw array bytes, never pickled tensors):

- hello, once per connection from the CPU worker: ``HELLO`` (its pid, the fd of its staging arena and its bytes,
  the fd of its landing arena and its bytes; 0 bytes: none), answered with one ``ACK`` byte (bit 0: the receiving
  worker mapped the staging arena, bit 1: the landing arena).
- request: ``REQUEST`` header (id, items B, dense width D, tables T, ids N, the query's deadline in nanoseconds
  of ``CLOCK_MONOTONIC``, the arrays' offset in the staging arena or ``INLINE``, or ``PLACED`` with the dense
  array's offset in the landing arena) then, when inline, dense f32 ``[B, D]``, values i64 ``[N]``, lengths i32
  ``[T, B]``; when placed, ``PLACES`` (the values' and the lengths' offsets in the landing arena).
- reply: ``REPLY`` header (id, status, rows, columns) then f32 ``[rows, columns]`` scores (status 0) or
  ``columns`` bytes of UTF-8 error message (status: the error code's index in ``ERROR_CODES``, from 1).

The deadline travels with the query because the receiving worker's queue is where a burst waits.  It is an absolute
time on the host's monotonic clock (both workers' ``perf_counter``), not the time left: under overload a frame can wait
in the socket before the receiving worker reads it, and a budget counted from the read would give that wait back, so
the worker would compute queries its CPU worker had already answered 504.  The sending side never hangs: a dead or
unreachable worker is 503 at once, a silent one 504 at the deadline (``LinkClient``).
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import logging
import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable

import numpy as np

from recserve.serving.wire.errors import InferError

log = logging.getLogger("recserve.serving")

HELLO = struct.Struct("<QQQQQ")
ACK = struct.Struct("<B")
STAGING_MAPPED, LANDING_MAPPED = 1, 2  # ACK's bits
REQUEST = struct.Struct("<QIIIQQQ")
PLACES = struct.Struct("<QQ")
REPLY = struct.Struct("<QBxxxII")
INLINE = 2**64 - 1  # a request whose arrays follow its header on the socket
PLACED = 1 << 62  # a request whose arrays lie where the sender received them, in its landing arena
OK = 0
# reply status i + 1; append only (a code's index is its status on the wire)
ERROR_CODES = ("internal", "unavailable", "deadline", "data_loss", "invalid")
# A large query is megabytes: with asyncio's 64 KiB stream limit and the default socket buffers it crosses the
# socket in dozens of wake-ups; these let it cross in a few.
STREAM_LIMIT = 16 * 1024 * 1024
SOCKET_BUFFER = 4 * 1024 * 1024
SEND_BACKLOG = 32 * 1024 * 1024  # inline query bytes a CPU worker lets wait in a link's socket; more -> 503

Done = Callable[[np.ndarray | None, InferError | None], None]  # called once per query sent: scores, or the error


def _widen(writer: asyncio.StreamWriter) -> None:
    """A link's socket buffers widened to ``SOCKET_BUFFER`` (as far as the kernel allows)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError:
                pass  # the kernel's cap applies


def array_bytes(items: int, width: int, tables: int, ids: int) -> tuple[int, int, int]:
    """Bytes of a query's dense, values and lengths arrays (how a frame or an arena slot is laid out)."""
    return items * width * 4, ids * 8, tables * items * 4


def request_header(request_id: int, arrays: tuple[np.ndarray, ...], deadline: float, offset: int = INLINE) -> bytes:
    """``deadline``: ``time.perf_counter()`` seconds (``CLOCK_MONOTONIC``, the same clock in every process)."""
    dense, values, lengths = arrays
    return REQUEST.pack(request_id, dense.shape[0], dense.shape[1], lengths.shape[0], values.shape[0],
                        max(0, int(deadline * 1e9)), offset)


def wire_arrays(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The arrays in the frame's dtypes (lengths as i32: sums fit, bounded by the body), contiguous."""
    dense, values, lengths = arrays
    lengths = lengths if lengths.dtype == np.int32 else lengths.astype(np.int32)
    return tuple(np.ascontiguousarray(a) for a in (dense, values, lengths))


def request_frame(request_id: int, arrays: tuple[np.ndarray, ...], deadline: float, offset: int = INLINE
                  ) -> list[bytes | memoryview]:
    """A query as frame pieces: the header, then (inline) each array's bytes without a copy where it is
    contiguous; a query staged at ``offset`` in the arena is its header alone."""
    arrays = wire_arrays(arrays)
    header = request_header(request_id, arrays, deadline, offset)
    return [header, *(memoryview(a).cast("B") for a in arrays)] if offset == INLINE else [header]


def placed_frame(request_id: int, arrays: tuple[np.ndarray, ...], deadline: float, places: tuple[int, ...]) -> bytes:
    """A query whose arrays the receiver reads where they lie in the sender's landing arena, at ``places``."""
    return request_header(request_id, arrays, deadline, PLACED | places[0]) + PLACES.pack(*places[1:])


def split_arrays(buffer: np.ndarray, items: int, width: int, tables: int, ids: int) -> tuple[np.ndarray, ...]:
    """dense, values, lengths as views of ``buffer`` (uint8, laid out as ``array_bytes`` says)."""
    sizes = array_bytes(items, width, tables, ids)
    a, b = sizes[0], sizes[0] + sizes[1]
    return (buffer[:a].view(np.float32).reshape(items, width), buffer[a:b].view(np.int64),
            buffer[b : b + sizes[2]].view(np.int32).reshape(tables, items))


async def read_request(reader: asyncio.StreamReader, arena: np.ndarray | None = None,
                       landing: np.ndarray | None = None) -> tuple[int, tuple[np.ndarray, ...], float]:
    """(id, arrays, deadline on this process's ``perf_counter``); arrays in ``arena`` or ``landing`` (the sender's
    staging and landing arenas, as mapped here) are views of it."""
    request_id, items, width, tables, ids, deadline_ns, offset = REQUEST.unpack(await reader.readexactly(REQUEST.size))
    deadline = deadline_ns / 1e9
    total = sum(array_bytes(items, width, tables, ids))
    if offset == INLINE:
        buffer = np.frombuffer(await reader.readexactly(total), np.uint8)
    elif offset & PLACED:
        places = (offset & ~PLACED, *PLACES.unpack(await reader.readexactly(PLACES.size)))
        return request_id, placed_arrays(landing, places, items, width, tables, ids), deadline
    elif arena is not None and offset + total <= arena.shape[0]:
        buffer = arena[offset : offset + total]
    else:
        raise ConnectionError(f"request {request_id} names arena bytes [{offset}, {offset + total}) this worker "
                              "has not mapped")
    return request_id, split_arrays(buffer, items, width, tables, ids), deadline


def placed_arrays(landing: np.ndarray | None, places: tuple[int, ...], items: int, width: int, tables: int,
                  ids: int) -> tuple[np.ndarray, ...]:
    """dense, values, lengths as views of the sender's landing arena at ``places`` (their offsets)."""
    sizes = array_bytes(items, width, tables, ids)
    if landing is None or any(at + size > landing.shape[0] for at, size in zip(places, sizes, strict=True)):
        raise ConnectionError(f"a request names landing arena bytes at {places} this worker has not mapped")
    dense, values, lengths = (landing[at : at + size] for at, size in zip(places, sizes, strict=True))
    return (dense.view(np.float32).reshape(items, width), values.view(np.int64),
            lengths.view(np.int32).reshape(tables, items))


# ---------------------------------------------------------------------------------------- staging arena


class Arena:
    """Shared memory of a CPU worker that a receiving worker maps too (a memfd): a link's staging arena, or the
    landing arena a worker receives large gRPC requests in.

    Why: a large query crossing the socket costs the two workers more CPU than the GPU pass itself (asyncio joins
    and buffers the frame, the reader re-assembles it).  With
    the arena the CPU worker copies the arrays once and sends only their offset; the receiving worker reads
    them in place, and on a GPU the arena is registered as pinned memory, so the host-to-device copy is DMA
    straight from it.  A slot stays taken until its reply arrives (the receiver may still be reading it
    after the CPU worker gave up on the query); a query that does not fit crosses the socket as before.
    A query received into the landing arena (``buffer``) is not copied at all: its arrays' offsets are sent.
    """

    ALIGN = 64

    def __init__(self, size: int, name: str = "recserve-accel-staging") -> None:
        import mmap

        self.size = size
        self.fd = os.memfd_create(name)
        self._close_fd = weakref.finalize(self, os.close, self.fd)  # also when a dropped link is collected
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.view = np.frombuffer(self.map, np.uint8)
        self.base = self.view.ctypes.data
        self.taken: dict[int, int] = {}  # offset -> bytes, of queries sent and not yet answered
        # a landing slot is freed when its last view is collected, on whichever thread drops it (a pass's); re-entrant:
        # a collection may run inside ``_fit``
        self.lock = threading.RLock()

    def put(self, arrays: tuple[np.ndarray, ...]) -> int | None:
        """Copy ``arrays`` (wire dtypes) into a free slot; its offset, or None when none is large enough."""
        total = sum(a.nbytes for a in arrays)
        offset = self._take(total)
        if offset is None:
            return None
        at = offset
        for a in arrays:
            self.view[at : at + a.nbytes] = a.reshape(-1).view(np.uint8)
            at += a.nbytes
        return offset

    def buffer(self, size: int, lead: int) -> memoryview | None:
        """An uninitialised slot of ``size`` bytes whose byte ``lead`` is ``ALIGN``-aligned (as
        ``codec.aligned_buffer`` places a request), free again once nothing refers to it; None when none is free."""
        offset = self._take(size + self.ALIGN)
        if offset is None:
            return None
        # the slot's own object (not a numpy view: numpy collapses a view's base to the arena's whole array, so an
        # array made by ``np.ndarray(buffer=...)``, as ``codec.parse_raw`` makes a planned request's, would not keep
        # it alive and the slot would be taken again while that query is queued)
        slot = (ctypes.c_char * (size + self.ALIGN)).from_buffer(self.map, offset)
        weakref.finalize(slot, self.release, offset)
        pad = -(offset + lead) % self.ALIGN
        return memoryview(slot).cast("B")[pad : pad + size]

    def locate(self, arrays: tuple[np.ndarray, ...]) -> tuple[int, ...] | None:
        """Each array's offset here, where every one lies in this arena (C-contiguous; an empty one anywhere), else
        None."""
        offsets = []
        for a in arrays:
            at = a.ctypes.data - self.base if a.nbytes else 0
            if at < 0 or at + a.nbytes > self.size or not a.flags.c_contiguous:
                return None
            offsets.append(at)
        return tuple(offsets)

    def _take(self, total: int) -> int | None:
        with self.lock:
            offset = self._fit(total)
            if offset is not None:
                self.taken[offset] = total
            return offset

    def _fit(self, total: int) -> int | None:
        start = 0
        for offset, size in sorted(self.taken.items()):
            if offset - start >= total:
                return start
            start = -(-(offset + size) // self.ALIGN) * self.ALIGN
        return start if self.size - start >= total else None

    def release(self, offset: int | None) -> None:
        if offset is not None:
            with self.lock:
                self.taken.pop(offset, None)

    def close(self) -> None:
        self.taken.clear()
        self.view = np.zeros(0, np.uint8)
        try:
            self.map.close()
        except BufferError:
            pass  # a view is still alive: the mapping goes with it
        self._close_fd()


def map_arena(pid: int, fd: int, size: int) -> np.ndarray:
    """The receiving worker's view of a CPU worker's arena (read through /proc: no fd passing needed)."""
    import mmap

    with open(f"/proc/{pid}/fd/{fd}", "r+b") as f:
        return np.frombuffer(mmap.mmap(f.fileno(), size), np.uint8)


def reply_frame(request_id: int, scores: np.ndarray | None, error: InferError | None = None) -> bytes:
    if scores is None:
        error = error or InferError("internal", "no scores")
        code = error.code if error.code in ERROR_CODES else "internal"
        message = str(error).encode()
        return REPLY.pack(request_id, ERROR_CODES.index(code) + 1, 0, len(message)) + message
    scores = np.ascontiguousarray(scores, dtype=np.float32)
    return REPLY.pack(request_id, OK, scores.shape[0], scores.shape[1]) + scores.tobytes()


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, np.ndarray | None, InferError | None]:
    request_id, status, rows, columns = REPLY.unpack(await reader.readexactly(REPLY.size))
    if status != OK:
        message = (await reader.readexactly(columns)).decode(errors="replace")
        code = ERROR_CODES[status - 1] if status <= len(ERROR_CODES) else "internal"
        return request_id, None, InferError(code, message)
    scores = np.frombuffer(await reader.readexactly(rows * columns * 4), np.float32).reshape(rows, columns)
    return request_id, scores, None


# ---------------------------------------------------------------------------------------- a link's receiving end

OnRequest = Callable[[asyncio.StreamWriter, int, tuple[np.ndarray, ...], float], None]


async def serve_links(path: str, on_request: OnRequest, adopt: Callable[[np.ndarray], None] = lambda arena: None,
                      forget: Callable[[np.ndarray], None] = lambda arena: None) -> asyncio.AbstractServer:
    """The receiving end of every ``Link`` to ``path`` (an accelerator worker, or a sibling CPU worker): per
    connection the hello (the sender's staging arena mapped and ``adopt``-ed, its landing arena mapped), then each
    request frame handed to ``on_request(writer, id, arrays, deadline)`` until the connection closes (the staging
    arena then ``forget``-ed)."""
    if os.path.exists(path):
        os.unlink(path)  # a dead predecessor's socket file

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _widen(writer)
        arena = None
        try:
            pid, fd, size, landing_fd, landing_size = HELLO.unpack(await reader.readexactly(HELLO.size))
            # on a thread: pinning a 128 MiB arena (cudaHostRegister faults in and locks every page) took the loop
            # away from the other links' queries for tens of ms per CPU worker as links opened under load
            arena = await asyncio.get_running_loop().run_in_executor(None, _open_arena, pid, fd, size, adopt)
            landing = _open_arena(pid, landing_fd, landing_size, what="landing arena", instead="be copied")
            writer.write(ACK.pack((arena is not None) * STAGING_MAPPED | (landing is not None) * LANDING_MAPPED))
            while True:
                on_request(writer, *await read_request(reader, arena, landing))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):  # closed, or the worker exits
            writer.close()
        finally:
            if arena is not None:
                forget(arena)

    return await asyncio.start_unix_server(connection, path=path, limit=STREAM_LIMIT)


def _open_arena(pid: int, fd: int, size: int, adopt: Callable[[np.ndarray], None] = lambda arena: None,
                what: str = "staging arena", instead: str = "cross the socket") -> np.ndarray | None:
    if not size:
        return None
    try:
        arena = map_arena(pid, fd, size)
        adopt(arena)
    except (OSError, ValueError, RuntimeError) as exc:  # the link works without it
        log.warning("cannot map the %s of pid %d (%s); its queries will %s", what, pid, exc, instead)
        return None
    return arena


# ---------------------------------------------------------------------------------------- CPU worker side


class Link:
    """One CPU worker's connection to one receiving worker; queries outstanding on it by request id."""

    def __init__(self, path: str, staging_bytes: int = 0, peer: str = "worker", landing: Arena | None = None) -> None:
        self.path = path
        self.peer = peer  # what its errors call the receiving worker (``LinkClient.peer``)
        self.staging_bytes = staging_bytes
        self.arena: Arena | None = None  # mapped by the receiving worker of the current connection
        self.landing = landing  # the sending worker's landing arena (``SiblingClient.buffer``), shared by its links
        self.landing_mapped = False  # by the receiving worker of the current connection
        self.placed: dict[int, tuple] = {}  # request id -> its arrays read in the landing arena, until the reply
        self.writer: asyncio.StreamWriter | None = None
        self.connecting: asyncio.Future | None = None
        self.outstanding: dict[int, Done] = {}
        self.sent_at: dict[int, float] = {}  # request id -> when submitted, oldest first (pruned lazily)
        self.slots: dict[int, int] = {}  # request id -> its arena offset, until the reply arrives

    async def connect(self) -> asyncio.StreamWriter:
        if self.writer is not None and not self.writer.is_closing():
            return self.writer
        if self.connecting is None:
            self.connecting = asyncio.ensure_future(self._open())
        try:
            reader, writer, arena, landing_mapped = await asyncio.shield(self.connecting)
        finally:
            self.connecting = None
        if self.writer is None or self.writer.is_closing():
            _widen(writer)
            self.writer, self.arena, self.landing_mapped = writer, arena, landing_mapped
            asyncio.get_running_loop().create_task(self._read(reader, writer))
        return self.writer

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Arena | None, bool]:
        """Connect and offer the staging arena (made once per link; kept across reconnections) and the landing
        arena; the staging arena if it was mapped, and whether the landing arena was."""
        reader, writer = await asyncio.open_unix_connection(self.path, limit=STREAM_LIMIT)
        if self.staging_bytes and self.arena is None:
            try:
                self.arena = Arena(self.staging_bytes)
            except (OSError, AttributeError) as exc:  # AttributeError: no memfd_create on this platform
                log.warning("link %s: no staging arena (%s); queries cross the socket", self.path, exc)
                self.staging_bytes = 0
        arena, landing = self.arena, self.landing
        writer.write(HELLO.pack(os.getpid(), arena.fd if arena else 0, arena.size if arena else 0,
                                landing.fd if landing else 0, landing.size if landing else 0))
        (mapped,) = ACK.unpack(await reader.readexactly(ACK.size))
        return reader, writer, arena if mapped & STAGING_MAPPED else None, bool(mapped & LANDING_MAPPED)

    def place(self, request_id: int, arrays: tuple[np.ndarray, ...]) -> tuple[int, ...] | None:
        """The offsets of the query's arrays in the landing arena, where it was received there and the receiving
        worker mapped it (the arrays are then kept until the reply: their slot stays taken); else None."""
        if not self.landing_mapped:
            return None
        places = self.landing.locate(arrays)  # type: ignore[union-attr]
        if places is not None:
            self.placed[request_id] = arrays
        return places

    def stage(self, request_id: int, arrays: tuple[np.ndarray, ...]) -> int | None:
        """The arena offset the query's arrays were copied to; ``INLINE`` when there is no arena or the query is
        larger than all of it; None when it would fit but the slots are taken (the receiver is that far behind)."""
        if self.arena is None or sum(a.nbytes for a in arrays) > self.arena.size:
            return INLINE
        offset = self.arena.put(arrays)
        if offset is not None:
            self.slots[request_id] = offset
        return offset

    def oldest_wait(self, now: float) -> float:
        """Seconds the oldest query still outstanding on this link has waited for its reply (0 if none)."""
        while self.sent_at:
            oldest = next(iter(self.sent_at))
            if oldest in self.outstanding:
                return now - self.sent_at[oldest]
            del self.sent_at[oldest]
        return 0.0

    def backlogged(self) -> bool:
        """Bytes written to the socket and not yet taken by the receiving worker are over ``SEND_BACKLOG``."""
        transport = self.writer.transport if self.writer is not None else None
        return transport is not None and transport.get_write_buffer_size() > SEND_BACKLOG

    def settled(self, request_id: int) -> None:
        """The receiving worker answered (or will never read): the query's slot is free again."""
        offset = self.slots.pop(request_id, None)
        if self.arena is not None:
            self.arena.release(offset)
        self.placed.pop(request_id, None)  # its landing slot is freed with the last view of it

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                self._answered(*await read_reply(reader))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        if self.writer is writer:
            self.writer = None
        writer.close()
        self.fail_all(f"the {self.peer} at {self.path} closed the connection")

    def _answered(self, request_id: int, scores: np.ndarray | None, error: InferError | None) -> None:
        """A reply: the query's slot freed, its callback called (not kept in ``_read``'s frame while the next reply
        is awaited: the callback holds the query's arrays, and those a landing slot)."""
        self.settled(request_id)
        done = self.outstanding.pop(request_id, None)
        if done is not None:
            done(scores, error)

    def fail_all(self, why: str) -> None:
        for request_id in [*self.slots, *self.placed]:  # the connection is gone: nothing reads the arenas any more
            self.settled(request_id)
        waiting, self.outstanding = self.outstanding, {}
        for done in waiting.values():
            done(None, InferError("unavailable", f"{why}; the query was not answered, retry"))


class LinkClient:
    """Sends a CPU worker's decoded queries over its links, on the least-loaded one unless told which, and calls
    back with their scores.  Never a hang: a dead or unreachable worker is 503 at once, a silent one 504 at the
    deadline."""

    peer = "worker"  # what the errors call the other side

    def __init__(self, model_name: str, sockets: list[str], limit: int, staging_bytes: int = 0) -> None:
        self.model_name = model_name
        self.staging_bytes = staging_bytes  # each link's shared arena (``Arena``); 0: every query on the socket
        self.limit = limit  # queries outstanding per link from this CPU worker; more -> 503
        self.links: list[Link] = []
        self._ids = itertools.count(1)
        self.set_sockets(sockets)

    def set_sockets(self, sockets: list[str]) -> None:
        """The receiving workers now running (the supervisor broadcasts accelerator workers as their pool changes); new
        links are opened at once, so their arenas are mapped and pinned before queries need them, not under load."""
        keep = {link.path: link for link in self.links}
        self.links = [keep.get(path) or Link(path, self.staging_bytes, self.peer) for path in sockets]
        self._turn = 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: each link opens at its first query
        for link in self.links:
            if link.writer is None and link.connecting is None:
                task = loop.create_task(link.connect())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retried at the first query

    def _least_loaded(self) -> Link:
        """The link with the fewest queries outstanding, ties taken in turn (``submit`` moves the turn on, so the
        ``behind`` check before it looks at the link the query will take): with ``min`` alone an idle node sent
        every query to the first accelerator worker, and the others' links first opened under load."""
        turn = self._turn % len(self.links)
        return min(self.links[turn:] + self.links[:turn], key=lambda k: len(k.outstanding))

    def behind(self, deadline: float, link: Link | None = None) -> InferError | None:
        """503 when even the least-loaded receiving worker is behind for a query due by ``deadline``: the oldest
        query this worker has outstanding there has already waited over half of the new query's time left.

        Why: the sojourn time of the head of the queue is the congestion signal (CoDel's), and it is known here
        before the query is decoded (``EarlyRefusal.from_header``).  Count and byte bounds alone let many times a
        deadline's worth of work wait: the CPU worker then spent its core decoding queries it later answered 504
        while replies waited unread."""
        if not self.links:
            return None
        now = time.perf_counter()
        link = link or self._least_loaded()
        waited, left = link.oldest_wait(now), deadline - now
        if waited > left / 2:
            return InferError("unavailable", f"model {self.model_name!r}: the {self.peer} is behind (its "
                                             f"oldest query has waited {waited * 1e3:.0f} ms, this one has "
                                             f"{left * 1e3:.0f} ms left); retry later")
        return None

    def submit(self, arrays: tuple[np.ndarray, ...], deadline: float, done: Done, link: Link | None = None) -> None:
        """Send one decoded query (on ``link``, else the least-loaded one: an accelerator worker gets validated
        queries, a sibling checks what it is sent); ``done`` is called exactly once
        (scores, or the error)."""
        if link is None:
            if not self.links:
                done(None, InferError("unavailable", f"model {self.model_name!r} has no {self.peer} running"))
                return
            link = self._least_loaded()
            self._turn += 1
        refusal = self.behind(deadline, link)
        if refusal is not None:
            done(None, refusal)
            return
        if len(link.outstanding) >= self.limit:
            done(None, InferError("unavailable", f"model {self.model_name!r}: {self.peer}s are overloaded "
                                                 f"({self.limit} queries outstanding each); retry later"))
            return
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(max(0.0, deadline - time.perf_counter()), self._expire, link, request_id)

        def finish(scores: np.ndarray | None, error: InferError | None) -> None:
            timer.cancel()
            done(scores, error)

        link.outstanding[request_id] = finish
        link.sent_at[request_id] = time.perf_counter()
        task = loop.create_task(self._send(link, request_id, arrays, deadline))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _send(self, link: Link, request_id: int, arrays: tuple[np.ndarray, ...], deadline: float) -> None:
        try:
            writer = await link.connect()
            if request_id not in link.outstanding:
                return  # expired while connecting
            arrays = wire_arrays(arrays)
            places = link.place(request_id, arrays)
            if places is not None:
                writer.write(placed_frame(request_id, arrays, deadline, places))
                return
            offset = link.stage(request_id, arrays)
            if offset is None or (offset == INLINE and link.backlogged()):
                self._refuse(link, request_id, "its staging arena is full" if offset is None else
                             f"over {SEND_BACKLOG >> 20} MiB of queries wait in its socket")
                return
            if link.landing_mapped:
                self.copied()
            writer.writelines(request_frame(request_id, arrays, deadline, offset))
        except (OSError, ConnectionError) as exc:
            self._answer(link, request_id, InferError("unavailable", f"model {self.model_name!r}: the {self.peer} "
                                                                     f"at {link.path} is unreachable ({exc}); retry"))

    def copied(self) -> None:
        """A query the receiving worker could have read in place (its landing arena is mapped) is copied instead:
        it was received elsewhere (the arena was full) or its arrays were converted."""

    def _refuse(self, link: Link, request_id: int, why: str) -> None:
        """503 at once: the receiving worker is behind by a full arena or socket, so this query would wait
        behind at least that much work; queueing frames in memory without bound would spend the CPU worker's core
        copying them while its own clients wait."""
        self._answer(link, request_id, InferError("unavailable", f"model {self.model_name!r}: the {self.peer} "
                                                                 f"is overloaded ({why}); retry later"))

    def _expire(self, link: Link, request_id: int) -> None:
        self._answer(link, request_id, InferError("deadline", f"model {self.model_name!r}: deadline exceeded "
                                                              f"waiting for the {self.peer}"))

    @staticmethod
    def _answer(link: Link, request_id: int, error: InferError) -> None:
        """Answer a query sent on ``link`` with ``error``, unless it was answered already (reply or deadline)."""
        done = link.outstanding.pop(request_id, None)
        if done is not None:
            done(None, error)
