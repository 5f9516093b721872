"""Plans into node-server configs: what a deployment hands the node server (which never reads plans).

- ``tier_section``: an SDM TierPlan as the node config's ``tier`` tables (SM tables, those without a
  row cache), so storage gets a placement, not a plan file.
- ``hera_node_configs``: a Hera co-location plan as one node config per distinct server group, each
  model with its planned workers (one core each).
- ``accelerator_section``: a planned model's accelerator workers on a server type with an accelerator.
"""

from __future__ import annotations

from typing import Any

from recserve.errors import RecserveError, SpecError
from recserve.planners.plan import ColocationPlan, Plan, ServerPlan
from recserve.specs import ServerType


def tier_section(plan: Plan, tier: dict[str, Any]) -> dict[str, Any]:
    """``tier`` with its ``plan`` replaced by the plan's SM tables (and ``no_cache`` for SM tables without cache)."""
    if plan.kind != "tier":
        raise SpecError(f"tier.plan: expected a `recserve plan tier` plan, got a {plan.kind!r} plan")
    sm = [t for t in getattr(plan, "tables", []) if t.tier == "SM"]
    out = {k: v for k, v in tier.items() if k != "plan"}
    out["tables"] = [t.table for t in sm]
    uncached = [t.table for t in sm if not t.cache]
    if uncached:
        out["no_cache"] = uncached
    return out


def resolve_tier_plans(config: Any) -> Any:
    """Every model of a NodeConfig whose ``options.tier`` names a ``plan`` gets the placement instead (in place)."""
    for m in config.models:
        tier = (m.options or {}).get("tier")
        if isinstance(tier, dict) and "plan" in tier:
            m.options["tier"] = tier_section(Plan.load(tier["plan"]), tier)
    return config


def server_groups(plan: ColocationPlan) -> list[tuple[ServerPlan, int]]:
    """Identical servers (same server type, models, workers) once each, with how many there are."""
    groups: dict[tuple, list[ServerPlan]] = {}
    for s in plan.servers:
        key = (s.server, tuple((p.model, p.workers, p.ways) for p in s.placements))
        groups.setdefault(key, []).append(s)
    return [(members[0], len(members)) for members in groups.values()]


def node_config(server: ServerPlan, scale: float = 1e-3, http_port: int = 8000, grpc_port: int = 8001,
                host: str = "0.0.0.0") -> dict[str, Any]:
    """The node config (YAML-ready data) of one planned server: each model with its planned workers, one
    single-threaded worker per core (Hera: a worker is a core).  No core ids: the server runs in a container
    whose exclusive cpuset (the static CPU manager's) its workers inherit."""
    models = [{"model": p.model, "name": p.model, "scale": scale, "workers": p.workers, "threads": 1}
              for p in server.placements]
    return {"host": host, "http_port": http_port, "grpc_port": grpc_port, "models": models}


def planned_cpus(server: ServerPlan) -> int:
    return sum(p.workers for p in server.placements)


def accelerator_section(server: ServerType, alloc: dict[str, Any], entry: dict[str, Any],
                        where: str) -> dict[str, Any] | None:
    """A planned model's node-config ``accelerator`` on ``server`` (None without an accelerator).  There Hercules'
    model-based threads run on the device, fusing queued queries up to the planned batch: the plan's capacity.
    So each of ``entry``'s workers gets an accelerator worker on its cores that takes every query (``min_items``
    1); the CPU workers accept and forward.  A pipeline's dense threads on the device have no node-config form
    (accelerator workers take whole queries): refused, naming ``where``."""
    if not server.accelerator:
        return None
    mode = alloc.get("mode") or "model"
    if mode != "model":
        raise RecserveError(f"{where}: the plan runs its {mode} dense threads on the {server.accelerator}, which a "
                            "node config cannot express (accelerator workers take whole queries, mode: model)")
    section: dict[str, Any] = {"device": "cuda", "workers": entry["workers"], "threads": entry["threads"],
                               "min_items": 1}
    if alloc.get("batch"):
        section["fuse_items"] = int(alloc["batch"])
    if entry.get("cores"):
        section["cores"] = [list(c) for c in entry["cores"]]
    return section
