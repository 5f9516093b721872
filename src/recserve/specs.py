"""Plain descriptions of what is served and where: ModelSpec, ServerType, SLA, Traffic.

Specs are loaded from YAML (the bundled catalogue in ``recserve/catalogue/`` or a user's file),
validated once here, and then passed everywhere as immutable values.  Full-size specs stay
full-size: planners need real capacities; only the live zoo shrinks rows (``zoo.build(scale=…)``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from recserve.errors import SpecError
from recserve.jsonio import read_text

# "program": a user's torch.export program of any architecture, described by what was read off it (zoo/artifacts.py)
FAMILIES = ("dlrm", "wnd", "mtwnd", "ncf", "din", "dien", "program")
INTERACTIONS = ("dot", "concat", "attention", "gru", "program")
SIDES = ("user", "item")
TABLE_KINDS = ("pooled", "sequence")


@dataclass(frozen=True)
class TableSpec:
    """One embedding table.  ``pooling`` = lookups per sample (the pooling factor).

    A ``sequence`` table is looked up by a behaviour sequence of exactly ``pooling`` ids per sample
    (DIN/DIEN) and its rows are not sum-pooled but attended over.
    """

    name: str
    rows: int
    dim: int
    pooling: int = 1
    side: str = "item"
    kind: str = "pooled"

    def __post_init__(self) -> None:
        _positive(self, "rows", "dim", "pooling")
        _one_of(self, "side", SIDES)
        _one_of(self, "kind", TABLE_KINDS)

    def row_bytes(self, bytes_per_elem: int = 4) -> int:
        return self.dim * bytes_per_elem

    def bytes(self, bytes_per_elem: int = 4) -> int:
        return self.rows * self.row_bytes(bytes_per_elem)


@dataclass(frozen=True)
class SLA:
    """Tail-latency target: the ``percentile`` of per-query latency must stay under ``target_ms``."""

    target_ms: float
    percentile: float = 95.0

    def __post_init__(self) -> None:
        _positive(self, "target_ms")
        if not 50.0 <= self.percentile < 100.0:
            raise SpecError(f"SLA percentile must be in [50, 100), got {self.percentile}")


@dataclass(frozen=True)
class ModelSpec:
    """A recommendation model at full size, as the papers describe it."""

    name: str
    family: str
    dense_in: int
    tables: tuple[TableSpec, ...]
    interaction: str
    sla: SLA
    bottom_mlp: tuple[int, ...] = ()
    top_mlp: tuple[int, ...] = (1,)
    towers: int = 1
    tower_mlp: tuple[int, ...] = ()
    gru_hidden: int = 0
    attention_mlp: tuple[int, ...] = ()
    source: str = ""
    notes: str = ""
    bytes_per_elem: int = 4
    # Counted on a program (family "program"), whose MLP widths are unknown; 0 = derive from the widths / the zoo.
    dense_flops: float = 0.0
    dense_params: int = 0

    def __post_init__(self) -> None:
        _one_of(self, "family", FAMILIES)
        _one_of(self, "interaction", INTERACTIONS)
        _positive(self, "dense_in", "towers", "bytes_per_elem")
        if not self.tables:
            raise SpecError(f"model {self.name!r}: needs at least one table")
        for name in ("bottom_mlp", "top_mlp", "tower_mlp", "attention_mlp"):
            if any(int(w) <= 0 for w in getattr(self, name)):
                raise SpecError(f"model {self.name!r}: {name} widths must be positive")
        if len({t.name for t in self.tables}) != len(self.tables):
            raise SpecError(f"model {self.name!r}: table names must be unique")
        if self.interaction == "dot":
            dims = {t.dim for t in self.tables}
            out = self.bottom_mlp[-1] if self.bottom_mlp else self.dense_in
            if len(dims) != 1 or out not in dims:
                raise SpecError(
                    f"model {self.name!r}: dot interaction needs every table dim and the bottom MLP "
                    f"output equal (tables {sorted(dims)}, bottom MLP out {out})"
                )
        if self.interaction == "gru" and self.gru_hidden <= 0:
            raise SpecError(f"model {self.name!r}: gru interaction needs gru_hidden > 0")
        if self.interaction in ("attention", "gru") and not self.sequence_tables:
            raise SpecError(f"model {self.name!r}: {self.interaction} needs a table of kind 'sequence'")

    # ---- derived quantities (used by `models list`, the perfmodel and the planners) ----
    @property
    def sequence_tables(self) -> tuple[TableSpec, ...]:
        return tuple(t for t in self.tables if t.kind == "sequence")

    @property
    def embedding_bytes(self) -> int:
        return sum(t.bytes(self.bytes_per_elem) for t in self.tables)

    @property
    def lookups_per_item(self) -> int:
        return sum(t.pooling for t in self.tables)

    @property
    def gather_bytes_per_item(self) -> int:
        """Bytes of embedding rows read per candidate item (the sparse part's memory traffic)."""
        return sum(t.pooling * t.row_bytes(self.bytes_per_elem) for t in self.tables)

    def scaled_rows(self, scale: float, min_rows: int = 16) -> tuple[int, ...]:
        """Table rows after shrinking by ``scale`` (what the live zoo allocates)."""
        if not 0 < scale <= 1:
            raise SpecError(f"scale must be in (0, 1], got {scale}")
        return tuple(max(min_rows, int(round(t.rows * scale))) for t in self.tables)

    def scaled_embedding_bytes(self, scale: float) -> int:
        rows = self.scaled_rows(scale)
        return sum(r * t.row_bytes(self.bytes_per_elem) for r, t in zip(rows, self.tables, strict=True))


@dataclass(frozen=True)
class SSDSpec:
    """A local SSD: random-read IOPS at 4 KiB, read latency and capacity."""

    iops: float
    read_latency_us: float
    capacity_gb: float
    bandwidth_gbs: float = 0.0
    kind: str = "nand"


@dataclass(frozen=True)
class ServerType:
    """A kind of machine a model can be placed on, with what it costs to run."""

    name: str
    cores: int
    mem_gb: float
    mem_bw_gbs: float
    llc_mb: float = 0.0
    llc_ways: int = 0
    freq_ghz: float = 2.0
    flops_per_cycle: int = 16
    accelerator: str | None = None
    accel_tflops: float = 0.0
    accel_mem_gb: float = 0.0
    accel_mem_bw_gbs: float = 0.0
    pcie_gbs: float = 0.0
    nmp: bool = False
    ssd: SSDSpec | None = None
    price_per_hr: float | None = None
    power_w: float | None = None
    cpu_share: float = 1.0  # sustained share of each core (burstable cloud instances: their baseline)
    source: str = ""
    assumptions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive(self, "cores", "mem_gb", "mem_bw_gbs", "freq_ghz")
        if not 0 < self.cpu_share <= 1:
            raise SpecError(f"server {self.name!r}: cpu_share must be in (0, 1], got {self.cpu_share}")
        if self.llc_ways < 0 or self.llc_mb < 0:
            raise SpecError(f"server {self.name!r}: LLC size and ways must be >= 0")

    @property
    def peak_gflops(self) -> float:
        return self.cores * self.freq_ghz * self.flops_per_cycle


@dataclass(frozen=True)
class Traffic:
    """Load offered to one model: a rate (or a diurnal trace scaled to ``peak_qps``) and a size mix."""

    model: str
    qps: float
    query_sizes: str = "production"
    trace: str | None = None

    def __post_init__(self) -> None:
        if self.qps < 0:
            raise SpecError(f"traffic for {self.model!r}: qps must be >= 0, got {self.qps}")


# ---------------------------------------------------------------- loading


def _label(obj: Any) -> str:
    """What a field error names first: the object, where it has a name (an SLA is named by where it was read)."""
    return f"{type(obj).__name__} {obj.name!r}: " if hasattr(obj, "name") else ""


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise SpecError(f"{_label(obj)}{name} must be a positive number, got {value!r}")


def _one_of(obj: Any, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise SpecError(f"{_label(obj)}{name} must be one of {allowed}, got {value!r}")


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    """Construct a dataclass from a mapping with clear errors for unknown or missing keys."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    missing = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in data
    ]
    if missing:
        raise SpecError(f"{where}: missing field(s) {missing}")
    kwargs = {}
    for key, value in data.items():
        if isinstance(value, list):
            value = tuple(value)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, SpecError) as exc:  # a field's own check names the field, ``where`` the file
        raise SpecError(f"{where}: {exc}") from exc


def model_from_dict(name: str, data: dict[str, Any]) -> ModelSpec:
    where = f"model {name!r}"
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping")
    data = dict(data)
    tables = []
    raw_tables = data.pop("tables", None)
    if not isinstance(raw_tables, list) or not raw_tables:
        raise SpecError(f"{where}: 'tables' must be a non-empty list")
    for i, raw in enumerate(raw_tables):
        raw = dict(raw) if isinstance(raw, dict) else raw
        repeat = raw.pop("repeat", 1) if isinstance(raw, dict) else 1
        for r in range(int(repeat)):
            item = dict(raw)
            base = item.get("name", f"t{i}")
            item["name"] = f"{base}{r}" if repeat > 1 else base
            tables.append(_build(TableSpec, item, f"{where} table {i}"))
    sla = _build(SLA, data.pop("sla", {}), f"{where} sla")
    data.setdefault("name", name)
    return _build(ModelSpec, {**data, "tables": tables, "sla": sla}, where)


def server_from_dict(name: str, data: dict[str, Any]) -> ServerType:
    where = f"server {name!r}"
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping")
    data = dict(data)
    ssd = data.pop("ssd", None)
    if ssd is not None:
        data["ssd"] = _build(SSDSpec, ssd, f"{where} ssd")
    data.setdefault("name", name)
    return _build(ServerType, data, where)


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last would silently win: a model listed
    twice planned at its second value, a second block replacing the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path) -> Any:
    """A YAML (or JSON) file's contents; one error line naming the file (and line) when it cannot be read."""
    text = read_text(path, SpecError)
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        kind = "JSON" if Path(path).suffix.lower() == ".json" else "YAML"
        raise SpecError(f"{path}:{where} malformed {kind}: {getattr(exc, 'problem', exc)}") from exc


def load_models(path: str | Path) -> dict[str, ModelSpec]:
    """Load a YAML file of ``models: {name: {...}}`` (or a bare mapping)."""
    data = read_yaml(path)
    data = data.get("models", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of model name to spec")
    return {name: model_from_dict(name, spec) for name, spec in data.items()}


def load_servers(path: str | Path) -> dict[str, ServerType]:
    data = read_yaml(path)
    data = data.get("servers", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of server name to spec")
    return {name: server_from_dict(name, spec) for name, spec in data.items()}


def _catalogue_path(name: str) -> Path:
    return Path(str(resources.files("recserve") / "catalogue" / name))


@cache
def catalogue_models() -> dict[str, ModelSpec]:
    return load_models(_catalogue_path("models.yaml"))


@cache
def catalogue_servers() -> dict[str, ServerType]:
    servers = load_servers(_catalogue_path("servers.yaml"))
    from recserve.hostinfo import this_host

    servers["this-host"] = ServerType(**this_host())
    return servers


TABLES_SUFFIX = "@tables="


def first_tables(spec: ModelSpec, k: int) -> ModelSpec:
    """``spec`` with only its first ``k`` tables, named ``<name>@tables=<k>`` so that ``get_model`` resolves
    it in any process (worker processes rebuild models by name) — a big model cut down to fit a small host."""
    if not 0 < k <= len(spec.tables):
        raise SpecError(f"model {spec.name!r} has {len(spec.tables)} tables; cannot keep {k}")
    return dataclasses.replace(spec, name=f"{spec.name}{TABLES_SUFFIX}{k}", tables=spec.tables[:k])


MODEL_SOURCES: list[Callable[[str], ModelSpec | None]] = []
"""Where else a model name may point, added by the layers that can read it (``serving/node/repository.py`` adds
repository paths): specs sits below every artifact reader, so it asks them instead of importing them."""


def add_model_source(source: Callable[[str], ModelSpec | None]) -> None:
    if source not in MODEL_SOURCES:
        MODEL_SOURCES.append(source)


def fleet_served_name(model: str) -> str:
    """The name a fleet serves ``model`` under (its nodes, router and manifests): a repository model's path
    (``REPO/ctr``, ``REPO/ctr/2``) is not one URL segment (``/v2/models/<name>/infer``), so it is served as its model
    directory's name (``ctr``, ``ctr-v2``); a catalogue model as itself."""
    if "/" not in model:
        return model
    parts = [p for p in model.rstrip("/").split("/") if p]
    if parts[-1].isdigit() and len(parts) > 1:
        return f"{parts[-2]}-v{parts[-1]}"
    return parts[-1]


def get_model(name: str, extra: dict[str, ModelSpec] | None = None) -> ModelSpec:
    models = {**catalogue_models(), **(extra or {})}
    base, sep, keep = name.rpartition(TABLES_SUFFIX)
    if name not in models and sep and base in models and keep.isdigit():
        return first_tables(models[base], int(keep))
    if name not in models:
        for source in MODEL_SOURCES:  # e.g. a model repository's path, REPO/<model>[/<version>]
            spec = source(name)
            if spec is not None:
                return spec
        if "/" in name and not Path(name).exists():  # meant as a repository path: say that it is not there
            raise SpecError(f"unknown model {name!r}: no such directory (a repository model is named by its path, "
                            f"REPO/<model>[/<version>]; catalogue models: {', '.join(sorted(models))})")
        raise SpecError(f"unknown model {name!r}; known: {', '.join(sorted(models))} (or a repository model's "
                        "path, REPO/<model>)")
    return models[name]


def get_server(name: str, extra: dict[str, ServerType] | None = None) -> ServerType:
    servers = {**catalogue_servers(), **(extra or {})}
    if name not in servers:
        raise SpecError(f"unknown server type {name!r}; known: {', '.join(sorted(servers))}")
    return servers[name]


def to_dict(spec: Any) -> dict[str, Any]:
    """A JSON-ready dict of any spec dataclass (tuples become lists)."""
    return dataclasses.asdict(spec)


__all__ = [
    "SLA",
    "ModelSpec",
    "SSDSpec",
    "ServerType",
    "TableSpec",
    "Traffic",
    "catalogue_models",
    "catalogue_servers",
    "get_model",
    "get_server",
    "load_models",
    "load_servers",
]


VERSION_NAME = re.compile(r"[1-9][0-9]{0,17}", re.ASCII)


def version_number(name: str) -> int | None:
    """A version directory's number, as Triton reads one: ASCII digits not starting with 0, within int64 (``01``,
    ``0`` and ``٣`` are not versions, so no two directories name one version); None for any other name."""
    return int(name) if VERSION_NAME.fullmatch(name) else None


def version_dirs(model_dir: Path) -> list[int]:
    """The versions of a model directory, oldest first."""
    return sorted(v for d in model_dir.iterdir() if d.is_dir() and (v := version_number(d.name)) is not None)
