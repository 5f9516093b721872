"""Kairos (HPDC'23) instance-pool planner: the best mix of instance types under a $/hr budget.

Inputs are ``latency_vs_batch`` Profile tables (per-query latency per batch size per instance
type), a p99 QoS target per model, prices, per-type caps and the query-size mix.  Nothing is
measured here.

* ``type_stats``: per instance type, the QoS-meeting batch limit ``s`` (largest batch whose
  per-query latency meets QoS, as Kairos' allocator uses the *mean* latency of a query of that
  size), the fraction ``f`` of queries of size <= s, and the standalone QPS on those queries.
  The **base** type is the most cost-effective type that meets QoS for every query size.
* ``upper_bounds``: Eq. 9-15 for every configuration at once (numpy, vectorised).
* ``kairos_pick``: top-3 same-base-count check, else the top-10 configuration with the least sum
  of squared Euclidean distances to the other nine.
* ``kairos_plus``: Alg. 1 - evaluate configurations in upper-bound order with an injected
  ``evaluate(config) -> allowable QPS`` (simulator or live), pruning by upper bound and by
  sub-configuration.
* ``homogeneous``: the base type alone, as many as fit, throughput scaled to the whole budget (the
  paper's conservative comparison), or to what its cap lets it spend.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recserve.errors import InfeasibleError, ProfileError, SpecError
from recserve.planners.plan import PoolChoice, PoolPlan
from recserve.profiles import ProfileSet, ProfileTable

LATENCY_STATS = {"mean": "mean_ms", "p50": "p50_ms", "p99": "p99_ms"}


# ----------------------------------------------------------------- reference data


def load_kairos_reference(path: str | Path, prefix: str = "kairos-") -> ProfileSet:
    """Load the Kairos authors' AWS latency JSON into ``latency_vs_batch`` tables (source=reference).

    Model names become ``prefix + name`` (``kairos-ncf`` ... as in the catalogue); pass
    ``prefix=""`` for the raw names.  ``meta`` carries ``qos_p99_ms`` (per prefixed model),
    ``prices_usd_per_hr``, ``max_instances`` and ``budget_usd_per_hr``.  Columns: batch, mean_ms,
    p50_ms, p99_ms, exec_mean_ms (execution alone, without loading).
    """
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"{path}: no such Kairos reference file")
    try:
        data = json.loads(path.read_text())
        instances = data["instances"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise ProfileError(f"{path}: not the Kairos reference latency JSON ({exc})") from exc
    tables = []
    columns = ("batch", "mean_ms", "p50_ms", "p99_ms", "exec_mean_ms")
    for server, models in instances.items():
        for model, points in models.items():
            rows = [[float(b), p["mean"], p["p50"], p["p99"], p.get("exec_mean", float("nan"))]
                    for b, p in sorted(points.items(), key=lambda kv: int(kv[0]))]
            tables.append(ProfileTable(prefix + model, server, "latency_vs_batch", columns, rows, source="reference",
                                       conditions={}))
    meta = {
        "source": data.get("source", str(path)),
        "unit": data.get("unit", "milliseconds"),
        "qos_p99_ms": {prefix + m: float(v) for m, v in data.get("qos_p99_ms", {}).items()},
        "prices_usd_per_hr": dict(data.get("prices_usd_per_hr", {})),
        "max_instances": dict(data.get("max_instances_in_paper_search", {})),
        "budget_usd_per_hr": data.get("budget_usd_per_hr"),
    }
    return ProfileSet(tables, meta)


# ----------------------------------------------------------------- query-size mix


def production_size_mix(max_size: int = 1000, step: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Kairos' production-like query-size mix as an exact pmf over multiples of ``step``.

    Recipe (reference/README.md): r uniform in 1..99; r<=8: uniform 1..99; 8<r<=30: uniform
    200..599; 30<r<=35: uniform 600..999; otherwise lognormal(5.1, 0.2), replaced by uniform
    190..199 outside [100, 200]; rounded up to a multiple of 10.  Uses ``recserve.workload`` when it
    provides ``production_size_pmf``; computing the pmf exactly keeps planning deterministic.
    """
    try:  # a colleague's workload package may own the canonical mix
        from recserve.workload import production_size_pmf  # type: ignore[attr-defined]

        return production_size_pmf(max_size=max_size, step=step)
    except (ImportError, AttributeError, TypeError):
        pass
    from scipy.stats import lognorm

    sizes = np.arange(step, max_size + 1, step)
    pmf = np.zeros(len(sizes))

    def uniform(lo: int, hi: int, weight: float) -> None:
        xs = np.arange(lo, hi + 1)
        idx = (np.ceil(xs / step) * step).astype(int) // step - 1
        np.add.at(pmf, idx, weight / len(xs))

    uniform(1, 99, 8 / 99)
    uniform(200, 599, 22 / 99)
    uniform(600, 999, 5 / 99)
    w = 64 / 99
    dist = lognorm(s=0.2, scale=math.exp(5.1))
    for k in range(100 // step + 1, 200 // step + 1):
        pmf[k - 1] += w * (dist.cdf(k * step) - dist.cdf((k - 1) * step))
    uniform(190, 199, w * (1 - (dist.cdf(200) - dist.cdf(100))))
    return sizes, pmf / pmf.sum()


def empirical_size_mix(samples: Sequence[int], step: int = 10, max_size: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    """A pmf from observed query sizes (Kairos monitors the last ~10k queries), rounded up to ``step``."""
    sizes = np.arange(step, max_size + 1, step)
    idx = np.clip(np.ceil(np.asarray(samples, dtype=float) / step).astype(int) - 1, 0, len(sizes) - 1)
    pmf = np.bincount(idx, minlength=len(sizes)).astype(float)
    if pmf.sum() == 0:
        raise SpecError("empty query-size sample")
    return sizes, pmf / pmf.sum()


# ----------------------------------------------------------------- per-type statistics


@dataclass
class TypeStats:
    """What the upper bound needs from one instance type for one model."""

    name: str
    price: float
    cap: int
    qps: float              # standalone QPS on the queries it can serve (all if base)
    s: float                # largest QoS-meeting batch (inf-like: max size if it meets QoS for all)
    f: float                # fraction of queries of size <= s
    meets_all: bool


@dataclass
class PoolInputs:
    """Everything the pool planner derives for one model, in a fixed type order (base first)."""

    model: str
    qos_ms: float
    types: list[TypeStats]
    qps_small: np.ndarray   # [T, T]: type i's QPS on queries <= s of type k
    base_qps_large: np.ndarray  # [T]: base type's QPS on queries > s of type k (nan if none)

    @property
    def base(self) -> TypeStats:
        return self.types[0]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.types]


def _latency(table: ProfileTable, sizes: np.ndarray, stat: str) -> np.ndarray:
    col = LATENCY_STATS.get(stat)
    if col is None:
        raise ProfileError(f"latency statistic must be one of {sorted(LATENCY_STATS)}, got {stat!r}")
    xs, ys = table.column("batch"), table.column(col)
    order = np.argsort(xs)
    return np.interp(sizes, xs[order], ys[order])


def _qps(lat_ms: np.ndarray, pmf: np.ndarray, mask: np.ndarray) -> float:
    """Queries per second of one instance serving only the queries in ``mask`` back to back."""
    weight = pmf[mask].sum()
    if weight <= 0:
        return float("nan")
    return 1000.0 / float((pmf[mask] * lat_ms[mask]).sum() / weight)


def type_stats(profiles: ProfileSet, model: str, qos_ms: float, prices: dict[str, float],
               caps: dict[str, int] | None = None, sizes: np.ndarray | None = None, pmf: np.ndarray | None = None,
               stat: str = "mean", types: Sequence[str] | None = None) -> PoolInputs:
    """Derive s, f, standalone QPS for each type, pick the base type, and precompute the QPS matrices."""
    if sizes is None or pmf is None:
        sizes, pmf = production_size_mix()
    tables = {t.server: t for t in profiles.find(model=model, kind="latency_vs_batch")}
    names = [t for t in (types or sorted(tables)) if t in tables]
    if not names:
        raise ProfileError(f"no latency_vs_batch profile for model {model!r}")
    missing = [t for t in names if t not in prices]
    if missing:
        raise ProfileError(f"no price for instance type(s) {missing}")
    lat = {t: _latency(tables[t], sizes, stat) for t in names}
    support = pmf > 0
    stats: dict[str, TypeStats] = {}
    limits: dict[str, float] = {}
    for t in names:
        ok = lat[t] <= qos_ms
        prefix = int(np.argmin(ok)) if not ok.all() else len(sizes)
        meets_all = bool(ok[support].all())
        s = float(sizes[-1]) if meets_all else (float(sizes[prefix - 1]) if prefix > 0 else 0.0)
        small = sizes <= s
        f = float(pmf[small].sum())
        qps = _qps(lat[t], pmf, small) if f > 0 else 0.0
        cap = int((caps or {}).get(t, 10**6))
        stats[t] = TypeStats(t, float(prices[t]), cap, qps, s, f, meets_all)
        limits[t] = s
    full = [t for t in names if stats[t].meets_all]
    if not full:
        raise InfeasibleError(f"model {model!r}: no instance type meets the {qos_ms:g} ms QoS for every query size "
                              f"(largest QoS-meeting batch per type: {({t: stats[t].s for t in names})})")
    base = max(full, key=lambda t: stats[t].qps / stats[t].price)
    order = [base] + [t for t in names if t != base]
    T = len(order)
    qps_small = np.zeros((T, T))
    base_large = np.full(T, np.nan)
    for k, tk in enumerate(order):
        small = sizes <= limits[tk]
        for i, ti in enumerate(order):
            qps_small[i, k] = _qps(lat[ti], pmf, small) if small.any() else 0.0
        if (~small & support).any():
            base_large[k] = _qps(lat[base], pmf, ~small)
    return PoolInputs(model, qos_ms, [stats[t] for t in order], qps_small, base_large)


# ----------------------------------------------------------------- enumeration and upper bound


def enumerate_configs(prices: Sequence[float], caps: Sequence[int], budget: float) -> np.ndarray:
    """Every instance-count vector with n_j <= cap_j and Σ n_j·price_j <= budget (int array [K, T])."""
    configs = np.zeros((1, 0), dtype=np.int32)
    cost = np.zeros(1)
    eps = 1e-9
    for price, cap in zip(prices, caps, strict=True):
        cap = int(min(cap, math.floor(budget / price + eps))) if price > 0 else int(cap)
        counts = np.arange(cap + 1)
        new_cost = (cost[:, None] + counts[None, :] * price).ravel()
        keep = new_cost <= budget + eps
        rep = np.repeat(configs, cap + 1, axis=0)
        col = np.tile(counts, len(configs))[:, None]
        configs = np.hstack([rep, col])[keep]
        cost = new_cost[keep]
    return configs[configs.sum(axis=1) > 0]


def upper_bounds(inputs: PoolInputs, configs: np.ndarray) -> np.ndarray:
    """Eq. 9-15 for every configuration (column 0 = base type count u, others = auxiliary v^i).

    Every auxiliary type in a configuration is assumed to serve up to the largest ``s`` among the
    auxiliary types present (f' = max f), as Kairos does; a pool without a base instance cannot serve
    queries larger than s and gets bound 0 unless its auxiliaries meet QoS for every size.
    """
    configs = np.asarray(configs)
    u = configs[:, 0].astype(float)
    v = configs[:, 1:].astype(float)
    aux = inputs.types[1:]
    q_base = inputs.base.qps
    if not aux:
        return u * q_base
    f_aux = np.array([t.f for t in aux])
    present = v > 0
    f_masked = np.where(present, f_aux[None, :], -1.0)
    k_star = np.argmax(f_masked, axis=1)            # aux index with the largest f (hence s)
    f_prime = f_masked[np.arange(len(configs)), k_star]
    has_aux = f_prime >= 0
    k_col = k_star + 1                               # column in the [T, T] matrices
    qa = inputs.qps_small[1:, :][:, k_col].T         # [K, n_aux]: aux i QPS on queries <= s_{k*}
    sum_vq = (v * np.nan_to_num(qa)).sum(axis=1)
    q_large = inputs.base_qps_large[k_col]           # base QPS on queries > s_{k*}
    with np.errstate(divide="ignore", invalid="ignore"):
        fp = np.clip(f_prime, 1e-12, 1.0)
        C = sum_vq * (1 - fp) / fp
        uq = u * q_large
        base_bound = uq / (1 - fp)
        aux_bound = sum_vq / fp + (uq - C) / uq * u * q_base
        ub = np.where(uq <= C, base_bound, aux_bound)
        all_served = np.isnan(q_large) | (f_prime >= 1.0)
        ub = np.where(all_served, sum_vq + u * q_base, ub)
        ub = np.where(u == 0, np.where(all_served, sum_vq, 0.0), ub)
    return np.where(has_aux, np.nan_to_num(ub), u * q_base)


def kairos_pick(configs: np.ndarray, bounds: np.ndarray, cost: np.ndarray | None = None) -> int:
    """Index of Kairos' one-shot choice among configurations (Sec. 5.2 similarity rule), moved to the best
    affordable configuration containing it (``_undominated``).

    With ``cost`` (each configuration's $/hr) the budget is read as a ceiling: the similarity rule's pick at every
    lower budget (the configurations costing at most that much) is affordable too, and the one whose bound is
    highest is chosen.  The rule alone is not monotone in the budget: a larger budget adds configurations to the top
    ten, and the medoid of the new ten can have a lower bound than the last pick, which is still affordable."""
    order = np.argsort(-bounds, kind="stable")
    if len(order) == 0:
        raise InfeasibleError("no configuration to choose from")
    picks = {_similarity_pick(configs, order)} if cost is None else _picks_at_every_budget(configs, bounds, cost)
    best = [_undominated(configs, bounds, pick) for pick in sorted(picks)]
    return max(best, key=lambda i: (bounds[i], -i))


def _similarity_pick(configs: np.ndarray, order: Sequence[int]) -> int:
    """Sec. 5.2 on configurations ranked by upper bound (``order``, best first): the best one if the top three share
    the base count, else the one of the top ten with the least sum of squared distances to the other nine."""
    if len({int(configs[i, 0]) for i in order[:3]}) == 1:
        return int(order[0])
    top10 = np.asarray(order[:10])
    pts = configs[top10].astype(float)
    d2 = ((pts[:, None, :] - pts[None, :, :]) ** 2).sum(axis=2).sum(axis=1)
    return int(top10[int(np.argmin(d2))])


def _picks_at_every_budget(configs: np.ndarray, bounds: np.ndarray, cost: np.ndarray) -> set[int]:
    """The similarity rule's pick among the configurations costing at most c, for every configuration cost c: the
    top ten kept as configurations are added in cost order (ties in bound ranked by index, as a stable sort)."""
    rank = {int(i): r for r, i in enumerate(np.argsort(-bounds, kind="stable"))}  # lower: ranked higher
    by_cost = np.argsort(cost, kind="stable").tolist()
    costs = np.asarray(cost)[by_cost].tolist()
    picks: set[int] = set()
    top: list[int] = []
    changed = False
    for n, i in enumerate(by_cost):
        if len(top) < 10 or rank[i] < rank[top[-1]]:
            top = sorted([*top, i], key=rank.__getitem__)[:10]
            changed = True
        if changed and (n + 1 == len(by_cost) or costs[n + 1] != costs[n]):  # every configuration of this cost in
            picks.add(_similarity_pick(configs, top))
            changed = False
    return picks


def _undominated(configs: np.ndarray, bounds: np.ndarray, pick: int) -> int:
    """The pick, or the highest-bound configuration with at least as many instances of every type and a higher
    bound: a sub-configuration of an affordable one cannot do better (Alg. 1's pruning rule), and the similarity
    rule picks one when the top ten are few or spread along one type."""
    more = np.flatnonzero((configs >= configs[pick]).all(axis=1) & (bounds > bounds[pick]))
    return int(more[np.argmax(bounds[more])]) if more.size else pick


@dataclass
class SearchResult:
    best_qps: float
    best_index: int | None
    evaluations: int
    order: list[int]


def kairos_plus(configs: np.ndarray, bounds: np.ndarray, evaluate: Callable[[np.ndarray], float]) -> SearchResult:
    """Alg. 1: evaluate in upper-bound order; drop configs whose bound <= best so far and every
    sub-configuration of an evaluated one (fewer instances of every type cannot do better)."""
    order = np.argsort(-bounds, kind="stable")
    remaining = np.ones(len(configs), dtype=bool)
    best, best_idx, evaluated = 0.0, None, []
    for idx in order:
        if not remaining[idx]:
            continue
        x = configs[idx]
        value = float(evaluate(x))
        evaluated.append(int(idx))
        if value > best:
            best, best_idx = value, int(idx)
            remaining &= bounds > best
        remaining &= ~np.all(configs <= x, axis=1)
        if not remaining.any():
            break
    return SearchResult(best, best_idx, len(evaluated), evaluated)


def homogeneous(inputs: PoolInputs, budget: float) -> dict[str, Any]:
    """Best homogeneous pool (the paper's baseline, §8.1): the base type, as many as the budget buys, QPS scaled to
    the full budget (``budget_scale``; to the most its cap lets it spend, where the budget buys more instances than
    the cap allows).  The one implementation: the simulator's baseline (``sim.dispatch_eval.homogeneous_pool``)
    is this pool."""
    base = inputs.base
    count = min(base.cap, int(math.floor(budget / base.price + 1e-9)))
    if count < 1:
        raise InfeasibleError(f"model {inputs.model!r}: budget ${budget:g}/hr is below one {base.name} "
                              f"(${base.price:g}/hr), the cheapest type that meets QoS for every query")
    scale = min(budget, base.cap * base.price) / (count * base.price)
    return {"type": base.name, "count": count, "cost_per_hr": count * base.price, "budget_scale": scale,
            "qps_unscaled": count * base.qps, "qps": count * base.qps * scale}


# ----------------------------------------------------------------- the planner


def plan_pool(profiles: ProfileSet, models: Sequence[str], budget: float, prices: dict[str, float],
              qos_ms: dict[str, float], caps: dict[str, int] | None = None,
              evaluate: Callable[[str, dict[str, int]], float] | None = None,
              size_mix: tuple[np.ndarray, np.ndarray] | None = None, stat: str = "mean",
              types: Sequence[str] | None = None) -> PoolPlan:
    """Pick a pool per model under ``budget`` $/hr.  With ``evaluate(model, config) -> QPS`` also run
    Kairos+ and report its configuration and number of evaluations."""
    sizes, pmf = size_mix if size_mix is not None else production_size_mix()
    pools = []
    for model in models:
        if model not in qos_ms:
            raise ProfileError(f"no QoS target for model {model!r}")
        inputs = type_stats(profiles, model, qos_ms[model], prices, caps, sizes, pmf, stat, types)
        pools.append(_plan_one(inputs, budget, evaluate))
    summary = {
        "budget_usd_per_hr": budget,
        "models": len(pools),
        "mean_ub_gain_vs_homogeneous": float(np.mean([p.upper_bound_qps / p.homogeneous["qps"] for p in pools])),
    }
    return PoolPlan("kairos", inputs={"budget_usd_per_hr": budget, "prices_usd_per_hr": prices, "caps": caps or {},
                                      "qos_ms": {m: qos_ms[m] for m in models}, "latency_stat": stat,
                                      "size_mix_mean": float((sizes * pmf).sum())},
                    summary=summary, pools=pools,
                    notes=["throughputs are Eq. 9-15 upper bounds unless 'evaluated QPS' is shown; the homogeneous "
                           "baseline is the base type's standalone QPS scaled to the whole budget"])


def _plan_one(inputs: PoolInputs, budget: float,
              evaluate: Callable[[str, dict[str, int]], float] | None) -> PoolChoice:
    homo = homogeneous(inputs, budget)
    prices = [t.price for t in inputs.types]
    configs = enumerate_configs(prices, [t.cap for t in inputs.types], budget)
    bounds = upper_bounds(inputs, configs)
    pick = kairos_pick(configs, bounds, configs @ np.asarray(prices))
    names = inputs.names

    def as_dict(row: np.ndarray) -> dict[str, int]:
        return {n: int(c) for n, c in zip(names, row, strict=True)}

    top = np.argsort(-bounds, kind="stable")[:10]
    details: dict[str, Any] = {
        "base_type": inputs.base.name,
        "configurations": int(len(configs)),
        "types": {t.name: {"price": t.price, "cap": t.cap, "s": t.s, "f": round(t.f, 4),
                           "qps": round(t.qps, 3), "meets_qos_for_all": t.meets_all} for t in inputs.types},
        "top10": [{"config": as_dict(configs[i]), "upper_bound": float(bounds[i])} for i in top],
        "highest_bound_config": as_dict(configs[int(np.argmax(bounds))]),
    }
    evaluated = None
    if evaluate is not None:
        res = kairos_plus(configs, bounds, lambda row: evaluate(inputs.model, as_dict(row)))
        best = as_dict(configs[res.best_index]) if res.best_index is not None else None
        details["kairos_plus"] = {"config": best, "qps": res.best_qps, "evaluations": res.evaluations}
        evaluated = float(evaluate(inputs.model, as_dict(configs[pick])))
        homo_config = {n: (homo["count"] if n == inputs.base.name else 0) for n in names}
        homo["evaluated_qps"] = float(evaluate(inputs.model, homo_config)) * homo["budget_scale"]
    return PoolChoice(inputs.model, as_dict(configs[pick]), float(configs[pick] @ prices), float(bounds[pick]),
                      homo, evaluated, details)
