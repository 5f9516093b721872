"""Hera (HPCA'23) co-location planner for multi-tenant CPU inference servers.

From four Profile tables per model on one server type (``maxload_vs_workers``, ``maxload_vs_ways``,
``membw_vs_workers`` and, if present, ``footprint``) it derives:

* **worker scalability** (Sec. VI-B): the slope of the normalised max-load curve over the last
  quarter of the cores; a model whose QPS stops growing (memory-bandwidth bound) or cannot spawn
  more workers (memory-capacity bound: no profile row or footprint over the server's DRAM) is *low*.
* the **co-location affinity matrix** (Alg. 1), vectorised: CoAff_LLC is the best way split's mean
  normalised QPS, CoAff_DRAM = min(BW_sys / (BW_A + BW_B), 1) with each model's bandwidth at half
  the cores; affinity = min of the two.
* the **node allocation** of a pair (Sec. VI-C): cores split evenly, a model that cannot use its half
  (it reaches 95 % of its max load with fewer workers, or memory runs out) gives its idle cores to
  the partner; a model needing less than its share keeps only the workers that carry it (the RMU sizes workers
  to traffic, Alg. 3); LLC ways split as the RMU would (Alg. 3, here maximising the pair's EMU); a shared
  memory-bandwidth overload scales both models by BW_sys / (BW_A + BW_B).
* the **cluster schedule** (Alg. 2) for per-model target QPS, and the paper's baselines
  DeepRecSys (one model per server, max workers), Random pairs and Hera(Random).  Two readings of
  Alg. 2 line 9 made explicit: the partner is the highest-affinity high-scalability model *that
  still has unmet target* (else the highest-affinity one), and once no such partner remains a low
  model gets a dedicated server when that serves more of it than a pair would (otherwise a skew
  towards low-scalability models makes Hera use more servers than DeepRecSys).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recserve.errors import InfeasibleError, ProfileError
from recserve.planners.plan import ColocationPlan, Placement, ServerPlan
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ServerType

POLICIES = ("hera", "hera-random", "random", "deeprecsys")


@dataclass
class ModelCurves:
    """One model's profiles on one server type, resampled at every worker count and way count."""

    name: str
    qps: np.ndarray          # [W+1] best max load with <= w workers (0 at w=0), within memory
    ways_ratio: np.ndarray   # [K+1] max load with k ways / with all K ways (clipped to [0, 1])
    membw: np.ndarray        # [W+1] memory bandwidth (GB/s) with w workers
    mem_gb: np.ndarray       # [W+1] DRAM footprint with w workers (0 if unknown)
    feasible_workers: int
    slope: float
    high: bool
    useful_workers: int

    @property
    def isolated_qps(self) -> float:
        return float(self.qps[-1])


def _index(profiles: ProfileSet, server: str) -> dict[tuple[str, str], ProfileTable]:
    """(model, kind) -> table on ``server``; a table without conditions (the whole-server profile)
    wins over per-condition ones such as maxload_vs_ways at a given worker count."""
    out: dict[tuple[str, str], ProfileTable] = {}
    for t in profiles:
        key = (t.model, t.kind)
        if t.server == server and (key not in out or (out[key].conditions and not t.conditions)):
            out[key] = t
    return out


def _resample(table: ProfileTable, y: str, xs: np.ndarray) -> np.ndarray:
    return np.array([table.interp(float(x), y) for x in xs])


def _serves_nothing(table: ProfileTable, model: str, server: str) -> str:
    """Why a model's measured max load is 0 at every worker count: its SLA is missed with no load, or the search
    that measured it stopped before any rate passed (a quick profile's few probes), which says nothing of the SLA."""
    cols = table.columns
    unfinished = [r for r in table.rows if "converged" in cols and not r[cols.index("converged")]]
    if not unfinished:
        return f"model {model!r} misses its SLA even at no load on {server!r}"
    row = unfinished[0]
    unloaded = row[cols.index("unloaded_pctl_ms")] if "unloaded_pctl_ms" in cols else float("nan")
    return (f"model {model!r} on {server!r}: the profile's max-load search at {row[cols.index('workers')]:g} "
            f"worker(s) stopped before any rate met the SLA (its probes spent; unloaded tail {unloaded:.1f} ms), "
            "so it measured no capacity: profile again with more probes (without --quick)")


def model_curves(profiles: ProfileSet | dict, model: str, server: ServerType, threshold: float = 0.5,
                 tail: float = 0.25, knee: float = 0.95) -> ModelCurves:
    """Resample a model's Hera profiles on ``server``; ``profiles`` may be a prebuilt index."""
    index = profiles if isinstance(profiles, dict) else _index(profiles, server.name)

    def need(kind: str) -> ProfileTable:
        table = index.get((model, kind))
        if table is None:
            raise ProfileError(f"no profile {kind!r} for model {model!r} on server {server.name!r} — run "
                               "`recserve profile` or give --profiles with that table")
        return table

    W, K = server.cores, max(server.llc_ways, 1)
    workers = np.arange(W + 1)
    mw = need("maxload_vs_workers")
    measured = mw.column("workers")
    raw = _resample(mw, "max_qps", workers)
    fp = index.get((model, "footprint"))
    mem = _resample(fp, "mem_gb", workers) if fp is not None else np.zeros(W + 1)
    feasible = (workers <= measured.max()) & (mem <= server.mem_gb) & (workers >= 1)
    if not feasible.any():
        raise InfeasibleError(f"model {model!r} cannot run even one worker on {server.name!r} "
                              f"(footprint {mem[1]:.1f} GB > {server.mem_gb:g} GB or no profile row)")
    feasible_workers = int(workers[feasible].max())
    served = np.where(feasible, np.maximum(raw, 0.0), 0.0)
    qps = np.maximum.accumulate(served)
    # the worker count that delivers qps[w] (best with <= w workers): its bandwidth is the model's MemBW with w
    # cores (Alg. 1 line 13), not that of a row that serves nothing (e.g. one over the usable memory)
    best = np.array([int(np.argmax(served[:w + 1])) for w in workers])
    at = np.where(qps > 0, best, np.minimum(workers, feasible_workers))
    iso = qps[-1]
    if iso <= 0:
        raise InfeasibleError(_serves_nothing(mw, model, server.name))
    step = max(1, math.ceil(tail * W))
    slope = float((qps[W] - qps[W - step]) / iso / (step / W))
    useful = int(np.argmax(qps >= knee * iso))
    ways = need("maxload_vs_ways")
    by_ways = _resample(ways, "max_qps", np.arange(K + 1))
    full = by_ways[K] if by_ways[K] > 0 else by_ways.max()
    ratio = np.clip(by_ways / full, 0.0, 1.0) if full > 0 else np.ones(K + 1)
    bw = _resample(need("membw_vs_workers"), "gbs", at)
    return ModelCurves(model, qps, ratio, np.maximum(bw, 0.0), mem, feasible_workers, slope, slope >= threshold,
                       useful)


def all_curves(profiles: ProfileSet, models: Sequence[str], server: ServerType, **kw: float) -> list[ModelCurves]:
    index = _index(profiles, server.name)
    return [model_curves(index, m, server, **kw) for m in models]


# ----------------------------------------------------------------- Alg. 1


def affinity_matrix(curves: Sequence[ModelCurves], server: ServerType) -> dict[str, np.ndarray]:
    """Alg. 1 for every pair at once: ``{"llc", "dram", "affinity", "llc_ways_a"}`` [M, M] arrays.

    ``llc_ways_a[a, b]`` is the number of ways model a gets at the best split with b (b gets the rest).
    """
    K = max(server.llc_ways, 2)
    R = np.stack([c.ways_ratio[1:K] for c in curves])          # ways 1..K-1 for A
    pair = (R[:, None, :] + R[None, :, ::-1]) / 2.0              # B gets K - ways_A
    best = pair.argmax(axis=2)
    llc = pair.max(axis=2)
    half = server.cores // 2
    bw = np.array([c.membw[min(half, c.feasible_workers)] for c in curves])
    with np.errstate(divide="ignore"):
        dram = np.minimum(server.mem_bw_gbs / (bw[:, None] + bw[None, :]), 1.0)
    return {"llc": llc, "dram": dram, "affinity": np.minimum(llc, dram), "llc_ways_a": best + 1}


# ----------------------------------------------------------------- node allocation


def pair_allocation(a: ModelCurves, b: ModelCurves, server: ServerType, need_a: float = math.inf) -> ServerPlan:
    """Allocation of a co-located pair and its predicted max QPS per model.

    Cores are split evenly, a model's cores past its useful count going to the other (§V-C, initialisation).
    A model that misses its SLA even at no load on its half (``_first_serving`` above it) is given its fewest serving
    workers, as the RMU's ``adjust_workers`` upsizes a model after its violations (Alg. 3), the other keeping the
    rest; without that the pair would be planned with the model serving nothing.  ``need_a`` is the traffic of a
    still to place: when the split carries more of it, a keeps only the fewest workers that carry it and b gets
    the cores this frees, as ``adjust_workers`` sizes a model to its arrival rate (``find_number_of_workers``).
    """
    wa, wb = _even_split(a, b, server)
    plan = _predicted_pair(a, b, *_fit_memory(a, b, wa, wb, server), server)
    if plan.placements[0].qps <= need_a:
        return plan
    for fewer in range(_first_serving(a), wa):
        sized = _predicted_pair(a, b, *_fit_memory(a, b, fewer, min(server.cores - fewer, b.useful_workers), server),
                                server)
        if sized.placements[0].qps >= need_a and sized.placements[1].qps >= plan.placements[1].qps:
            return sized
    return plan


def _even_split(a: ModelCurves, b: ModelCurves, server: ServerType) -> tuple[int, int]:
    """Workers of a and b at initialisation: half the cores each, idle cores to the other, a model that serves
    nothing on its half given its fewest serving workers."""
    W = server.cores
    wa = min(W // 2, a.useful_workers)
    wb = min(W - wa, b.useful_workers)
    wa = min(W - wb, a.useful_workers)
    wa, wb = max(wa, 1), max(wb, 1)
    if a.qps[wa] <= 0 and _first_serving(a) < W:
        wa = _first_serving(a)
        wb = max(1, min(W - wa, b.useful_workers))
    elif b.qps[wb] <= 0 and _first_serving(b) < W:
        wb = _first_serving(b)
        wa = max(1, min(W - wb, a.useful_workers))
    return wa, wb


def _fit_memory(a: ModelCurves, b: ModelCurves, wa: int, wb: int, server: ServerType) -> tuple[int, int]:
    """Workers removed (where the footprint grows most) until both models fit in the server's DRAM."""
    wa, wb = max(wa, 1), max(wb, 1)
    while a.mem_gb[wa] + b.mem_gb[wb] > server.mem_gb and wa + wb > 2:
        if (a.mem_gb[wa] - a.mem_gb[wa - 1] >= b.mem_gb[wb] - b.mem_gb[wb - 1] and wa > 1) or wb == 1:
            wa -= 1
        else:
            wb -= 1
    if a.mem_gb[wa] + b.mem_gb[wb] > server.mem_gb:
        raise InfeasibleError(f"{a.name} and {b.name} do not fit together in {server.mem_gb:g} GB")
    return wa, wb


def _predicted_pair(a: ModelCurves, b: ModelCurves, wa: int, wb: int, server: ServerType) -> ServerPlan:
    """The pair at these worker counts: the LLC split maximising its EMU, both scaled down by a shared bandwidth
    overload."""
    K = max(server.llc_ways, 2)
    ka = np.arange(1, K)
    frac_a = a.qps[wa] / a.isolated_qps * a.ways_ratio[ka]
    frac_b = b.qps[wb] / b.isolated_qps * b.ways_ratio[K - ka]
    i = int(np.argmax(frac_a + frac_b))
    demand = a.membw[wa] + b.membw[wb]
    dram = min(1.0, server.mem_bw_gbs / demand) if demand > 0 else 1.0
    qa = float(frac_a[i] * a.isolated_qps * dram)
    qb = float(frac_b[i] * b.isolated_qps * dram)
    return ServerPlan(server.name, [Placement(a.name, int(wa), int(ka[i]), qa, a.isolated_qps),
                                    Placement(b.name, int(wb), int(K - ka[i]), qb, b.isolated_qps)])


def _first_serving(c: ModelCurves) -> int:
    """The fewest workers with which ``c`` meets its SLA at some load (``model_curves`` refuses a model with none)."""
    return int(np.argmax(c.qps > 0))


def isolated_allocation(c: ModelCurves, server: ServerType) -> ServerPlan:
    return ServerPlan(server.name, [Placement(c.name, c.feasible_workers, max(server.llc_ways, 1),
                                              c.isolated_qps, c.isolated_qps)])


# ----------------------------------------------------------------- Alg. 2 and baselines


class _Scheduler:
    def __init__(self, curves: Sequence[ModelCurves], server: ServerType, affinity: np.ndarray):
        self.curves = {c.name: c for c in curves}
        self.names = [c.name for c in curves]
        self.pos = {n: i for i, n in enumerate(self.names)}
        self.server = server
        self.affinity = affinity
        self._pairs: dict[tuple[str, str], ServerPlan] = {}

    def pair(self, a: str, b: str, need_a: float = math.inf) -> ServerPlan:
        """The pair's allocation, a sized to ``need_a`` (its traffic still to place) when that is less than its
        share (every policy: the paper runs all four with the same RMU, §VII-A)."""
        if (a, b) not in self._pairs:
            self._pairs[(a, b)] = pair_allocation(self.curves[a], self.curves[b], self.server)
        full = self._pairs[(a, b)]
        if full.placements[0].qps <= need_a:
            return full
        return pair_allocation(self.curves[a], self.curves[b], self.server, need_a)

    def run(self, targets: dict[str, float], policy: str, rng: np.random.Generator) -> list[ServerPlan]:
        served = dict.fromkeys(targets, 0.0)
        servers: list[ServerPlan] = []

        def add(plan: ServerPlan) -> None:
            servers.append(plan)
            for p in plan.placements:
                if p.model in served:
                    served[p.model] += p.qps

        def unmet(m: str) -> bool:
            return served[m] < targets[m] - 1e-9

        def need(m: str) -> float:
            return targets[m] - served[m]

        if policy == "random":
            while any(unmet(m) for m in targets):
                todo = [m for m in targets if unmet(m)]
                a = todo[rng.integers(len(todo))]
                others = [m for m in (todo if len(todo) > 1 else self.names) if m != a]
                if not others:
                    add(isolated_allocation(self.curves[a], self.server))
                    continue
                plan = self.pair(a, others[rng.integers(len(others))], need(a))
                add(plan if plan.placements[0].qps > 0 else isolated_allocation(self.curves[a], self.server))
            return servers
        if policy in ("hera", "hera-random"):
            low = [m for m in targets if not self.curves[m].high]
            high = [m for m in self.names if self.curves[m].high]
            for mi in low:
                while unmet(mi):
                    waiting = {m for m in targets if unmet(m)}
                    mj = self._partner(mi, high, policy, rng, waiting)
                    plan = self.pair(mi, mj, need(mi)) if mj is not None else None
                    iso = isolated_allocation(self.curves[mi], self.server)
                    if plan is None or plan.placements[0].qps <= 0:
                        plan = iso
                    elif policy == "hera" and mj not in waiting and iso.placements[0].qps > plan.placements[0].qps:
                        plan = iso  # partner needs nothing more: a dedicated server serves more of mi
                    add(plan)
        for m in targets:  # Step B (and the whole of DeepRecSys): isolated servers, max workers
            iso = isolated_allocation(self.curves[m], self.server)
            while unmet(m):
                add(iso)
        return servers

    def _partner(self, mi: str, high: list[str], policy: str, rng: np.random.Generator,
                 unmet: set[str]) -> str | None:
        if policy == "hera-random":  # any pair except (high, high): mi is low, so any other model
            others = [m for m in self.names if m != mi]
            return others[rng.integers(len(others))] if others else None
        if not high:
            return None
        pool = [m for m in high if m in unmet] or high
        row = self.affinity[self.pos[mi]]
        return max(pool, key=lambda m: row[self.pos[m]])


def plan_colocation(profiles: ProfileSet, server: ServerType, targets: dict[str, float],
                    baselines: Sequence[str] = ("deeprecsys", "random", "hera-random"), seeds: int = 20,
                    threshold: float = 0.5) -> ColocationPlan:
    """Hera's cluster plan for per-model target QPS on one server type, with the paper's baselines.

    Random baselines are averaged over ``seeds`` runs (servers mean/min/max); the plan's own server
    list is Hera's.  Raises InfeasibleError for a model that meets its SLA on no worker count.
    """
    if not targets:
        raise InfeasibleError("no target QPS given")
    bad = {m: q for m, q in targets.items() if not (math.isfinite(q) and q >= 0)}
    if bad:
        raise InfeasibleError(f"target QPS must be finite and >= 0: {bad}")
    if seeds < 1:
        raise InfeasibleError(f"seeds must be >= 1, got {seeds}")
    models = list(targets)
    curves = all_curves(profiles, models, server, threshold=threshold)
    _check_cluster_size(curves, targets, server)
    aff = affinity_matrix(curves, server)
    sched = _Scheduler(curves, server, aff["affinity"])
    chosen = sched.run(targets, "hera", np.random.default_rng(0))
    summary = _summary(chosen)
    base: dict[str, dict] = {}
    for policy in baselines:
        if policy not in POLICIES:
            raise InfeasibleError(f"unknown co-location policy {policy!r}; known: {POLICIES}")
        runs = [sched.run(targets, policy, np.random.default_rng(s)) for s in range(seeds if "random" in policy else 1)]
        counts = [len(r) for r in runs]
        base[policy] = {**_summary_of_runs([_summary(r) for r in runs]), "servers_min": min(counts),
                        "servers_max": max(counts), "runs": len(runs)}
    all_pairs = [sched.pair(a, b).emu for i, a in enumerate(models) for b in models[i + 1:]]
    summary.update({
        "random_pair_emu_min": float(min(all_pairs)) if all_pairs else None,  # None, not NaN: JSON has no NaN
        "random_pair_emu_max": float(max(all_pairs)) if all_pairs else None,
    })
    inputs = {
        "server": server.name, "targets_qps": dict(targets), "scalability_threshold": threshold,
        "models": {c.name: {"high_scalability": bool(c.high), "slope": round(c.slope, 4),
                            "isolated_qps": c.isolated_qps, "feasible_workers": c.feasible_workers,
                            "useful_workers": c.useful_workers} for c in curves},
    }
    if len(models) <= 30:
        inputs["affinity"] = {a: {b: round(float(aff["affinity"][i, j]), 4) for j, b in enumerate(models) if j != i}
                              for i, a in enumerate(models)}
    return ColocationPlan("hera", inputs=inputs, summary=summary, baselines=base, servers=chosen,
                          notes=["predicted QPS comes from Profile tables (no measurement); EMU = Σ load ÷ isolated "
                                 "max load"])


MAX_CLUSTER_SERVERS = 100_000
"""Refuse targets needing more servers than this even alone: the greedy scheduler places one server at a time."""


def _check_cluster_size(curves: Sequence[ModelCurves], targets: dict[str, float], server: ServerType) -> None:
    needed = sum(targets[c.name] / c.isolated_qps for c in curves if c.isolated_qps > 0)
    if needed > MAX_CLUSTER_SERVERS:
        count = f"{needed:,.0f}" if needed < 1e12 else f"{needed:.3g}"  # not a 300-digit number
        raise InfeasibleError(f"targets need at least {count} {server.name} servers (one model per server), "
                              f"more than the {MAX_CLUSTER_SERVERS:,} this planner places; lower the target QPS")


def _summary(servers: list[ServerPlan]) -> dict[str, float | None]:
    pairs = [s.emu for s in servers if len(s.placements) > 1]
    emus = [s.emu for s in servers]
    return {
        "servers": len(servers),
        "colocated_servers": len(pairs),
        "mean_emu": float(np.mean(emus)) if emus else 0.0,
        # Fig. 11's measure: the EMU of the co-located pairs only (an isolated server is 100% by definition)
        "mean_pair_emu": float(np.mean(pairs)) if pairs else None,
        "min_pair_emu": float(min(pairs)) if pairs else None,  # no co-located pair: nothing to report
        "max_pair_emu": float(max(pairs)) if pairs else None,
    }


def _summary_of_runs(runs: list[dict[str, float | None]]) -> dict[str, float | None]:
    """The summaries of a baseline's seeded runs as one: each field's mean, its pair EMU range over every run (so
    that every field describes the same runs)."""
    def values(key: str) -> list[float]:
        return [r[key] for r in runs if r[key] is not None]  # type: ignore[misc]

    out: dict[str, float | None] = {k: float(np.mean(values(k))) if values(k) else None
                                    for k in ("servers", "colocated_servers", "mean_emu", "mean_pair_emu")}
    out["min_pair_emu"] = min(values("min_pair_emu"), default=None)
    out["max_pair_emu"] = max(values("max_pair_emu"), default=None)
    return out


def identical_targets(curves: Sequence[ModelCurves], level: float) -> dict[str, float]:
    """Hera §VII-C / Fig. 15: every model gets the *same* target QPS, ``level`` x the median isolated max load of
    the models.  A low-scalability model (small isolated max load) then needs many servers under DeepRecSys,
    which is where co-location saves; :func:`targets_at_load` instead gives each model ``level`` servers' worth."""
    qps = sorted(c.isolated_qps for c in curves)
    return dict.fromkeys((c.name for c in curves), level * float(np.median(qps)))


def targets_at_load(curves: Sequence[ModelCurves], level: float, low_share: float | None = None) -> dict[str, float]:
    """Targets as multiples of each model's isolated max load (Fig. 15/16 style).

    ``level`` is the mean load per model in "servers' worth"; with ``low_share`` the low-scalability
    models together get that share of the total instead of an even split.
    """
    if low_share is None:
        return {c.name: level * c.isolated_qps for c in curves}
    low = [c for c in curves if not c.high]
    high = [c for c in curves if c.high]
    total = level * len(curves)
    out = {c.name: total * low_share / max(len(low), 1) * c.isolated_qps for c in low}
    out.update({c.name: total * (1 - low_share) / max(len(high), 1) * c.isolated_qps for c in high})
    return out
