"""Service times for the simulator, from ``latency_vs_batch`` Profile tables.

A table gives mean, p50 and p99 latency per batch size for one (model, server type).  The simulator
draws each query's service time from a lognormal whose median is p50 and whose 99th percentile is
p99 (sigma = ln(p99/p50) / z_0.99); the tail is what an SLA sees, so the tail is matched rather
than the mean.  The Kairos paper's reference latencies (``kairos_aws_latency.json``) load into the
same tables via :func:`load_reference`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from recserve.errors import ProfileError
from recserve.profiles import ProfileSet

Z99 = 2.3263478740408408  # standard normal 99th percentile


def load_reference(path: str | Path) -> ProfileSet:
    """The Kairos reference latencies as ``latency_vs_batch`` tables (models named ``kairos-<name>``);
    one loader for the whole project: the pool planner's."""
    from recserve.planners.kairos import load_kairos_reference

    return load_kairos_reference(path)


@dataclass
class ServiceModel:
    """Per server type arrays over a common batch grid: mean, p50, p99 and lognormal sigma (ms)."""

    model: str
    types: list[str]
    batches: np.ndarray
    mean: np.ndarray  # [T, B]
    p50: np.ndarray
    p99: np.ndarray

    @property
    def sigma(self) -> np.ndarray:
        return np.log(np.maximum(self.p99, self.p50) / self.p50) / Z99

    @property
    def step(self) -> float:
        return float(self.batches[1] - self.batches[0]) if len(self.batches) > 1 else float(self.batches[0])

    def bucket(self, sizes: np.ndarray) -> np.ndarray:
        """Grid index for each batch size (rounded up to the grid, clamped)."""
        idx = np.ceil(np.asarray(sizes, dtype=float) / self.step).astype(np.int64) - 1
        return np.clip(idx, 0, len(self.batches) - 1)

    def type_index(self, name: str) -> int:
        if name not in self.types:
            raise ProfileError(f"no latency table for model {self.model!r} on {name!r}; have {self.types}")
        return self.types.index(name)

    def sample(self, type_names: Sequence[str], buckets: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Service times [N, len(type_names)] for queries with standard-normal ``noise`` (common across types)."""
        idx = [self.type_index(t) for t in type_names]
        p50 = self.p50[idx][:, buckets].T
        sig = self.sigma[idx][:, buckets].T
        return p50 * np.exp(sig * noise[:, None])

    def scaled(self, factor: float) -> ServiceModel:
        """All latencies multiplied by ``factor`` (co-location slowdown)."""
        return ServiceModel(self.model, self.types, self.batches, self.mean * factor, self.p50 * factor,
                            self.p99 * factor)

    def with_spread(self, cv: float) -> ServiceModel:
        """The same mean latencies with a lognormal spread of coefficient of variation ``cv`` instead of the
        measured one: the Kairos paper's premise of near-deterministic inference (Sec. 5.1, "< 0.5% of mean")."""
        if cv < 0:
            raise ProfileError(f"coefficient of variation must be >= 0, got {cv}")
        sigma = float(np.sqrt(np.log1p(cv * cv)))
        p50 = self.mean / np.exp(sigma * sigma / 2.0)
        return ServiceModel(self.model, self.types, self.batches, self.mean.copy(), p50, p50 * np.exp(Z99 * sigma))

    def as_dict(self, kind: str = "mean") -> dict[str, np.ndarray]:
        arr = {"mean": self.mean, "p50": self.p50, "p99": self.p99}[kind]
        return {t: arr[i] for i, t in enumerate(self.types)}

    @classmethod
    def from_profiles(cls, profiles: ProfileSet, model: str, types: Sequence[str] | None = None) -> ServiceModel:
        tables = profiles.find(model=model, kind="latency_vs_batch")
        if types is not None:
            tables = [t for t in tables if t.server in set(types)]
        if not tables:
            raise ProfileError(f"no latency_vs_batch tables for model {model!r}"
                               + (f" on {list(types)}" if types else "")
                               + f"; models with tables: {profiles.models()}")
        names = list(dict.fromkeys(t.server for t in tables)) if types is None else list(types)
        missing = [n for n in names if n not in {t.server for t in tables}]
        if missing:
            raise ProfileError(f"no latency_vs_batch table for model {model!r} on {missing}")
        by_server = {t.server: t for t in tables}
        batches = np.unique(np.concatenate([by_server[n].column("batch") for n in names]))
        grid = np.arange(batches.min(), batches.max() + 1e-9, np.diff(batches).min() if len(batches) > 1 else 1.0)

        def column(col: str) -> np.ndarray:
            return np.array([[by_server[n].interp(float(b), col) for b in grid] for n in names])

        return cls(model, names, grid, column("mean_ms"), column("p50_ms"), column("p99_ms"))
