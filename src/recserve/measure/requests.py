"""What the load generator sends: Poisson arrival times, query sizes, and a pre-built request pool.

Requests are built before the run (never on the hot path).  A run of thousands of queries cycles
through a *pool* of distinct queries whose sizes are the quantiles of the size mix, so choosing pool
entries uniformly at random reproduces the mix's distribution without holding thousands of tensors.
The pool is a small recipe (spec, scale, sizes, seed, index skew) that any process can materialise
identically, so in-process worker processes receive only an index per request.  Size mixes, arrival
gaps and index skew come from ``recserve.workload``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from recserve import workload
from recserve.errors import RecserveError
from recserve.specs import ModelSpec
from recserve.zoo.batch import QueryBatch, random_batch


def poisson_gaps(rate: float, n: int, rng: np.random.Generator | int = 0, integer_ms: bool = False) -> np.ndarray:
    """``n`` exponential inter-arrival gaps (seconds) of a Poisson process at ``rate`` per second
    (``integer_ms``: DeepRecSys' integer-millisecond Poisson gaps instead)."""
    return workload.poisson_gaps(rate, n, rng, integer_ms=integer_ms)


def arrival_times(rate: float, duration_s: float | None, max_requests: int | None,
                  rng: np.random.Generator | int = 0, integer_ms: bool = False) -> np.ndarray:
    """Scheduled send times (seconds from the start), bounded by duration and by count."""
    if duration_s is None and max_requests is None:
        raise RecserveError("a load run needs a duration or a request count (or both)")
    limit = max_requests if max_requests is not None else int(rate * duration_s * 1.5 + 100)
    times = np.cumsum(poisson_gaps(rate, limit, rng, integer_ms))
    if duration_s is not None:
        times = times[times < duration_s]
    return times


def sample_sizes(mix: str, n: int, rng: np.random.Generator | int = 0) -> np.ndarray:
    """``n`` query sizes from a ``recserve.workload`` size distribution (``production``, ``fixed:64``,
    ``lognormal:mu=5.1,sigma=0.2``, ``normal:mean=256,sd=32``, ``file:PATH``)."""
    return workload.size_distribution(mix).sample(n, rng)


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
    index: str = "uniform"
    _cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_mix(cls, spec: ModelSpec, scale: float, mix: str = "production", pool: int = 32,
                 seed: int = 0, index: str = "uniform") -> RequestPool:
        workload.index_sampler(index)  # fail early on a bad spec
        return cls(spec, scale, pool_sizes(mix, pool, seed), seed, index)

    def recipe(self) -> RequestPool:
        """The same pool without its built tensors (what is sent to worker processes)."""
        return RequestPool(self.spec, self.scale, self.sizes, self.seed, self.index)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        return self.spec.scaled_rows(self.scale)

    def batch(self, i: int) -> QueryBatch:
        if i not in self._cache:
            spec = self.spec
            self._cache[i] = random_batch(
                spec.dense_in, self.rows, tuple(t.pooling for t in spec.tables), self.sizes[i],
                np.random.default_rng([self.seed, i]), sampler=workload.index_sampler(self.index),
                fixed=tuple(t.kind == "sequence" for t in spec.tables),
            )
        return self._cache[i]

    def batches(self) -> list[QueryBatch]:
        return [self.batch(i) for i in range(len(self.sizes))]

    @property
    def mean_size(self) -> float:
        return float(np.mean(self.sizes))

    def __len__(self) -> int:
        return len(self.sizes)
