"""Hercules (HPCA'22) cluster provisioning: minimum provisioned power under a diurnal load.

For every provisioning interval t, with QPS[w,h] and power[w,h] the efficiency tuple of workload w on
server type h (``efficiency`` Profile tables), solve the integer program (Sec. IV-C, Eq. 1-3)

    min  Σ_{w,h} power[w,h] · x[w,h]
    s.t. Σ_h QPS[w,h] · x[w,h] >= (1 + α) · load_w(t)     for every workload w
         Σ_w x[w,h] <= available_h                        for every server type h
         x integer >= 0

with ``scipy.optimize.milp`` (HiGHS).  Baselines (Sec. II-C, III-C): the heterogeneity-aware
**greedy** scheduler (each workload takes its best-ranked available type by QPS/W; workloads take
turns one server at a time, so contested types are split between them) and the
heterogeneity-**oblivious** scheduler (random available servers).  A type on which a workload
misses its SLA (no table or max_qps <= 0) is never used for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from recserve.errors import InfeasibleError, ProfileError, SpecError
from recserve.planners.plan import ProvisionPlan, ProvisionStep
from recserve.profiles import ProfileSet

BASELINES = ("greedy", "oblivious")


@dataclass
class Efficiency:
    """QPS and power per (workload, server type); QPS 0 where the SLA is not met."""

    workloads: list[str]
    servers: list[str]
    qps: np.ndarray     # [W, H]
    power: np.ndarray   # [W, H]


# Per-interval solver budget.  On 20 workloads x 10 types HiGHS reaches the 0.1% gap in about 0.6 s
# typically but up to 3 s on hard instances; stopping at 0.9 s kept every step under 1 s with a worst
# gap of 0.52% (objective within 0.3% of the 0.1%-gap answer).  The plan reports the worst gap.
STEP_TIME_LIMIT_S = 0.9

def efficiency_matrix(profiles: ProfileSet, workloads: Sequence[str], servers: Sequence[str]) -> Efficiency:
    index = {(t.model, t.server): t for t in profiles.find(kind="efficiency")}
    if not index:
        raise ProfileError("no 'efficiency' profiles given (max_qps, power_w per model and server type)")
    qps = np.zeros((len(workloads), len(servers)))
    power = np.zeros_like(qps)
    for i, w in enumerate(workloads):
        if not any((w, h) in index for h in servers):
            raise ProfileError(f"no 'efficiency' profile for workload {w!r} on any of {list(servers)}; the profiles "
                               f"hold {sorted({m for m, _ in index})} on {sorted({h for _, h in index})}")
        for j, h in enumerate(servers):
            table = index.get((w, h))
            if table is None:
                continue
            q, p = float(table.column("max_qps")[0]), float(table.column("power_w")[0])
            if q > 0 and p > 0:
                qps[i, j], power[i, j] = q, p
        if not (qps[i] > 0).any():
            raise InfeasibleError(f"workload {w!r} meets its SLA on none of the server types {list(servers)} "
                                  "(no efficiency profile with max_qps > 0)")
    return Efficiency(list(workloads), list(servers), qps, power)


# ----------------------------------------------------------------- one step


def _check_capacity(eff: Efficiency, need: np.ndarray, avail: np.ndarray, t: float | None) -> None:
    alone = eff.qps @ avail
    short = [(w, need[i], alone[i]) for i, w in enumerate(eff.workloads) if need[i] > alone[i] + 1e-9]
    when = f" at t={t:g} h" if t is not None else ""
    if short:
        w, n, a = short[0]
        raise InfeasibleError(f"load{when} exceeds cluster capacity: workload {w!r} needs {n:,.0f} QPS "
                              f"(with over-provisioning), at most {a:,.0f} QPS even with every available server")


def solve_ilp(eff: Efficiency, demand: np.ndarray, avail: np.ndarray, alpha: float = 0.0,
              t: float | None = None, mip_rel_gap: float = 1e-3, time_limit_s: float = STEP_TIME_LIMIT_S,
              info: dict | None = None) -> np.ndarray:
    """Optimal integer allocation x[w,h] for one interval (HiGHS branch and bound).

    Rows are scaled to unit demand (better conditioned).  HiGHS stops at ``mip_rel_gap`` or after
    ``time_limit_s`` with its best allocation; ``info`` (if given) receives ``gap`` and ``status``.
    """
    need = (1 + alpha) * np.asarray(demand, dtype=float)
    avail = np.asarray(avail, dtype=float)
    _check_capacity(eff, need, avail, t)
    W, H = eff.qps.shape
    usable = eff.qps > 0
    scale = float(eff.power[usable].max())
    c = np.where(usable, eff.power, 0.0).ravel() / scale
    A_load = np.zeros((W, W * H))
    A_cap = np.zeros((H, W * H))
    served = need > 0
    for i in range(W):
        A_load[i, i * H:(i + 1) * H] = eff.qps[i] / need[i] if served[i] else 0.0
    for j in range(H):
        A_cap[j, j::H] = 1.0
    # no workload needs more servers of one type than would cover its load alone: a tighter box
    # (same optimum) that shrinks HiGHS' branch-and-bound tree
    alone = np.ceil(need[:, None] / np.where(usable, eff.qps, np.inf) - 1e-9)
    upper = np.where(usable & served[:, None], np.minimum(avail[None, :], alone), 0.0).ravel()
    for limit in (time_limit_s, 10 * time_limit_s):  # no incumbent within the budget (rare): allow more time
        res = milp(c, integrality=np.ones(W * H), bounds=Bounds(np.zeros(W * H), upper),
                   constraints=[LinearConstraint(A_load, served.astype(float), np.inf),
                                LinearConstraint(A_cap, 0, avail)],
                   options={"mip_rel_gap": mip_rel_gap, "time_limit": limit})
        if res.x is not None or res.status != 1:
            break
    if res.x is None:
        when = f" at t={t:g} h" if t is not None else ""
        if res.status == 2:
            raise InfeasibleError(f"load{when} exceeds what the available servers can serve together "
                                  "(needs " + ", ".join(f"{w} {q:,.0f} QPS" for w, q in zip(eff.workloads, need,
                                                                                            strict=True)) + ")")
        raise InfeasibleError(f"provisioning solver found no allocation{when}: {res.message}")
    if info is not None:
        info["status"] = int(res.status)
        info["gap"] = float(getattr(res, "mip_gap", 0.0) or 0.0)
    return np.rint(res.x).astype(int).reshape(W, H)


def _take_turns(eff: Efficiency, need: np.ndarray, avail: np.ndarray, choose: Callable[[int, np.ndarray], int],
                t: float | None, strict: bool = True) -> np.ndarray:
    """Workloads take one server each in turn until served; ``strict=False`` returns a partial
    allocation when servers run out (a baseline that cannot serve the load is a result, not an error)."""
    if strict:
        _check_capacity(eff, need, avail, t)
    x = np.zeros(eff.qps.shape, dtype=int)
    left = avail.astype(int).copy()
    remaining = need.astype(float).copy()
    while (remaining > 1e-9).any():
        progressed = False
        for i in np.flatnonzero(remaining > 1e-9):
            open_types = (left > 0) & (eff.qps[i] > 0)
            if not open_types.any():
                continue
            j = choose(i, open_types)
            x[i, j] += 1
            left[j] -= 1
            remaining[i] -= eff.qps[i, j]
            progressed = True
        if not progressed and not strict:
            break
        if not progressed:
            when = f" at t={t:g} h" if t is not None else ""
            raise InfeasibleError(f"load{when} exceeds cluster capacity under this scheduler: "
                                  f"{[eff.workloads[i] for i in np.flatnonzero(remaining > 1e-9)]} left unserved")
    return x


def solve_greedy(eff: Efficiency, demand: np.ndarray, avail: np.ndarray, alpha: float = 0.0,
                 t: float | None = None, strict: bool = True) -> np.ndarray:
    """Heterogeneity-aware greedy: best available QPS/W first, workloads taking turns."""
    ratio = np.divide(eff.qps, eff.power, out=np.zeros_like(eff.qps), where=eff.power > 0)

    def best(i: int, open_types: np.ndarray) -> int:
        return int(np.argmax(np.where(open_types, ratio[i], -np.inf)))

    return _take_turns(eff, (1 + alpha) * np.asarray(demand, float), np.asarray(avail), best, t, strict)


def solve_oblivious(eff: Efficiency, demand: np.ndarray, avail: np.ndarray, alpha: float = 0.0,
                    t: float | None = None, rng: np.random.Generator | None = None,
                    strict: bool = True) -> np.ndarray:
    """Heterogeneity-oblivious: a random available server (types weighted by free count)."""
    rng = rng or np.random.default_rng(0)
    left = np.asarray(avail, dtype=float).copy()

    def pick(i: int, open_types: np.ndarray) -> int:
        weights = np.where(open_types, left, 0.0)
        j = int(rng.choice(len(weights), p=weights / weights.sum()))
        left[j] -= 1
        return j

    return _take_turns(eff, (1 + alpha) * np.asarray(demand, float), np.asarray(avail), pick, t, strict)


# ----------------------------------------------------------------- over-provision rate


def alpha_from_history(history: dict[str, Sequence[float]], interval_steps: int = 1, quantile: float = 1.0) -> float:
    """Hercules §IV-C: the over-provision rate α that covers the load growth within one provisioning interval,
    estimated from past loads — the ``quantile`` (default: the largest) of every workload's relative increase
    over ``interval_steps`` consecutive samples (0 when loads never rise)."""
    if interval_steps < 1:
        raise SpecError("interval_steps must be >= 1")
    rises = []
    for series in history.values():
        x = np.asarray(series, dtype=float)
        if x.size <= interval_steps:
            continue
        before, after = x[:-interval_steps], x[interval_steps:]
        ok = before > 0
        rises.append(np.maximum(after[ok] / before[ok] - 1.0, 0.0))
    if not rises:
        raise SpecError("load history too short to estimate the over-provision rate")
    return float(np.quantile(np.concatenate(rises), quantile))


# ----------------------------------------------------------------- a day


def diurnal_trace(peaks: dict[str, float], steps: int = 48, trough_ratio: float = 0.5,
                  peak_hour: float = 20.0, noise: float = 0.0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Per-workload load over 24 h at ``steps`` intervals (hours, {workload: qps}).

    Uses ``recserve.workload.diurnal_trace`` (synchronous raised cosine, Hercules' ~50 % peak-to-valley
    swing) when available; otherwise the same cosine computed here.
    """
    try:
        from recserve.workload import diurnal_trace as workload_trace
    except ImportError:
        workload_trace = None
    if workload_trace is not None:
        trace = workload_trace(dict(peaks), hours=24.0, step_min=24 * 60 / steps,
                               peak_valley_ratio=1 / trough_ratio, peak_hour=peak_hour, noise=noise)
        return trace.times_s / 3600.0, {w: np.asarray(trace.qps[w], dtype=float) for w in peaks}
    hours = np.arange(steps) * 24.0 / steps
    mid = hours + 12.0 / steps
    shape = trough_ratio + (1 - trough_ratio) * (1 + np.cos(2 * math.pi * (mid - peak_hour) / 24.0)) / 2
    return hours, {w: p * shape for w, p in peaks.items()}


def _step(eff: Efficiency, x: np.ndarray, t: float, demand: np.ndarray) -> ProvisionStep:
    alloc = {w: {h: int(x[i, j]) for j, h in enumerate(eff.servers) if x[i, j]} for i, w in enumerate(eff.workloads)}
    cap = {w: float(eff.qps[i] @ x[i]) for i, w in enumerate(eff.workloads)}
    short = {w: float(d - cap[w]) for w, d in zip(eff.workloads, demand, strict=True) if cap[w] < d - 1e-9}
    return ProvisionStep(float(t), {w: float(d) for w, d in zip(eff.workloads, demand, strict=True)}, alloc,
                         float((eff.power * x).sum()), cap, short)


def _report_step(progress: Callable[[str], None] | None, name: str, done: int, total: int) -> None:
    """A line at every tenth of a long day (100 steps or more), so a day of many intervals shows it is moving."""
    if progress and total >= 100 and done < total and done % (total // 10) == 0:
        progress(f"{name}: {done}/{total} steps")


def plan_provision(profiles: ProfileSet, available: dict[str, int], loads: dict[str, Sequence[float]],
                   hours: Sequence[float], alpha: float = 0.05, baselines: Sequence[str] = BASELINES,
                   seed: int = 0, progress: Callable[[str], None] | None = None, mip_rel_gap: float = 1e-3,
                   time_limit_s: float = STEP_TIME_LIMIT_S) -> ProvisionPlan:
    """Provision every interval of a day with the ILP and the baselines; summarise peak/average savings."""
    _check_provision_inputs(available, alpha, mip_rel_gap, time_limit_s)
    workloads = list(loads)
    servers = [h for h, n in available.items() if n > 0]
    if not servers:
        raise InfeasibleError("no servers available")
    eff = efficiency_matrix(profiles, workloads, servers)
    avail = np.array([available[h] for h in servers])
    demand = np.stack([np.asarray(loads[w], dtype=float) for w in workloads])   # [W, T]
    unknown = [name for name in baselines if name not in BASELINES]
    if unknown:
        raise SpecError(f"unknown provisioning baseline {unknown[0]!r}; known: {BASELINES}")
    series: dict[str, list[ProvisionStep]] = {}
    worst_gap = 0.0
    for name in ["hercules", *baselines]:
        series[name], gap = _provision_day(name, eff, demand, avail, hours, alpha, seed, mip_rel_gap, time_limit_s,
                                           progress)
        worst_gap = max(worst_gap, gap)
    main = series.pop("hercules")
    summary = _day_summary(main)
    summary["worst_ilp_gap"] = worst_gap
    base = {name: _savings(summary, _day_summary(steps)) for name, steps in series.items()}
    inputs = {"available": dict(available), "alpha": alpha, "workloads": workloads,
              "peak_load_qps": {w: float(demand[i].max()) for i, w in enumerate(workloads)},
              "efficiency": {w: {h: {"qps": float(eff.qps[i, j]), "power_w": float(eff.power[i, j])}
                                 for j, h in enumerate(servers) if eff.qps[i, j] > 0}
                             for i, w in enumerate(workloads)}}
    return ProvisionPlan("hercules", inputs=inputs, summary=summary, baselines=base, steps=main,
                         baseline_steps=series,
                         notes=["power is provisioned power (Σ servers × their power budget), not measured draw"])


def _check_provision_inputs(available: dict[str, int], alpha: float, mip_rel_gap: float, time_limit_s: float) -> None:
    if not (0 <= alpha < float("inf")) or mip_rel_gap < 0 or not time_limit_s > 0:
        raise SpecError(f"alpha and mip_rel_gap must be >= 0 (an under-provisioning alpha < 0 meets no load) "
                        f"and time_limit_s > 0; got {alpha}, {mip_rel_gap}, {time_limit_s}")
    if any(n < 0 for n in available.values()):
        raise SpecError(f"available server counts must be >= 0, got {available}")


def _provision_day(name: str, eff: Efficiency, demand: np.ndarray, avail: np.ndarray, hours: Sequence[float],
                   alpha: float, seed: int, mip_rel_gap: float, time_limit_s: float,
                   progress: Callable[[str], None] | None) -> tuple[list[ProvisionStep], float]:
    """One policy's allocation at every interval ("hercules": the ILP; "greedy", "oblivious": the baselines, which
    may fall short), and the ILP's worst relative gap (0 for a baseline)."""
    rng = np.random.default_rng(seed)
    steps = []
    worst_gap = 0.0
    for k, t in enumerate(hours):
        if name == "oblivious":
            x = solve_oblivious(eff, demand[:, k], avail, alpha, t, rng, strict=False)
        elif name == "greedy":
            x = solve_greedy(eff, demand[:, k], avail, alpha, t, strict=False)
        else:
            info: dict = {}
            x = solve_ilp(eff, demand[:, k], avail, alpha, t, mip_rel_gap, time_limit_s, info)
            worst_gap = max(worst_gap, info["gap"])
        steps.append(_step(eff, x, t, demand[:, k]))
        _report_step(progress, name, k + 1, len(hours))
    if progress:
        progress(f"{name}: {len(steps)} steps, peak {max(s.power_w for s in steps):,.0f} W")
    return steps, worst_gap


def _savings(hercules: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """A baseline's day summary with the ILP's peak and average power and server savings over it."""
    other["hercules_power_saving_peak"] = 1 - hercules["peak_power_w"] / other["peak_power_w"]
    other["hercules_power_saving_avg"] = 1 - hercules["avg_power_w"] / other["avg_power_w"]
    other["hercules_server_saving_peak"] = 1 - hercules["peak_servers"] / other["peak_servers"]
    other["hercules_server_saving_avg"] = 1 - hercules["avg_servers"] / other["avg_servers"]
    return other


def _day_summary(steps: list[ProvisionStep]) -> dict[str, float]:
    power = np.array([s.power_w for s in steps])
    servers = np.array([s.servers for s in steps])
    return {"peak_power_w": float(power.max()), "avg_power_w": float(power.mean()),
            "peak_servers": int(servers.max()), "avg_servers": float(servers.mean()),
            "steps_short_of_load": int(sum(1 for s in steps if s.unserved))}
