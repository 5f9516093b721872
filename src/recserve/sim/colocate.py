"""Fluctuating-load co-location scenario (Hera Sec. VII-B, Fig. 14) on the simulated node.

Two co-located models (a memory-bound one, like DLRM(D), and a cache-sensitive one, like NCF)
receive loads given as fractions of each model's max load alone on the whole node: both rise
gradually until T1, when the cache-sensitive model's load drops suddenly; at T2 it spikes while the
memory-bound model's load drops.  Each controller (Hera RMU, PARTIES-style, static) runs the same
arrivals; the result is the fraction of monitoring windows violating an SLA and the allocations
over time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.policies.rmu import CapacityProfile, make_controller
from recserve.profiles import ProfileSet
from recserve.sim.node import ColocModel, ColocNode
from recserve.sim.queries import QueryStream, piecewise_rate


@dataclass
class LoadShape:
    """(time_s, fraction of the model's max load alone) breakpoints, linearly interpolated."""

    points: list[tuple[float, float]]

    def rate(self, max_qps: float) -> Callable[[float], float]:
        return piecewise_rate([(t, f * max_qps) for t, f in self.points])


def hera_fig14(duration_s: float = 120.0, t1: float | None = None, t2: float | None = None,
               memory_peak: float = 0.6, cache_peak: float = 0.5, cache_spike: float = 0.6,
               cache_drop: float = 0.2) -> tuple[LoadShape, LoadShape]:
    """Loads for (memory-bound model, cache-sensitive model): gradual rise to T1 (to ``memory_peak`` and
    ``cache_peak``); at T1 the cache-sensitive model drops to ``cache_drop`` (the paper's 20%); at T2 it spikes to
    ``cache_spike`` (the paper's 60%) while the memory-bound one drops to 10%."""
    t1 = duration_s / 3 if t1 is None else t1
    t2 = 2 * duration_s / 3 if t2 is None else t2
    eps = 1e-3
    memory = LoadShape([(0, 0.1), (t1, memory_peak), (t2, memory_peak), (t2 + eps, 0.1), (duration_s, 0.1)])
    cache = LoadShape([(0, 0.1), (t1, cache_peak), (t1 + eps, cache_drop), (t2, cache_drop), (t2 + eps, cache_spike),
                       (duration_s, cache_spike)])
    return memory, cache


def diurnal(duration_s: float = 120.0, peak: float = 0.6, trough: float = 0.15,
            points: int = 61) -> tuple[LoadShape, LoadShape]:
    """One compressed "day" per run: the memory-bound model peaks mid-run, the cache-sensitive one is in
    anti-phase (peaks at the start and end), both sinusoidal between ``trough`` and ``peak``."""
    ts = np.linspace(0.0, duration_s, points)
    mid, amp = (peak + trough) / 2, (peak - trough) / 2
    memory = LoadShape([(float(t), float(mid - amp * np.cos(2 * np.pi * t / duration_s))) for t in ts])
    cache = LoadShape([(float(t), float(mid + amp * np.cos(2 * np.pi * t / duration_s))) for t in ts])
    return memory, cache


def steps(duration_s: float = 120.0, levels: Sequence[float] = (0.1, 0.3, 0.5, 0.3, 0.6, 0.2)
          ) -> tuple[LoadShape, LoadShape]:
    """Staircase loads: the memory-bound model walks ``levels``, the cache-sensitive one walks them reversed."""
    def stair(lv: Sequence[float]) -> LoadShape:
        width = duration_s / len(lv)
        pts: list[tuple[float, float]] = []
        for k, f in enumerate(lv):
            pts += [(k * width + (1e-3 if k else 0.0), f), ((k + 1) * width, f)]
        return LoadShape(pts)

    return stair(levels), stair(list(reversed(levels)))


SCENARIOS = {"fig14": hera_fig14, "diurnal": diurnal, "steps": steps}


def run_scenario(models: Sequence[ColocModel], shapes: Sequence[LoadShape], alone_max_qps: dict[str, float],
                 profiles: ProfileSet, server: str, controllers: Sequence[str], duration_s: float,
                 cores: int = 16, ways: int = 11, mem_bw_gbs: float = 60.0, t_monitor_s: float = 1.0,
                 seed: int = 0, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every controller on the same arrivals; returns per-controller windows and violation fractions.
    ``progress`` hears of each controller as its run starts."""
    streams, arrivals = {}, {}
    for k, (m, shape) in enumerate(zip(models, shapes, strict=True)):
        rate = shape.rate(alone_max_qps[m.name])
        peak = max(f for _, f in shape.points) * alone_max_qps[m.name]
        n = int(peak * duration_s * 1.2) + 100
        streams[m.name] = QueryStream(n, seed=seed + k)
        arrivals[m.name] = streams[m.name].arrivals_shaped(rate, duration_s)
    capacity = {m.name: CapacityProfile.from_profiles(profiles, m.name, server) for m in models}
    out: dict[str, Any] = {"controllers": {}}
    for name in controllers:
        node = ColocNode(models, cores=cores, ways=ways, mem_bw_gbs=mem_bw_gbs, t_monitor_s=t_monitor_s)
        ctl = make_controller(name, capacity)
        if progress:
            progress(f"simulating {name}: {sum(len(a) for a in arrivals.values()):,} queries over {duration_s:g} s")
        windows = node.run(arrivals, streams, ctl, duration_s)
        out["controllers"][name] = {
            "violating_window_fraction": _violating(windows),
            "severe_window_fraction": _violating(windows, 1.5),
            "per_model_violating_fraction": {m.name: float(np.mean([w["models"][m.name]["tail_over_sla"] > 1.0
                                                                    for w in windows])) for m in models},
            "decisions": len(ctl.log),
            "windows": windows,
        }
    out["loads"] = {m.name: {"alone_max_qps": alone_max_qps[m.name], "shape": s.points}
                    for m, s in zip(models, shapes, strict=True)}
    return out


def _violating(windows: list[dict[str, Any]], factor: float = 1.0) -> float:
    """Fraction of windows in which some model's tail exceeded ``factor`` x its SLA."""
    if not windows:
        return 0.0
    return float(np.mean([any(v["tail_over_sla"] > factor for v in w["models"].values()) for w in windows]))
