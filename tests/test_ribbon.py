"""Ribbon's pool search as Kairos runs it: Bayesian optimisation over every pool under the budget."""

from __future__ import annotations

import numpy as np
import pytest

from recserve.planners.ribbon import bayes_opt, ribbon_search
from recserve.profiles import ProfileSet, ProfileTable
from recserve.sim.dispatch_eval import DispatchEvaluation, ribbon_best_pool


def test_bayes_opt_finds_the_peak_of_a_smooth_objective_without_trying_every_point():
    grid = np.array([[a, b] for a in range(16) for b in range(16)])
    calls = []

    def objective(x):
        calls.append(tuple(x))
        return 100.0 - (x[0] - 11) ** 2 - 2 * (x[1] - 4) ** 2

    res = bayes_opt(grid, objective, seed=3)
    assert res.config.tolist() == [11, 4] and res.value == 100.0
    assert res.evaluations == len(calls) == len(set(calls)) < len(grid) // 2  # never the same point twice


def test_bayes_opt_stops_at_its_evaluation_budget():
    grid = np.arange(50)[:, None]
    res = bayes_opt(grid, lambda x: float(x[0] % 7), max_evals=5, seed=0)
    assert res.evaluations == 5 and len(res.trace) == 5


def test_ribbon_search_covers_every_pool_under_the_budget_not_only_base_heavy_ones():
    seen = []

    def evaluate(config):
        seen.append(config)
        return 10.0 * config["cpu"] + 1.0 * config["gpu"]  # the best pool holds no base instance at all

    res = ribbon_search(["gpu", "cpu"], {"gpu": 1.0, "cpu": 0.25}, {"gpu": 3, "cpu": 8}, 2.0, evaluate, seed=1)
    assert res.config.tolist() == [0, 8] and res.value == 80.0
    assert all(1.0 * c["gpu"] + 0.25 * c["cpu"] <= 2.0 for c in seen)


def _two_type_profiles() -> ProfileSet:
    """A GPU that serves every size within QoS and a cheap CPU that meets it only for small queries."""
    ps = ProfileSet(meta={"qos_p99_ms": {"m": 60.0}})
    for name, base, slope in (("gpu", 4.0, 0.02), ("cpu", 1.0, 0.2)):
        rows = [[float(b), base + slope * b, base + slope * b, 1.1 * (base + slope * b)] for b in range(10, 1010, 10)]
        ps.add(ProfileTable("m", name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows))
    return ps


def test_ribbon_runs_fcfs_on_its_own_pool_where_a_cpu_heavy_pool_collapses():
    """Kairos §8.2: Ribbon is compared on the pool its own search picks.  On a CPU-heavy pool FCFS sends
    large queries to CPUs that cannot meet QoS; Ribbon's search keeps away from such pools."""
    ev = DispatchEvaluation(_two_type_profiles(), "m", 60.0, queries=2000, rtol=0.08, log=None)
    prices, caps = {"gpu": 1.0, "cpu": 0.25}, {"gpu": 3, "cpu": 8}
    pool, qps, search = ribbon_best_pool(ev, prices, caps, 3.0, max_evals=40)
    cpu_heavy = ["gpu"] + ["cpu"] * 8
    heavy = ev.max_load(cpu_heavy, lambda: ev.policy("ribbon", cpu_heavy), 1.0)[0]
    assert qps > 1.5 * heavy
    assert sum(prices[t] for t in pool) <= 3.0 and pool.count("gpu") >= 2
    assert search["evaluations"] <= 40 and search["candidates"] > search["evaluations"]
    assert max(v for _, v in search["trace"]) == pytest.approx(qps)


def test_bayes_opt_does_not_declare_convergence_before_its_minimum_share_of_the_space():
    grid = np.arange(100)[:, None]
    flat = bayes_opt(grid, lambda x: 1.0, min_share=0.2, seed=0)  # nothing to improve: stops as soon as allowed
    assert flat.evaluations == 20
    early = bayes_opt(grid, lambda x: 1.0, min_share=0.0, seed=0)
    assert early.evaluations < 20
