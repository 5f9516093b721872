"""Siblings: a busy worker hands a decoded query to a less loaded worker of the same model, and answers it.

Why (docs/decisions/2026-11-28-forward-to-idle-siblings.md): a client connection belongs to the worker that accepted
it.  An HTTP/1.1 connection carries one query at a time and idle ones move between workers
(``ConnectionManager.maybe_move``), but one HTTP/2 connection carries every call of a gRPC client: tritonclient's
``InferenceServerClient`` opens one channel, perf_analyzer ``--streaming`` one stream.  All of such a client's
queries would land on one worker while its siblings idled: a second worker added nothing to one channel's
throughput.

So every worker of a whole-query model also serves a Unix socket named by its slot in the model's shared load
array (``socket_path``), and a worker that receives a query while it is busy (queries queued, or a long pass on
its compute thread) sends the query, already decoded and validated, to the sibling holding the fewest queries if
that is fewer than it holds itself (``SiblingClient.less_loaded``: the shorter queue, so one channel's queries
spread over every worker, not only over the idle ones; see docs/decisions/2026-11-28-grpc-one-channel-scaling.md).
The frames, the staging arena and the deadline handling are the
accelerator link's (``serving/worker/accel.py``): one implementation of "send a decoded query to another worker".  The
sibling queues it through its own admission (``WorkerPlane.enqueue_at``) and fuses it with its own queries; it
records the query in the node's statistics, the forwarding worker does not.  A sibling that refuses the query
(it became busy meanwhile), retires or dies gives the query back: it is then queued where it arrived, as if it
had never left, so resizing and a dying sibling cost no forwarded query.  A sibling never forwards a forwarded
query.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np

from recserve.serving.wire.errors import InferError
from recserve.serving.worker.accel import AcceleratorClient, Link, reply_frame, serve_links

# each link's arena: several production-mix queries of the catalogue's whole-query models at once (the shorter-queue
# rule keeps a few outstanding per sibling; one that finds the arena full comes back unforwarded); its pages are
# touched only as far as the queries outstanding at once reach, larger queries cross the socket
STAGING_BYTES = 32 * 1024 * 1024


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
        plane.enqueue_at(arrays, arrays[0].shape[0], time.perf_counter(), deadline, reply, forwarded=True)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


class SiblingClient(AcceleratorClient):
    """The sending side: one link per sibling slot, opened at the first query sent there."""

    peer = "sibling worker"

    def __init__(self, model_name: str, directory: str, slot: int, loads: np.ndarray, limit: int) -> None:
        super().__init__(model_name, [], 0, limit, STAGING_BYTES)
        self.directory, self.slot, self.loads = directory, slot, loads
        self.by_slot: dict[int, Link] = {}
        self._next = 0

    def less_loaded(self, own: int) -> Link | None:
        """The link to the sibling holding the fewest queries, if that is fewer than ``own`` (the queries this worker
        holds), else None: a query joins the shorter queue (so ``own`` 1 sends it only to an idle sibling).

        A sibling's load is the larger of what it publishes and what this worker has outstanding there (queries on
        their way are not published yet).  Siblings of equal load are taken in turn, so a burst spreads over them;
        a retiring one publishes a huge load and is never chosen."""
        loads = self.loads
        fewer = np.flatnonzero((loads >= 0) & (loads < own))
        if not fewer.size:
            return None
        self._next += 1
        best, best_load = None, own
        for k in np.roll(fewer, -(self._next % fewer.size)):
            slot = int(k)
            if slot == self.slot:
                continue
            link = self.by_slot.get(slot)
            if link is None:
                link = self.by_slot[slot] = Link(socket_path(self.directory, slot), self.staging_bytes)
            load = max(int(loads[slot]), len(link.outstanding))
            if load < best_load:
                best, best_load = link, load
        return best

    def close(self) -> None:
        """Close every link (a worker's links otherwise end with its process)."""
        for link in self.by_slot.values():
            if link.writer is not None:
                link.writer.close()
