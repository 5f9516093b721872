"""Tail latency and max load of a node from per-query service times (M/G/c-style approximation).

A query of ``n`` items is split into sub-batches of at most ``b`` items (DeepRecSys' data
parallelism); sub-batches are jobs for ``c`` identical workers.  Waiting time follows the
Allen–Cunneen approximation of M/G/c with batch-Poisson job arrivals: P(wait > t) ≈
ErlangC · exp(−(c − a)/E[S] · 2/(ca² + cs²) · t).  A query's sojourn time is its wait plus its
span (the rounds its sub-batches need on ``c`` workers); the SLA percentile of sojourn over the
query-size mix is solved for, and max load is the largest arrival rate keeping it under the SLA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


def production_sizes(n: int = 20000, seed: int = 0) -> np.ndarray:
    """Kairos' production-like query-size mix (reference/README.md): mean ≈ 244, median ≈ 180, p99 ≈ 920.

    Used until ``recserve.workload`` provides the shared generator.
    """
    rng = np.random.default_rng(seed)
    r = rng.integers(1, 100, size=n)
    out = np.empty(n)
    small, mid, large, rest = r <= 8, (r > 8) & (r <= 30), (r > 30) & (r <= 35), r > 35
    out[small] = rng.integers(1, 100, size=small.sum())
    out[mid] = rng.integers(200, 600, size=mid.sum())
    out[large] = rng.integers(600, 1000, size=large.sum())
    logn = rng.lognormal(5.1, 0.2, size=rest.sum())
    bad = (logn < 100) | (logn > 200)
    logn[bad] = rng.integers(190, 200, size=bad.sum())
    out[rest] = logn
    return (np.ceil(out / 10.0) * 10.0).astype(int)


def default_sizes() -> np.ndarray:
    """The shared production-like mix from ``recserve.workload`` when it exists, else the local copy."""
    try:  # the workload colleague's generator, when it lands
        from recserve.workload import production_query_sizes  # type: ignore[attr-defined]

        return np.asarray(production_query_sizes(20000, seed=0), dtype=int)
    except (ImportError, AttributeError, TypeError):
        return production_sizes()


@dataclass(frozen=True)
class SizeMix:
    sizes: np.ndarray  # distinct query sizes
    probs: np.ndarray

    @classmethod
    def of(cls, sizes: np.ndarray | list[int] | None) -> SizeMix:
        arr = default_sizes() if sizes is None else np.asarray(sizes, dtype=int)
        arr = np.clip(arr, 1, None)
        values, counts = np.unique(arr, return_counts=True)
        return cls(values, counts / counts.sum())

    @property
    def mean(self) -> float:
        return float((self.sizes * self.probs).sum())


@dataclass(frozen=True)
class Station:
    """One pool of ``c`` workers as the query-size mix sees it, at one arrival rate.

    ``ek``/``ek2``: mean jobs per query and its second moment; ``ework``/``ework2``: mean worker-ms
    per query and mean sum of squared job times per query; ``span`` (per size): ms from a query's
    first job starting to its last finishing.
    """

    c: int
    ek: float
    ek2: float
    ework: float
    ework2: float
    span: np.ndarray
    batched: bool = False  # fused launches: a query waits for at most the launch in progress, counted in ``span``

    @classmethod
    def from_jobs(cls, c: int, probs: np.ndarray, k: np.ndarray, work: np.ndarray, work2: np.ndarray,
                  span: np.ndarray) -> Station:
        return cls(c, float(probs @ k), float(probs @ (k * k)), float(probs @ work), float(probs @ work2), span)

    def wait_tail(self, qps: float) -> tuple[float, float]:
        """(P(wait > 0), decay rate per ms) of the Allen–Cunneen exponential wait tail; (1, 0) if overloaded;
        (0, inf) for a station of fused launches below saturation (its wait, one launch at most, is in ``span``)."""
        if self.batched:
            return 0.0, math.inf
        es = self.ework / self.ek
        es2 = self.ework2 / self.ek
        a = qps / 1000.0 * self.ework
        if a >= self.c or es <= 0:
            return 1.0, 0.0
        cs2 = max(es2 / (es * es) - 1.0, 0.0)
        ca2 = self.ek2 / self.ek
        return erlang_c(self.c, a), (self.c - a) / es * 2.0 / (ca2 + cs2)

    def utilisation(self, qps: float) -> float:
        return qps / 1000.0 * self.ework / self.c


def erlang_c(c: int, a: float) -> float:
    """Probability an arrival waits in M/M/c with offered load ``a`` (Erlang B recursion)."""
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def jitter(pct: float, p99_over_mean: float) -> float:
    """Service-time percentile over mean, from an exponential-shaped tail pinned at p99."""
    return 1.0 + (p99_over_mean - 1.0) * math.log(1.0 / (1.0 - pct / 100.0)) / math.log(100.0)


def sojourn_percentile(stations: list[Station], probs: np.ndarray, qps: float, pct: float,
                       span_scale: float = 1.0) -> float:
    """The ``pct`` percentile (ms) of query sojourn through ``stations`` in series at ``qps``."""
    span = sum(s.span for s in stations) * span_scale
    if qps <= 0:
        return _quantile_discrete(span, probs, pct)
    p_wait, theta = 1.0, math.inf
    p_none = 1.0
    for s in stations:
        pw, th = s.wait_tail(qps)
        if th <= 0:
            return math.inf
        p_none *= 1.0 - pw
        theta = min(theta, th, 1e300)  # fused stations wait nothing beyond their span (inf)
    p_wait = 1.0 - p_none
    target = 1.0 - pct / 100.0

    def tail(x: float) -> float:
        y = x - span
        return float((probs * np.where(y < 0, 1.0, p_wait * np.exp(-theta * np.maximum(y, 0.0)))).sum())

    lo = float(span.min())
    hi = float(span.max()) + max(0.0, math.log(max(p_wait, 1e-300) / target)) / theta + 1e-9
    if tail(lo) <= target:
        return lo
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if tail(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-3 * hi:
            break
    return hi


def violation(stations: list[Station], probs: np.ndarray, qps: float, pct: float, target_ms: float,
              span_scale: float = 1.0) -> float:
    """P(sojourn > target) minus the allowed 1 − pct/100 at ``qps`` (≤ 0 means the SLA is met)."""
    span = sum(s.span for s in stations) * span_scale
    p_none, theta = 1.0, math.inf
    for s in stations:
        if qps <= 0:
            break
        pw, th = s.wait_tail(qps)
        if th <= 0:
            return pct / 100.0
        p_none *= 1.0 - pw
        theta = min(theta, th, 1e300)  # fused stations wait nothing beyond their span (inf)
    y = target_ms - span
    if qps <= 0:
        exceed = float(probs[y < 0].sum())
    else:
        exceed = float(probs @ np.where(y < 0, 1.0, (1.0 - p_none) * np.exp(-theta * np.maximum(y, 0.0))))
    return exceed - (1.0 - pct / 100.0)


def sla_met(stations: list[Station], probs: np.ndarray, qps: float, pct: float, target_ms: float,
            span_scale: float = 1.0) -> bool:
    """Whether the ``pct`` sojourn percentile at ``qps`` is within ``target_ms``."""
    return violation(stations, probs, qps, pct, target_ms, span_scale) <= 1e-12


def _quantile_discrete(values: np.ndarray, probs: np.ndarray, pct: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(probs[order])
    i = int(np.searchsorted(cum, pct / 100.0 - 1e-12))
    return float(values[order][min(i, len(values) - 1)])


def solve_max_load(at_rate: Callable[[float], list[Station] | None], probs: np.ndarray, pct: float,
                   target_ms: float, upper_qps: float, span_scale: float = 1.0, rel_tol: float = 2e-3) -> float:
    """Largest arrival rate (QPS) whose sojourn percentile meets ``target_ms``; 0 if none does.

    ``at_rate(qps)`` gives the stations at that rate (service times may depend on it through memory
    bandwidth) or None when the rate is infeasible outright.  The SLA violation is monotone in the
    rate, so the root is bracketed and found by the Illinois variant of regula falsi.
    """
    allowed = 1.0 - pct / 100.0

    def v(qps: float) -> float:
        st = at_rate(qps)
        return allowed if st is None else violation(st, probs, qps, pct, target_ms, span_scale)

    lo, hi = upper_qps * 1e-6, upper_qps
    f_lo, f_hi = v(lo), allowed
    if f_lo > 1e-12:
        return 0.0
    side = 0
    for _ in range(60):
        if hi - lo <= rel_tol * hi:
            break
        x = (lo * f_hi - hi * f_lo) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (lo + hi)
        x = min(max(x, lo + 0.02 * (hi - lo)), hi - 0.02 * (hi - lo))
        fx = v(x)
        if fx <= 1e-12:
            lo, f_lo = x, fx
            if side == -1:
                f_hi *= 0.5
            side = -1
        else:
            hi, f_hi = x, fx
            if side == 1:
                f_lo *= 0.5
            side = 1
    return lo
