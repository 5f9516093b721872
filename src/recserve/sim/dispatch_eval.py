"""Allowable throughput of dispatch policies on one pool, in simulation (Kairos Sec. 7-8 methodology).

For a model and a pool: every online policy gets a max-load search (raise the Poisson rate until
the p99 target breaks, then bisect) over the same query stream; DRS first hill-climbs its batch
threshold; the Oracle's throughput is computed from the sorted query sequence.  The pool is the
one the Kairos pool planner picks under the budget unless one is given, and the best homogeneous
pool (the base type, as many as the budget buys) is simulated alongside.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recserve.errors import ProfileError, RecserveError
from recserve.measure.maxload import find_max_load
from recserve.policies.dispatch import DispatchPolicy, make_policy, oracle_throughput, tune_threshold
from recserve.policies.predictor import LatencyPredictor, prior_from_profiles
from recserve.profiles import ProfileSet
from recserve.sim.cluster import ClusterSim, pool_text
from recserve.sim.latency import ServiceModel
from recserve.sim.queries import QueryStream

ONLINE = ("kairos", "ribbon", "fcfs", "drs", "clockwork")


def resolve_model(profiles: ProfileSet, name: str) -> str:
    """Accept ``rm2`` for ``kairos-rm2`` when only the prefixed tables exist."""
    models = profiles.models()
    if name in models:
        return name
    for cand in models:
        if cand.endswith("-" + name):
            return cand
    raise ProfileError(f"no latency tables for model {name!r}; have {models}")


def config_to_pool(config: dict[str, int]) -> list[str]:
    return [t for t, n in config.items() for _ in range(int(n))]


@dataclass
class PolicyResult:
    policy: str
    max_qps: float
    probes: int
    details: dict[str, Any] = field(default_factory=dict)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class DispatchEvaluation:
    """Everything needed to evaluate policies for one model: latency tables, QoS, the query stream."""

    def __init__(self, profiles: ProfileSet, model: str, qos_ms: float, queries: int = 10000, seed: int = 0,
                 mix: str = "production", percentile: float = 99.0, rtol: float = 0.02,
                 log: Callable[[str], None] | None = _log, seed_predictor: bool = False,
                 latency_cv: float | None = None) -> None:
        self.profiles = profiles
        self.model = model
        self.qos_ms = float(qos_ms)
        self.percentile = percentile
        self.rtol = rtol
        self.stream = QueryStream(queries, seed=seed, mix=mix)
        self.service = ServiceModel.from_profiles(profiles, model)
        if latency_cv is not None:  # service times spread by ``latency_cv`` around the tables' means
            self.service = self.service.with_spread(latency_cv)
        self.log = log or (lambda _m: None)
        self.seed_predictor = seed_predictor  # start each policy's predictor from the latency tables

    def policy(self, name: str, pool: Sequence[str], **kw: object) -> DispatchPolicy:
        """A fresh policy; with ``seed_predictor`` its predictor starts from the profiled latencies
        (what the live router does with a pool file's ``prior``)."""
        if self.seed_predictor:  # the prior is read on the service grid, so the predictor buckets by that grid
            types = list(dict.fromkeys(pool))
            grid = self.service.batches
            prior = prior_from_profiles(self.profiles, self.model, types, buckets=grid)
            kw["predictor"] = LatencyPredictor(types, buckets=grid, prior=prior)
        return make_policy(name, self.qos_ms, **kw)

    def base_types(self, pool: Sequence[str]) -> list[str]:
        """The type fastest on the largest query (Kairos' base type), among those in the pool."""
        present = list(dict.fromkeys(pool))
        return [min(present, key=lambda t: self.service.mean[self.service.type_index(t), -1])]

    def max_load(self, pool: Sequence[str], make: Callable[[], DispatchPolicy], start_qps: float) -> tuple[float, int]:
        sim = ClusterSim(self.service, pool, self.qos_ms, self.percentile)
        res = find_max_load(lambda r: sim.run(make(), self.stream, qps=r).tail(self.percentile), self.qos_ms,
                            self.percentile, start_qps=max(start_qps, 0.1), rtol=self.rtol)
        return res.max_qps, len(res.probes)

    def oracle(self, pool: Sequence[str]) -> float:
        return oracle_throughput(self.stream.sizes, pool, self.service.as_dict("mean"), self.service.as_dict("p99"),
                                 self.qos_ms, self.service.bucket, 1.0 - self.percentile / 100.0)

    def drs_start(self, pool: Sequence[str]) -> int:
        """Start the threshold hill-climb at the largest batch every auxiliary type serves within QoS."""
        base = set(self.base_types(pool))
        aux = [t for t in dict.fromkeys(pool) if t not in base]
        if not aux:
            return int(self.service.batches[-1])
        limits = []
        for t in aux:
            ok = self.service.mean[self.service.type_index(t)] <= self.qos_ms
            limits.append(int(self.service.batches[int(np.argmin(ok)) - 1]) if not ok.all() else
                          int(self.service.batches[-1]))
        return max(10, min(limits))

    def evaluate(self, pool: Sequence[str], policies: Sequence[str]) -> dict[str, PolicyResult]:
        """Allowable throughput of each policy (and ``oracle``) on ``pool``."""
        unknown = [p for p in policies if p not in ONLINE and p != "oracle"]
        if unknown:
            raise RecserveError(f"unknown policy {unknown}; known: {', '.join(ONLINE)}, oracle")
        oracle = self.oracle(pool)
        start = max(oracle / 2.0, 0.5)
        out: dict[str, PolicyResult] = {}
        base = self.base_types(pool)
        for name in policies:
            if name == "oracle":
                out[name] = PolicyResult("oracle", oracle, 0, {"note": "all queries known in advance (Kairos Sec. 7)"})
                continue
            if name == "drs":
                out[name] = self._drs(pool, base, start)
            else:
                qps, probes = self.max_load(pool, lambda n=name: self.policy(n, pool), start)
                out[name] = PolicyResult(name, qps, probes)
            self.log(f"  {self.model} [{pool_text(pool)}] {name:9s} {out[name].max_qps:9.2f} qps")
        return out

    def _drs(self, pool: Sequence[str], base: list[str], start: float) -> PolicyResult:
        probes = 0

        def value(threshold: int) -> float:
            nonlocal probes
            qps, n = self.max_load(pool, lambda: self.policy("drs", pool, threshold=threshold,
                                                             base_types=base), start)
            probes += n
            return qps

        best, best_qps, trace = tune_threshold(value, self.drs_start(pool), step=100, min_step=25,
                                               lo=0, hi=int(self.service.batches[-1]))
        return PolicyResult("drs", best_qps, probes, {"threshold": best, "base_types": base,
                                                      "hill_climb": [[t, q] for t, q in trace]})


def homogeneous_pool(profiles: ProfileSet, model: str, prices: dict[str, float], budget: float, qos_ms: float,
                     caps: dict[str, int] | None = None) -> tuple[list[str], float]:
    """The paper's homogeneous baseline as the pool planner sizes it (``planners.kairos.homogeneous``: the base
    type, as many as the budget buys within its cap), as a pool to simulate, and the factor scaling its throughput to
    the budget.  Only the priced types are candidates for the base."""
    from recserve.planners.kairos import homogeneous, type_stats

    priced = [t.server for t in profiles.find(model=model, kind="latency_vs_batch") if t.server in prices]
    homo = homogeneous(type_stats(profiles, model, qos_ms, prices, caps, types=priced), budget)
    return [homo["type"]] * homo["count"], homo["budget_scale"]


def oracle_best_pool(ev: DispatchEvaluation, prices: dict[str, float], caps: dict[str, int],
                     budget: float) -> tuple[list[str], float]:
    """The pool with the highest Oracle throughput under the budget: what the Kairos paper hands the
    competing schemes (Sec. 8.2, "best heterogeneous configuration obtained via Oracle search")."""
    from recserve.planners.kairos import enumerate_configs

    types = [t for t in ev.service.types if t in prices]
    configs = enumerate_configs([prices[t] for t in types], [int(caps.get(t, 10**6)) for t in types], budget)
    best, best_pool = -1.0, []
    for row in configs:
        pool = [t for t, n in zip(types, row.tolist(), strict=True) for _ in range(n)]
        value = ev.oracle(pool)
        if value > best:
            best, best_pool = value, pool
    return best_pool, best


def ribbon_best_pool(ev: DispatchEvaluation, prices: dict[str, float], caps: dict[str, int], budget: float,
                     max_evals: int | None = None, seed: int = 0) -> tuple[list[str], float, dict[str, Any]]:
    """Ribbon as the Kairos paper runs it (Sec. 7, 8.2): FCFS dispatch on the pool its Bayesian optimisation
    finds among every pool under the budget, each candidate evaluated by its simulated allowable QPS.
    Returns (pool, its allowable QPS, search details)."""
    from recserve.planners.ribbon import MAX_EVALS, ribbon_search

    types = [t for t in ev.service.types if t in prices]

    def evaluate(config: dict[str, int]) -> float:
        pool = config_to_pool(config)
        start = max(ev.oracle(pool) / 2.0, 0.5)
        return ev.max_load(pool, lambda: ev.policy("ribbon", pool), start)[0]

    res = ribbon_search(types, prices, caps, budget, evaluate, max_evals=max_evals or MAX_EVALS, seed=seed)
    pool = config_to_pool(dict(zip(types, res.config.tolist(), strict=True)))
    return pool, res.value, {"evaluations": res.evaluations, "candidates": res.candidates,
                             "trace": [[pool_text(config_to_pool(dict(zip(types, c, strict=True)))), v]
                                       for c, v in res.trace]}
