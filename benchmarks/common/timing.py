"""Latency and CPU of a call taken many times: summaries, a process's CPU seconds, the node's own model time."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from recserve.measure.sink import process_cpu_s


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1e3
    return {"mean_ms": float(ms.mean()), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "n": len(ms)}


def interleaved(calls: dict[str, Callable[[], object]], n: int) -> dict[str, dict[str, float]]:
    """Latency of every path taken in turn, one call each per round: a host whose speed drifts over a run (a
    shared VM's does, by 2x within minutes) moves every path alike, so their differences hold."""
    samples: dict[str, list[float]] = {path: [] for path in calls}
    for _ in range(n):
        for path, call in calls.items():
            t = time.perf_counter()
            call()
            samples[path].append(time.perf_counter() - t)
    return {path: summary(s) for path, s in samples.items()}


def cpu_s(pid: int) -> float:
    """CPU seconds of a process: its live threads' run time in ns (``/proc/PID/task/*/schedstat``), else user+system
    clock ticks (``/proc/PID/stat``, 10 ms each: over 400 queries that is 0.025 ms a query, as large as the
    differences issue #14 is about)."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # the thread ended meanwhile
                pass
        return total / 1e9
    except (OSError, ValueError, IndexError):
        return process_cpu_s([pid])


def tcp_sockets(port: int, state: str, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> set[str]:
    """The TCP sockets on local ``port`` in ``state`` (``/proc/net/tcp``'s code: ``0A`` listening, ``01``
    established), as a process's descriptors link to them (``socket:[inode]``)."""
    found = set()
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(f"socket:[{fields[9]}]")
    return found


def socket_links(pid: int) -> set[str]:
    """The sockets process ``pid``'s descriptors hold (none if it is gone or not ours to read; a descriptor closed
    meanwhile, such as the one that listed them, is skipped)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
    return {link for link in links if link.startswith("socket:[")}


def connections_held(pid: int, port: int) -> int:
    """Established TCP connections to local ``port`` that process ``pid`` holds (IPv4 loopback; a connection
    held by two of its descriptors counts once)."""
    return len(socket_links(pid) & tcp_sockets(port, "01", ("/proc/net/tcp",)))


def listening_pids(port: int) -> set[int]:
    """Processes holding a listening TCP socket on local ``port`` (IPv4 or IPv6): a server's front end."""
    listening = tcp_sockets(port, "0A")
    return {pid for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()) if socket_links(pid) & listening}


def process_tree(roots: set[int]) -> set[int]:
    """``roots`` and every process descended from them (``/proc/PID/stat``'s parent field)."""
    children: dict[int, list[int]] = {}
    for pid in (int(d) for d in os.listdir("/proc") if d.isdigit()):
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


def tree_cpu_s(pids: set[int]) -> float:
    """CPU seconds of the live processes among ``pids`` (one that exited counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_s(pid)
        except OSError:
            pass
    return total


def timed_cpu(fn, n: int, server_pids: list[int], worker_pids: list[int],
              model_time: Callable[[], tuple[int, int]] | None = None) -> dict[str, float]:
    """Latency summary plus CPU per request of the client (this process), the server front end and the workers.

    CPU time does not include waiting for a core, so it shows the software overhead even on a
    host whose run queue is long (wall-clock latency there is dominated by wake-up delays).  With
    ``model_time`` (the server's own ``compute_infer`` count and ns), the server's CPU per request
    that is not the model's forward pass is reported too: the client's CPU on a 2-core host slows
    the worker's model beside it, which a comparison with the in-process model would count as overhead.
    """
    for _ in range(10):
        fn()
    groups = {"client": [os.getpid()], "server_front_end": server_pids, "workers": worker_pids}
    before = {k: sum(cpu_s(p) for p in pids) for k, pids in groups.items()}
    model_before = model_time() if model_time else (0, 0)
    out = summary(timed(fn, n, warmup=0))
    for k, pids in groups.items():
        out[f"cpu_ms_per_request_{k}"] = (sum(cpu_s(p) for p in pids) - before[k]) / n * 1e3
    if model_time is not None:
        time.sleep(0.1)  # the workers report completed queries every 25 ms
        count, ns = (a - b for a, b in zip(model_time(), model_before, strict=True))
        out["model_ms_per_request"] = ns / max(1, count) / 1e6
        out["server_non_model_cpu_ms_per_request"] = (out["cpu_ms_per_request_server_front_end"]
                                                      + out["cpu_ms_per_request_workers"] - out["model_ms_per_request"])
    return out


def stats_reader(port: int, model: str) -> Callable[[], tuple[int, int]]:
    """The node's ``compute_infer`` (count, ns) for ``model``, from ``/v2/models/{m}/stats``."""
    def read() -> tuple[int, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.load(r)["model_stats"][0]["inference_stats"]["compute_infer"]
        return stats["count"], stats["ns"]
    return read


def timed(fn, n: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out
