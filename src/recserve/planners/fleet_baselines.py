"""What a user gets today for the fleet question: each single-paper planner applied alone as its paper defines it,
and the planners chained one after another (each stage fixes its decision before the next).  Every baseline
prices its servers the same way as the fleet plan: owned servers 0 $/hr, rented ones at their price, and a
plan needing more servers of a type than owned + rentable, or leaving a model's peak unserved, is infeasible.

- ``hercules``: node search per (model, type), then Hercules' cluster provisioning ILP (min provisioned power,
  Eq. 1-3) over every available server, all tables in DRAM.
- ``kairos``: per model, the smallest budget (bisection, 14 steps) whose Kairos pool (``plan_pool``: Eq. 9-15 upper
  bound, its one-shot pick) carries the peak; instances serve one query at a time (the paper's latency-table
  instance); owned servers priced ~0 and handed out model by model.
- ``hera``: Hera's cluster schedule (Alg. 2) on one CPU server type, the best type.
- ``elasticrec``: every model sharded and its replicas packed (first fit) on one server type, the best type.
- ``sdm``: one server type, each model on SDM's DRAM host or SSD-tiered host (whichever serves more), the best type.
- ``sequential``: SDM tiers (only models no type's DRAM holds) -> ElasticRec shards (models still placeless) ->
  Hercules-searched configurations -> the cheapest instance mix for that (one ILP, no pairs) -> Hera pairs within
  each type's servers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.planners.fleet_candidates import (
    Column,
    hera_profiles,
    hercules_capacity,
    query_batch,
    sdm_capacity,
    shard_columns,
    single_columns,
)
from recserve.planners.fleet_spec import FleetSpec

OWNED_PRICE = 1e-6  # Kairos divides by prices: an owned server is (almost) free


def _cost(fleet: FleetSpec, counts: dict[str, int]) -> tuple[float, bool, str]:
    """($/hr, feasible, why not) of using ``counts`` servers per type."""
    cost = 0.0
    for h, n in counts.items():
        if n > fleet.available(h):
            return math.inf, False, f"needs {n} {h}, only {fleet.available(h)} available"
        cost += max(0, n - fleet.owned.get(h, 0)) * fleet.price(h)
    return cost, True, ""


def _result(fleet: FleetSpec, counts: dict[str, int], note: str = "") -> dict[str, Any]:
    cost, ok, why = _cost(fleet, counts)
    return {"cost_per_hr": cost if ok else None, "feasible": ok, "servers": int(sum(counts.values())),
            "counts": {h: int(n) for h, n in counts.items() if n}, "note": why or note}


def _fail(why: str) -> dict[str, Any]:
    return {"cost_per_hr": None, "feasible": False, "servers": None, "counts": {}, "note": why}


def _best(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ok = {h: r for h, r in results.items() if r["feasible"]}
    if not ok:
        return _fail("; ".join(f"{h}: {r['note']}" for h, r in results.items())[:400] or "no server type")
    h = min(ok, key=lambda k: (ok[k]["cost_per_hr"], ok[k]["servers"]))
    return {**ok[h], "note": f"best single type {h}"}


def _types(fleet: FleetSpec) -> list[str]:
    return [h for h in fleet.servers if fleet.available(h) > 0]


def hercules_alone(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    from recserve.planners.hercules.provision import Efficiency, solve_ilp

    types = _types(fleet)
    qps = np.array([[hercules_capacity(m.spec, fleet.servers[h], pm)[0] for h in types] for m in fleet.models])
    power = np.array([[fleet.servers[h].power_w or 1.0 for h in types] for _ in fleet.models])
    for i, m in enumerate(fleet.models):
        if not (qps[i] > 0).any():
            return _fail(f"{m.name} meets its SLA in DRAM on no available type")
    eff = Efficiency([m.name for m in fleet.models], types, qps, power)
    try:
        x = solve_ilp(eff, np.array([m.peak_qps for m in fleet.models]), np.array([fleet.available(h) for h in types]))
    except RecserveError as exc:
        return _fail(str(exc).splitlines()[0])
    return _result(fleet, {h: int(x[:, j].sum()) for j, h in enumerate(types)}, "min provisioned power (Eq. 1-3)")


def kairos_alone(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    from recserve.planners.kairos import plan_pool, production_size_mix, type_stats
    from recserve.profiles import ProfileSet

    types = _types(fleet)
    profiles = ProfileSet()
    for h in types:
        for t in hera_profiles([m.spec for m in fleet.models], fleet.servers[h], pm):
            profiles.add(t)
    sizes, pmf = production_size_mix()
    owned_left = {h: fleet.owned.get(h, 0) for h in types}
    rent_left = {h: fleet.rentable[h].max if h in fleet.rentable else 0 for h in types}
    counts = dict.fromkeys(types, 0)
    for m in fleet.models:
        # one price per type in Kairos: a type's owned servers while any are left, then its rentable ones
        prices = {h: OWNED_PRICE if owned_left[h] else fleet.price(h) for h in types}
        caps = {h: owned_left[h] or rent_left[h] for h in types}
        usable = [h for h in types if caps[h] > 0]
        try:  # the base type (meets QoS for every query size) exists, or Kairos has no pool for this model
            type_stats(profiles, m.name, m.sla.target_ms, prices, caps, sizes, pmf, "mean", usable)
        except RecserveError as exc:
            return _fail(f"{m.name}: {str(exc).splitlines()[0]}")
        top = sum(prices[h] * caps[h] for h in usable)

        def pick(budget: float, m=m, prices=prices, caps=caps, usable=usable):  # noqa: ANN202 - local helper
            try:
                return plan_pool(profiles, [m.name], budget, prices, {m.name: m.sla.target_ms}, caps,
                                 size_mix=(sizes, pmf), types=usable).pools[0]
            except RecserveError:
                return None

        full = pick(top)
        if full is None or full.upper_bound_qps < m.peak_qps:
            return _fail(f"{m.name}: Kairos' pool with every available instance bounds "
                         f"{0 if full is None else full.upper_bound_qps:,.0f} QPS < peak {m.peak_qps:,.0f}")
        lo, hi, best = 0.0, top, full
        for _ in range(14):
            mid = (lo + hi) / 2
            choice = pick(mid)
            if choice is not None and choice.upper_bound_qps >= m.peak_qps:
                hi, best = mid, choice
            else:
                lo = mid
        for h, n in best.config.items():
            if owned_left[h]:
                owned_left[h] -= n
            else:
                rent_left[h] -= n
            counts[h] += n
    return _result(fleet, counts, "per model, the cheapest Kairos pick whose upper bound carries the peak")


def hera_alone(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    from recserve.planners.hera import plan_colocation

    out = {}
    for h in _types(fleet):
        server = fleet.servers[h]
        if server.accelerator or server.llc_ways < 2:
            continue
        try:
            plan = plan_colocation(hera_profiles([m.spec for m in fleet.models], server, pm), server,
                                   {m.name: m.peak_qps for m in fleet.models}, baselines=())
        except RecserveError as exc:
            out[h] = _fail(str(exc).splitlines()[0])
            continue
        out[h] = _result(fleet, {h: int(plan.summary["servers"])})
    return _best(out)


def elasticrec_alone(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    from recserve.planners.elasticrec import cost_model_from_perfmodel, pack_servers, plan_replicas, plan_shards

    out = {}
    for h in _types(fleet):
        server = fleet.servers[h]
        replicas = []
        try:
            for m in fleet.models:
                cost = cost_model_from_perfmodel(m.spec, server, query_batch(), pm)
                plan = plan_shards(m.spec, m.peak_qps, cost, batch=query_batch())
                replicas += plan_replicas(plan, m.spec, cost)[0]
            out[h] = _result(fleet, {h: pack_servers(replicas, server)})
        except RecserveError as exc:
            out[h] = _fail(str(exc).splitlines()[0])
    return _best(out)


def sdm_alone(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    from recserve.planners.sdm import dram_host_qps

    out = {}
    for h in _types(fleet):
        server = fleet.servers[h]
        hosts = 0
        why = ""
        for m in fleet.models:
            q = dram_host_qps(m.spec, server, query_batch(), pm)[0]
            if fleet.ssd and server.ssd is not None:
                q = max(q, sdm_capacity(m.spec, server, pm)[0])
            if q <= 0:
                why = f"{m.name} serves no QPS within its SLA on {h}"
                break
            hosts += int(math.ceil(m.peak_qps / q - 1e-9))
        out[h] = _fail(why) if why else _result(fleet, {h: hosts})
    return _best(out)


def sequential(fleet: FleetSpec, pm: Any) -> dict[str, Any]:
    """Each stage fixes its decision before the next; see the module docstring."""
    from recserve.planners.fleet import solve

    types = _types(fleet)
    cols, stages, failed = _tier_then_shard_columns(fleet, pm, types)
    if failed:
        return _fail(failed)
    x, rented, short, _ = solve(fleet, cols)
    if (short > 1e-6).any():
        return _fail("the servers cannot carry every peak")
    counts = {h: 0 for h in fleet.servers}
    for c, n in zip(cols, x, strict=True):
        counts[c.server] += int(n) * c.servers
    for h in types:  # Hera: consolidate each CPU type's single-model servers into pairs where that takes fewer
        saved = _hera_pairs_saving(fleet, pm, h, cols, x)
        if saved is not None:
            singles, paired = saved
            counts[h] -= singles - paired
            stages.append(f"Hera pairs on {h}: {singles} -> {paired} servers")
    return _result(fleet, counts, "; ".join(stages) or "all in DRAM, no pairs saved a server")


def _tier_then_shard_columns(fleet: FleetSpec, pm: Any, types: list[str]) -> tuple[list[Column], list[str], str]:
    """Each model's columns, stage by stage: DRAM where some type holds it (SDM), else the SSD tier, else
    ElasticRec's shard blocks; the stages taken, and why none could be ("" when every model has columns)."""
    cols: list[Column] = []
    rejected: list[str] = []
    stages = []
    for m in fleet.models:
        per_type = {h: single_columns(m, fleet.servers[h], fleet, pm, rejected) for h in types}
        fits = any(c.tier[m.name] == "dram" for cs in per_type.values() for c in cs)
        if fits:  # SDM: a model some type's DRAM holds stays in DRAM
            cols += [c for cs in per_type.values() for c in cs if c.tier[m.name] == "dram"]
            continue
        tiered = [c for cs in per_type.values() for c in cs if c.tier[m.name] == "ssd"]
        if tiered:
            stages.append(f"{m.name}: SSD tier")
            cols += tiered
            continue
        blocks = [c for h in types for c in shard_columns(m, fleet.servers[h], pm, rejected)]
        if not blocks:
            return cols, stages, f"{m.name}: fits no type in DRAM or SSD, and no shard plan holds its SLA"
        stages.append(f"{m.name}: ElasticRec shards")
        cols += blocks
    return cols, stages, ""


def _hera_pairs_saving(fleet: FleetSpec, pm: Any, h: str, cols: list[Column],
                       x: Any) -> tuple[int, int] | None:
    """(single-model DRAM servers of type ``h``, the servers Hera's pairs need for their load) where the pairs need
    fewer; None where they do not, or ``h`` cannot co-locate (an accelerator, no LLC ways to split, one model)."""
    from recserve.planners.hera import plan_colocation

    server = fleet.servers[h]
    load: dict[str, float] = {}
    for c, n in zip(cols, x, strict=True):
        if n and c.server == h and c.kind == "single" and all(t == "dram" for t in c.tier.values()):
            for mname, q in c.qps.items():
                load[mname] = load.get(mname, 0.0) + q * n
    singles = sum(int(n) for c, n in zip(cols, x, strict=True) if c.server == h and c.kind == "single"
                  and all(t == "dram" for t in c.tier.values()))
    if len(load) < 2 or server.accelerator or server.llc_ways < 2:
        return None
    peaks = {m.name: m.peak_qps for m in fleet.models}
    total = {mname: sum(c.qps.get(mname, 0.0) * n for c, n in zip(cols, x, strict=True)) for mname in load}
    targets = {mname: peaks[mname] * q / total[mname] for mname, q in load.items()}  # h's share of the peak
    try:
        plan = plan_colocation(hera_profiles([m.spec for m in fleet.models if m.name in load], server, pm),
                               server, targets, baselines=())
    except RecserveError:
        return None
    paired = int(plan.summary["servers"])
    return (singles, paired) if plan.summary["servers"] < singles else None


BASELINES: dict[str, Callable[[FleetSpec, Any], dict[str, Any]]] = {
    "hercules": hercules_alone, "kairos": kairos_alone, "hera": hera_alone, "elasticrec": elasticrec_alone,
    "sdm": sdm_alone, "sequential": sequential,
}


def run_baselines(fleet: FleetSpec, pm: Any, progress: Callable[[str], None] | None = None,
                  names: tuple[str, ...] = tuple(BASELINES)) -> dict[str, dict[str, Any]]:
    out = {}
    for name in names:
        if progress:
            progress(f"baseline: {name}")
        try:
            out[name] = BASELINES[name](fleet, pm)
        except RecserveError as exc:
            out[name] = _fail(str(exc).splitlines()[0])
    return out
