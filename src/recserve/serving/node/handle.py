"""One worker process as the supervisor sees it: its handle, and the thread that writes to its pipe."""

from __future__ import annotations

import asyncio
import itertools
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.serving.wire import pipe

next_id = itertools.count(1).__next__  # worker ids and the ids of the items sent to workers, unique in this process


class Outbox:
    """What the supervisor sends one worker, written by a thread of its own, in order.

    Why: a blocking write to a worker that is not reading (busy computing, or itself blocked writing to the
    supervisor) would stop the supervisor's loop; once both directions of the pipe were full, neither would read
    again (seen live: a retiring worker's few hundred connections handed to a sibling that registered each one
    back, and the node stopped accepting).  The loop only queues; this thread waits for the worker."""

    def __init__(self, conn: Any, name: str) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{name}-outbox", daemon=True)
        self._thread.start()

    def post(self, msg: Any, fd: int | None = None) -> None:
        """Send ``msg`` (then a duplicate of descriptor ``fd``, which the caller keeps) to the worker."""
        self._queue.put((msg, os.dup(fd) if fd is not None else None))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        from multiprocessing.reduction import send_handle

        broken = False
        while (item := self._queue.get()) is not None:
            msg, fd = item
            try:
                if not broken:
                    self._conn.send(msg)
                    if fd is not None:
                        send_handle(self._conn, fd, 0)
            except OSError:
                broken = True  # the worker is gone: its reader on the supervisor's side sees EOF
            finally:
                if fd is not None:
                    os.close(fd)


@dataclass
class WorkerHandle:
    worker_id: int
    stage: str
    cores: list[int]
    threads: int
    process: Any
    conn: Any
    ready: asyncio.Future
    exited: asyncio.Future
    io: np.ndarray | None = None  # this worker's shared I/O buffer (numpy view)
    io_split: int = 0
    pid: int = 0
    retiring: bool = False
    stop_sent: bool = False
    current: Any = None  # the part of a query it computes (dispatch.Part)
    items_done: int = 0
    queries_done: int = 0  # v2: queries this worker computed and answered (forwarded ones included: it computed them)
    last_beat: float = 0.0  # data plane v2: monotonic time of the worker's last heartbeat
    config_seq: int = 0  # v2: the last live settings change (``pipe.Config.seq``) it has applied
    conns: dict[int, int] = field(default_factory=dict)  # v2: the worker's connection descriptors -> ours
    # v2: connections posted to it and not yet registered (``watchdog.hold_in_transit``): inode -> (ours, read, when)
    incoming: dict[int, tuple[int, bytes, float]] = field(default_factory=dict)
    slot: int = -1  # v2: its index in the model's shared load array
    outbox: Outbox | None = None
    states: np.ndarray | None = None  # v2: shared, one row per worker descriptor (``Connection.mark``)
    hung: bool = False
    accel_socket: str = ""  # an accelerator worker's Unix socket (serving/worker/accel.py)
    waiting: Callable[[], bool] = field(init=False)  # whether a message waits on ``conn`` (``pipe.waiting``)

    def __post_init__(self) -> None:
        self.waiting = pipe.waiting(self.conn) if self.conn is not None else lambda: False

    @property
    def working(self) -> bool:
        return self.ready.done() and not self.ready.exception() and not self.hung

    def describe(self) -> dict[str, Any]:
        return {"id": self.worker_id, "pid": self.pid, "cores": self.cores, "threads": self.threads,
                "ready": self.ready.done() and not self.ready.exception(), "retiring": self.retiring,
                "busy": self.current is not None, "items_done": self.items_done,
                "queries_done": self.queries_done, **memory_of(self.pid)}


def memory_of(pid: int) -> dict[str, float]:
    """RSS and PSS of a process in MB (PSS splits shared pages among the processes mapping them)."""
    out = {"rss_mb": 0.0, "pss_mb": 0.0}
    if not pid:
        return out
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    out[f"{key.lower()}_mb"] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return out
