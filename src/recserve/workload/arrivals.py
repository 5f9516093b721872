"""Query arrival times.

A Poisson process at ``qps`` has independent exponential gaps of mean ``1/qps`` seconds; that is what
recserve uses.  DeepRecSys-lineage load generators instead draw *integer* Poisson-distributed gaps in
milliseconds (``poisson(1000/qps)``): ``integer_ms=True`` reproduces that variant, whose gaps are far
less variable (variance = mean, in ms) than exponential ones (sd = mean) and which cannot go above
1000 QPS meaningfully (gaps of 0 ms).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.workload._common import RngLike, WorkloadError, as_rng
from recserve.workload.sizes import SizeDistribution, production


def poisson_gaps(qps: float, n: int, rng: RngLike = 0, integer_ms: bool = False) -> np.ndarray:
    """``n`` inter-arrival gaps in seconds."""
    if not qps > 0:
        raise WorkloadError(f"arrival rate must be positive, got {qps}")
    if n < 0:
        raise WorkloadError(f"number of arrivals must be >= 0, got {n}")
    rng = as_rng(rng)
    if integer_ms:
        return rng.poisson(1000.0 / qps, size=n).astype(np.float64) / 1000.0
    return rng.exponential(1.0 / qps, size=n)


def poisson_arrivals(qps: float, n: int | None = None, duration_s: float | None = None, rng: RngLike = 0,
                     integer_ms: bool = False) -> np.ndarray:
    """Arrival times (seconds from 0, the first after one gap) of ``n`` queries or of all queries within
    ``duration_s``; exactly one of the two must be given."""
    if (n is None) == (duration_s is None):
        raise WorkloadError("give exactly one of n or duration_s")
    rng = as_rng(rng)
    if n is not None:
        return np.cumsum(poisson_gaps(qps, n, rng, integer_ms))
    if duration_s is None or duration_s < 0:
        raise WorkloadError(f"duration must be >= 0 s, got {duration_s}")
    times: list[np.ndarray] = []
    t, chunk = 0.0, max(16, int(qps * duration_s * 1.1) + 16)
    while True:
        block = t + np.cumsum(poisson_gaps(qps, chunk, rng, integer_ms))
        times.append(block[block <= duration_s])
        if block[-1] > duration_s:
            return np.concatenate(times)
        t = float(block[-1])


def piecewise_poisson_arrivals(times_s: np.ndarray, qps: np.ndarray, rng: RngLike = 0) -> np.ndarray:
    """Arrivals of a Poisson process whose rate is ``qps[i]`` on ``[times_s[i], times_s[i+1])`` (the last step
    lasts as long as the one before it): how a diurnal trace becomes queries."""
    times_s, qps = np.asarray(times_s, dtype=float), np.asarray(qps, dtype=float)
    if times_s.ndim != 1 or times_s.shape != qps.shape or times_s.size == 0:
        raise WorkloadError("times and qps must be 1-D arrays of the same, non-zero length")
    if np.any(qps < 0) or np.any(np.diff(times_s) <= 0):
        raise WorkloadError("rates must be >= 0 and times strictly increasing")
    rng = as_rng(rng)
    step = np.diff(times_s, append=times_s[-1] + (times_s[-1] - times_s[-2] if times_s.size > 1 else 1.0))
    out = []
    for start, length, rate in zip(times_s, step, qps, strict=True):
        count = rng.poisson(rate * length)  # Poisson count, then uniform order statistics = Poisson process
        out.append(np.sort(start + rng.uniform(0.0, length, size=count)))
    return np.concatenate(out)


@dataclass
class QueryTrace:
    """A reproducible stream of queries: arrival times (s) and sizes (items)."""

    arrival_s: np.ndarray
    sizes: np.ndarray

    def save(self, path: str | Path) -> Path:
        """``.npz`` (arrays) or ``.csv`` (``arrival_s,size`` per line)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".npz":
            np.savez(path, arrival_s=self.arrival_s, sizes=self.sizes)
        else:
            lines = ["arrival_s,size"] + [f"{t:.9f},{int(s)}" for t, s in zip(self.arrival_s, self.sizes, strict=True)]
            path.write_text("\n".join(lines) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> QueryTrace:
        path = Path(path)
        if not path.exists():
            raise WorkloadError(f"{path}: no such file")
        try:
            if path.suffix == ".npz":
                with np.load(path) as data:
                    return cls(data["arrival_s"], data["sizes"].astype(np.int64))
            data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
            return cls(data[:, 0], data[:, 1].astype(np.int64))
        except (KeyError, ValueError, IndexError, OSError) as exc:
            raise WorkloadError(f"{path}: not a query trace ({exc})") from None


def query_trace(qps: float, n: int, sizes: SizeDistribution | None = None, seed: int = 0,
                integer_ms: bool = False) -> QueryTrace:
    """``n`` Poisson arrivals at ``qps`` with sizes from ``sizes`` (production mix by default).  Arrivals and
    sizes use separate streams spawned from ``seed``, so changing the rate keeps the same sizes."""
    arrival_rng, size_rng = np.random.default_rng(seed).spawn(2)
    dist = sizes or production()
    return QueryTrace(poisson_arrivals(qps, n=n, rng=arrival_rng, integer_ms=integer_ms), dist.sample(n, size_rng))
