"""The CPU a server's processes spend, read from /proc: what bench_peers reports beside each probe's latency (the
process tree and CPU readers are ``benchmarks/common/timing.py``'s, as ``bench_wrk`` uses them).

A server is the processes this benchmark started for it (``ServerProcesses.started``: the children that appeared
while its context was entered) and their descendants at each reading, so workers a server spawns or restarts later
are counted.  A process that exits between two readings loses what it spent since the first; a process a server
detaches from its tree (a daemon re-parented to init) is not seen.  Where /proc is missing, nothing is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.common.timing import cpu_s, process_tree

PROC = Path("/proc")


def children(pid: int) -> set[int]:
    """The live children of ``pid`` (every thread's list), empty when it is gone or /proc is missing."""
    out: set[int] = set()
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.update(int(x) for x in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return out


class ServerProcesses:
    """One server's processes: ``reading()`` before a probe, ``cpu_since(reading)`` after it."""

    def __init__(self, roots: set[int]) -> None:
        self.roots = roots

    @classmethod
    @contextmanager
    def started(cls, parent: int | None = None) -> Iterator[ServerProcesses]:
        """The processes ``parent`` (this one) gains while the block runs: enter the server's context inside it."""
        parent = os.getpid() if parent is None else parent
        before = children(parent)
        found = cls(set())
        yield found
        found.roots = children(parent) - before

    def reading(self) -> dict[int, float]:
        """CPU seconds of each live process of the server (``timing.process_tree``, ``timing.cpu_s``)."""
        if not PROC.is_dir():
            return {}
        out = {}
        for pid in process_tree(self.roots):
            try:
                out[pid] = cpu_s(pid)
            except OSError:  # gone since the tree was read
                continue
        return out

    def cpu_since(self, before: dict[int, float]) -> tuple[float, int]:
        """CPU seconds spent since ``before`` by the processes alive now (new ones: all they spent), and their
        count."""
        now = self.reading()
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items()), len(now)
