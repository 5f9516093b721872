"""The fleet spec: one file that states the user's whole question.

    models:                                   # catalogue names or repository paths
      hercules-rmc1: {peak_qps: 4000}         # SLA defaults to the catalogue's
      kairos-rm2: {peak_qps: 300, sla_ms: 350, percentile: 99}
      sdm-m1: {trace: [120, 100, ..., 400]}   # hourly QPS (24 values, or any number of equal steps)
    owned: {hercules-t2: 4}                   # servers already paid for: 0 $/hr
    rentable:                                 # $/hr each, and how many can be rented
      sdm-hw-ss: {price: 1.2, max: 10}
      c5n.2xlarge: {max: 20}                  # price defaults to the catalogue's price_per_hr
    budget: 25                                # $/hr for rented servers
    constraints: {ssd: true}                  # may tables go to SSD (SDM)? default true

Every error is one line, ``FILE: field: message``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError, SpecError
from recserve.specs import (
    SLA,
    ModelSpec,
    ServerType,
    catalogue_servers,
    fleet_served_name,
    get_model,
    get_server,
    read_yaml,
)

TOP_FIELDS = ("models", "owned", "rentable", "budget", "constraints")
MODEL_FIELDS = ("peak_qps", "trace", "sla_ms", "percentile")
CONSTRAINT_FIELDS = ("ssd",)


@dataclass(frozen=True)
class FleetModel:
    """One model of the fleet: its spec (with the fleet's SLA) and its traffic."""

    name: str
    spec: ModelSpec
    peak_qps: float
    trace: tuple[float, ...] = ()

    @property
    def sla(self) -> SLA:
        return self.spec.sla


@dataclass(frozen=True)
class Rentable:
    price: float
    max: int


@dataclass
class FleetSpec:
    models: list[FleetModel]
    owned: dict[str, int]
    rentable: dict[str, Rentable]
    budget: float | None
    ssd: bool = True
    servers: dict[str, ServerType] = field(default_factory=dict)
    source: str = ""

    def available(self, server: str) -> int:
        return self.owned.get(server, 0) + (self.rentable[server].max if server in self.rentable else 0)

    def price(self, server: str) -> float:
        return self.rentable[server].price if server in self.rentable else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"models": {m.name: {"peak_qps": m.peak_qps, "sla_ms": m.sla.target_ms, "percentile": m.sla.percentile,
                                    **({"trace": list(m.trace)} if m.trace else {})} for m in self.models},
                "owned": dict(self.owned),
                "rentable": {k: {"price": r.price, "max": r.max} for k, r in self.rentable.items()},
                "budget": self.budget, "constraints": {"ssd": self.ssd}, "source": self.source}


def _number(value: Any, where: str, *, low: float = 0.0, low_open: bool = True, integer: bool = False) -> float:
    """A finite number above ``low`` (or an integer), else SpecError ``where: must be ...``."""
    if isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            pass
    kind = "an integer" if integer else "a number"
    bound = f"{'>' if low_open else '>='} {low:g}"
    ok = (not isinstance(value, bool) and isinstance(value, int if integer else int | float)
          and math.isfinite(value) and (value > low if low_open else value >= low))
    if not ok:
        raise SpecError(f"{where}: must be {kind} {bound}, got {value!r}")
    return value


def _mapping(value: Any, where: str, what: str) -> dict:
    if not isinstance(value, dict):
        raise SpecError(f"{where}: must be a mapping of {what}, got {type(value).__name__}")
    return value


def _unknown(data: dict, allowed: tuple[str, ...], where: str) -> None:
    extra = [str(k) for k in data if k not in allowed]
    if extra:
        raise SpecError(f"{where}: unknown field {extra[0]!r} (known: {', '.join(allowed)})")


def _server(name: str, where: str) -> ServerType:
    try:
        return get_server(name)
    except RecserveError:
        known = ", ".join(sorted(catalogue_servers()))
        raise SpecError(f"{where}: unknown server type {name!r} (catalogue: {known})") from None


def _model(name: str, raw: Any, where: str) -> FleetModel:
    raw = _mapping(raw if raw is not None else {}, where, "peak_qps/trace/sla_ms/percentile")
    _unknown(raw, MODEL_FIELDS, where)
    try:
        spec = get_model(name)
    except RecserveError:
        raise SpecError(f"{where}: unknown model {name!r} (a catalogue name from `recserve models list`, or a "
                        "repository path REPO/<model>)") from None
    if "peak_qps" in raw and "trace" in raw:
        raise SpecError(f"{where}: give peak_qps or trace, not both")
    trace: tuple[float, ...] = ()
    if "trace" in raw:
        values = raw["trace"]
        if not isinstance(values, list) or not values:
            raise SpecError(f"{where}.trace: must be a non-empty list of QPS, one per step (hourly: 24 values)")
        trace = tuple(float(_number(v, f"{where}.trace[{i}]", low_open=False)) for i, v in enumerate(values))
        peak = max(trace)
        if peak <= 0:
            raise SpecError(f"{where}.trace: every step is 0 QPS: nothing to serve")
    elif "peak_qps" in raw:
        peak = float(_number(raw["peak_qps"], f"{where}.peak_qps"))
    else:
        raise SpecError(f"{where}: give peak_qps (QPS) or trace (QPS per step)")
    sla_ms = float(_number(raw.get("sla_ms", spec.sla.target_ms), f"{where}.sla_ms"))
    pct = float(_number(raw.get("percentile", spec.sla.percentile), f"{where}.percentile"))
    if not 50 <= pct < 100:
        raise SpecError(f"{where}.percentile: must be in [50, 100), got {pct:g}")
    return FleetModel(name, replace(spec, sla=SLA(sla_ms, pct)), peak, trace)


def _model_name(name: Any, where: str) -> str:
    """A spec's model name as the plan keeps it: a catalogue name as given; a repository path made absolute and
    normalised (a plan is deployed and verified from any directory, and ``REPO/ctr/.`` is ``REPO/ctr``).  A name
    with control characters is refused: it becomes a URL segment, a file name and a Kubernetes label."""
    name = str(name)
    if not name.isprintable():
        raise SpecError(f"{where}: model name {name!r} has control characters")
    return os.path.abspath(name) if "/" in name else name


def _served_once(models: list[FleetModel], where: str) -> None:
    """Refuse two models served under one name (a repository model is served as its directory's name): a node
    cannot hold both, and a router would send both models' queries to one of them."""
    seen: dict[str, str] = {}
    for m in models:
        served = fleet_served_name(m.name)
        other = seen.setdefault(served, m.name)
        if other != m.name:
            raise SpecError(f"{where}: models: {other!r} and {m.name!r} would both be served as {served!r}; "
                            "rename one model's directory")


def parse_fleet(data: Any, where: str = "fleet spec") -> FleetSpec:
    """Validate a parsed fleet spec; SpecError ``where: field: message`` on the first problem."""
    data = _mapping(data, where, "models/owned/rentable/budget/constraints")
    _unknown(data, TOP_FIELDS, where)
    raw_models = _mapping(data.get("models"), f"{where}: models", "model name to {peak_qps | trace}") \
        if "models" in data else None
    if not raw_models:
        raise SpecError(f"{where}: models: give at least one model (name: {{peak_qps: QPS}})")
    models = [_model(_model_name(m, f"{where}: models"), v, f"{where}: models.{m}") for m, v in raw_models.items()]
    _served_once(models, where)
    servers: dict[str, ServerType] = {}
    owned: dict[str, int] = {}
    for name, n in _mapping(data.get("owned") or {}, f"{where}: owned", "server type to count").items():
        servers[str(name)] = _server(str(name), f"{where}: owned.{name}")
        owned[str(name)] = int(_number(n, f"{where}: owned.{name}", low_open=False, integer=True))
    rentable: dict[str, Rentable] = {}
    for name, raw in _mapping(data.get("rentable") or {}, f"{where}: rentable",
                              "server type to {price, max}").items():
        at = f"{where}: rentable.{name}"
        server = _server(str(name), at)
        raw = _mapping(raw, at, "price/max")
        _unknown(raw, ("price", "max"), at)
        if "price" in raw:
            price = float(_number(raw["price"], f"{at}.price"))
        elif server.price_per_hr:
            price = float(server.price_per_hr)
        else:
            raise SpecError(f"{at}.price: {name} has no catalogue price_per_hr; give price ($/hr)")
        if "max" not in raw:
            raise SpecError(f"{at}.max: give how many can be rented (an integer >= 0)")
        rentable[str(name)] = Rentable(price, int(_number(raw["max"], f"{at}.max", low_open=False, integer=True)))
        servers[str(name)] = server
    if not any(owned.values()) and not any(r.max for r in rentable.values()):
        raise SpecError(f"{where}: owned/rentable: no server to place models on (every count is 0 or none given)")
    budget = None
    if data.get("budget") is not None:
        budget = float(_number(data["budget"], f"{where}: budget", low_open=False))
    constraints = _mapping(data.get("constraints") or {}, f"{where}: constraints", "ssd: true|false")
    _unknown(constraints, CONSTRAINT_FIELDS, f"{where}: constraints")
    ssd = constraints.get("ssd", True)
    if not isinstance(ssd, bool):
        raise SpecError(f"{where}: constraints.ssd: must be true or false, got {ssd!r}")
    return FleetSpec(models, owned, rentable, budget, ssd, servers, where)


def load_fleet(path: str | Path) -> FleetSpec:
    """Read and validate a YAML or JSON fleet spec."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such fleet spec file")
    try:
        data = read_yaml(path)
    except SpecError as exc:
        raise SpecError(str(exc).splitlines()[0]) from None
    return parse_fleet(data, str(path))
