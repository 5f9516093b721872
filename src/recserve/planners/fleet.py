"""One plan for the whole fleet: the cheapest deployment of every model at its SLA on the servers
owned plus those rentable, decided jointly.

The single planners each make one decision (``fleet_candidates``: Hercules' node configuration, SDM's tiering,
ElasticRec's sharding, Hera's pairs); here every (model or pair, server type, configuration, tier) they
produce is a column of one integer program, solved with ``scipy.optimize.milp`` (HiGHS)::

    min  Σ_h price_h · r_h  +  ε · Σ_k power_k · x_k  +  M · Σ_m s_m
    s.t. Σ_k qps[k, m] / peak_m · x_k + s_m >= 1          every model m (capacity >= peak)
         Σ_{k on h} servers_k · x_k - r_h <= owned_h      every type h (owned first: they cost 0 $/hr)
         0 <= r_h <= rentable_h,  x_k integer (shard blocks 0/1),  s_m >= 0

so the instance mix under the budget (Kairos' question), the server counts (Hercules' provisioning), which
tables go to SSD, which models are sharded and which share a server interact in one solve: a model tiered to
SSD fits a cheaper type, a pair fills a server one model would leave half idle.  ``s_m`` (shortfall) is
non-zero only when the servers cannot carry a model's peak; a plan costing more than the budget says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from recserve.errors import InfeasibleError
from recserve.planners.fleet_candidates import Column, columns
from recserve.planners.fleet_spec import FleetSpec
from recserve.planners.plan import Plan, format_table, register_plan

EPS_PER_W = 1e-6      # $/hr per provisioned W: only breaks ties (fewer, lower-power owned servers)
TIME_LIMIT_S = 20.0
MIP_GAP = 1e-8  # relative: below the power tie-break's share of a plan's cost, so HiGHS resolves the tie


@dataclass
class FleetGroup:
    """``count`` identical units of one column: what they run, on what, and why."""

    kind: str
    server: str
    count: int
    servers: int                    # servers in all (count x servers per unit)
    qps: dict[str, float]           # per unit
    tier: dict[str, str]
    config: str
    why: str
    alloc: dict[str, dict[str, Any]] = field(default_factory=dict)   # model -> node-config fields per unit

    def __post_init__(self) -> None:
        """A group a hand-edited plan file holds is one deploy can carry out, or the file is refused naming it."""
        if self.kind not in GROUP_KINDS:
            raise ValueError(f"kind must be one of {list(GROUP_KINDS)}, got {self.kind!r}")
        for name, value in (("count", self.count), ("servers", self.servers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")
        if not self.qps:
            raise ValueError("qps must name the models the group serves")
        for model, fields in self.alloc.items():
            if model not in self.qps:
                raise ValueError(f"alloc names {model!r}, which the group does not serve ({list(self.qps)})")
            for key, low in ALLOC_COUNTS.items():
                value = fields.get(key)  # unset or null: the node's default
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                    raise ValueError(f"alloc[{model!r}].{key} must be a whole number >= {low}, got {value!r}")


GROUP_KINDS = ("single", "pair", "shards")  # the columns ``fleet_candidates`` makes
ALLOC_COUNTS = {"workers": 1, "threads": 1, "sparse_workers": 0, "ways": 0, "batch": 1}  # least value of each


@register_plan
@dataclass
class FleetPlan(Plan):
    kind: ClassVar[str] = "fleet"
    planner: str = "fleet"
    groups: list[FleetGroup] = field(default_factory=list)
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    feasible: bool = True
    within_budget: bool = True
    steps: list[dict[str, Any]] = field(default_factory=list)   # per trace step: servers kept, rented, $/hr

    @property
    def cost_per_hr(self) -> float:
        return float(self.summary.get("cost_per_hr", 0.0))

    def table(self) -> str:
        rows = [[g.count, g.kind, g.server, " + ".join(f"{m}{' (ssd)' if g.tier.get(m) == 'ssd' else ''}"
                                                      for m in g.qps),
                 " / ".join(f"{q:,.1f}" for q in g.qps.values()), g.servers, g.config] for g in self.groups]
        out = [format_table(["units", "kind", "server", "models", "QPS per unit", "servers", "configuration"], rows)]
        out.append(format_table(["server type", "owned used", "rented", "$/hr each", "$/hr"],
                                [[t, v["owned_used"], v["rented"], v["price"], v["cost_per_hr"]]
                                 for t, v in self.types.items()]))
        out.append(format_table(["model", "peak QPS", "capacity QPS", "SLA", "predicted SLA attainment"],
                                [[m, v["peak_qps"], v["capacity_qps"], f"{v['sla_ms']:g} ms p{v['percentile']:g}",
                                  f"{100 * v['attainment']:.0f}%"] for m, v in self.models.items()]))
        s = self.summary
        budget = s.get("budget")
        out.append(f"cost ${s['cost_per_hr']:.3f}/hr" + (f" of a ${budget:g}/hr budget" if budget is not None else "")
                   + f"; {s['servers']} servers ({s['owned_used']} owned, {s['rented']} rented), "
                   f"{s['power_w']:,.0f} W provisioned")
        if self.steps:
            out.append(f"over the traces ({len(self.steps)} steps), keeping only the servers each step needs: "
                       f"{s['avg_servers_over_trace']:.1f} servers and ${s['avg_cost_per_hr_over_trace']:.3f}/hr on "
                       f"average (min {min(x['servers'] for x in self.steps)}, max "
                       f"{max(x['servers'] for x in self.steps)} servers)")
        if not self.feasible:
            out.append("CANNOT serve every peak with these servers: see the attainment column")
        elif not self.within_budget:
            out.append(f"CANNOT stay within the budget: the cheapest plan costs ${s['cost_per_hr']:.3f}/hr")
        out.append("why:\n" + "\n".join(f"  {g.count} x {g.server}: {g.why}" for g in self.groups))
        extra = self.baseline_table()
        return "\n\n".join(out) + ("\n\n" + extra if extra else "")


def solve(fleet: FleetSpec, cols: list[Column], time_limit_s: float = TIME_LIMIT_S,
          demand: np.ndarray | None = None, most: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                                 np.ndarray, dict]:
    """(units per column, rented per type, shortfall per model, solver info) of the min-cost cover of ``demand``
    (default: every model's peak), with at most ``most[k]`` units of column k if given."""
    models = [m.name for m in fleet.models]
    types = list(fleet.servers)
    K, M, H = len(cols), len(models), len(types)
    n = K + H + M
    peak = np.array([m.peak_qps for m in fleet.models]) if demand is None else np.asarray(demand, dtype=float)
    peak = np.maximum(peak, 1e-9)
    power = np.array([fleet.servers[c.server].power_w or 0.0 for c in cols]) * np.array([c.servers for c in cols])
    price = np.array([fleet.price(t) for t in types])
    big = 1e3 * (1.0 + float((price * np.array([fleet.available(t) for t in types])).sum()))
    c = np.concatenate([EPS_PER_W * power, price, np.full(M, big)])
    cover = np.zeros((M, n))
    for k, col in enumerate(cols):
        for m, q in col.qps.items():
            cover[models.index(m), k] = q / peak[models.index(m)]
    cover[:, K + H:] = np.eye(M)
    use = np.zeros((H, n))
    for k, col in enumerate(cols):
        use[types.index(col.server), k] = col.servers
    use[:, K:K + H] = -np.eye(H)
    owned = np.array([fleet.owned.get(t, 0) for t in types], dtype=float)
    rent_max = np.array([fleet.rentable[t].max if t in fleet.rentable else 0 for t in types], dtype=float)
    upper = np.array([1.0 if col.block else fleet.available(col.server) // col.servers for col in cols], dtype=float)
    if most is not None:
        upper = np.minimum(upper, most)
    # a demand beyond every server's capacity together is solved as that capacity (and its shortfall said against
    # the real one): covered as a share of a far larger peak, each server counts too little for its price, or its
    # coefficient falls under the solver's tolerance and the plan uses no server at all
    reach = np.maximum(np.array([sum(col.qps.get(m, 0.0) * u for col, u in zip(cols, upper, strict=True))
                                 for m in models]), 1e-9)
    scale = np.minimum(1.0, reach / peak)
    cover[:, :K] /= scale[:, None]
    upper = np.concatenate([upper, rent_max, np.ones(M)])
    integrality = np.concatenate([np.ones(K + H), np.zeros(M)])
    res = milp(c, integrality=integrality, bounds=Bounds(np.zeros(n), upper),
               constraints=[LinearConstraint(cover, np.ones(M), np.inf), LinearConstraint(use, -np.inf, owned)],
               options={"time_limit": time_limit_s, "mip_rel_gap": MIP_GAP})
    if res.x is None:
        raise InfeasibleError(f"fleet ILP found no solution: {res.message}")
    x = res.x
    info = {"status": int(res.status), "gap": float(getattr(res, "mip_gap", 0.0) or 0.0), "columns": K,
            "message": str(res.message)}
    short = 1.0 - (1.0 - np.clip(x[K + H:], 0.0, 1.0)) * scale  # of the real demand
    return np.rint(x[:K]).astype(int), np.rint(x[K:K + H]).astype(int), np.maximum(short, 0.0), info


def corrected(cols: list[Column], corrections: dict[str, float]) -> list[Column]:
    """``cols`` with each model's QPS per unit multiplied by its measured correction (measured / predicted max
    load); a pair's models are corrected each by its own factor."""
    if not corrections:
        return cols
    return [replace(c, qps={m: q * corrections.get(m, 1.0) for m, q in c.qps.items()}) for c in cols]


def plan_fleet(fleet: FleetSpec, perfmodel: Any = None, progress: Callable[[str], None] | None = None,
               pairs: bool = True, shards: bool = True, baselines: bool = False,
               corrections: dict[str, float] | None = None) -> FleetPlan:
    """The joint plan of ``fleet``; ``baselines`` also runs each single planner alone and the sequential chain.

    ``corrections`` (model -> measured / predicted max load, from ``recserve verify``) scale every option's
    capacity for that model before the ILP: the measured Profile correction of the perfmodel's capacities."""
    from recserve.perfmodel import PerfModel

    pm = perfmodel or PerfModel()
    cols, rejected = columns(fleet, pm, progress, pairs=pairs, shards=shards)
    cols = corrected(cols, corrections or {})
    if progress:
        progress(f"solving the fleet ILP over {len(cols)} candidate columns (HiGHS)")
    x, rented, short, info = solve(fleet, cols)
    plan = _assemble(fleet, cols, x, rented, short, info, rejected)
    plan.summary["options"] = {"pairs": pairs, "shards": shards}
    if corrections:
        plan.summary["capacity_corrections"] = dict(corrections)
        plan.notes.insert(1, "capacities corrected by measurement (measured / predicted max load, `recserve "
                             "verify --replan`): " + ", ".join(f"{m} x{f:.3f}" for m, f in corrections.items()))
    plan.notes += _trace_notes(fleet, plan.feasible)
    if any(m.trace for m in fleet.models) and plan.feasible:
        plan.steps = hourly_steps(fleet, cols, x)
        plan.summary["avg_cost_per_hr_over_trace"] = float(np.mean([s["cost_per_hr"] for s in plan.steps]))
        plan.summary["avg_servers_over_trace"] = float(np.mean([s["servers"] for s in plan.steps]))
    if baselines:
        from recserve.planners.fleet_baselines import run_baselines

        plan.baselines = run_baselines(fleet, pm, progress)
        best = min((b["cost_per_hr"] for b in plan.baselines.values() if b.get("feasible")), default=None)
        if best is not None and plan.feasible:
            plan.summary["saving_vs_best_single"] = 1 - plan.cost_per_hr / best if best > 0 else 0.0
    return plan


def _trace_notes(fleet: FleetSpec, feasible: bool) -> list[str]:
    """What the plan does with the traces that a reader would otherwise not know: shorter ones repeated to the
    longest; none provisioned step by step when the peak itself cannot be served."""
    traced = [m for m in fleet.models if m.trace]
    if not traced:
        return []
    steps = max(len(m.trace) for m in traced)
    notes = [f"{m.name}'s trace of {len(m.trace)} steps is repeated to fill the longest trace's {steps} steps"
             for m in traced if len(m.trace) < steps]
    if not feasible:
        notes.append("no step-by-step provisioning over the traces: the servers cannot carry the peak")
    return notes


def hourly_steps(fleet: FleetSpec, cols: list[Column], peak_units: np.ndarray) -> list[dict[str, Any]]:
    """Hercules' provisioning over the traces: at each step, the cheapest subset of the peak plan's servers that
    carries that step's load (a model without a trace stays at its peak); renting by the step costs the mean."""
    steps = max(len(m.trace) for m in fleet.models)
    out = []
    for t in range(steps):
        demand = np.array([m.trace[t % len(m.trace)] if m.trace else m.peak_qps for m in fleet.models])
        x, rented, short, _ = solve(fleet, cols, demand=demand, most=peak_units.astype(float))
        types = list(fleet.servers)
        out.append({"step": t, "load": {m.name: float(d) for m, d in zip(fleet.models, demand, strict=True)},
                    "servers": int(sum(c.servers * n for c, n in zip(cols, x, strict=True))),
                    "rented": {h: int(r) for h, r in zip(types, rented, strict=True) if r},
                    "cost_per_hr": float(sum(fleet.price(h) * r for h, r in zip(types, rented, strict=True))),
                    "short": {m.name: float(v) for m, v in zip(fleet.models, short, strict=True) if v > 1e-6}})
    return out


def _assemble(fleet: FleetSpec, cols: list[Column], x: np.ndarray, rented: np.ndarray, short: np.ndarray,
              info: dict, rejected: list[str]) -> FleetPlan:
    types = list(fleet.servers)
    groups = [FleetGroup(c.kind, c.server, int(n), int(n * c.servers), dict(c.qps), dict(c.tier), c.config, c.why,
                         dict(c.alloc))
              for c, n in zip(cols, x, strict=True) if n > 0]
    groups.sort(key=lambda g: (g.server, g.kind, list(g.qps)))
    used = {t: sum(g.servers for g in groups if g.server == t) for t in types}
    type_rows = {}
    for j, t in enumerate(types):
        owned_used = min(used[t], fleet.owned.get(t, 0))
        type_rows[t] = {"owned_used": owned_used, "rented": int(rented[j]), "price": fleet.price(t),
                        "cost_per_hr": fleet.price(t) * int(rented[j]),
                        "power_w": (fleet.servers[t].power_w or 0.0) * used[t]}
    models = {}
    for m in fleet.models:
        cap = sum(g.count * g.qps.get(m.name, 0.0) for g in groups)
        models[m.name] = {"peak_qps": m.peak_qps, "capacity_qps": cap, "sla_ms": m.sla.target_ms,
                          "percentile": m.sla.percentile, "attainment": min(1.0, cap / m.peak_qps),
                          "headroom": cap / m.peak_qps - 1.0,
                          "tier": sorted({g.tier[m.name] for g in groups if m.name in g.tier}),
                          "served_by": [f"{g.count} x {g.kind} on {g.server}" for g in groups if m.name in g.qps]}
    feasible = all(v["capacity_qps"] >= v["peak_qps"] * (1 - 1e-6) for v in models.values())
    cost = float(sum(v["cost_per_hr"] for v in type_rows.values()))
    within = fleet.budget is None or cost <= fleet.budget + 1e-9
    summary = {"cost_per_hr": cost, "budget": fleet.budget, "servers": sum(used.values()),
               "owned_used": sum(v["owned_used"] for v in type_rows.values()),
               "rented": int(rented.sum()), "power_w": sum(v["power_w"] for v in type_rows.values()),
               "models_at_sla": sum(1 for v in models.values() if v["attainment"] >= 1 - 1e-6),
               "models": len(models), "ilp_columns": info["columns"], "ilp_gap": info["gap"]}
    notes = ["capacities are the perfmodel's max load within each model's SLA percentile (Profile tables, no "
             "measurement); predicted SLA attainment = min(1, capacity / peak)",
             "owned servers cost 0 $/hr; among equal-cost plans the ILP prefers less provisioned power",
             *(f"not a candidate: {r}" for r in rejected[:40])]
    if len(rejected) > 40:
        notes.append(f"... and {len(rejected) - 40} more options left out")
    if not feasible:
        notes.append("short of peak: " + ", ".join(f"{m.name} by {100 * s:.0f}%" for m, s in zip(fleet.models, short,
                                                                                            strict=True) if s > 1e-6))
    return FleetPlan(inputs=fleet.to_dict(), summary=summary, groups=groups, types=type_rows, models=models,
                     feasible=feasible, within_budget=within, notes=notes)


def spec_of(plan: FleetPlan) -> FleetSpec:
    """The fleet spec a plan was made from (its ``inputs``), validated again."""
    from recserve.planners.fleet_spec import parse_fleet

    data = {k: v for k, v in plan.inputs.items() if k != "source"}
    models = {}
    for name, raw in (data.get("models") or {}).items():
        models[name] = {k: v for k, v in raw.items() if not (k == "peak_qps" and "trace" in raw)}
    data["models"] = models
    return parse_fleet(data, str(plan.inputs.get("source") or "the plan's inputs"))


def refit_corrections(plan: FleetPlan, measured: dict[str, float], predicted: dict[str, float],
                      threshold: float = 0.2) -> tuple[dict[str, float], dict[str, float]]:
    """(corrections for the next plan, the models that disagree and by what ratio): a model whose measured max load
    differs from the plan's prediction by more than ``threshold`` (relative) gets its correction multiplied by
    measured / predicted; the others keep the plan's own (1 if none).  Nothing disagreeing: no replan needed."""
    before = dict(plan.summary.get("capacity_corrections") or {})
    after = dict(before)
    off: dict[str, float] = {}
    for m, q in measured.items():
        p = predicted.get(m, 0.0)
        if p <= 0:
            continue
        ratio = q / p
        if abs(ratio - 1.0) > threshold:
            off[m] = ratio
            after[m] = before.get(m, 1.0) * max(ratio, 1e-3)
    return after, off


def replan(plan: FleetPlan, corrections: dict[str, float], progress: Callable[[str], None] | None = None,
           perfmodel: Any = None) -> FleetPlan:
    """The plan again from its own inputs and options (``--no-pairs``/``--no-shards``), every option's capacity for a
    corrected model scaled by its factor."""
    options = plan.summary.get("options") or {}
    return plan_fleet(spec_of(plan), perfmodel=perfmodel, progress=progress, corrections=corrections,
                      pairs=options.get("pairs", True), shards=options.get("shards", True))


def plan_changes(old: FleetPlan, new: FleetPlan) -> list[str]:
    """What a replan changed: each model's capacity and servers, the groups, the cost."""
    out = []
    for m, v in new.models.items():
        o = old.models.get(m, {})
        was, now = o.get("served_by", []), v["served_by"]
        out.append(f"{m}: capacity {o.get('capacity_qps', 0.0):,.1f} -> {v['capacity_qps']:,.1f} QPS (peak "
                   f"{v['peak_qps']:,.1f}); " + ("servers unchanged: " + ", ".join(now) if was == now else
                                                 f"servers {', '.join(was) or 'none'} -> {', '.join(now) or 'none'}"))
    out.append(f"cost ${old.cost_per_hr:.3f}/hr -> ${new.cost_per_hr:.3f}/hr; servers {old.summary.get('servers')} -> "
               f"{new.summary.get('servers')}; feasible {old.feasible} -> {new.feasible}")
    return out
