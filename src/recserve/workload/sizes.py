"""Query-size distributions: how many candidate items (the batch size) each query carries.

Registry names (``size_distribution("lognormal:mu=5.1,sigma=0.2")``):

- ``production`` — the Kairos/DeepRecSys production-like mix (reference/README.md): r uniform in 1..99;
  r<=8: uniform 1..99; 8<r<=30: uniform 200..599; 30<r<=35: uniform 600..999; otherwise a lognormal(5.1, 0.2)
  draw, replaced by uniform 190..199 if outside [100, 200]; rounded up to a multiple of 10.
- ``lognormal`` (mu, sigma) and ``normal`` (mean, sd): DeepRecSys' load-generator shapes, rounded to integers
  and clipped to [lo, hi] = [1, 1024].
- ``fixed`` (size) — every query the same size.
- ``file:PATH`` — the empirical distribution of sizes in a file (one per line, or a ``.npy`` array),
  sampled with replacement.

Every sampler takes ``(n, rng)`` and returns ``int64`` sizes; the same seed gives the same sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recserve.workload._common import RngLike, WorkloadError, as_float, as_rng, parse_spec

MIN_SIZE, MAX_SIZE = 1, 1024


@dataclass(frozen=True)
class SizeDistribution:
    """A named, parameterised sampler of query sizes."""

    name: str
    params: dict[str, float | str] = field(default_factory=dict)
    draw: Callable[[int, np.random.Generator], np.ndarray] | None = field(default=None, compare=False, repr=False)

    def sample(self, n: int, rng: RngLike = 0) -> np.ndarray:
        if n < 0:
            raise WorkloadError(f"number of queries must be >= 0, got {n}")
        assert self.draw is not None
        return np.asarray(self.draw(int(n), as_rng(rng)), dtype=np.int64)

    def describe(self) -> str:
        if self.name == "file":
            return f"file:{self.params['path']}"
        args = ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.params.items())
        return f"{self.name}:{args}" if args else self.name


# ----------------------------------------------------------------- production-like mix


def _production(n: int, rng: np.random.Generator) -> np.ndarray:
    r = rng.integers(1, 100, size=n)  # 1..99
    out = np.empty(n, dtype=np.float64)
    small, mid, large = r <= 8, (r > 8) & (r <= 30), (r > 30) & (r <= 35)
    rest = r > 35
    out[small] = rng.integers(1, 100, size=int(small.sum()))
    out[mid] = rng.integers(200, 600, size=int(mid.sum()))
    out[large] = rng.integers(600, 1000, size=int(large.sum()))
    logn = rng.lognormal(5.1, 0.2, size=int(rest.sum()))
    outside = (logn < 100) | (logn > 200)
    logn[outside] = rng.integers(190, 200, size=int(outside.sum()))
    out[rest] = logn
    return (np.ceil(out / 10.0) * 10).astype(np.int64)


def production_query_sizes(n: int = 20000, seed: RngLike = 0) -> np.ndarray:
    """``n`` sizes from the production-like mix (mean ≈ 244, median ≈ 180, p90 ≈ 520, p99 ≈ 920)."""
    return _production(int(n), as_rng(seed))


def _lognormal_cdf(x: float, mu: float, sigma: float) -> float:
    return 0.0 if x <= 0 else 0.5 * (1.0 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2.0))))


def production_size_pmf(max_size: int = 1000, step: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The production-like mix as an exact pmf over ``step, 2·step, …, max_size`` (mass above ``max_size``
    lands in the last bin).  Lets planners use the mix without sampling noise."""
    if step <= 0 or max_size < step:
        raise WorkloadError(f"need 0 < step <= max_size, got step={step}, max_size={max_size}")
    sizes = np.arange(step, max_size + 1, step)
    pmf = np.zeros(len(sizes))

    def bin_of(values: np.ndarray) -> np.ndarray:
        return np.clip(np.ceil(values / step).astype(int) - 1, 0, len(sizes) - 1)

    def uniform(lo: int, hi: int, weight: float) -> None:
        xs = np.arange(lo, hi + 1, dtype=float)
        np.add.at(pmf, bin_of(np.ceil(xs / 10.0) * 10), weight / len(xs))

    uniform(1, 99, 8 / 99)
    uniform(200, 599, 22 / 99)
    uniform(600, 999, 5 / 99)
    weight, mu, sigma = 64 / 99, 5.1, 0.2
    inside = _lognormal_cdf(200, mu, sigma) - _lognormal_cdf(100, mu, sigma)
    for upper in range(110, 201, 10):  # values in (upper-10, upper] round up to `upper`
        mass = _lognormal_cdf(upper, mu, sigma) - _lognormal_cdf(upper - 10, mu, sigma)
        pmf[bin_of(np.array([float(upper)]))[0]] += weight * mass
    uniform(190, 199, weight * (1.0 - inside))
    return sizes, pmf / pmf.sum()


# ----------------------------------------------------------------- parametric shapes


def _clip_round(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.clip(np.rint(values), lo, hi).astype(np.int64)


def _bounds(params: dict, where: str) -> tuple[float, float]:
    lo = as_float(params, "lo", MIN_SIZE, where=where)
    hi = as_float(params, "hi", MAX_SIZE, where=where)
    if not 1 <= lo <= hi:
        raise WorkloadError(f"{where}: need 1 <= lo <= hi, got lo={lo:g}, hi={hi:g}")
    return lo, hi


def lognormal(mu: float = 5.1, sigma: float = 0.2, lo: float = MIN_SIZE, hi: float = MAX_SIZE) -> SizeDistribution:
    if sigma < 0:
        raise WorkloadError(f"lognormal: sigma must be >= 0, got {sigma:g}")
    lo, hi = _bounds({"lo": lo, "hi": hi}, "lognormal")
    return SizeDistribution("lognormal", {"mu": mu, "sigma": sigma, "lo": lo, "hi": hi},
                            lambda n, rng: _clip_round(rng.lognormal(mu, sigma, n), lo, hi))


def normal(mean: float = 165.0, sd: float = 16.0, lo: float = MIN_SIZE, hi: float = MAX_SIZE) -> SizeDistribution:
    if sd < 0:
        raise WorkloadError(f"normal: sd must be >= 0, got {sd:g}")
    lo, hi = _bounds({"lo": lo, "hi": hi}, "normal")
    if not lo <= mean <= hi:  # else nearly every draw is clipped to a bound: a fixed size in disguise
        raise WorkloadError(f"normal: mean must be within [lo, hi] = [{lo:g}, {hi:g}] items, got {mean:g}")
    return SizeDistribution("normal", {"mean": mean, "sd": sd, "lo": lo, "hi": hi},
                            lambda n, rng: _clip_round(rng.normal(mean, sd, n), lo, hi))


def fixed(size: int) -> SizeDistribution:
    if size < 1 or int(size) != size:
        raise WorkloadError(f"fixed: size must be a positive integer, got {size}")
    return SizeDistribution("fixed", {"size": int(size)}, lambda n, rng: np.full(n, int(size), dtype=np.int64))


def production() -> SizeDistribution:
    return SizeDistribution("production", {}, _production)


# ----------------------------------------------------------------- files


def load_sizes(path: str | Path) -> np.ndarray:
    """Sizes from a ``.npy`` array or a text file with one integer per line (blank lines and ``#`` ignored)."""
    path = Path(path)
    if not path.exists():
        raise WorkloadError(f"{path}: no such file")
    try:
        if path.suffix == ".npy":
            values = np.load(path, allow_pickle=False).ravel()
        else:
            lines = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
            values = np.array([float(x) for x in lines if x])
    except (ValueError, OSError) as exc:
        raise WorkloadError(f"{path}: not a list of query sizes ({exc})") from None
    if values.size == 0:
        raise WorkloadError(f"{path}: holds no query sizes")
    if not np.all(np.isfinite(values)) or np.any(values < 1) or np.any(values != np.round(values)):
        raise WorkloadError(f"{path}: query sizes must be positive integers")
    return values.astype(np.int64)


def save_sizes(path: str | Path, sizes: np.ndarray) -> Path:
    """``.npy`` keeps the array; anything else is written one size per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sizes = np.asarray(sizes, dtype=np.int64)
    if path.suffix == ".npy":
        np.save(path, sizes)
    else:
        path.write_text("".join(f"{int(s)}\n" for s in sizes))
    return path


def from_file(path: str | Path) -> SizeDistribution:
    values = load_sizes(path)
    return SizeDistribution("file", {"path": str(path)}, lambda n, rng: rng.choice(values, size=n, replace=True))


# ----------------------------------------------------------------- registry

_FACTORIES: dict[str, tuple[Callable[..., SizeDistribution], tuple[str, ...]]] = {
    "production": (production, ()),
    "lognormal": (lognormal, ("mu", "sigma", "lo", "hi")),
    "normal": (normal, ("mean", "sd", "lo", "hi")),
    "fixed": (fixed, ("size",)),
}
SIZE_DISTRIBUTIONS = (*_FACTORIES, "file")


def size_distribution(spec: str, **overrides: object) -> SizeDistribution:
    """A distribution by registry spec, e.g. ``"production"``, ``"normal:mean=256,sd=32"``, ``"fixed:64"``,
    ``"file:sizes.npy"``; keyword ``overrides`` replace parameters from the string."""
    name, params = parse_spec(spec)
    params = {**params, **{k: str(v) for k, v in overrides.items()}}
    if name == "file":
        return from_file(params["path"])
    if name not in _FACTORIES:
        raise WorkloadError(f"unknown query-size distribution {name!r}; known: {', '.join(SIZE_DISTRIBUTIONS)}")
    factory, allowed = _FACTORIES[name]
    if "" in params and allowed:
        params[allowed[0]] = params.pop("")
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise WorkloadError(f"{name}: unknown parameter(s) {unknown}; allowed: {list(allowed) or 'none'}")
    kwargs = {k: as_float(params, k, where=name) for k in params}
    if name == "fixed":
        if "size" not in kwargs:
            raise WorkloadError("fixed: needs a size, e.g. fixed:64 or fixed:size=64")
        size = kwargs["size"]
        if size != int(size):
            raise WorkloadError(f"fixed: size must be a positive integer, got {size:g}")
        return fixed(int(size))
    return factory(**kwargs)


def summarize(sizes: np.ndarray) -> dict[str, float]:
    """Mean, median, p90, p99, min, max and count of a size sample."""
    sizes = np.asarray(sizes)
    if sizes.size == 0:
        raise WorkloadError("no query sizes to summarise")
    p50, p90, p99 = np.percentile(sizes, [50, 90, 99])
    return {"n": int(sizes.size), "mean": float(sizes.mean()), "median": float(p50), "p90": float(p90),
            "p99": float(p99), "min": float(sizes.min()), "max": float(sizes.max())}
