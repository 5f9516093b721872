"""Profile tables: the numbers that drive every decision, as versioned JSON.

``measure/`` writes them from real runs on this host; ``perfmodel/`` writes the same tables for
server types we cannot run (marked ``source="modelled"``); ``reference`` tables come from the
papers' public artifacts.  Planners and the simulator only read them.

A table is keyed by (model, server, kind, conditions) and holds named columns of rows, e.g.
kind ``latency_vs_batch`` with columns ``batch, mean_ms, p50_ms, p99_ms``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recserve.errors import ProfileError
from recserve.jsonio import read_json, write_text_atomic

PROFILE_VERSION = 1

# kind -> the columns it must have (first column is the x axis)
KINDS: dict[str, tuple[str, ...]] = {
    "latency_vs_batch": ("batch", "mean_ms", "p50_ms", "p99_ms"),
    "maxload_vs_workers": ("workers", "max_qps"),
    "maxload_vs_ways": ("ways", "max_qps"),
    "membw_vs_workers": ("workers", "gbs"),
    "footprint": ("workers", "mem_gb"),
    "gather_qps": ("gathers", "qps"),
    "efficiency": ("max_qps", "power_w"),
    # co-location interference measured on a host (measure/interference.py)
    "slowdown_vs_llc_occupied": ("occupied_mb", "slowdown"),
    "slowdown_vs_corunner_gbs": ("corunner_gbs", "slowdown"),
    "colocated_slowdown": ("alone_ms", "with_ms", "slowdown"),
    "latency_vs_table_mb": ("table_mb", "mean_ms"),
}
SOURCES = ("measured", "modelled", "reference")


@dataclass
class ProfileTable:
    model: str
    server: str
    kind: str
    columns: tuple[str, ...]
    rows: list[list[float]]
    source: str = "measured"
    conditions: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        need = KINDS.get(self.kind)
        if need is None:
            raise ProfileError(f"unknown profile kind {self.kind!r}; known: {sorted(KINDS)}")
        missing = [c for c in need if c not in self.columns]
        if missing:
            raise ProfileError(f"profile {self.key}: kind {self.kind} needs columns {missing}")
        if self.source not in SOURCES:
            raise ProfileError(f"profile {self.key}: source must be one of {SOURCES}")
        if any(len(r) != len(self.columns) for r in self.rows):
            raise ProfileError(f"profile {self.key}: every row needs {len(self.columns)} values")
        self.columns = tuple(self.columns)

    @property
    def key(self) -> str:
        cond = ",".join(f"{k}={v}" for k, v in sorted(self.conditions.items()))
        return f"{self.model}@{self.server}:{self.kind}" + (f"[{cond}]" if cond else "")

    def column(self, name: str) -> np.ndarray:
        if name not in self.columns:
            raise ProfileError(f"profile {self.key}: no column {name!r} (has {list(self.columns)})")
        i = self.columns.index(name)
        return np.array([r[i] for r in self.rows], dtype=float)

    def interp(self, x: float, y: str, x_col: str | None = None) -> float:
        """Linear interpolation of column ``y`` at ``x`` (clamped extrapolation by slope at the ends)."""
        xs = self.column(x_col or self.columns[0])
        ys = self.column(y)
        order = np.argsort(xs)
        xs, ys = xs[order], ys[order]
        if len(xs) == 1:
            return float(ys[0])
        if x < xs[0] or x > xs[-1]:
            i = 0 if x < xs[0] else len(xs) - 2
            slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
            base = xs[i] if x < xs[0] else xs[i + 1]
            return float((ys[i] if x < xs[0] else ys[i + 1]) + slope * (x - base))
        return float(np.interp(x, xs, ys))

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "server": self.server,
            "kind": self.kind,
            "source": self.source,
            "conditions": self.conditions,
            "columns": list(self.columns),
            "rows": self.rows,
        }


class ProfileSet:
    """A collection of tables with lookup by key; saved as one versioned JSON file."""

    def __init__(self, tables: Iterable[ProfileTable] = (), meta: dict[str, Any] | None = None) -> None:
        self.meta = dict(meta or {})
        self._tables: dict[str, ProfileTable] = {}
        for t in tables:
            self.add(t)

    def add(self, table: ProfileTable) -> None:
        self._tables[table.key] = table

    def __iter__(self):
        return iter(self._tables.values())

    def __len__(self) -> int:
        return len(self._tables)

    def find(self, model: str | None = None, server: str | None = None, kind: str | None = None,
             **conditions: Any) -> list[ProfileTable]:
        return [
            t for t in self
            if (model is None or t.model == model)
            and (server is None or t.server == server)
            and (kind is None or t.kind == kind)
            and all(t.conditions.get(k) == v for k, v in conditions.items())
        ]

    def get(self, model: str, server: str, kind: str, **conditions: Any) -> ProfileTable:
        found = self.find(model, server, kind, **conditions)
        if not found:
            raise ProfileError(f"no profile {kind!r} for model {model!r} on server {server!r}"
                               + (f" with {conditions}" if conditions else "")
                               + " — run `recserve profile` or `recserve profile model` to make one")
        return found[0]

    def models(self) -> list[str]:
        return sorted({t.model for t in self})

    def servers(self) -> list[str]:
        return sorted({t.server for t in self})

    def merge(self, other: ProfileSet) -> ProfileSet:
        out = ProfileSet(self, {**self.meta, **other.meta})
        for t in other:
            out.add(t)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "meta": self.meta, "tables": [t.to_dict() for t in self]}

    def save(self, path: str | Path) -> Path:
        """Written whole or not at all (two processes saving at once each rename a whole file)."""
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "profile") -> ProfileSet:
        if not isinstance(data, dict) or "version" not in data:
            raise ProfileError(f"{where}: not a recserve profile file (no 'version')")
        if "tables" not in data and "constants" in data:  # `recserve profile calibrate --out`'s file
            raise ProfileError(f"{where}: a perfmodel calibration, not a profile (give it to --calibration)")
        if "tables" not in data and isinstance(data.get("kind"), str):  # a Plan (planners/plan.py)
            raise ProfileError(f"{where}: a {data['kind']} plan, not a profile (`recserve profile host|model` "
                               "writes one)")
        if not isinstance(data.get("tables"), list):
            raise ProfileError(f"{where}: not a recserve profile file (no 'tables' list)")
        if data["version"] != PROFILE_VERSION:
            raise ProfileError(f"{where}: profile version {data['version']} is not supported "
                               f"(this recserve reads version {PROFILE_VERSION}); re-run `recserve profile`")
        try:
            tables = [ProfileTable(**{**t, "columns": tuple(t["columns"])}) for t in data.get("tables", [])]
        except (TypeError, KeyError) as exc:
            raise ProfileError(f"{where}: malformed table: {exc}") from exc
        return cls(tables, data.get("meta"))

    @classmethod
    def load(cls, path: str | Path) -> ProfileSet:
        return cls.from_dict(read_json(path, ProfileError, "profile file"), str(path))
