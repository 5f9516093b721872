"""Embedding-index generators with controlled skew.

Every sampler is a callable ``(rows, n, rng) -> int64 array`` in ``[0, rows)``, the ``IndexSampler``
signature that ``zoo.sample_batch(model, B, rng, sampler=...)`` takes.

- :class:`LocalitySampler` — ElasticRec's locality metric: a share ``p`` of all lookups hits the hottest
  ``hot_fraction`` (10%) of rows, uniformly within the hot set and within the cold set.
- :class:`ZipfSampler` — Zipf(alpha) popularity over row ranks, P(rank k) ∝ k^-alpha, k = 1..rows.

Which rows are hot: ``hot="scattered"`` (default) places popularity rank ``k`` at row
``(a·k + b) mod rows`` with ``a`` coprime to ``rows`` drawn from ``perm_seed`` — a fixed pseudo-random
permutation that needs no memory (tables have up to 10^9 rows) and is identical on every call, so hot rows
stay hot across queries and are spread over the table like real ids (no spatial locality).  ``hot="first"``
makes row ``k`` the rank-``k`` row (the hot set is rows ``0 … hot_rows-1``), as after ElasticRec's hotness
sort.  :meth:`rank_to_row` / :meth:`row_rank` expose the true popularity order.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from recserve.workload._common import WorkloadError, as_float, parse_spec

HOT_FRACTION = 0.10
HOT_LAYOUTS = ("scattered", "first")


@lru_cache(maxsize=256)
def _affine(rows: int, perm_seed: int) -> tuple[int, int, int]:
    """(a, b, a^-1 mod rows) of the permutation rank → (a·rank + b) mod rows."""
    if rows == 1:
        return 1, 0, 1
    rng = np.random.default_rng([perm_seed, rows])
    while True:
        a = int(rng.integers(1, rows))
        if math.gcd(a, rows) == 1:
            break
    b = int(rng.integers(0, rows))
    return a, b, pow(a, -1, rows)


@dataclass(frozen=True)
class _RankedSampler:
    hot: str = "scattered"
    perm_seed: int = 0

    def __post_init__(self) -> None:
        if self.hot not in HOT_LAYOUTS:
            raise WorkloadError(f"hot rows must be one of {HOT_LAYOUTS}, got {self.hot!r}")

    def rank_to_row(self, ranks: np.ndarray, rows: int) -> np.ndarray:
        """Row id of each popularity rank (0 = hottest)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if self.hot == "first":
            return ranks
        a, b, _ = _affine(rows, self.perm_seed)
        return _mulmod(ranks, a, b, rows)

    def row_rank(self, row_ids: np.ndarray, rows: int) -> np.ndarray:
        """Popularity rank of each row id (inverse of :meth:`rank_to_row`)."""
        row_ids = np.asarray(row_ids, dtype=np.int64)
        if self.hot == "first":
            return row_ids
        a, b, a_inv = _affine(rows, self.perm_seed)
        return _mulmod((row_ids - b) % rows, a_inv, 0, rows)

    def ranks(self, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
        if rows < 1 or n < 0:
            raise WorkloadError(f"need rows >= 1 and n >= 0, got rows={rows}, n={n}")
        return self.rank_to_row(self.ranks(int(rows), int(n), rng), int(rows))


def _mulmod(x: np.ndarray, a: int, b: int, m: int) -> np.ndarray:
    """(a·x + b) mod m without int64 overflow (exact for m < 2^62)."""
    if m < 2**31 and a < 2**31:
        return (x * a + b) % m
    return np.array([(int(v) * a + b) % m for v in x.tolist()], dtype=np.int64)


def hot_rows(rows: int, hot_fraction: float = HOT_FRACTION) -> int:
    """Size of the hot set: ``hot_fraction`` of the rows, at least 1."""
    return min(rows, max(1, int(round(rows * hot_fraction))))


@dataclass(frozen=True)
class LocalitySampler(_RankedSampler):
    """A share ``p`` of lookups goes to the hottest ``hot_fraction`` of rows (uniform inside each set)."""

    p: float = 0.9
    hot_fraction: float = HOT_FRACTION

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.p <= 1.0:
            raise WorkloadError(f"locality p must be in [0, 1], got {self.p}")
        if not 0.0 < self.hot_fraction < 1.0:
            raise WorkloadError(f"hot fraction must be in (0, 1), got {self.hot_fraction}")

    def ranks(self, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
        h = hot_rows(rows, self.hot_fraction)
        if h >= rows:
            return rng.integers(0, rows, size=n, dtype=np.int64)
        is_hot = rng.random(n) < self.p
        out = rng.integers(h, rows, size=n, dtype=np.int64)
        out[is_hot] = rng.integers(0, h, size=int(is_hot.sum()), dtype=np.int64)
        return out


@dataclass(frozen=True)
class ZipfSampler(_RankedSampler):
    """Bounded Zipf over ranks 1..rows: P(k) ∝ k^-alpha (alpha >= 0; 0 is uniform).

    The first ``head`` ranks are sampled from their exact pmf; beyond them the continuous approximation
    ∫ x^-alpha over [k-½, k+½] is accurate to well under 0.1% and needs O(1) memory for any ``rows``.
    """

    alpha: float = 1.0
    head: int = field(default=100_000, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.alpha >= 0:
            raise WorkloadError(f"zipf alpha must be >= 0, got {self.alpha}")

    def ranks(self, rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
        head_cdf, head_mass, tail_mass = _zipf_parts(rows, self.alpha, self.head)
        u = rng.random(n) * (head_mass + tail_mass)
        in_head = u < head_mass
        out = np.empty(n, dtype=np.int64)
        out[in_head] = np.searchsorted(head_cdf, u[in_head], side="right")
        if not in_head.all():
            h = len(head_cdf)
            v = (u[~in_head] - head_mass) / tail_mass  # uniform in [0, 1) over the tail
            x = _power_inverse(v, h + 0.5, rows + 0.5, self.alpha)  # continuous rank in [h+½, rows+½)
            out[~in_head] = np.clip(np.floor(x + 0.5).astype(np.int64) - 1, h, rows - 1)
        return out


def _power_integral(lo: float, hi: float, alpha: float) -> float:
    if abs(alpha - 1.0) < 1e-12:
        return math.log(hi / lo)
    return (hi ** (1 - alpha) - lo ** (1 - alpha)) / (1 - alpha)


def _power_inverse(v: np.ndarray, lo: float, hi: float, alpha: float) -> np.ndarray:
    """x with ∫_lo^x t^-alpha dt = v · ∫_lo^hi t^-alpha dt."""
    if abs(alpha - 1.0) < 1e-12:
        return lo * np.exp(v * math.log(hi / lo))
    a, b = lo ** (1 - alpha), hi ** (1 - alpha)
    return (a + v * (b - a)) ** (1 / (1 - alpha))


@lru_cache(maxsize=64)
def _zipf_parts(rows: int, alpha: float, head: int) -> tuple[np.ndarray, float, float]:
    h = min(rows, head)
    weights = np.arange(1, h + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(weights)
    tail = _power_integral(h + 0.5, rows + 0.5, alpha) if rows > h else 0.0
    return cdf, float(cdf[-1]), tail


def zipf_locality(alpha: float, rows: int, hot_fraction: float = HOT_FRACTION) -> float:
    """The locality P of Zipf(alpha) over ``rows``: the share of lookups the hottest ``hot_fraction`` get."""
    cdf, head_mass, tail_mass = _zipf_parts(rows, alpha, 100_000)
    k = hot_rows(rows, hot_fraction)
    if k <= len(cdf):
        hot = float(cdf[k - 1])
    else:
        hot = head_mass + _power_integral(len(cdf) + 0.5, k + 0.5, alpha)
    return hot / (head_mass + tail_mass)


def zipf_rank_cdf(rows: int, alpha: float) -> np.ndarray:
    """CDF over popularity ranks of the bounded Zipf that :class:`ZipfSampler` draws: ``cdf[x]`` = share of
    lookups to the ``x`` hottest rows (``cdf[0] = 0``, ``cdf[rows] = 1``), exact over the sampler's head and
    its continuous tail beyond — so a planner sees the same skew the live sampler produces."""
    return zipf_rank_cdf_at(rows, alpha)(np.arange(rows + 1))


def zipf_rank_cdf_at(rows: int, alpha: float) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`zipf_rank_cdf` as a function of the ranks asked for (no array of ``rows`` entries)."""
    head_cdf, head_mass, tail_mass = _zipf_parts(rows, alpha, 100_000)
    h, total = len(head_cdf), head_mass + tail_mass
    head0, lo = np.concatenate([[0.0], head_cdf]), h + 0.5

    def at(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        head = head0[np.clip(x, 0, h)]
        ranks = np.maximum(x, h + 1).astype(np.float64) + 0.5
        if abs(alpha - 1.0) < 1e-12:
            tail = np.log(ranks / lo)
        else:
            tail = (ranks ** (1 - alpha) - lo ** (1 - alpha)) / (1 - alpha)
        out = np.where(x <= h, head, head_mass + tail) / total
        return np.where(x >= rows, 1.0, out)

    return at


def zipf_alpha_for_locality(p: float, rows: int, hot_fraction: float = HOT_FRACTION) -> float:
    """The Zipf alpha whose locality over ``rows`` is ``p`` (bisection; locality grows with alpha)."""
    if not hot_fraction < p < 1:
        raise WorkloadError(f"a Zipf locality must be in ({hot_fraction}, 1), got {p}")
    lo, hi = 0.0, 8.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if zipf_locality(mid, rows, hot_fraction) < p else (lo, mid)
    return (lo + hi) / 2


def measure_locality(indices: np.ndarray, rows: int, hot_fraction: float = HOT_FRACTION) -> float:
    """Share of ``indices`` that hit the ``hot_fraction`` most-accessed rows, ranked by observed counts.

    This is how ElasticRec defines P.  It needs many more lookups than rows to be unbiased: with few
    lookups per row, the observed top-10% includes cold rows that happened to be drawn.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size == 0:
        raise WorkloadError("no lookups to measure")
    if indices.min() < 0 or indices.max() >= rows:
        raise WorkloadError(f"indices out of range [0, {rows})")
    _, counts = np.unique(indices, return_counts=True)
    counts = np.sort(counts)[::-1]
    return float(counts[: hot_rows(rows, hot_fraction)].sum() / indices.size)


def uniform(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, rows, size=n, dtype=np.int64)


INDEX_SAMPLERS = ("uniform", "locality", "zipf")


def index_sampler(spec: str, **overrides: object):
    """A sampler by spec: ``"uniform"``, ``"locality:p=0.9"`` (also ``hot_fraction``, ``hot``, ``seed``),
    ``"zipf:alpha=1.05"`` (also ``hot``, ``seed``); ``overrides`` replace parameters in the string."""
    name, params = parse_spec(spec)
    params = {**params, **{k: str(v) for k, v in overrides.items()}}
    if name == "uniform":  # every row equally likely: layout and seed do not matter
        _only(name, {k: v for k, v in params.items() if k not in ("hot", "seed")}, ())
        return uniform
    common = {"hot": params.pop("hot", "scattered"), "perm_seed": int(as_float(params, "seed", 0, where=name))}
    params.pop("seed", None)
    if name == "locality":
        if "" in params:
            params["p"] = params.pop("")
        _only(name, params, ("p", "hot_fraction"))
        return LocalitySampler(p=as_float(params, "p", where=name),
                               hot_fraction=as_float(params, "hot_fraction", HOT_FRACTION, where=name), **common)
    if name == "zipf":
        if "" in params:
            params["alpha"] = params.pop("")
        _only(name, params, ("alpha",))
        return ZipfSampler(alpha=as_float(params, "alpha", where=name), **common)
    raise WorkloadError(f"unknown index sampler {name!r}; known: {', '.join(INDEX_SAMPLERS)}")


def _only(name: str, params: dict, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise WorkloadError(f"{name}: unknown parameter(s) {unknown}; allowed: {[*allowed, 'hot', 'seed']}")
