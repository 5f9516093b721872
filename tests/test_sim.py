"""The discrete-event simulators: query streams, service times, the pool simulator, the co-located node."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from recserve.cli import main
from recserve.errors import ProfileError, RecserveError
from recserve.policies.dispatch import make_policy
from recserve.policies.rmu import CapacityProfile, HeraRMU, StaticController
from recserve.profiles import ProfileSet, ProfileTable
from recserve.reference import reference_path
from recserve.sim.cluster import ClusterSim, parse_pool, pool_text
from recserve.sim.colocate import LoadShape, run_scenario
from recserve.sim.dispatch_eval import DispatchEvaluation, homogeneous_pool, oracle_best_pool
from recserve.sim.latency import ServiceModel, load_reference
from recserve.sim.node import ColocModel, ColocNode, SimNodeControl
from recserve.sim.queries import QueryStream, piecewise_rate

REFERENCE = str(reference_path("kairos_aws_latency.json"))


def synthetic_profiles(per_item: dict[str, float], base_ms: float = 1.0, spread: float = 1.2) -> ProfileSet:
    """latency_vs_batch tables: mean = base + per_item * batch, p99 = spread * p50."""
    tables = []
    for server, slope in per_item.items():
        rows = []
        for b in range(10, 1010, 10):
            m = base_ms + slope * b
            rows.append([float(b), m, m, m * spread])
        tables.append(ProfileTable("m", server, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"), rows,
                                   source="modelled"))
    return ProfileSet(tables, {"qos_p99_ms": {"m": 60.0}, "prices_usd_per_hr": {"gpu": 1.0, "cpu": 0.25}})


@pytest.fixture(scope="module")
def reference():
    return load_reference(REFERENCE)


def test_pool_parsing_round_trips_and_rejects_nonsense():
    pool = parse_pool("g4dn.xlarge=1, r5n.large=2")
    assert pool == ["g4dn.xlarge", "r5n.large", "r5n.large"]
    assert pool_text(pool) == "g4dn.xlarge=1,r5n.large=2"
    with pytest.raises(RecserveError):
        parse_pool("a=x")
    with pytest.raises(RecserveError):
        parse_pool("a=0")


def test_production_mix_and_poisson_arrivals_have_the_documented_shape():
    s = QueryStream(20000, seed=3)
    assert 225 < s.sizes.mean() < 265 and np.median(s.sizes) == pytest.approx(180, abs=10)
    assert np.all(s.sizes % 10 == 0) and s.sizes.min() >= 10 and s.sizes.max() <= 1000
    arr = s.arrivals(250.0)
    assert np.all(np.diff(arr) >= 0)
    assert len(arr) / (arr[-1] / 1000.0) == pytest.approx(250.0, rel=0.05)


def test_shaped_arrivals_follow_the_rate_curve():
    s = QueryStream(5000, seed=1)
    arr = s.arrivals_shaped(piecewise_rate([(0, 100), (10, 100), (10.001, 300), (20, 300)]), 20.0)
    first, second = (arr < 10_000).sum(), (arr >= 10_000).sum()
    assert first == pytest.approx(1000, rel=0.1) and second == pytest.approx(3000, rel=0.1)


def test_service_times_match_the_tables_median_and_tail(reference):
    svc = ServiceModel.from_profiles(reference, "kairos-rm2", ["c5n.2xlarge"])
    s = QueryStream(40000, seed=0)
    buckets = np.full(len(s.sizes), svc.bucket(np.array([500]))[0])
    draws = svc.sample(["c5n.2xlarge"], buckets, s.noise)[:, 0]
    row = svc.type_index("c5n.2xlarge")
    assert np.median(draws) == pytest.approx(svc.p50[row, 49], rel=0.01)
    assert np.percentile(draws, 99) == pytest.approx(svc.p99[row, 49], rel=0.02)


def test_one_instance_at_low_load_shows_pure_service_time():
    ps = synthetic_profiles({"gpu": 0.01}, spread=1.0)
    sim = ClusterSim(ServiceModel.from_profiles(ps, "m"), ["gpu"], qos_ms=60.0)
    s = QueryStream(500, seed=0)
    res = sim.run(make_policy("ribbon", 60.0), s, qps=1.0, warmup=0.0)
    assert res.completed == 500 and not res.aborted
    service = 1.0 + 0.01 * s.sizes  # one server, FIFO: the k-th completion is the k-th query
    assert np.all(res.latencies_ms >= service - 1e-9)
    assert np.mean(np.isclose(res.latencies_ms, service)) > 0.97  # only the rare back-to-back arrivals wait


def test_overload_aborts_early_and_reports_infinite_tail():
    ps = synthetic_profiles({"gpu": 0.01})
    sim = ClusterSim(ServiceModel.from_profiles(ps, "m"), ["gpu"], qos_ms=5.0)
    res = sim.run(make_policy("kairos", 5.0), QueryStream(3000, seed=0), qps=2000.0)
    assert res.aborted and math.isinf(res.tail(99))


@pytest.mark.parametrize("policy", ["kairos", "ribbon", "clockwork"])
def test_every_query_completes_once(policy):
    ps = synthetic_profiles({"gpu": 0.01, "cpu": 0.05})
    sim = ClusterSim(ServiceModel.from_profiles(ps, "m"), ["gpu", "cpu", "cpu"], qos_ms=60.0)
    res = sim.run(make_policy(policy, 60.0), QueryStream(1000, seed=2), qps=80.0, warmup=0.0,
                  abort_on_violation=False)
    assert res.completed == 1000 and sum(res.served_by_type.values()) == 1000
    assert res.served_by_type["cpu"] > 0


def test_kairos_beats_fcfs_and_stays_below_oracle_on_a_heterogeneous_pool(reference):
    ev = DispatchEvaluation(reference, "kairos-rm2", 350.0, queries=3000, seed=0, rtol=0.08, log=None)
    pool = parse_pool("g4dn.xlarge=1,r5n.large=6")
    res = ev.evaluate(pool, ["kairos", "ribbon", "oracle"])
    assert res["kairos"].max_qps > 1.2 * res["ribbon"].max_qps
    assert res["kairos"].max_qps < res["oracle"].max_qps


def test_homogeneous_pool_fills_the_budget_with_the_base_type(reference):
    pool, scale = homogeneous_pool(reference, "kairos-rm2", reference.meta["prices_usd_per_hr"], 2.5, 350.0)
    assert pool == ["g4dn.xlarge"] * 4 and scale == pytest.approx(2.5 / (4 * 0.526))


def test_with_spread_keeps_the_means_and_draws_service_times_at_that_spread():
    svc = ServiceModel.from_profiles(synthetic_profiles({"gpu": 0.01, "cpu": 0.05}, spread=1.6), "m")
    tight = svc.with_spread(0.005)  # the Kairos paper's premise: SD 0.5% of the mean
    assert np.array_equal(tight.mean, svc.mean)
    assert np.allclose(tight.p99 / tight.mean, 1.0, atol=0.013) and (svc.p99 / svc.mean > 1.5).all()
    noise = QueryStream(20000, seed=1).noise
    draws = tight.sample(["cpu"], np.full(len(noise), 50), noise)[:, 0]
    assert draws.std() / draws.mean() == pytest.approx(0.005, rel=0.05)
    assert draws.mean() == pytest.approx(svc.mean[svc.type_index("cpu"), 50], rel=1e-3)
    exact = svc.with_spread(0.0)
    assert np.array_equal(exact.p50, svc.mean) and np.array_equal(exact.p99, svc.mean)
    with pytest.raises(ProfileError):
        svc.with_spread(-0.1)


def test_dispatch_evaluation_runs_the_tables_at_the_spread_it_is_given(reference):
    measured = DispatchEvaluation(reference, "kairos-mtwnd", 25.0, queries=500, log=None).service
    premise = DispatchEvaluation(reference, "kairos-mtwnd", 25.0, queries=500, log=None, latency_cv=0.005).service
    t3 = measured.type_index("t3.xlarge")
    assert np.median(measured.p99[t3] / measured.mean[t3]) > 1.3  # the artifact's burstable tail
    assert np.array_equal(premise.mean, measured.mean) and (premise.p99 / premise.mean < 1.02).all()


def test_the_papers_oracle_takes_the_best_pool_under_the_budget_and_bounds_kairos(reference):
    from recserve.planners.kairos import enumerate_configs

    prices, caps = reference.meta["prices_usd_per_hr"], reference.meta["max_instances"]
    ev = DispatchEvaluation(reference, "kairos-rm2", 350.0, queries=2000, seed=0, rtol=0.08, log=None)
    pool, best = oracle_best_pool(ev, prices, caps, 1.2)
    assert ev.oracle(pool) == best
    types = [t for t in ev.service.types if t in prices]
    for row in enumerate_configs([prices[t] for t in types], [caps[t] for t in types], 1.2):
        assert ev.oracle([t for t, n in zip(types, row.tolist(), strict=True) for _ in range(n)]) <= best
    assert ev.evaluate(pool, ["kairos"])["kairos"].max_qps < best  # Poisson queueing at the p99 costs


# ------------------------------------------------------------------ co-located node


def small_models(ps: ProfileSet) -> list[ColocModel]:
    svc = ServiceModel.from_profiles(ps, "m", ["cpu"])
    return [ColocModel("mem", svc, "cpu", 60.0, 95.0, llc_sensitivity=0.1, bw_per_worker_gbs=10, memory_fraction=0.8),
            ColocModel("cache", svc, "cpu", 60.0, 95.0, llc_sensitivity=1.0, bw_per_worker_gbs=1,
                       memory_fraction=0.2)]


def test_node_control_enforces_core_and_way_budgets():
    node = ColocNode(small_models(synthetic_profiles({"cpu": 0.02})), cores=4, ways=4)
    ctl = SimNodeControl(node)
    StaticController().start(ctl)
    assert [ctl.get_workers(m) for m in ctl.models()] == [2, 2]
    with pytest.raises(RecserveError):
        ctl.set_workers("mem", 3)
    with pytest.raises(RecserveError):
        ctl.set_ways("cache", 0)


def test_llc_and_bandwidth_slowdowns_follow_the_documented_formulas():
    models = small_models(synthetic_profiles({"cpu": 0.02}))
    node = ColocNode(models, cores=4, ways=11, mem_bw_gbs=10.0)
    assert node.llc_factor(models[1], 11) == 1.0
    assert node.llc_factor(models[1], 1) == pytest.approx(2.0)
    node.state["mem"].busy = 2  # 20 GB/s of demand on a 10 GB/s node
    assert node._bw_factor(models[0]) == pytest.approx(1.8)


def test_hera_rmu_violates_fewer_windows_than_static_when_load_shifts():
    ps = synthetic_profiles({"cpu": 0.02})
    models = small_models(ps)
    # hand-made worker-scalability profile (a little under what a ~6 ms worker really sustains)
    prof = ProfileSet([ProfileTable(m.name, "node", "maxload_vs_workers", ("workers", "max_qps"),
                                    [[1.0, 150.0], [8.0, 1300.0]], source="modelled") for m in models])
    cap = {m.name: CapacityProfile.from_profiles(prof, m.name, "node") for m in models}
    assert cap["mem"].qps(4, 3) == pytest.approx(cap["mem"].max_qps(4))  # no ways table: factor 1
    shapes = [LoadShape([(0, 0.1), (10, 0.1), (10.001, 0.6), (30, 0.6)]), LoadShape([(0, 0.3), (30, 0.3)])]
    # mem jumps to 800 qps at t=10 s: more than the 4 static workers sustain
    res = run_scenario(models, shapes, {"mem": 1330.0, "cache": 400.0}, prof, "node", ["hera", "static"], 30.0,
                       cores=8, ways=11, mem_bw_gbs=200.0, t_monitor_s=1.0)
    hera, static = res["controllers"]["hera"], res["controllers"]["static"]
    assert static["violating_window_fraction"] > hera["violating_window_fraction"]
    last = hera["windows"][-1]["models"]
    assert last["mem"]["workers"] > last["cache"]["workers"]  # the loaded model got the cores
    assert isinstance(HeraRMU(cap).capacity, dict)


# ------------------------------------------------------------------ CLI


def test_cli_simulate_dispatch_writes_json(tmp_path, capsys):
    out = tmp_path / "d.json"
    rc = main(["simulate", "dispatch", "--reference", REFERENCE, "--model", "rm2", "--pool",
               "g4dn.xlarge=1,r5n.large=4", "--policies", "kairos,ribbon,oracle", "--queries", "800",
               "--rtol", "0.1", "--no-homogeneous", "--json-out", str(out), "--plot", str(tmp_path / "d.png")])
    assert rc == 0
    data = json.loads(out.read_text())["results"][0]
    assert data["model"] == "kairos-rm2" and set(data["policies"]) == {"kairos", "ribbon", "oracle"}
    assert (tmp_path / "d.png").stat().st_size > 0
    assert "kairos/ribbon" in capsys.readouterr().out


def test_cli_rejects_unknown_policy():
    assert main(["simulate", "dispatch", "--reference", REFERENCE, "--model", "rm2", "--pool", "g4dn.xlarge=1",
                 "--policies", "random", "--no-homogeneous"]) == 2


def test_cli_simulate_colocate_profiles_the_node_and_compares_controllers(tmp_path, capsys):
    out = tmp_path / "c.json"
    rc = main(["simulate", "colocate", "--reference", REFERENCE, "--models", "rm2,wnd", "--cores", "4", "--ways", "4",
               "--duration", "12", "--t-monitor", "2", "--profile-queries", "300",
               "--node-profiles", str(tmp_path / "prof.json"), "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["controllers"]) == {"hera", "parties", "static"}
    for ctl in data["controllers"].values():
        assert len(ctl["windows"]) == 6 and 0.0 <= ctl["violating_window_fraction"] <= 1.0
        for w in ctl["windows"]:
            alloc = w["models"].values()
            assert sum(m["workers"] for m in alloc) <= 4 and sum(m["ways"] for m in alloc) <= 4
    prof = ProfileSet.load(tmp_path / "prof.json")
    assert prof.find(kind="maxload_vs_workers") and prof.find(kind="maxload_vs_ways")
    assert "hera" in capsys.readouterr().out


def test_load_scenarios_have_the_documented_shape():
    from recserve.sim.colocate import diurnal, hera_fig14, steps

    mem, cache = hera_fig14(120.0)
    rm, rc = mem.rate(100.0), cache.rate(100.0)
    assert rm(0) == pytest.approx(10) and rm(40) == pytest.approx(60) and rm(81) == pytest.approx(10)
    assert rc(39.9) > 45 and rc(41) == pytest.approx(20) and rc(81) == pytest.approx(60)
    mem, cache = diurnal(120.0, peak=0.6, trough=0.2)
    assert mem.rate(1.0)(60) == pytest.approx(0.6) and cache.rate(1.0)(60) == pytest.approx(0.2)
    mem, cache = steps(60.0, (0.1, 0.5, 0.3))
    assert [mem.rate(1.0)(t) for t in (10, 30, 50)] == pytest.approx([0.1, 0.5, 0.3])
    assert [cache.rate(1.0)(t) for t in (10, 30, 50)] == pytest.approx([0.3, 0.5, 0.1])


def test_seeded_predictors_use_the_service_grid():
    """With ``seed_predictor`` the policies start from the latency tables on the simulator's own grid
    (simulated queries carry grid indices): Kairos keeps large queries off the slow type and beats FCFS."""
    from recserve.profiles import ProfileSet, ProfileTable
    from recserve.sim.dispatch_eval import DispatchEvaluation

    sizes = [10, 100, 250, 500, 750, 1000]
    ps = ProfileSet()
    for name, lat in (("dram", [9.5, 13.7, 21.9, 43.8, 56.3, 72.9]), ("ssd", [11.2, 21.3, 48.7, 84.0, 115.8, 147.3])):
        ps.add(ProfileTable("kairos-wnd", name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
                            [[b, m, m, 1.15 * m] for b, m in zip(sizes, lat, strict=True)]))
    ev = DispatchEvaluation(ps, "kairos-wnd", 96.6, queries=3000, log=None, seed_predictor=True)
    policy = ev.policy("kairos", ["dram", "ssd"])
    assert len(policy.predictor.buckets) == len(ev.service.batches)
    res = ev.evaluate(["dram", "ssd"], ["kairos", "ribbon"])
    assert res["kairos"].max_qps > 1.5 * res["ribbon"].max_qps > 0
