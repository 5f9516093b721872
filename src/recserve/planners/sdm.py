"""Tier placement (Software Defined Memory §2.2, §4.6): which tables live in DRAM (FM), which on SSD (SM)
behind the unified row cache, and what that asks of the SSD.

Equations (SDM):

- Eq. 1–2, bandwidth need of table t:  ``BW_t = QPS × B_side(t) × P_t × row_bytes_t`` with ``B_user = 1`` (a query
  is one user) and ``B_item`` = candidate items per query.  Item tables need ~B_item× more bandwidth per byte.
- Eq. 8, IOPS required from SM:  ``IOPS = QPS × Σ_{t ∈ SM} B_side(t) × P_t × miss_t``.
- Eq. 3–4, latency budget: the user (SM) lookups of a query run beside the item (FM) lookups and are hidden while
  ``T_user(SM) ≤ T_item(FM)``.  ``T_item`` = item bytes per query ÷ effective DRAM gather bandwidth;
  ``T_user`` = waves of outstanding IOs × loaded SSD latency (``read_latency / (1 − IOPS/IOPS_max)``) + cached rows
  from DRAM.

Hit rates come from a locality model: ``locality`` P = the share of a table's accesses that go to its hottest 10 %
of rows (ElasticRec's P; SDM §4.2 reports power-law skew, items more skewed than users).  The unified cache is
filled greedily with the segments (table, hot 10 % | cold 90 %) of highest access rate per byte — what an ideal
shared cache converges to.  The DRAM budget always holds: directly mapped tables + cache slots + the cache's
per-slot index overhead ≤ budget.

Policies (SDM Table 5):

- ``sm-cache``: every table of the SM sides (default: user) on SSD; all the rest of DRAM is row cache.
- ``fixed-fm``: a fixed share of the budget maps tables to DRAM directly, highest bandwidth need per byte first
  (Eq. 2); the rest go to SM; the remainder of the budget is cache.
- ``per-table-cache``: like ``sm-cache``, but tables whose predicted hit rate is below ``min_hit`` skip the cache
  (low temporal locality; saves the lookup overhead) and their share goes to the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from recserve.embedding.row_index import slot_overhead_bytes
from recserve.errors import InfeasibleError, SpecError
from recserve.planners.plan import Plan, format_table, register_plan
from recserve.specs import ModelSpec, ServerType, SSDSpec, TableSpec

POLICIES = ("sm-cache", "fixed-fm", "per-table-cache")
SIDES = ("user", "item")
HOT_FRACTION = 0.10
# bytes beside a cached row (RowCache.dram_bytes per slot): its key, CLOCK's bit, the native index's entry (the index an
# install builds; where it is not built the node's dict index takes ~114 B instead, and a plan overstates its cache)
CACHE_OVERHEAD_PER_SLOT = slot_overhead_bytes("clock", "native")
DEFAULT_SSD = SSDSpec(iops=500_000, read_latency_us=100, capacity_gb=2000, kind="nand")  # SDM Table 1 NAND
GATHER_EFFICIENCY = 0.25  # random row gathers reach about a quarter of peak DRAM bandwidth (assumption)


@dataclass
class TablePlacement:
    table: str
    side: str
    tier: str  # "FM" | "SM"
    bytes: int
    bw_gbs: float  # Eq. 2
    cache: bool
    hit_rate: float
    iops: float  # Eq. 8 share


@register_plan
@dataclass
class TierPlan(Plan):
    kind: ClassVar[str] = "tier"
    tables: list[TablePlacement] = field(default_factory=list)

    def table(self) -> str:
        groups: dict[tuple, list[TablePlacement]] = {}
        for t in self.tables:
            key = (t.side, t.tier, t.cache, round(t.hit_rate, 3), t.bytes, round(t.bw_gbs, 6))
            groups.setdefault(key, []).append(t)
        rows = []
        for (side, tier, cache, hit, size, bw), members in groups.items():
            names = members[0].table + (f" (+{len(members) - 1})" if len(members) > 1 else "")
            rows.append([names, side, tier, "on" if cache and tier == "SM" else "-", size / 1e9, bw * len(members),
                         f"{100 * hit:.1f}%" if tier == "SM" else "-",
                         sum(m.iops for m in members)])
        out = format_table(["tables", "side", "tier", "cache", "GB each", "BW GB/s (all)", "hit", "IOPS"], rows)
        summary = format_table(["metric", "value"], [[k, v] for k, v in self.summary.items()])
        extra = self.baseline_table()
        return out + "\n\n" + summary + ("\n\n" + extra if extra else "")


def side_batch(table: TableSpec, item_batch: int) -> int:
    return 1 if table.side == "user" else item_batch


def bandwidth_need(spec: ModelSpec, table: TableSpec, qps: float, item_batch: int) -> float:
    """Eq. 2 for one table, bytes/s."""
    return qps * side_batch(table, item_batch) * table.pooling * table.row_bytes(spec.bytes_per_elem)


def _hit_rates(spec: ModelSpec, sm: list[int], cached: set[int], cache_bytes: float, qps: float,
               item_batch: int, locality: dict[str, float]) -> dict[int, float]:
    """Greedy ideal unified-cache fill by access rate per byte over (table, hot|cold) segments."""
    segments = []
    for t in sm:
        if t not in cached:
            continue
        tab = spec.tables[t]
        rate = qps * side_batch(tab, item_batch) * tab.pooling
        p = locality[tab.side]
        slot = tab.row_bytes(spec.bytes_per_elem) + CACHE_OVERHEAD_PER_SLOT
        for frac, share in ((HOT_FRACTION, p), (1 - HOT_FRACTION, 1 - p)):
            rows = tab.rows * frac
            segments.append((rate * share / rows / slot, t, rows, share, slot))
    segments.sort(key=lambda s: -s[0])
    hit = {t: 0.0 for t in sm}
    left = cache_bytes
    for _, t, rows, share, slot in segments:
        if left <= 0:
            break
        take = min(rows, left / slot)
        hit[t] += share * take / rows
        left -= take * slot
    return hit


def plan_tier(spec: ModelSpec, dram_gb: float, qps: float, *, item_batch: int = 100, policy: str = "sm-cache",
              server: ServerType | None = None, sm_sides: tuple[str, ...] = ("user",),
              locality_user: float = 0.9, locality_item: float = 0.95, fm_fraction: float = 0.5,
              min_hit: float = 0.05, queue_depth: int = 32, tables_in_flight: int = 4,
              simulated_hit: float | None = None) -> TierPlan:
    """Place ``spec``'s tables under a DRAM budget of ``dram_gb`` (for embeddings) at ``qps`` queries/s.

    ``simulated_hit`` replaces the ideal-fill hit rate of every cached SM table by one measured on an index
    trace (``sim.cache.simulate_tier_hits``)."""
    _check_inputs(policy, dram_gb, qps, item_batch, queue_depth, {"fm_fraction": fm_fraction, "min_hit": min_hit})
    _check_locality(sm_sides, {"locality_user": locality_user, "locality_item": locality_item})
    ssd = server.ssd if server is not None and server.ssd is not None else DEFAULT_SSD
    mem_bw = (server.mem_bw_gbs if server is not None else 50.0) * 1e9
    budget = dram_gb * 1e9
    sizes = [t.bytes(spec.bytes_per_elem) for t in spec.tables]
    bw = [bandwidth_need(spec, t, qps, item_batch) for t in spec.tables]
    fm, sm = _fm_and_sm(spec, policy, dram_gb, fm_fraction, sm_sides, sizes, bw)
    fm_bytes = sum(sizes[i] for i in fm)
    cache_bytes = budget - fm_bytes
    locality = {"user": locality_user, "item": locality_item}
    cached, hit = _cache_hits(spec, policy, sm, cache_bytes, qps, item_batch, locality, min_hit, simulated_hit)
    placements = _placements(spec, sizes, bw, set(sm), cached, hit, qps, item_batch)
    iops_total = sum(p.iops for p in placements)
    sm_bytes = sum(sizes[i] for i in sm)
    summary = {"policy": policy, "dram_budget_gb": dram_gb, "fm_tables": len(fm), "sm_tables": len(sm),
               "fm_direct_gb": fm_bytes / 1e9, "cache_gb": cache_bytes / 1e9, "sm_gb": sm_bytes / 1e9,
               "dram_saved_gb": max(0.0, sum(sizes) / 1e9 - dram_gb) if sm else 0.0,
               **_latency_budget(spec, sm, hit, iops_total, qps, item_batch, ssd, mem_bw,
                                 queue_depth * tables_in_flight)}
    if sm_bytes > ssd.capacity_gb * 1e9:
        summary["feasible"] = False
    notes = _notes(locality, ssd, server, mem_bw, simulated_hit is not None)
    if budget >= sum(sizes):
        notes.append(f"the {dram_gb:g} GB budget holds all {sum(sizes) / 1e9:,.3g} GB of tables: every table stays "
                     "in DRAM, no SSD tier needed, nothing saved")
    if summary["ssd_utilisation"] >= 1:
        notes.append(f"infeasible: {iops_total:,.0f} IOPS required exceeds the SSD's {ssd.iops:,.0f}")
    inputs = {"model": spec.name, "dram_gb": dram_gb, "qps": qps, "item_batch": item_batch, "policy": policy,
              "server": server.name if server is not None else None, "sm_sides": list(sm_sides),
              "locality_user": locality_user, "locality_item": locality_item, "fm_fraction": fm_fraction,
              "min_hit": min_hit, "queue_depth": queue_depth, "tables_in_flight": tables_in_flight,
              "simulated_hit": simulated_hit}
    return TierPlan(planner=f"sdm/{policy}", inputs=inputs, summary=summary, notes=notes, tables=placements)


def _fm_and_sm(spec: ModelSpec, policy: str, dram_gb: float, fm_fraction: float, sm_sides: tuple[str, ...],
               sizes: list[int], bw: list[float]) -> tuple[list[int], list[int]]:
    """Indices of the tables mapped in DRAM (FM) and of those on SSD (SM); InfeasibleError when the FM ones alone
    overflow the budget."""
    budget = dram_gb * 1e9
    if budget >= sum(sizes):  # DRAM holds every table: nothing goes to SSD
        fm, sm = list(range(len(sizes))), []
    else:
        fm, sm = _split(spec, policy, budget * fm_fraction, sm_sides, sizes, bw)
    fm_bytes = sum(sizes[i] for i in fm)
    if fm_bytes > budget:
        raise InfeasibleError(f"{spec.name}: tables kept in DRAM need {fm_bytes / 1e9:,.3g} GB, more than the "
                              f"{dram_gb:g} GB budget; put more sides on SSD (--sm-sides) or raise --dram-gb")
    return fm, sm


def _cache_hits(spec: ModelSpec, policy: str, sm: list[int], cache_bytes: float, qps: float, item_batch: int,
                locality: dict[str, float], min_hit: float,
                simulated_hit: float | None) -> tuple[set[int], dict[int, float]]:
    """The SM tables given row cache (per-table-cache: those whose hit rate reaches ``min_hit``) and every SM
    table's hit rate (the ideal fill's, or ``simulated_hit`` for each cached one)."""
    cached = set(sm)
    hit = _hit_rates(spec, sm, cached, cache_bytes, qps, item_batch, locality)
    if policy == "per-table-cache":
        cached = {i for i in sm if hit[i] >= min_hit}
        hit = _hit_rates(spec, sm, cached, cache_bytes, qps, item_batch, locality)
    if simulated_hit is not None:
        hit = {i: (simulated_hit if i in cached and cache_bytes > 0 else 0.0) for i in sm}
    return cached, hit


def _placements(spec: ModelSpec, sizes: list[int], bw: list[float], on_sm: set[int], cached: set[int],
                hit: dict[int, float], qps: float, item_batch: int) -> list[TablePlacement]:
    """Each table's tier, and for an SM one its cache, hit rate and the SSD reads its misses cost."""
    return [TablePlacement(t.name, t.side, "SM", sizes[i], bw[i] / 1e9, i in cached, hit[i],
                           qps * side_batch(t, item_batch) * t.pooling * (1 - hit[i])) if i in on_sm
            else TablePlacement(t.name, t.side, "FM", sizes[i], bw[i] / 1e9, False, 1.0, 0.0)
            for i, t in enumerate(spec.tables)]


def _check_inputs(policy: str, dram_gb: float, qps: float, item_batch: int, queue_depth: int,
                  shares: dict[str, float]) -> None:
    if policy not in POLICIES:
        raise SpecError(f"policy must be one of {POLICIES}, got {policy!r}")
    if not (0 < dram_gb < math.inf and 0 < qps < math.inf) or item_batch < 1 or queue_depth < 1:
        raise SpecError(f"dram_gb and qps must be finite and > 0, item_batch and queue_depth >= 1; got {dram_gb}, "
                        f"{qps}, {item_batch}, {queue_depth}")
    for name, share in shares.items():
        if not 0 <= share <= 1:
            raise SpecError(f"{name} must be in [0, 1], got {share}")


def _check_locality(sm_sides: tuple[str, ...], localities: dict[str, float]) -> None:
    """SM sides are ``user``/``item``; a locality (the hottest 10 % of rows' share of accesses) below 10 % would
    make the hot rows colder than the rest, which the locality model does not describe."""
    bad = [s for s in sm_sides if s not in SIDES]
    if bad or not sm_sides:
        raise SpecError(f"sm_sides must be {' and/or '.join(SIDES)}, got {list(sm_sides)}")
    for name, share in localities.items():
        if not HOT_FRACTION <= share <= 1:
            raise SpecError(f"{name} must be in [{HOT_FRACTION:g}, 1] (the share of accesses to the hottest "
                            f"{HOT_FRACTION:.0%} of rows; {HOT_FRACTION:g} is uniform), got {share}")


def _split(spec: ModelSpec, policy: str, fm_budget: float, sm_sides: tuple[str, ...], sizes: list[int],
           bw: list[float]) -> tuple[list[int], list[int]]:
    """The tables mapped to DRAM (FM) and those on SSD (SM): ``fixed-fm`` fills ``fm_budget`` with the highest
    bandwidth need per byte first (Eq. 2), the other policies put the ``sm_sides`` on SSD."""
    n = len(spec.tables)
    if policy == "fixed-fm":
        fm, used = [], 0.0
        for i in sorted(range(n), key=lambda i: -bw[i] / sizes[i]):
            if used + sizes[i] <= fm_budget:
                fm.append(i)
                used += sizes[i]
        return fm, [i for i in range(n) if i not in fm]
    sm = [i for i, t in enumerate(spec.tables) if t.side in sm_sides]
    return [i for i in range(n) if i not in sm], sm


def _latency_budget(spec: ModelSpec, sm: list[int], hit: dict[int, float], iops_total: float, qps: float,
                    item_batch: int, ssd: SSDSpec, mem_bw: float, ios_in_flight: int) -> dict[str, Any]:
    """Eq. 3-4 per query: the user (SM) lookups' time against the item (FM) lookups' that hides it, with the SSD
    loaded by Eq. 8's IOPS; ``ios_in_flight`` IOs are outstanding at once (queue depth x tables)."""
    bpe = spec.bytes_per_elem
    utilisation = iops_total / ssd.iops
    loaded_latency_us = ssd.read_latency_us / max(1e-3, 1 - utilisation) if utilisation < 1 else float("inf")
    sm_ios_per_query = iops_total / qps
    waves = -(-sm_ios_per_query // ios_in_flight) if sm_ios_per_query else 0
    sm_hit_bytes = sum(side_batch(spec.tables[i], item_batch) * spec.tables[i].pooling * hit[i]
                       * spec.tables[i].row_bytes(bpe) for i in sm)
    t_user_ms = waves * loaded_latency_us / 1e3 + sm_hit_bytes / (mem_bw * GATHER_EFFICIENCY) * 1e3
    item_bytes = sum(side_batch(t, item_batch) * t.pooling * t.row_bytes(bpe) for t in spec.tables
                     if t.side == "item")
    t_item_ms = item_bytes / (mem_bw * GATHER_EFFICIENCY) * 1e3
    lookups_sm = sum(side_batch(spec.tables[i], item_batch) * spec.tables[i].pooling for i in sm)
    exposed = max(0.0, t_user_ms - t_item_ms)
    return {"hit_rate": (1 - sm_ios_per_query / lookups_sm) if lookups_sm else 1.0,
            "required_iops": iops_total, "iops_no_cache": qps * lookups_sm, "ssd_iops": ssd.iops,
            "ssd_utilisation": utilisation, "ssd_loaded_latency_us": loaded_latency_us, "t_user_sm_ms": t_user_ms,
            "t_item_fm_ms": t_item_ms, "latency_exposed_ms": exposed, "sla_ms": spec.sla.target_ms,
            "feasible": utilisation < 1 and exposed < spec.sla.target_ms}


def _notes(locality: dict[str, float], ssd: SSDSpec, server: ServerType | None, mem_bw: float,
           simulated: bool) -> list[str]:
    """The plan's assumptions, stated."""
    return [
        f"locality: top 10% rows take {100 * locality['user']:g}% of user and {100 * locality['item']:g}% of item "
        "accesses",
        f"SSD: {ssd.iops:,.0f} IOPS, {ssd.read_latency_us:g} us, {ssd.capacity_gb:g} GB"
        + ("" if server is not None and server.ssd is not None else " (assumed NAND, SDM Table 1)"),
        f"DRAM gather bandwidth = {GATHER_EFFICIENCY:g} x {mem_bw / 1e9:g} GB/s (assumption)",
        "hit rate: " + ("simulated on an index trace" if simulated else "ideal fill (no trace)"),
        f"cache: {CACHE_OVERHEAD_PER_SLOT:.0f} B per slot beside each row (CLOCK, the native key index; a node "
        "without it indexes rows in a dict, ~114 B: `recserve doctor` says which)",
    ]


def compare_policies(spec: ModelSpec, dram_gb: float, qps: float, **kwargs: Any) -> TierPlan:
    """The chosen policy's plan with the other policies as baselines (for ``--json`` and the table)."""
    chosen = kwargs.pop("policy", "sm-cache")
    plan = plan_tier(spec, dram_gb, qps, policy=chosen, **kwargs)
    keys = ("required_iops", "hit_rate", "ssd_utilisation", "t_user_sm_ms", "latency_exposed_ms", "fm_direct_gb",
            "cache_gb")
    for other in POLICIES:
        if other == chosen:
            continue
        try:
            alt = plan_tier(spec, dram_gb, qps, policy=other, **kwargs)
        except InfeasibleError as exc:
            plan.baselines[f"sdm/{other}"] = {"error": str(exc)}
            continue
        plan.baselines[f"sdm/{other}"] = {k: alt.summary[k] for k in keys}
    return plan


# ------------------------------------------------------------------ Eq. 5-7: hosts and power at fleet scale


@dataclass
class FleetOption:
    """One way to serve a fleet-wide load (SDM Tables 8-9): per-host QPS at the SLA, hosts, total power."""

    name: str
    server: str
    qps_per_host: float
    power_w_per_host: float
    hosts: int
    power_w: float
    limit: str = ""


def fleet(name: str, server: ServerType, total_qps: float, qps_per_host: float, limit: str = "") -> FleetOption:
    """Eq. 5-7: hosts = ceil(total QPS / QPS per host at the target latency); power = hosts x host power."""
    if qps_per_host <= 0:
        raise InfeasibleError(f"{name}: {server.name} serves no QPS within the SLA ({limit})")
    hosts = int(math.ceil(total_qps / qps_per_host - 1e-9))
    return FleetOption(name, server.name, qps_per_host, server.power_w, hosts, hosts * server.power_w, limit)


def dram_host_qps(spec: ModelSpec, server: ServerType, item_batch: int, perfmodel: Any = None) -> tuple[float, str]:
    """Max QPS at the SLA of the all-DRAM host (calibrated perfmodel, one single-core worker per core)."""
    from recserve.perfmodel import Allocation, PerfModel

    pm = perfmodel or PerfModel()
    res = pm.evaluate(spec, server, Allocation(workers=server.cores), sizes=[item_batch], with_latency=False)
    return res.max_qps, res.reason or "compute/bandwidth (perfmodel)"


def sdm_host_qps(spec: ModelSpec, server: ServerType, dram_gb: float, item_batch: int,
                 simulated_hit: float | None = None, perfmodel: Any = None, **tier: Any) -> tuple[float, str]:
    """Max QPS at the SLA of a host whose SM tables sit on its SSD behind the row cache: the perfmodel's
    rate for the model with only the DRAM-resident part of the SM tables (what the cache holds), capped
    by the highest load at which the SSD keeps up and the exposed SM latency stays within the SLA (Eq. 3-4, 8)."""
    from recserve.perfmodel import Allocation, PerfModel

    pm = perfmodel or PerfModel()
    probe = plan_tier(spec, dram_gb, 1.0, item_batch=item_batch, server=server, simulated_hit=simulated_hit, **tier)
    sm_gb = probe.summary["sm_gb"]
    keep = min(1.0, probe.summary["cache_gb"] / sm_gb) if sm_gb else 1.0
    sm_names = {t.table for t in probe.tables if t.tier == "SM"}
    resident = replace(spec, tables=tuple(replace(t, rows=max(1, int(t.rows * keep))) if t.name in sm_names else t
                                          for t in spec.tables))
    cpu = pm.evaluate(resident, server, Allocation(workers=server.cores), sizes=[item_batch], with_latency=False)
    if cpu.max_qps <= 0:
        return 0.0, cpu.reason
    base_ms = pm.latency_ms(resident, server, item_batch, Allocation(workers=server.cores))

    def ok(qps: float) -> bool:
        s = plan_tier(spec, dram_gb, qps, item_batch=item_batch, server=server, simulated_hit=simulated_hit,
                      **tier).summary
        return bool(s["feasible"]) and s["latency_exposed_ms"] + base_ms <= spec.sla.target_ms

    if ok(cpu.max_qps):
        return cpu.max_qps, "compute/bandwidth (perfmodel)"
    lo, hi = 0.0, cpu.max_qps
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, "SSD IOPS / exposed SM latency (Eq. 3-4, 8)"
