"""Discrete-event simulation of one multi-tenant CPU node: co-located models, workers, LLC ways.

Each model has a FIFO queue and ``workers`` single-query workers (one per core).  A query's service
time is its single-worker latency (drawn from the model's ``latency_vs_batch`` table, lognormal
matched to p50/p99) times two co-location slowdowns, documented parameters of :class:`ColocModel`
(no calibrated interference model exists in ``recserve.perfmodel`` yet):

- LLC: ``1 + llc_sensitivity * ((W - ways) / (W - 1))**2`` (1 at the full W ways; Hera Fig. 7 shape:
  cache-sensitive models lose up to half their QPS at one way, memory-bound ones ~10%);
- memory bandwidth: ``1 + memory_fraction * (max(1, demand / node_bw) - 1)`` where ``demand`` is
  the sum of ``bw_per_worker_gbs`` over the workers busy at that moment.

Every ``t_monitor_s`` the node computes window statistics and lets a controller (Hera RMU, PARTIES,
static) act through :class:`SimNodeControl`, the simulator's implementation of ``NodeControl``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.measure.maxload import find_max_load
from recserve.policies.rmu import Controller, NodeControl, WindowStats, even_split
from recserve.profiles import ProfileSet, ProfileTable
from recserve.sim.latency import ServiceModel
from recserve.sim.queries import QueryStream


@dataclass
class ColocModel:
    name: str
    service: ServiceModel          # single worker, alone, full LLC
    server: str                    # which type row of ``service`` to use
    sla_ms: float
    percentile: float = 95.0
    llc_sensitivity: float = 0.5
    bw_per_worker_gbs: float = 2.0
    memory_fraction: float = 0.5

    def base_service(self, stream: QueryStream) -> np.ndarray:
        buckets = self.service.bucket(stream.sizes)
        return self.service.sample([self.server], buckets, stream.noise)[:, 0]


@dataclass
class _State:
    workers: int = 1
    ways: int = 1
    busy: int = 0
    queue: deque = field(default_factory=deque)  # (arrival_ms, base_service_ms)
    window_lat: list = field(default_factory=list)
    window_arrivals: int = 0
    window_done: int = 0
    stats: WindowStats = field(default_factory=lambda: WindowStats(0.0, 0.0, 0.0))


class ColocNode:
    """The node: cores, LLC ways, memory bandwidth, and the models placed on it."""

    def __init__(self, models: Sequence[ColocModel], cores: int = 16, ways: int = 11, mem_bw_gbs: float = 60.0,
                 t_monitor_s: float = 1.0) -> None:
        if not models:
            raise RecserveError("a node needs at least one model")
        if cores < len(models) or ways < len(models):
            raise RecserveError(f"{len(models)} models need at least one core and one LLC way each")
        self.models = list(models)
        self.cores, self.ways, self.mem_bw = int(cores), int(ways), float(mem_bw_gbs)
        self.t_monitor_ms = float(t_monitor_s) * 1000.0
        self.state = {m.name: _State() for m in self.models}

    # ------------------------------------------------------------------ physics
    def llc_factor(self, model: ColocModel, ways: int) -> float:
        if self.ways <= 1:
            return 1.0
        missing = (self.ways - min(max(ways, 1), self.ways)) / (self.ways - 1)
        return 1.0 + model.llc_sensitivity * missing * missing

    def _bw_factor(self, model: ColocModel) -> float:
        demand = sum(self.state[m.name].busy * m.bw_per_worker_gbs for m in self.models)
        return 1.0 + model.memory_fraction * (max(1.0, demand / self.mem_bw) - 1.0)

    # ------------------------------------------------------------------ run
    def run(self, arrivals: dict[str, np.ndarray], streams: dict[str, QueryStream], controller: Controller | None,
            duration_s: float | None = None) -> list[dict[str, Any]]:
        """Simulate; returns one record per monitoring window with every model's stats and allocation."""
        control = SimNodeControl(self)
        if controller is not None:
            controller.start(control)
        names = [m.name for m in self.models]
        base = {m.name: m.base_service(streams[m.name]) for m in self.models}
        times = np.concatenate([arrivals[n] for n in names]) if names else np.zeros(0)
        owner = np.concatenate([np.full(len(arrivals[n]), k) for k, n in enumerate(names)])
        index = np.concatenate([np.arange(len(arrivals[n])) for n in names])
        order = np.argsort(times, kind="stable")
        times, owner, index = times[order].tolist(), owner[order].tolist(), index[order].tolist()
        end_ms = duration_s * 1000.0 if duration_s is not None else math.inf
        heap: list[tuple[float, int, int, float]] = []
        seq = 0
        next_tick = self.t_monitor_ms
        windows: list[dict[str, Any]] = []
        i, n = 0, len(times)
        models = self.models
        while True:
            t_arr = times[i] if i < n else math.inf
            t_done = heap[0][0] if heap else math.inf
            if duration_s is None and i >= n and not heap:
                break
            t_next = min(t_arr, t_done, next_tick)
            if t_next > end_ms:
                break
            if t_next == next_tick:
                windows.append(self._tick(next_tick, controller, control))
                seq = self._fill_all(next_tick, heap, seq)
                next_tick += self.t_monitor_ms
            elif t_done <= t_arr:
                now, _, k, arrived = heapq.heappop(heap)
                st = self.state[models[k].name]
                st.busy -= 1
                st.window_lat.append(now - arrived)
                st.window_done += 1
                seq = self._start(k, now, heap, seq)
            else:
                k = owner[i]
                st = self.state[models[k].name]
                st.queue.append((t_arr, base[models[k].name][index[i]]))
                st.window_arrivals += 1
                i += 1
                seq = self._start(k, t_arr, heap, seq)
        return windows

    def _start(self, k: int, now: float, heap: list, seq: int) -> int:
        model = self.models[k]
        st = self.state[model.name]
        while st.queue and st.busy < st.workers:
            arrived, base = st.queue.popleft()
            st.busy += 1
            svc = base * self.llc_factor(model, st.ways) * self._bw_factor(model)
            seq += 1
            heapq.heappush(heap, (now + svc, seq, k, arrived))
        return seq

    def _fill_all(self, now: float, heap: list, seq: int) -> int:
        for k in range(len(self.models)):
            seq = self._start(k, now, heap, seq)
        return seq

    def _tick(self, now: float, controller: Controller | None, control: NodeControl) -> dict[str, Any]:
        secs = self.t_monitor_ms / 1000.0
        record: dict[str, Any] = {"t_s": now / 1000.0, "models": {}}
        for m in self.models:
            st = self.state[m.name]
            # queries still waiting are at least this late: count them so overload shows up at once
            late = [now - a for a, _ in st.queue]
            sample = st.window_lat + late
            tail = float(np.percentile(sample, m.percentile)) if sample else 0.0
            st.stats = WindowStats(tail, st.window_done / secs, st.window_arrivals / secs, st.window_done)
            record["models"][m.name] = {"tail_ms": tail, "tail_over_sla": tail / m.sla_ms, "samples": len(sample),
                                        "over_sla": int(np.count_nonzero(np.asarray(sample) > m.sla_ms)),
                                        "qps": st.stats.qps, "arrival_qps": st.stats.arrival_qps,
                                        "workers": st.workers, "ways": st.ways}
            st.window_lat, st.window_arrivals, st.window_done = [], 0, 0
        if controller is not None:
            controller.step(now / 1000.0, control)
        return record


class SimNodeControl:
    """``NodeControl`` over the simulated node (the live one talks to the server's control API)."""

    def __init__(self, node: ColocNode) -> None:
        self.node = node
        self._by_name = {m.name: m for m in node.models}

    def models(self) -> list[str]:
        return [m.name for m in self.node.models]

    def sla(self, model: str) -> tuple[float, float]:
        m = self._by_name[model]
        return m.sla_ms, m.percentile

    def total_cores(self) -> int:
        return self.node.cores

    def total_ways(self) -> int:
        return self.node.ways

    def get_workers(self, model: str) -> int:
        return self.node.state[model].workers

    def set_workers(self, model: str, workers: int) -> None:
        others = sum(s.workers for n, s in self.node.state.items() if n != model)
        if workers < 1 or workers + others > self.node.cores:
            raise RecserveError(f"{model}: {workers} workers do not fit ({others} of {self.node.cores} cores taken)")
        self.node.state[model].workers = int(workers)

    def get_ways(self, model: str) -> int:
        return self.node.state[model].ways

    def set_ways(self, model: str, ways: int) -> None:
        others = sum(s.ways for n, s in self.node.state.items() if n != model)
        if ways < 1 or ways + others > self.node.ways:
            raise RecserveError(f"{model}: {ways} LLC ways do not fit ({others} of {self.node.ways} taken)")
        self.node.state[model].ways = int(ways)

    def window_stats(self, model: str) -> WindowStats:
        return self.node.state[model].stats


class _Fixed:
    """A controller that pins one allocation (used for offline profiling)."""

    name = "fixed"

    def __init__(self, workers: int, ways: int) -> None:
        self.workers, self.ways = workers, ways

    def start(self, control: NodeControl) -> None:
        even_split(control)
        m = control.models()[0]
        control.set_workers(m, self.workers)
        control.set_ways(m, self.ways)

    def step(self, now_s: float, control: NodeControl) -> None:
        return None


def alone_max_load(model: ColocModel, workers: int, ways: int, cores: int, total_ways: int, mem_bw: float,
                   queries: int = 3000, seed: int = 0) -> float:
    """Max load of ``model`` alone on the node with a fixed allocation (the offline profiling step)."""
    stream = QueryStream(queries, seed=seed)

    def tail_at(rate: float) -> float:
        node = ColocNode([model], cores=cores, ways=total_ways, mem_bw_gbs=mem_bw, t_monitor_s=1e9)
        node.run({model.name: stream.arrivals(rate)}, {model.name: stream}, _Fixed(workers, ways))  # type: ignore[arg-type]
        lat = node.state[model.name].window_lat
        if len(lat) < queries:  # unfinished queries: overloaded
            return math.inf
        return float(np.percentile(lat, model.percentile))

    mean_ms = float(np.mean(model.base_service(stream)))
    start = max(0.5, workers * 1000.0 / mean_ms * 0.3)
    return find_max_load(tail_at, model.sla_ms, model.percentile, start_qps=start, rtol=0.03).max_qps


def profile_node(models: Sequence[ColocModel], cores: int, ways: int, mem_bw: float, server: str = "sim-node",
                 worker_points: Sequence[int] | None = None, way_points: Sequence[int] | None = None,
                 queries: int = 3000, log: Any = None) -> ProfileSet:
    """Hera's offline profiling on the simulated node: maxload_vs_workers (full LLC) and a 3-D
    maxload_vs_ways table (columns ways, max_qps, workers) for every model, measured by max-load search."""
    worker_points = sorted(set(worker_points or [1, 2, 4, 6, 8, 12, cores]) & set(range(1, cores + 1)))
    way_points = sorted(set(way_points or [1, 2, 4, 7, ways]) & set(range(1, ways + 1)))
    tables = []
    for m in models:
        rows_w = []
        for w in worker_points:
            rows_w.append([float(w), alone_max_load(m, w, ways, cores, ways, mem_bw, queries)])
            if log:
                log(f"  profile {m.name}: {w} workers -> {rows_w[-1][1]:.1f} qps")
        tables.append(ProfileTable(m.name, server, "maxload_vs_workers", ("workers", "max_qps"), rows_w,
                                   source="modelled", conditions={}))
        rows_l = []
        for w in worker_points[:: max(1, len(worker_points) // 3)] + [worker_points[-1]]:
            for y in way_points:
                qps = rows_w[worker_points.index(w)][1] if y == ways else alone_max_load(m, w, y, cores, ways,
                                                                                          mem_bw, queries)
                rows_l.append([float(y), qps, float(w)])
        tables.append(ProfileTable(m.name, server, "maxload_vs_ways", ("ways", "max_qps", "workers"),
                                   _dedupe(rows_l), source="modelled", conditions={}))
    return ProfileSet(tables, {"note": "profiled on the simulated node (recserve.sim.node)",
                               "cores": cores, "ways": ways, "mem_bw_gbs": mem_bw})


def _dedupe(rows: list[list[float]]) -> list[list[float]]:
    seen, out = set(), []
    for r in rows:
        key = (r[0], r[2])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out
