"""The thread a worker's long forward passes run on, so that its event loop reads, admits and sheds meanwhile.

A pass predicted to take ``compute_thread_ms`` or more runs here (torch releases the GIL in its kernels): a
synchronous pass of ~10 ms left every request that arrived meanwhile unread, so a query shed under overload waited
for the pass to end and admission could not see the time it had waited.  Short passes stay inline (a thread hop
costs ~50 µs, a tenth of a batch-1 pass).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any


class ComputeThread:
    """One daemon thread that runs the worker's long forward passes, so its event loop serves on meanwhile.

    A daemon thread, not an executor: a pass that never ends must not hold the process at exit (the watchdog
    kills such a worker; an executor's threads are joined at interpreter exit).  It runs at the loop's priority:
    niced, it lost its core to any other process of the host (docs/decisions/2026-11-29-compute-thread-not-niced.md)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, compute: Callable[[Any], Any], lock: threading.Lock,
                 name: str = "recserve-compute") -> None:
        self.loop = loop
        self.compute = compute
        self.lock = lock
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def submit(self, arrays: Any, done: Callable[[Any, Exception | None, float], None]) -> None:
        """Compute ``arrays`` on the thread; ``done(scores, error, seconds)`` is then called on the loop.  (The
        worker's JSON decode thread passes a request's body and gets the decoded query: ``worker/json_decoder.py``.)"""
        self._jobs.put((arrays, done))

    def _serve(self) -> None:
        from recserve.zoo.threads import inherit_torch_threads

        inherit_torch_threads()  # else MKL runs this thread's GEMMs on every core of the host
        while True:
            arrays, done = self._jobs.get()
            start = time.perf_counter()
            try:
                with self.lock:
                    result, error = self.compute(arrays), None
            except Exception as exc:  # noqa: BLE001 - answered on the loop; the thread serves on
                result, error = None, exc
            seconds = time.perf_counter() - start
            try:
                self.loop.call_soon_threadsafe(done, result, error, seconds)
            except RuntimeError:  # the loop is closed: the worker is exiting
                return
            # not held while waiting for the next pass: the inputs may view a shared-memory region that is being
            # unregistered (serving/wire/shm.py), or a large request body
            del arrays, done, result, error
