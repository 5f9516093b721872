"""Kairos pool planner on the authors' reference latencies and on small hand-checkable inputs."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from recserve.errors import InfeasibleError
from recserve.planners.kairos import (
    PoolInputs,
    TypeStats,
    enumerate_configs,
    kairos_pick,
    kairos_plus,
    load_kairos_reference,
    plan_pool,
    production_size_mix,
    type_stats,
    upper_bounds,
)
from recserve.profiles import ProfileSet, ProfileTable
from recserve.reference import reference_path

REF = reference_path("kairos_aws_latency.json").parent
needs_ref = pytest.mark.skipif(not (REF / "kairos_aws_latency.json").exists(), reason="reference data absent")


@pytest.fixture(scope="module")
def ref():
    return load_kairos_reference(REF / "kairos_aws_latency.json")


def test_size_mix_matches_the_published_statistics():
    sizes, pmf = production_size_mix()
    cdf = np.cumsum(pmf)
    assert pmf.sum() == pytest.approx(1.0)
    assert (sizes * pmf).sum() == pytest.approx(244, abs=3)             # README: mean 244 over 20k samples
    assert sizes[np.searchsorted(cdf, 0.5)] == 180
    assert 500 <= sizes[np.searchsorted(cdf, 0.9)] <= 530               # README: p90 520
    assert sizes[np.searchsorted(cdf, 0.99)] == 920


@needs_ref
def test_reference_loads_as_latency_tables(ref):
    assert len(ref.find(kind="latency_vs_batch")) == 20
    assert all(t.source == "reference" for t in ref)
    assert ref.meta["budget_usd_per_hr"] == 2.5 and ref.meta["qos_p99_ms"]["kairos-rm2"] == 350
    t = ref.get("kairos-ncf", "g4dn.xlarge", "latency_vs_batch")
    assert t.column("batch")[0] == 10 and len(t.rows) == 100


@needs_ref
def test_derived_s_f_qps_agree_with_the_authors_allocator_profile(ref):
    authors = json.loads((REF / "kairos_allocator_profile.json").read_text())
    meta = ref.meta
    for model, per_type in authors.items():
        inputs = type_stats(ref, "kairos-" + model, meta["qos_p99_ms"]["kairos-" + model], meta["prices_usd_per_hr"])
        assert inputs.base.name == "g4dn.xlarge"
        ours = {t.name: t for t in inputs.types}
        assert ours["g4dn.xlarge"].qps == pytest.approx(per_type["g4dn.xlarge"]["qps"], rel=0.02)
        for name, theirs in per_type.items():
            if "vio_batch" not in theirs:
                continue
            # the authors store the first violating batch; ours is the last meeting one.  For ncf (QoS 5 ms) the
            # authors pass batches whose mean is up to 0.6% over 5 ms (docs/planners.md); t3 latencies are noisy.
            if name == "t3.xlarge":
                assert theirs["vio_batch"] - 10 - 50 <= ours[name].s <= theirs["vio_batch"] - 10
            else:
                assert ours[name].s == theirs["vio_batch"] - (20 if model == "ncf" else 10)
            assert ours[name].f == pytest.approx(theirs["small_ratio"], abs=0.035)
            assert ours[name].qps == pytest.approx(theirs["qps"], rel=0.12)


def _toy(q_base=100.0, q_large=60.0, q_aux=80.0, f=0.8) -> PoolInputs:
    types = [TypeStats("base", 1.0, 10, q_base, 1000, 1.0, True), TypeStats("aux", 0.3, 10, q_aux, 300, f, False)]
    return PoolInputs("toy", 10.0, types, np.array([[120.0, 120.0], [q_aux, q_aux]]), np.array([np.nan, q_large]))


@pytest.mark.parametrize("u,v", [(1, 1), (1, 4), (3, 1), (0, 2), (2, 0)])
def test_upper_bound_is_equation_12_and_13(u, v):
    inputs = _toy()
    qb, qbs, qa, f = 100.0, 60.0, 80.0, 0.8
    if v == 0:
        expected = u * qb
    elif u == 0:
        expected = 0.0
    elif u * qbs <= (1 - f) / f * v * qa:
        expected = u * qbs / (1 - f)
    else:
        expected = v * qa / f + (u * qbs - (1 - f) / f * v * qa) / (u * qbs) * u * qb
    assert upper_bounds(inputs, np.array([[u, v]]))[0] == pytest.approx(expected)


def test_enumeration_respects_budget_and_caps():
    prices, caps, budget = [0.526, 0.432, 0.149, 0.1664], [5, 6, 17, 15], 2.5
    configs = enumerate_configs(prices, caps, budget)
    brute = [c for c in itertools.product(*(range(k + 1) for k in caps))
             if sum(c) > 0 and np.dot(c, prices) <= budget + 1e-9]
    assert len(configs) == len(brute)
    assert (configs @ prices <= budget + 1e-9).all() and (configs <= caps).all()


def test_similarity_pick():
    configs = np.array([[2, 0, 1], [2, 1, 0], [2, 0, 0], [1, 5, 5]])
    assert kairos_pick(configs, np.array([10.0, 9.0, 8.0, 7.0])) == 0    # top-3 share the base count
    configs = np.array([[3, 0], [1, 6], [2, 3], [2, 2], [2, 4]])
    bounds = np.array([10.0, 9.9, 9.8, 9.7, 9.6])
    d = [((configs - c) ** 2).sum() for c in configs]
    assert kairos_pick(configs, bounds) == int(np.argmin(d))


def test_kairos_plus_finds_the_best_configuration_with_fewer_evaluations():
    rng = np.random.default_rng(0)
    configs = enumerate_configs([0.5, 0.4, 0.15], [5, 6, 15], 2.5)
    weights = np.array([30.0, 20.0, 9.0])
    actual = np.sqrt(configs @ weights)              # monotone: more instances never hurt
    bounds = actual * rng.uniform(1.0, 1.3, len(configs))
    calls = []
    result = kairos_plus(configs, bounds, lambda x: calls.append(1) or float(np.sqrt(x @ weights)))
    assert result.best_qps == pytest.approx(actual.max())
    assert result.evaluations == len(calls) < len(configs) / 4


@needs_ref
def test_plan_beats_budget_scaled_homogeneous_on_the_reference(ref):
    meta = ref.meta
    models = sorted(meta["qos_p99_ms"])
    plan = plan_pool(ref, models, meta["budget_usd_per_hr"], meta["prices_usd_per_hr"], meta["qos_p99_ms"],
                     meta["max_instances"])
    for pool in plan.pools:
        assert pool.cost_per_hr <= 2.5 + 1e-9
        assert pool.config["g4dn.xlarge"] >= 1
        assert pool.upper_bound_qps > pool.homogeneous["qps"]
    assert "UB gain" in plan.table()


@needs_ref
def test_budget_below_the_base_type_is_infeasible(ref):
    meta = ref.meta
    with pytest.raises(InfeasibleError, match="budget"):
        plan_pool(ref, ["kairos-ncf"], 0.5, meta["prices_usd_per_hr"], meta["qos_p99_ms"], meta["max_instances"])
    with pytest.raises(InfeasibleError, match="no instance type meets"):
        plan_pool(ref, ["kairos-rm2"], 2.5, meta["prices_usd_per_hr"], {"kairos-rm2": 1.0}, meta["max_instances"])


@needs_ref
def test_plan_pool_runs_kairos_plus_with_an_injected_evaluator(ref):
    meta = ref.meta
    weights = {"g4dn.xlarge": 15.0, "c5n.2xlarge": 9.0, "r5n.large": 9.5, "t3.xlarge": 5.0}
    calls = []

    def evaluate(model, config):
        calls.append(config)
        return sum(weights[t] * n for t, n in config.items()) * (1.0 if config["g4dn.xlarge"] else 0.0)

    plan = plan_pool(ref, ["kairos-rm2"], 2.5, meta["prices_usd_per_hr"], meta["qos_p99_ms"], meta["max_instances"],
                     evaluate=evaluate)
    pool = plan.pools[0]
    kp = pool.details["kairos_plus"]
    assert 1 <= kp["evaluations"] < pool.details["configurations"]
    assert kp["qps"] >= pool.evaluated_qps == evaluate("kairos-rm2", pool.config)
    assert pool.homogeneous["evaluated_qps"] == pytest.approx(4 * 15.0 * 2.5 / (4 * 0.526))


@needs_ref
def test_the_homogeneous_baseline_buys_no_more_than_its_cap(ref):
    meta = ref.meta
    caps = meta["max_instances"]
    plan = plan_pool(ref, ["kairos-rm2"], 100.0, meta["prices_usd_per_hr"], meta["qos_p99_ms"], caps)
    homo = plan.pools[0].homogeneous
    assert homo["count"] == caps[homo["type"]]
    assert homo["qps"] == pytest.approx(homo["qps_unscaled"])
    assert plan.pools[0].upper_bound_qps > homo["qps"]


@needs_ref
def test_the_simulated_homogeneous_pool_is_scaled_no_further_than_its_cap():
    from recserve.sim.dispatch_eval import homogeneous_pool
    from recserve.sim.latency import load_reference

    profiles = load_reference(REF / "kairos_aws_latency.json")
    pool, scale = homogeneous_pool(profiles, "kairos-rm2", {"g4dn.xlarge": 0.526}, 100.0, 350.0, {"g4dn.xlarge": 5})
    assert pool == ["g4dn.xlarge"] * 5 and scale == pytest.approx(1.0)


@needs_ref
@pytest.mark.parametrize(("argv", "said"), [
    (["--reference", "kairos", "--cap", "g4dn.xlarg=1"], "--cap: no instance type g4dn.xlarg here; known: "
                                                         "c5n.2xlarge, g4dn.xlarge, r5n.large, t3.xlarge"),
    (["--reference", "kairos", "--price", "nosuch=1"], "--price: no instance type nosuch here"),
    (["--reference", "kairos", "--servers", "g4dn.xlarge,nosuch"], "--servers: no instance type nosuch here"),
    (["--models", "kairos-rm2", "--servers", "g4dn.xlarge", "--budget", "2", "--cap", "t3.xlarge=2"],
     "--cap: no instance type t3.xlarge here; known: g4dn.xlarge"),
])
def test_a_type_named_by_an_option_is_one_the_plan_uses(capsys, argv, said):
    from recserve.cli import main

    assert main(["plan", "pool", *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_the_pick_is_never_a_sub_configuration_of_a_better_affordable_one():
    configs = np.array([[1], [2], [3]])
    assert kairos_pick(configs, np.array([1.0, 2.0, 3.0])) == 2          # one type: the similarity rule's medoid is 2
    configs = np.array([[1, 0], [1, 3], [2, 0], [1, 1], [0, 4]])
    bounds = np.array([1.0, 5.0, 4.0, 2.0, 0.0])
    assert kairos_pick(configs, bounds) == 1


@needs_ref
def test_more_budget_never_picks_a_lower_bound(ref):
    meta = ref.meta
    for model in sorted(meta["qos_p99_ms"]):
        bounds = [plan_pool(ref, [model], budget, meta["prices_usd_per_hr"], meta["qos_p99_ms"],
                            meta["max_instances"]).pools[0].upper_bound_qps for budget in (2.5, 2.8, 3.0, 3.5, 5.0)]
        assert bounds == sorted(bounds), model


def _random_catalogue(rng: np.random.Generator, types: int) -> tuple[ProfileSet, dict[str, float], dict[str, int]]:
    """Linear latency-vs-batch tables: type 0 meets a 350 ms QoS at every size, the others up to some size."""
    batches = [1, 10, 50, 100, 200, 400, 600, 800, 1000]
    tables, prices, caps = [], {}, {}
    for t in range(types):
        fixed, per_item = rng.uniform(1, 20), rng.uniform(0.05, 0.3 if t == 0 else 1.5)
        rows = [[b, fixed + per_item * b, fixed + per_item * b, fixed + per_item * b] for b in batches]
        tables.append(ProfileTable("m", f"t{t}", "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows,
                                   source="reference"))
        prices[f"t{t}"], caps[f"t{t}"] = round(float(rng.uniform(0.1, 1.0)), 3), int(rng.integers(2, 12))
    return ProfileSet(tables), prices, caps


@pytest.mark.parametrize("seed", range(12))
def test_more_budget_never_lowers_the_picked_bound_on_random_catalogues(seed):
    """For budgets b1 < b2 the pick's upper bound never drops: the pick at b1 is still affordable at b2.  The
    similarity rule alone dropped it on half of these catalogues (the medoid of a larger top ten ranking below the
    last pick)."""
    rng = np.random.default_rng(seed)
    profiles, prices, caps = _random_catalogue(rng, int(rng.integers(2, 5)))
    base = min(prices.values())
    bounds = [plan_pool(profiles, ["m"], budget, prices, {"m": 350.0}, caps).pools[0].upper_bound_qps
              for budget in np.linspace(max(prices.values()), 8 * base + max(prices.values()), 15)]
    assert all(b2 >= b1 - 1e-9 for b1, b2 in itertools.pairwise(bounds)), bounds


def test_the_simulator_and_the_planner_share_one_homogeneous_baseline():
    """Two types meet QoS at every size: the planner's base is the more cost-effective one (cheap), and the
    simulator's baseline is that pool (it took the fastest on the largest query, fast, by a rule of its own)."""
    from recserve.sim.dispatch_eval import homogeneous_pool

    batches = [1, 100, 1000]
    tables = [ProfileTable("m", name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
                           [[b, ms * b, ms * b, ms * b] for b in batches], source="reference")
              for name, ms in (("fast", 0.05), ("cheap", 0.1))]
    profiles, prices, caps = ProfileSet(tables), {"fast": 1.0, "cheap": 0.2}, {"fast": 10, "cheap": 3}
    planned = plan_pool(profiles, ["m"], 2.0, prices, {"m": 350.0}, caps).pools[0].homogeneous
    pool, scale = homogeneous_pool(profiles, "m", prices, 2.0, 350.0, caps)
    assert pool == [planned["type"]] * planned["count"] == ["cheap"] * 3
    assert scale == pytest.approx(planned["budget_scale"]) == pytest.approx(1.0)  # the cap: 3 x $0.2 is all it spends
