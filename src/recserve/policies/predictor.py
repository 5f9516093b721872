"""Online query-latency predictor used by the dispatch policies (Kairos Sec. 5.1, "Remarks").

Kairos needs the latency of a query of batch size ``b`` on an instance of type ``t`` to build its
cost matrix.  Inference latency is close to linear in batch size, so the predictor starts with a
per-type least-squares line fitted to the first completions it observes and, once a batch bucket
has been seen ``min_samples`` times, switches that bucket to the observed mean (a lookup table).
No prior knowledge is required; an optional prior (e.g. a measured Profile table, see
:func:`prior_from_profiles`) replaces the line for the buckets not yet learned.

Predictions live in one dense array ``pred[type, bucket]`` so a policy can build a whole cost
matrix with one fancy-indexing operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from recserve.profiles import ProfileSet

DEFAULT_BUCKET_STEP = 10  # batch sizes are rounded up to a multiple of this (Kairos' production mix does)


def default_buckets(max_batch: int = 1000, step: int = DEFAULT_BUCKET_STEP) -> np.ndarray:
    return np.arange(step, max_batch + step, step, dtype=float)


class LatencyPredictor:
    """Mean latency (ms) per (instance type, batch bucket), learned online from completions."""

    def __init__(self, types: Sequence[str], buckets: np.ndarray | None = None, min_samples: int = 3,
                 prior: dict[str, np.ndarray] | None = None, refit_every: int = 128) -> None:
        self.types = list(types)
        self.buckets = default_buckets() if buckets is None else np.asarray(buckets, dtype=float)
        self.step = float(self.buckets[1] - self.buckets[0]) if len(self.buckets) > 1 else float(self.buckets[0])
        self.min_samples = int(min_samples)
        self.refit_every = int(refit_every)
        shape = (len(self.types), len(self.buckets))
        self.pred = np.zeros(shape)
        # plain Python lists: observe() runs once per simulated query and numpy scalars are slow
        self._x = self.buckets.tolist()
        self._sum = [[0.0] * shape[1] for _ in range(shape[0])]
        self._count = [[0] * shape[1] for _ in range(shape[0])]
        # per-type sufficient statistics of the linear fit: n, sum x, sum y, sum xy, sum xx
        self._lin = [[0.0] * 5 for _ in range(shape[0])]
        self._since_refit = [0] * shape[0]
        # a prior (e.g. measured latency_vs_batch) stays the prediction of every bucket not yet seen
        # ``min_samples`` times: a greedy policy only observes the type it believes fastest, so a line
        # fitted to its first few completions could lock in a wrong belief about the other types
        self.prior: dict[int, np.ndarray] = {}
        if prior:
            for name, row in prior.items():
                if name not in self.types:
                    continue
                row = np.asarray(row, dtype=float)
                if row.shape != self.buckets.shape:
                    raise ValueError(f"prior for {name!r} has {row.size} values for {self.buckets.size} buckets")
                self.prior[self.types.index(name)] = row
                self.pred[self.types.index(name)] = row
        self.rows = self.pred.tolist()  # list mirror of ``pred`` for fast scalar lookups

    # ------------------------------------------------------------ lookups
    def bucket(self, batch: int) -> int:
        """Index of the bucket a batch size falls into (rounded up, clamped to the table)."""
        i = int(-(-batch // self.step)) - 1
        return 0 if i < 0 else min(i, len(self.buckets) - 1)

    def predict(self, type_idx: int, bucket: int) -> float:
        return self.rows[type_idx][bucket]

    def learned(self, type_idx: int) -> bool:
        """True once the type has enough observations for a linear fit."""
        return self._lin[type_idx][0] >= 2

    def coefficients(self) -> np.ndarray:
        """Kairos heterogeneity coefficients C_j in (0, 1]: latency of the largest query on the fastest type
        divided by its latency on type j (Definition 1).  Unlearned types get 1."""
        largest = [row[-1] for row in self.rows]  # the list mirror: a policy asks once per decision
        known = [x for x in largest if x > 0]
        if not known:
            return np.ones(len(self.types))
        base = min(known)
        return np.array([base / x if x > 0 else 1.0 for x in largest])

    # ------------------------------------------------------------ learning
    def observe(self, type_idx: int, bucket: int, latency_ms: float) -> None:
        sums, counts = self._sum[type_idx], self._count[type_idx]
        sums[bucket] += latency_ms
        counts[bucket] += 1
        x = self._x[bucket]
        lin = self._lin[type_idx]
        lin[0] += 1.0
        lin[1] += x
        lin[2] += latency_ms
        lin[3] += x * latency_ms
        lin[4] += x * x
        if counts[bucket] >= self.min_samples:
            value = sums[bucket] / counts[bucket]
            self.pred[type_idx, bucket] = value
            self.rows[type_idx][bucket] = value
        self._since_refit[type_idx] += 1
        # refit the linear part at every observation while it matters (few samples), rarely afterwards
        if lin[0] <= 32 or self._since_refit[type_idx] >= self.refit_every:
            self._refit(type_idx)

    def _refit(self, type_idx: int) -> None:
        self._since_refit[type_idx] = 0
        if type_idx in self.prior:  # unseen buckets keep the prior; seen ones are set by observe()
            return
        n, sx, sy, sxy, sxx = self._lin[type_idx]
        var = n * sxx - sx * sx
        if n >= 2 and var > 1e-9:
            slope = max((n * sxy - sx * sy) / var, 0.0)
            intercept = (sy - slope * sx) / n
        elif n >= 1:  # one distinct batch size seen: proportional model through the origin
            slope, intercept = sy / sx, 0.0
        else:
            return
        line = np.maximum(intercept + slope * self.buckets, 1e-3)
        table = np.array(self._count[type_idx]) >= self.min_samples
        self.pred[type_idx] = np.where(table, self.pred[type_idx], line)
        self.rows[type_idx] = self.pred[type_idx].tolist()

    def table_fraction(self) -> float:
        """Fraction of (type, bucket) cells served from the lookup table rather than the line."""
        return float((np.array(self._count) >= self.min_samples).mean())


def prior_from_profiles(profiles: ProfileSet, model: str, types: Sequence[str],
                        buckets: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Mean latency per bucket of each type that has a ``latency_vs_batch`` table for ``model`` (the
    table's server name is the type name), interpolated linearly and extrapolated along the last segment."""
    grid = default_buckets() if buckets is None else np.asarray(buckets, dtype=float)
    out = {}
    for table in profiles.find(model=model, kind="latency_vs_batch"):
        if table.server not in types:
            continue
        b, mean = np.asarray(table.column("batch"), float), np.asarray(table.column("mean_ms"), float)
        row = np.interp(grid, b, mean)
        if len(b) > 1:
            slope = (mean[-1] - mean[-2]) / max(b[-1] - b[-2], 1e-9)
            row = np.where(grid > b[-1], mean[-1] + slope * (grid - b[-1]), row)
        out[table.server] = np.maximum(row, 1e-3)
    return out
