"""What a whole-query worker tells its supervisor, and when it gives memory back.

- Completed, shed and refused queries are reported in small batches (``Stats``: one ``/stats`` and Prometheus view
  per node, whatever the process layout).
- A heartbeat every ``BEAT_S`` is the watchdog's evidence that this worker's loop is alive; it carries how long the
  pass in flight on the compute thread has run, so a pass that never ends looks like a silent worker.
- The queries this worker holds are published in its slot of the model's shared load array: siblings read it to
  forward queries and move idle connections (``worker/siblings.py``, ``ConnectionManager.maybe_move``).
- After a burst of large request bodies, free heap memory is returned once the worker is idle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.serving.wire import pipe
from recserve.serving.worker.admission import AdmissionQueue

STATS_FLUSH_S = 0.025  # records reach the supervisor within this delay (a flush wakes it: 5 ms cost ~4% of a worker)
BEAT_S = 0.25  # heartbeat period: the watchdog's evidence that this worker's loop is alive
TRIM_AFTER_BYTES = 64 << 20  # large request bodies received, past which free memory is returned when idle
TRIM_QUIET_S = 2.0  # ... and once no large body has come for this long (the burst is over)
TRIM_EVERY_S = 5.0  # free memory returned at most this often, when a client's large input was let go
RETIRING_LOAD = 1 << 30  # the load a retiring worker publishes: no sibling sends it anything


class Reporter:
    """A worker's reports to its supervisor (records, heartbeats, its load) and its memory trims."""

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[Any], None], admission: AdmissionQueue,
                 exit_event: asyncio.Event, regions: Any = None, loads: np.ndarray | None = None,
                 slot: int = -1) -> None:
        self.loop = loop
        self.send = send
        self.admission = admission  # whose load is published and whose pass in flight each beat carries
        self.exit_event = exit_event  # set: the worker is exiting, beats stop
        self.regions = regions  # the node's shared-memory regions as this worker follows them (serving/wire/shm.py)
        # shared with the model's other workers: queries each holds (-1 = no worker in that slot)
        self.loads = loads if loads is not None and 0 <= slot < len(loads) else None
        self.slot = slot
        self.read_pauses = 0  # connections paused for pipelining more than PIPELINE_BYTES behind a request
        self._records: list[tuple] = []
        self.sources: list[Callable[[], list[tuple]]] = []  # counters read each beat (the SSD tier's), as records
        self._flush_at: asyncio.TimerHandle | None = None
        self.trim_wanted = False  # a client's large input was let go: return free memory when idle (``beat``)
        self._large_input_bytes = 0  # large request bodies received since free memory was last asked back
        self._last_large_input = 0.0  # when the last one came (monotonic)
        self._trimmed_at = 0.0

    # ---- records ------------------------------------------------------------------------------------------
    def record(self, record: tuple) -> None:
        self._records.append(record)
        if self._flush_at is None:
            self._flush_at = self.loop.call_later(STATS_FLUSH_S, self.flush)

    def flush(self) -> None:
        self._flush_at = None
        if self._records:
            records, self._records = self._records, []
            self.send(pipe.encode(pipe.Stats(records)))

    def refused(self, code: str) -> None:
        """A request answered with an error before it was a query (unreadable, too large, too slow)."""
        self.record(("refused", code))

    def paused_reading(self) -> None:
        """A connection stopped reading: a client pipelines more than ``PIPELINE_BYTES`` behind a request."""
        self.read_pauses += 1
        self.record(("read_paused",))

    def publish_load(self, retiring: bool) -> None:
        """Queries this worker holds, in its shared slot; a retiring worker shows itself full, so that no sibling
        moves a connection or forwards a query to it."""
        if self.loads is not None:
            self.loads[self.slot] = RETIRING_LOAD if retiring else self.admission.held()

    # ---- heartbeat and memory ----------------------------------------------------------------------------
    def beat(self) -> None:
        """Tell the supervisor this loop is alive (its watchdog's evidence), answer queries queued past their
        deadline behind a pass on the compute thread, and report ``sources``' counters; again every ``BEAT_S``."""
        if self.exit_event.is_set():
            return
        self.send(pipe.encode(pipe.Beat(self.admission.busy_s())))
        self.admission.expire_waiting()
        for source in self.sources:
            for record in source():
                self.record(record)
        if self.regions is not None:  # unregistered regions' mappings are let go without waiting for a query
            self.regions.refresh()
        now = time.monotonic()
        if (self.trim_wanted and not self.admission.busy() and now - self._trimmed_at > TRIM_EVERY_S
                and now - self._last_large_input > TRIM_QUIET_S):
            self._trim()
        self.loop.call_later(BEAT_S, self.beat)

    def took_large_input(self, size: int) -> None:
        """A large request body was received: after ``TRIM_AFTER_BYTES`` of them, return free memory once none has
        come for ``TRIM_QUIET_S`` (a burst of 2.8 MB JSON queries left a worker 170 MB larger, kept by the heap
        tunables that keep activations; trimming while large queries keep coming would fault those in again)."""
        self._large_input_bytes += size
        self._last_large_input = time.monotonic()
        if self._large_input_bytes >= TRIM_AFTER_BYTES:
            self._large_input_bytes = 0
            self.trim_wanted = True

    def _trim(self) -> None:
        """Return the heap's free memory: what a client's large input took is not kept until the worker restarts
        (the next pass may fault its activations in once more; hence idle only, and at most every TRIM_EVERY_S)."""
        from recserve.zoo.allocator import release_free_memory

        self.trim_wanted, self._trimmed_at = False, time.monotonic()
        release_free_memory()
