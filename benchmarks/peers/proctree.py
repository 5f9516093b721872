"""The CPU a server's processes spend, read from /proc: what bench_peers reports beside each probe's latency.

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


def with_descendants(roots: set[int]) -> set[int]:
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children(pid))
    return seen


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (all its threads), None when it is gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


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
        return {pid: cpu for pid in with_descendants(self.roots) if (cpu := cpu_seconds(pid)) is not None}

    def cpu_since(self, before: dict[int, float]) -> tuple[float, int]:
        """CPU seconds spent since ``before`` by the processes alive now (new ones: all they spent), and their
        count."""
        now = self.reading()
        return sum(cpu - before.get(pid, 0.0) for pid, cpu in now.items()), len(now)
