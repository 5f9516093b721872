"""Siblings: a busy worker hands a decoded query to a less loaded worker of the same model, and answers it.

Why (docs/decisions/2026-11-28-forward-to-idle-siblings.md): a client connection belongs to the worker that accepted
it.  An HTTP/1.1 connection carries one query at a time and idle ones move between workers
(``ConnectionManager.maybe_move``), but one HTTP/2 connection carries every call of a gRPC client: tritonclient's
``InferenceServerClient`` opens one channel, perf_analyzer ``--streaming`` one stream.  All of such a client's
queries would land on one worker while its siblings idled: a second worker added nothing to one channel's
throughput.

So every worker of a whole-query model also serves a Unix socket named by its slot in the model's shared load
array (``socket_path``), and a worker that receives a query while it is busy (queries queued, or a long pass on
its compute thread) sends the query, decoded, to the sibling holding the fewest queries if
that is fewer than it holds itself (``SiblingClient.less_loaded``: the shorter queue, so one channel's queries
spread over every worker, not only over the idle ones; see docs/decisions/2026-11-28-grpc-one-channel-scaling.md).
The sibling checks the query's values (ids within their tables, lengths, finite features: ``ModelPath.check_owed``)
before it queues it, so the forwarding worker, whose core fronts the channel, spends nothing on them.
The frames, the staging arena and the deadline handling are a link's (``serving/worker/links.py``), as an accelerator
worker's: one implementation of "send a decoded query to another worker".  A large gRPC request is received into the
worker's landing arena, which every sibling maps (``SiblingClient.buffer``), so forwarding it sends its arrays' offsets,
not a copy: the forwarding worker's core fronts the channel and is the one to spare.  The sibling queues it through its
own admission (``WorkerPlane.enqueue_at``) and fuses it with its own queries; it records the query in the node's
statistics, the forwarding worker does not.  A sibling that refuses the query (it became busy meanwhile), retires or
dies gives the query back: it is then queued where it arrived, as if it had never left, so resizing and a dying sibling
cost no forwarded query.  A sibling never forwards a forwarded query.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.links import Arena, Link, LinkClient, log, reply_frame, serve_links

# each link's arena: several production-mix queries of the catalogue's whole-query models at once (the shorter-queue
# rule keeps a few outstanding per sibling; one that finds the arena full comes back unforwarded); its pages are
# touched only as far as the queries outstanding at once reach, larger queries cross the socket
STAGING_BYTES = 32 * 1024 * 1024
# the large gRPC requests a worker holds at once (being received, queued, or forwarded and not yet answered) that
# siblings read in place; past it a request lands in private memory and is copied when forwarded
LANDING_BYTES = 64 * 1024 * 1024
LOAD_WINDOW_S = 0.1  # the loop's CPU is read over windows of at least this long (a read is a system call)


class LoopLoad:
    """The share of this worker's core that its loop takes besides computing passes: reading, decoding and answering
    calls, and forwarding them.  A worker that fronts a gRPC channel for its siblings spends half a pass or more on
    each call, and its own passes get only the rest of its core (they share it with the loop), so its queue drains
    slower than a sibling's of the same length (docs/decisions/2026-11-29-a-fronting-worker-counts-its-queue-longer.md).

    Read on the loop thread (``time.thread_time``): the loop's CPU over a window, less the inline passes' CPU
    (``computed``), over the window's wall time; each window moves the estimate halfway, and a window with nothing
    to read (an idle loop) reads as zero."""

    def __init__(self, clock: Any = time.perf_counter, cpu: Any = time.thread_time) -> None:
        self.clock, self.cpu = clock, cpu
        self.share = 0.0  # of the core, smoothed
        self._at, self._cpu_at, self._passes_cpu = clock(), cpu(), 0.0

    def computed(self, cpu_s: float) -> None:
        """An inline pass of the loop took ``cpu_s`` seconds of CPU (computing, not fronting)."""
        self._passes_cpu += cpu_s

    def left(self) -> float:
        """The share of the core the worker's own passes get (at least a tenth)."""
        now = self.clock()
        if now - self._at >= LOAD_WINDOW_S:
            cpu = self.cpu()
            fronting = max(0.0, cpu - self._cpu_at - self._passes_cpu) / (now - self._at)
            self.share += 0.5 * (min(1.0, fronting) - self.share)
            self._at, self._cpu_at, self._passes_cpu = now, cpu, 0.0
        return max(0.1, 1.0 - self.share)


def socket_path(directory: str, slot: int) -> str:
    """The socket of the worker in load slot ``slot`` (a replacement in that slot binds the same path)."""
    return os.path.join(directory, f"slot-{slot}.sock")


class SiblingServer:
    """The receiving side: queries forwarded by the model's other workers, queued in this worker's plane."""

    def __init__(self) -> None:
        self.plane: Any = None  # the WorkerPlane, set once it exists (no sibling forwards before it publishes)
        self.server: asyncio.AbstractServer | None = None

    async def serve(self, path: str) -> None:
        self.server = await serve_links(path, self._queue)

    def _queue(self, writer: asyncio.StreamWriter, request_id: int, arrays: tuple[np.ndarray, ...],
               deadline: float) -> None:
        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            if not writer.is_closing():
                writer.write(reply_frame(request_id, scores, error))

        plane = self.plane
        if plane is None or plane.retiring:
            reply(None, InferError("unavailable", "sibling is retiring"))  # the sender queues it itself
            return
        if plane.checked(arrays, reply):  # the values' checks are this worker's (the sender left them)
            plane.enqueue_at(arrays, arrays[0].shape[0], time.perf_counter(), deadline, reply, forwarded=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class SiblingClient(LinkClient):
    """The sending side: one link per sibling slot, opened at the first query sent there."""

    peer = "sibling worker"

    def __init__(self, model_name: str, directory: str, slot: int, loads: np.ndarray, limit: int) -> None:
        super().__init__(model_name, [], limit, STAGING_BYTES)
        self.directory, self.slot, self.loads = directory, slot, loads
        self.by_slot: dict[int, Link] = {}
        self._next = 0
        self.loop_load = LoopLoad()
        self.landing = _landing_arena()
        self.record: Any = lambda record: None  # the worker's statistics (``Reporter.record``), set by its plane

    def buffer(self, size: int, lead: int) -> memoryview:
        """Where a large gRPC request is received (``codec.aligned_buffer``'s placement): the landing arena while it
        has room, so that a sibling reads the query in place if it is forwarded; else private memory."""
        slot = self.landing.buffer(size, lead) if self.landing is not None else None
        return slot if slot is not None else codec.aligned_buffer(size, lead)

    def copied(self) -> None:
        self.record(("sibling", "copied"))  # counted by the node: a landing arena too small shows here

    def less_loaded(self, held: int) -> Link | None:
        """The link to the sibling holding the fewest queries, if that is fewer than this worker's queue counts for,
        else None: a query joins the shorter queue.  ``held`` queries here, and the query, take as long as
        ``(held + 1) / left`` would at a sibling whose loop is idle (``LoopLoad.left``: the share of its core this
        worker's passes get), so they count as that, whole queries, less the query itself.  A worker whose loop is
        idle counts what it holds (``held`` 1 sends the query only to an idle sibling, 0 keeps it); the busier its
        loop, the longer its queue counts, and past half its core it sends a query to an idle sibling even when it
        holds none.

        A sibling's load is the larger of what it publishes and what this worker has outstanding there (queries on
        their way are not published yet).  Siblings of equal load are taken in turn, so a burst spreads over them;
        a retiring one publishes a huge load and is never chosen."""
        loads = self.loads
        own = int((held + 1) / self.loop_load.left()) - 1
        if own <= 0:  # no sibling holds fewer than nothing: the common idle case, without the array scan
            return None
        fewer = [slot for slot in np.flatnonzero((loads >= 0) & (loads < own)).tolist() if slot != self.slot]
        if not fewer:  # no sibling, or none holds fewer (a single worker: its own slot only)
            return None
        self._next += 1
        turn = self._next % len(fewer)
        best, best_load = None, own
        for slot in fewer[turn:] + fewer[:turn]:
            link = self.by_slot.get(slot)
            if link is None:
                link = self.by_slot[slot] = Link(socket_path(self.directory, slot), self.staging_bytes, self.peer,
                                                 self.landing)
            load = max(int(loads[slot]), len(link.outstanding))
            if load < best_load:
                best, best_load = link, load
        return best

    def close(self) -> None:
        """Close every link (a worker's links otherwise end with its process)."""
        for link in self.by_slot.values():
            if link.writer is not None:
                link.writer.close()


def _landing_arena() -> Arena | None:
    try:
        return Arena(LANDING_BYTES, "recserve-landing")
    except (OSError, AttributeError) as exc:  # AttributeError: no memfd_create on this platform
        log.warning("no landing arena (%s); a forwarded gRPC query is copied to its sibling", exc)
        return None
