"""What the load generator sends: Poisson arrival times, query sizes, and a pre-built request pool.

Requests are built before the run (never on the hot path).  A run of thousands of queries cycles
through a *pool* of distinct queries whose sizes are the quantiles of the size mix, so choosing pool
entries uniformly at random reproduces the mix's distribution without holding thousands of tensors.
The pool is a small recipe (spec, scale, sizes, seed) that any process can materialise identically,
so in-process worker processes receive only an index per request.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from recserve.errors import RecserveError
from recserve.specs import ModelSpec
from recserve.zoo.batch import QueryBatch, random_batch

MAX_QUERY_SIZE = 1024


def poisson_gaps(rate: float, n: int, rng: np.random.Generator | int = 0) -> np.ndarray:
    """``n`` exponential inter-arrival gaps (seconds) of a Poisson process at ``rate`` per second."""
    if rate <= 0:
        raise RecserveError(f"arrival rate must be > 0 queries/s, got {rate}")
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    return rng.exponential(1.0 / rate, size=n)


def arrival_times(rate: float, duration_s: float | None, max_requests: int | None,
                  rng: np.random.Generator | int = 0) -> np.ndarray:
    """Scheduled send times (seconds from the start), bounded by duration and by count."""
    if duration_s is None and max_requests is None:
        raise RecserveError("a load run needs a duration or a request count (or both)")
    limit = max_requests if max_requests is not None else int(rate * duration_s * 1.5 + 100)
    times = np.cumsum(poisson_gaps(rate, limit, rng))
    if duration_s is not None:
        times = times[times < duration_s]
    return times


def kairos_production_sizes(n: int, rng: np.random.Generator | int = 0) -> np.ndarray:
    """Kairos' production-like mix replaying DeepRecSys (see shared/reference/README.md).

    Fallback used until ``recserve.workload`` provides the mix; the definition is the public code's.
    """
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    r = rng.integers(1, 100, size=n)
    out = rng.lognormal(5.1, 0.2, size=n)
    bad = (out < 100) | (out > 200)
    out[bad] = rng.integers(190, 200, size=int(bad.sum()))
    small, mid, big = r <= 8, (r > 8) & (r <= 30), (r > 30) & (r <= 35)
    out[small] = rng.integers(1, 100, size=int(small.sum()))
    out[mid] = rng.integers(200, 600, size=int(mid.sum()))
    out[big] = rng.integers(600, 1000, size=int(big.sum()))
    return (np.ceil(out / 10.0) * 10).astype(np.int64).clip(1, MAX_QUERY_SIZE)


def _workload_sampler(mix: str):
    """The workload package's size sampler for ``mix`` if it exists yet, else ``None``."""
    try:
        module = importlib.import_module("recserve.workload.sizes")
    except ImportError:
        return None
    for name in ("sample_sizes", "query_sizes", "sample"):
        fn = getattr(module, name, None)
        if callable(fn):
            return lambda n, rng: np.asarray(fn(mix, n, rng), dtype=np.int64)
    return None


def sample_sizes(mix: str, n: int, rng: np.random.Generator | int = 0) -> np.ndarray:
    """``n`` query sizes from a named mix: ``production``, ``fixed:N``, ``uniform:A-B`` or ``lognormal:MU,SIGMA``."""
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    kind, _, arg = mix.partition(":")
    try:
        if kind == "fixed":
            return np.full(n, int(arg), dtype=np.int64)
        if kind == "uniform":
            lo, hi = (int(x) for x in arg.split("-"))
            return rng.integers(lo, hi + 1, size=n)
        if kind == "lognormal":
            mu, sigma = (float(x) for x in arg.split(","))
            return np.round(rng.lognormal(mu, sigma, size=n)).astype(np.int64).clip(1, MAX_QUERY_SIZE)
    except ValueError as exc:
        raise RecserveError(f"bad query-size mix {mix!r}: {exc}") from exc
    external = _workload_sampler(mix)
    if external is not None:
        return external(n, rng)
    if kind == "production":
        return kairos_production_sizes(n, rng)
    raise RecserveError(f"unknown query-size mix {mix!r}; use production, fixed:N, uniform:A-B or lognormal:MU,SIGMA")


def pool_sizes(mix: str, pool: int, seed: int = 0, sample: int = 20000) -> tuple[int, ...]:
    """``pool`` sizes at evenly spaced quantiles of the mix (a faithful small stand-in for it)."""
    draws = np.sort(sample_sizes(mix, sample, seed))
    q = (np.arange(pool) + 0.5) / pool
    return tuple(int(x) for x in np.quantile(draws, q, method="nearest"))


@dataclass(frozen=True)
class RequestPool:
    """A deterministic set of queries for one model: rebuilding it anywhere gives the same tensors."""

    spec: ModelSpec
    scale: float
    sizes: tuple[int, ...]
    seed: int = 0
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_mix(cls, spec: ModelSpec, scale: float, mix: str = "production", pool: int = 32,
                 seed: int = 0) -> RequestPool:
        return cls(spec, scale, pool_sizes(mix, pool, seed), seed)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        return self.spec.scaled_rows(self.scale)

    def batch(self, i: int) -> QueryBatch:
        if i not in self._cache:
            spec = self.spec
            self._cache[i] = random_batch(
                spec.dense_in, self.rows, tuple(t.pooling for t in spec.tables), self.sizes[i],
                np.random.default_rng([self.seed, i]), fixed=tuple(t.kind == "sequence" for t in spec.tables),
            )
        return self._cache[i]

    def batches(self) -> list[QueryBatch]:
        return [self.batch(i) for i in range(len(self.sizes))]

    @property
    def mean_size(self) -> float:
        return float(np.mean(self.sizes))

    def __len__(self) -> int:
        return len(self.sizes)
