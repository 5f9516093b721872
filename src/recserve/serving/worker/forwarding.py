"""Where a worker's query is computed when not in its own queue: on an accelerator worker (a query of at least its
``min_items`` items, ``worker/accel.py``) or on a less loaded sibling worker of the model (``worker/siblings.py``),
and what happens to its answer.  The base of ``plane.WorkerPlane``, which decides where each query goes
(``WorkerPlane.enqueue``) and holds the state below."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.serving.wire.errors import InferError
from recserve.serving.worker.admission import AdmissionQueue, Reply
from recserve.serving.worker.reporter import Reporter


class QueryForwarding:
    """Queries sent to an accelerator worker or a sibling (``WorkerPlane`` routes, queues and computes the rest)."""

    admission: AdmissionQueue
    reporter: Reporter
    connections: Any
    offload: Any
    siblings: Any
    checked: Callable[[tuple, Reply], bool]  # ``WorkerPlane``'s: the query's owed checks
    enqueue_at: Callable[..., None]  # ... queue the query here
    _fail: Callable[..., None]  # ... answer and record a failure

    def _forward(self, arrays: tuple, items: int, arrived: float, deadline: float, reply: Reply,
                 owed: bool = False) -> bool:
        """Send the query to a sibling holding fewer queries than this worker's queue counts for
        (``SiblingClient.less_loaded``), if there is one; it comes back here if
        the sibling refuses it, retires or dies (503 ``unavailable``; it is then queued as if it had never left,
        its ``owed`` checks run first).  Any other answer, scores or an error of the pass or of the sibling's
        checks, is the client's.  The sibling records it in the node's statistics."""
        link = self.siblings.less_loaded(self.admission.held())  # type: ignore[union-attr]
        if link is None:
            return False
        self.reporter.record(("sibling", "forwarded"))
        self.connections.forwarded_at = time.perf_counter()

        def done(scores: np.ndarray | None, error: InferError | None) -> None:
            if error is None or error.code != "unavailable":  # scores, or the sibling's verdict on the query
                reply(scores, error)
            else:
                self.reporter.record(("sibling", "returned"))
                if not owed or self.checked(arrays, reply):
                    self.enqueue_at(arrays, items, arrived, deadline, reply, returned=True)

        self.siblings.submit(arrays, deadline, done, link)  # type: ignore[union-attr]
        return True

    def _offload(self, arrays: tuple, items: int, arrived: float, deadline: float, reply: Reply) -> None:
        """A large query goes to an accelerator worker (``serving/worker/accel.py``); this loop serves on meanwhile."""
        self.reporter.record(("kind", "accelerator", items))
        sent = time.perf_counter()

        def done(scores: np.ndarray | None, error: InferError | None) -> None:
            if error is not None:
                self._fail(reply, arrived, error, sent)
                return
            reply(scores, None)
            now = time.perf_counter()
            self.reporter.record(("done", items, now - arrived, sent - arrived, now - sent, 0))  # passes: the worker's

        self.offload.submit(arrays, deadline, done)  # type: ignore[union-attr]
