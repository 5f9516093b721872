"""Query streams for the simulator: sizes from the production-like mix, Poisson arrivals, load shapes.

Sizes come from ``recserve.workload`` (the production-like Kairos/DeepRecSys mix by default);
shaped arrival curves (ramps, steps, spikes) are generated here by time rescaling.
Arrival times use common random numbers: one array of unit exponential gaps is scaled by the rate,
so runs at different rates (and with different policies) see the same query sequence.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from recserve.errors import RecserveError


def sizes_for(mix: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` query sizes from a ``recserve.workload`` size distribution spec (``production``,
    ``normal:mean=256,sd=32``, ``file:sizes.npy``, ...)."""
    from recserve.workload import WorkloadError, size_distribution

    try:
        return size_distribution(mix).sample(n, rng)
    except WorkloadError as exc:
        raise RecserveError(str(exc)) from exc


class QueryStream:
    """A fixed sequence of queries (sizes, unit gaps, service noise) replayable at any rate."""

    def __init__(self, n: int, seed: int = 0, mix: str = "production") -> None:
        if n <= 0:
            raise RecserveError(f"need at least one query, got {n}")
        rng = np.random.default_rng(seed)
        self.sizes = sizes_for(mix, n, rng)
        self.unit_gaps = rng.standard_exponential(n)
        self.noise = rng.standard_normal(n)
        self.n = n

    def arrivals(self, qps: float) -> np.ndarray:
        """Arrival times (ms) of a Poisson process at ``qps`` queries per second."""
        if qps <= 0:
            raise RecserveError(f"arrival rate must be positive, got {qps}")
        return np.cumsum(self.unit_gaps * (1000.0 / qps))

    def arrivals_shaped(self, rate_at: Callable[[float], float], duration_s: float) -> np.ndarray:
        """Arrival times (ms) of a non-homogeneous Poisson process with rate ``rate_at(t_seconds)``,
        by time rescaling of the unit gaps; stops at ``duration_s`` or when the stream runs out."""
        out, t = [], 0.0
        for g in self.unit_gaps:
            # advance until the integrated rate has accumulated one unit gap (piecewise, 1 ms steps)
            need = g
            while need > 0 and t < duration_s * 1000.0:
                r = max(rate_at(t / 1000.0), 1e-9) / 1000.0  # per ms
                dt = min(need / r, 1.0)
                need -= dt * r
                t += dt
            if t >= duration_s * 1000.0:
                break
            out.append(t)
        return np.array(out)


def piecewise_rate(points: Sequence[tuple[float, float]]) -> Callable[[float], float]:
    """Linear interpolation through (time_s, qps) points; holds the end values outside."""
    ts = np.array([p[0] for p in points], dtype=float)
    qs = np.array([p[1] for p in points], dtype=float)
    return lambda t: float(np.interp(t, ts, qs))


def diurnal_rate(peak_qps: float, period_s: float, trough_frac: float = 0.3) -> Callable[[float], float]:
    """Sinusoidal day: between trough_frac * peak and peak."""
    mid, amp = peak_qps * (1 + trough_frac) / 2, peak_qps * (1 - trough_frac) / 2
    return lambda t: float(mid - amp * np.cos(2 * np.pi * t / period_s))
