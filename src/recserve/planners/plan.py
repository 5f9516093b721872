"""Plans: what a planner decided, as plain data that saves to JSON and prints as a table.

Every planner returns a :class:`Plan` subclass.  A plan records its inputs (targets, budget, where
the profiles came from), its decision, and the same decision made by the baselines it is compared
with, so one JSON file is enough to reproduce a comparison.  ``Plan.load`` rebuilds the right
subclass from the ``kind`` field (pydantic validates the file against the dataclasses: unknown keys and wrong
types are one-line errors naming the field); other planners register their own subclasses with
:func:`register_plan`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

from recserve.errors import RecserveError
from recserve.jsonio import read_json
from recserve.schema import error_line

PLAN_VERSION = 1
_PLAN_KINDS: dict[str, type[Plan]] = {}
PLAN_MODULES = ("recserve.planners.sdm", "recserve.planners.fleet")
"""Where the plan kinds outside this module are registered (imported when a file names a kind not yet known)."""


def register_plan(cls: type[Plan]) -> type[Plan]:
    """Class decorator: make ``Plan.load`` able to rebuild ``cls`` from its ``kind``."""
    _PLAN_KINDS[cls.kind] = cls
    return cls


def format_table(header: list[str], rows: list[list[Any]]) -> str:
    """A left-aligned text table; floats get 4 significant digits."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    text = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in text]
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    return value


@dataclass
class Plan:
    """Base of every plan.  Subclasses add their decision fields and override ``table``."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # plan files: unknown keys refused (nested dataclasses too)
    kind: ClassVar[str] = "plan"
    planner: str
    inputs: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "kind": self.kind, **_jsonable(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def save(self, path: str | Path) -> Path:
        """Written whole or not at all (a plan cut short by a stop is never left for a deploy to read)."""
        from recserve.jsonio import write_text_atomic

        return write_text_atomic(path, self.to_json())

    def table(self) -> str:
        rows = [[k, v] for k, v in self.summary.items()]
        return format_table(["metric", "value"], rows)

    def baseline_table(self) -> str:
        """One row per policy (this plan's planner first) with the summary metrics they share."""
        if not self.baselines:
            return ""
        keys = [k for k in self.summary if all(k in b for b in self.baselines.values())
                and isinstance(self.summary[k], int | float)]
        rows = [[self.planner, *(self.summary[k] for k in keys)]]
        rows += [[name, *(b[k] for k in keys)] for name, b in self.baselines.items()]
        notes = [str(b.get("note") or "") for b in self.baselines.values()]
        if not any(notes):
            return format_table(["policy", *keys], rows)
        rows = [[*rows[0], ""], *([*row, _short(note)] for row, note in zip(rows[1:], notes, strict=True))]
        return format_table(["policy", *keys, "note"], rows)  # why a row is "-" (infeasible) or what it chose

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> Plan:
        if not isinstance(data, dict) or data.get("version") != PLAN_VERSION:
            raise RecserveError(f"{where}: not a recserve plan of version {PLAN_VERSION}")
        target = plan_kind(data.get("kind"), where) if "kind" in data else cls
        fields = target._without_derived({k: v for k, v in data.items() if k not in ("version", "kind")})
        try:
            return _reader(target).validate_python(fields)
        except ValidationError as exc:
            raise RecserveError(error_line(exc, where, target)) from None

    @classmethod
    def _without_derived(cls, fields: dict[str, Any]) -> dict[str, Any]:
        """The file's fields less those ``to_dict`` derives from the others (written for readers, not read back)."""
        return fields

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_dict(read_json(path, RecserveError, "plan file"), str(path))


register_plan(Plan)


def plan_kind(kind: Any, where: str) -> type[Plan]:
    """The Plan subclass of a file's ``kind``."""
    if kind not in _PLAN_KINDS:
        for module in PLAN_MODULES:
            importlib.import_module(module)
    if kind not in _PLAN_KINDS:
        raise RecserveError(f"{where}: kind: unknown plan kind {kind!r}; known: {sorted(_PLAN_KINDS)}")
    return _PLAN_KINDS[kind]


@functools.cache
def _reader(cls: type[Plan]) -> TypeAdapter:
    """Validates a plan file's fields into ``cls``, nested dataclasses included; unknown keys refused."""
    return TypeAdapter(cls)


# ----------------------------------------------------------------- co-location (Hera)


@dataclass
class Placement:
    """One model's share of a server: workers (= cores), LLC ways, predicted max QPS."""

    model: str
    workers: int
    ways: int
    qps: float
    isolated_qps: float

    @property
    def load_fraction(self) -> float:
        return self.qps / self.isolated_qps if self.isolated_qps > 0 else 0.0


@dataclass
class ServerPlan:
    """One server and the models placed on it."""

    server: str
    placements: list[Placement]

    @property
    def emu(self) -> float:
        """Effective machine utilisation: Σ model load ÷ that model's isolated max load."""
        return sum(p.load_fraction for p in self.placements)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(p.model for p in self.placements)


@register_plan
@dataclass
class ColocationPlan(Plan):
    kind: ClassVar[str] = "colocate"
    servers: list[ServerPlan] = field(default_factory=list)

    @classmethod
    def _without_derived(cls, fields: dict[str, Any]) -> dict[str, Any]:
        servers = fields.get("servers")
        if isinstance(servers, list):
            servers = [{k: v for k, v in s.items() if k != "emu"} if isinstance(s, dict) else s for s in servers]
        return {**fields, "servers": servers} if servers is not None else fields

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        for s, raw in zip(self.servers, data["servers"], strict=True):
            raw["emu"] = s.emu
        return data

    def table(self) -> str:
        groups: dict[tuple, list[ServerPlan]] = {}
        for s in self.servers:
            key = tuple((p.model, p.workers, p.ways, round(p.qps, 3)) for p in s.placements)
            groups.setdefault(key, []).append(s)
        rows = []
        for members in groups.values():
            s = members[0]
            rows.append([len(members), " + ".join(s.models),
                         " / ".join(str(p.workers) for p in s.placements),
                         " / ".join(str(p.ways) for p in s.placements),
                         " / ".join(f"{p.qps:,.1f}" for p in s.placements),
                         f"{100 * s.emu:.0f}%"])
        out = format_table(["servers", "models", "workers", "LLC ways", "pred. QPS", "EMU"], rows)
        extra = self.baseline_table()
        return out + ("\n\n" + extra if extra else "")


# ----------------------------------------------------------------- provisioning (Hercules)


@dataclass
class ProvisionStep:
    """One provisioning interval: the load and the servers activated for each workload."""

    t: float
    load: dict[str, float]
    allocation: dict[str, dict[str, int]]
    power_w: float
    capacity_qps: dict[str, float]
    unserved: dict[str, float] = field(default_factory=dict)

    @property
    def servers(self) -> int:
        return sum(sum(v.values()) for v in self.allocation.values())


@register_plan
@dataclass
class ProvisionPlan(Plan):
    kind: ClassVar[str] = "provision"
    steps: list[ProvisionStep] = field(default_factory=list)
    baseline_steps: dict[str, list[ProvisionStep]] = field(default_factory=dict)

    def table(self) -> str:
        names = [self.planner, *self.baseline_steps]
        series = [self.steps, *self.baseline_steps.values()]
        header = ["t (h)", "load (QPS)"] + [f"{n} W" for n in names] + [f"{n} servers" for n in names]
        rows = []
        for i, step in enumerate(self.steps):
            rows.append([f"{step.t:g}", f"{sum(step.load.values()):,.0f}",
                         *(f"{s[i].power_w:,.0f}" for s in series), *(s[i].servers for s in series)])
        out = format_table(header, rows)
        extra = self.baseline_table()
        savings = []
        for name, b in self.baselines.items():
            if "hercules_power_saving_peak" not in b:
                continue
            pct = {k: 100 * b[f"hercules_{k}"] for k in ("power_saving_peak", "power_saving_avg",
                                                          "server_saving_peak", "server_saving_avg")}
            savings.append(f"{self.planner} vs {name}: provisioned power {pct['power_saving_peak']:+.1f}% saved at "
                           f"peak, {pct['power_saving_avg']:+.1f}% on average; servers saved "
                           f"{pct['server_saving_peak']:+.1f}% at peak, {pct['server_saving_avg']:+.1f}% on average")
        return out + ("\n\n" + extra if extra else "") + ("\n" + "\n".join(savings) if savings else "")


# ----------------------------------------------------------------- instance pools (Kairos)


@dataclass
class PoolChoice:
    """The pool chosen for one model: instance counts per type, its cost and throughput bound."""

    model: str
    config: dict[str, int]
    cost_per_hr: float
    upper_bound_qps: float
    homogeneous: dict[str, Any] = field(default_factory=dict)
    evaluated_qps: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@register_plan
@dataclass
class PoolPlan(Plan):
    kind: ClassVar[str] = "pool"
    pools: list[PoolChoice] = field(default_factory=list)

    def table(self) -> str:
        rows = []
        for p in self.pools:
            homo = p.homogeneous
            gain = p.upper_bound_qps / homo["qps"] if homo.get("qps") else float("nan")
            rows.append([p.model, " ".join(f"{k}={v}" for k, v in p.config.items() if v),
                         f"${p.cost_per_hr:.3f}", p.upper_bound_qps,
                         "-" if p.evaluated_qps is None else p.evaluated_qps,
                         f"{homo.get('count', '-')}x{homo.get('type', '-')}", homo.get("qps", float("nan")),
                         f"{gain:.2f}x"])
        return format_table(["model", "pool", "$/hr", "upper bound QPS", "evaluated QPS", "homogeneous",
                             "homog. QPS (budget-scaled)", "UB gain"], rows)


# ----------------------------------------------------------------- shards (ElasticRec)


@dataclass
class TableShards:
    """One table's hotness-sorted shards: boundaries, planned replicas, expected rows gathered per query
    and the QPS one replica of each shard sustains (the autoscaler's target)."""

    table: str
    boundaries: list[int]          # [0, b1, ..., rows]
    replicas: list[int]
    rows_gathered: list[float]     # expected per query, per shard
    memory_bytes: float
    qps_max: list[float] = field(default_factory=list)

    @property
    def num_shards(self) -> int:
        return len(self.replicas)


@register_plan
@dataclass
class ShardPlan(Plan):
    """ElasticRec: a dense shard and per-table embedding shards, each with its own replicas, vs model-wise
    replication of the whole model."""

    kind: ClassVar[str] = "shard"
    planner: str = "elasticrec"
    model: str = ""
    server: str = ""
    target_qps: float = 0.0
    batch: int = 32
    dense_replicas: int = 1
    dense_memory_bytes: float = 0.0
    tables: list[TableShards] = field(default_factory=list)
    modelwise_replicas: int = 1
    modelwise_memory_bytes: float = 0.0
    assumptions: list[str] = field(default_factory=list)

    @property
    def memory_bytes(self) -> float:
        return self.dense_memory_bytes + sum(t.memory_bytes for t in self.tables)

    @property
    def saving(self) -> float:
        return self.modelwise_memory_bytes / self.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "memory_bytes": self.memory_bytes, "saving_vs_modelwise": self.saving}

    @classmethod
    def _without_derived(cls, fields: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if k not in ("memory_bytes", "saving_vs_modelwise")}

    def table(self) -> str:
        return self.table_text()

    def table_text(self) -> str:
        lines = [f"{self.model}: target {self.target_qps:g} QPS, batch {self.batch}",
                 f"  dense shard: {self.dense_replicas} replicas, {self.dense_memory_bytes / 2**30:.2f} GiB"]
        for t in self.tables:
            shards = ", ".join(f"[{a}:{b}) x{r}" for a, b, r in zip(t.boundaries[:-1], t.boundaries[1:], t.replicas,
                                                                    strict=True))
            lines.append(f"  {t.table}: {t.num_shards} shards {shards} -> {t.memory_bytes / 2**30:.2f} GiB")
        lines.append(f"  ElasticRec total {self.memory_bytes / 2**30:.1f} GiB vs model-wise "
                     f"{self.modelwise_memory_bytes / 2**30:.1f} GiB ({self.modelwise_replicas} replicas): "
                     f"{self.saving:.2f}x less memory")
        return "\n".join(lines)


def _short(note: str, width: int = 100) -> str:
    """A note on one table row: its first line, cut at ``width`` characters."""
    line = note.splitlines()[0] if note else ""
    return line if len(line) <= width else line[: width - 3] + "..."
