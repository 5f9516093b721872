"""Dispatch policies, the online latency predictor and the node resource managers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recserve.errors import RecserveError
from recserve.policies.dispatch import (
    ClockworkPolicy,
    DRSPolicy,
    FCFSPolicy,
    KairosPolicy,
    Query,
    make_instances,
    make_policy,
    oracle_throughput,
    tune_threshold,
)
from recserve.policies.parties import PartiesController
from recserve.policies.predictor import LatencyPredictor
from recserve.policies.rmu import (
    MAX_BACKOFF,
    CapacityProfile,
    HeraRMU,
    StaticController,
    WindowStats,
    even_split,
    violation_fraction,
)

BUCKETS = np.arange(10, 1010, 10, dtype=float)


def seeded_predictor(types: list[str], per_item_ms: dict[str, float], base_ms: float = 1.0) -> LatencyPredictor:
    prior = {t: base_ms + per_item_ms[t] * BUCKETS for t in types}
    return LatencyPredictor(types, BUCKETS, prior=prior)


def bind(policy, pool: list[str]):
    insts, types = make_instances(pool)
    policy.bind(insts, types)
    return insts


# ------------------------------------------------------------------ predictor


def test_predictor_starts_linear_then_uses_lookup_table():
    p = LatencyPredictor(["gpu"], BUCKETS, min_samples=3)
    assert p.pred[0, 5] == 0.0  # nothing known: optimistic
    p.observe(0, p.bucket(100), 12.0)
    assert p.pred[0, p.bucket(200)] == pytest.approx(24.0)  # one point: proportional
    p.observe(0, p.bucket(300), 32.0)
    assert p.pred[0, p.bucket(500)] == pytest.approx(52.0)  # two points: line 2 + 0.1 * b
    for _ in range(3):
        p.observe(0, p.bucket(500), 80.0)
    # bucket 500 now comes from the table (mean of its observations), others stay on the refitted line
    assert p.pred[0, p.bucket(500)] == pytest.approx(80.0)
    assert p.table_fraction() == pytest.approx(1 / len(BUCKETS))


def test_predictor_buckets_round_up_and_clamp():
    p = LatencyPredictor(["a"], BUCKETS)
    assert p.bucket(1) == 0 and p.bucket(10) == 0 and p.bucket(11) == 1 and p.bucket(5000) == len(BUCKETS) - 1


def test_heterogeneity_coefficients_are_latency_ratios_at_the_largest_query():
    p = seeded_predictor(["gpu", "cpu"], {"gpu": 0.1, "cpu": 0.4})
    c = p.coefficients()
    assert c[0] == pytest.approx(1.0)
    assert c[1] == pytest.approx((1 + 100) / (1 + 400))


# ------------------------------------------------------------------ Kairos


def test_kairos_penalises_qos_violating_pairs_and_matches_min_cost():
    pred = seeded_predictor(["gpu", "cpu"], {"gpu": 0.02, "cpu": 0.1})
    pol = KairosPolicy(qos_ms=50.0, predictor=pred)
    insts = bind(pol, ["gpu", "cpu"])
    big, small = Query(0, 800, 0.0, pred.bucket(800)), Query(1, 50, 0.0, pred.bucket(50))
    cost = pol.cost_matrix(0.0, [big, small])
    assert cost[0, 1] == pytest.approx(10 * 50.0 * pred.coefficients()[1])  # 81 ms on cpu > 0.98 * 50
    pairs = pol.assign(0.0, [big, small], insts)
    assert {(q.id, i.type_name) for q, i in pairs} == {(0, "gpu"), (1, "cpu")}


def test_kairos_holds_a_large_query_for_a_soon_free_fast_instance():
    pred = seeded_predictor(["gpu", "cpu"], {"gpu": 0.02, "cpu": 0.1})
    pol = KairosPolicy(qos_ms=50.0, predictor=pred)
    gpu, cpu = bind(pol, ["gpu", "cpu"])
    pol.free_at[gpu.index] = 5.0  # GPU busy for 5 more ms
    big = Query(0, 800, 0.0, pred.bucket(800))
    assert pol.assign(0.0, [big], [cpu]) == []  # waiting for the GPU beats a QoS violation on the CPU


def test_kairos_waiting_time_counts_against_qos():
    pred = seeded_predictor(["gpu"], {"gpu": 0.05})
    pol = KairosPolicy(qos_ms=50.0, predictor=pred)
    bind(pol, ["gpu"])
    fresh = Query(0, 400, 100.0, pred.bucket(400))
    stale = Query(1, 400, 70.0, pred.bucket(400))  # waited 30 ms already: 21 + 30 > 49
    cost = pol.cost_matrix(100.0, [fresh, stale])
    assert cost[0, 0] == pytest.approx(21.0)
    assert cost[1, 0] == pytest.approx(500.0)


def test_kairos_cost_matrix_for_20_by_20_is_cheap_enough_to_build_often():
    pred = seeded_predictor(["a", "b", "c", "d"], {"a": 0.02, "b": 0.05, "c": 0.08, "d": 0.1})
    pol = KairosPolicy(qos_ms=100.0, predictor=pred)
    insts = bind(pol, ["a", "b", "c", "d"] * 5)
    queue = [Query(i, 10 * (i + 1), 0.0, pred.bucket(10 * (i + 1))) for i in range(20)]
    pairs = pol.assign(1.0, queue, insts)
    assert len(pairs) == 20 and len({i.index for _, i in pairs}) == 20


# ------------------------------------------------------------------ baselines


def test_fcfs_sends_the_head_query_to_the_fastest_idle_instance():
    pred = seeded_predictor(["cpu", "gpu"], {"cpu": 0.1, "gpu": 0.02})
    pol = FCFSPolicy(qos_ms=50.0, predictor=pred)
    insts = bind(pol, ["cpu", "gpu"])
    q1, q2 = Query(0, 20, 0.0, 1), Query(1, 900, 0.0, 89)
    pairs = pol.assign(0.0, [q1, q2], insts)
    assert [(q.id, i.type_name) for q, i in pairs] == [(0, "gpu"), (1, "cpu")]  # FCFS ignores size


def test_drs_routes_by_static_threshold_without_crossing_classes():
    pred = seeded_predictor(["gpu", "cpu"], {"gpu": 0.02, "cpu": 0.1})
    pol = DRSPolicy(50.0, threshold=300, base_types=["gpu"], predictor=pred)
    gpu, cpu = bind(pol, ["gpu", "cpu"])
    small, large = Query(0, 100, 0.0, 9), Query(1, 600, 0.0, 59)
    assert [(q.id, i.type_name) for q, i in pol.assign(0.0, [small, large], [gpu, cpu])] == [(0, "cpu"), (1, "gpu")]
    # only the GPU idle: the small query waits for a CPU, the large one behind it still goes
    assert [(q.id, i.type_name) for q, i in pol.assign(0.0, [small, large], [gpu])] == [(1, "gpu")]


def test_clockwork_queues_on_the_instance_with_earliest_predicted_completion():
    pred = seeded_predictor(["gpu", "cpu"], {"gpu": 0.02, "cpu": 0.1})
    pol = ClockworkPolicy(qos_ms=100.0, predictor=pred)
    gpu, cpu = bind(pol, ["gpu", "cpu"])
    assert pol.per_instance_queues
    pol.free_at[gpu.index] = 10.0  # busy GPU still finishes a 500-item query first (10 + 11 < 51)
    pairs = pol.assign(0.0, [Query(0, 500, 0.0, 49)], [cpu])
    assert pairs[0][1] is gpu
    assert pol.free_at[gpu.index] == pytest.approx(21.0)


def test_on_complete_teaches_the_predictor_and_frees_the_instance():
    pol = FCFSPolicy(qos_ms=50.0)
    (inst,) = bind(pol, ["x"])
    q = Query(0, 100, 0.0, 9)
    pol.assign(0.0, [q], [inst])
    pol.on_complete(7.0, q, inst, 7.0)
    assert pol.free_at[inst.index] == 7.0
    assert pol.predictor.pred[0, 9] == pytest.approx(7.0)


def test_make_policy_rejects_unknown_names():
    with pytest.raises(RecserveError):
        make_policy("roundrobin", 10.0)


def test_threshold_hill_climb_finds_the_peak():
    best, value, trace = tune_threshold(lambda t: -abs(t - 370), start=100, step=100, min_step=10, lo=0, hi=1000)
    assert abs(best - 370) <= 10 and value == -abs(best - 370)
    assert len(trace) < 40


def test_oracle_throughput_matches_a_hand_computed_case():
    mean = {"gpu": np.full(100, 10.0), "cpu": np.full(100, 40.0)}
    mean["cpu"][50:] = 1e6  # the CPU cannot serve queries above 500
    tail = {k: v.copy() for k, v in mean.items()}

    def bucket_of(s):
        return (np.asarray(s) // 10 - 1).astype(int)

    sizes = np.array([100] * 6 + [900] * 2)
    qps = oracle_throughput(sizes, ["gpu", "cpu"], mean, tail, qos_ms=50.0, bucket_of=bucket_of)
    # GPU: 900 @0, 900 @10, then the largest remaining (100s) @20, 30, 40, 50; CPU: smallest 100 @0-40 and,
    # winning nothing at the 40 ms tie-break order, one more 100 @40-80 -> makespan 80 ms
    assert qps == pytest.approx(8 / 0.080)
    assert oracle_throughput(sizes, ["cpu"], mean, tail, 50.0, bucket_of) == 0.0  # 25% unservable


# ------------------------------------------------------------------ resource managers


class FakeNode:
    def __init__(self, stats: dict[str, WindowStats], cores: int = 16, ways: int = 11) -> None:
        self.stats = stats
        self.workers = {m: 1 for m in stats}
        self.ways = {m: 1 for m in stats}
        self.cores, self.nways = cores, ways

    def models(self):
        return list(self.stats)

    def sla(self, m):
        return 100.0, 95.0

    def total_cores(self):
        return self.cores

    def total_ways(self):
        return self.nways

    def get_workers(self, m):
        return self.workers[m]

    def set_workers(self, m, n):
        assert 1 <= n and sum(v for k, v in self.workers.items() if k != m) + n <= self.cores
        self.workers[m] = n

    def get_ways(self, m):
        return self.ways[m]

    def set_ways(self, m, w):
        assert 1 <= w and sum(v for k, v in self.ways.items() if k != m) + w <= self.nways
        self.ways[m] = w

    def window_stats(self, m):
        return self.stats[m]


def linear_capacity(per_worker: float, cache_sensitive: bool) -> CapacityProfile:
    def ways_factor(_n, w):
        return (0.4 + 0.6 * w / 11) if cache_sensitive else 1.0

    return CapacityProfile(lambda n: per_worker * n, ways_factor)


def test_hera_scales_workers_with_urgency_and_resplits_llc():
    node = FakeNode({"mem": WindowStats(200.0, 50, 100.0), "cache": WindowStats(50.0, 100, 100.0)})
    rmu = HeraRMU({"mem": linear_capacity(10.0, False), "cache": linear_capacity(50.0, True)})
    rmu.start(node)
    assert node.workers == {"mem": 8, "cache": 8} and node.ways == {"mem": 6, "cache": 5}
    rmu.step(1.0, node)
    # mem: urgency 2 -> 200 qps -> 20 workers wanted, capped by what the neighbour can give up
    # cache: slack 0.5 -> downsized to ceil(100 / 50) = 2 workers
    assert node.workers["cache"] == 2
    assert node.workers["mem"] == 14
    # LLC: mem does not care, so the cache-sensitive model gets all but one way
    assert node.ways == {"mem": 1, "cache": 10}


def test_hera_does_not_shrink_back_to_a_worker_count_just_seen_to_violate():
    # the profile says one worker carries 60 qps; live, one worker violated at 53 qps (a co-located node)
    node = FakeNode({"a": WindowStats(250.0, 50, 53.0), "b": WindowStats(85.0, 10, 10.0)})
    rmu = HeraRMU({"a": linear_capacity(60.0, False), "b": linear_capacity(60.0, False)}, memory_windows=3)
    rmu.start(node)
    node.workers = {"a": 1, "b": 1}
    rmu.step(1.0, node)
    assert node.workers["a"] == 3  # urgency 2.5 x 53 qps
    node.stats["a"] = WindowStats(40.0, 53, 53.0)  # slack 0.4 with three workers
    rmu.step(2.0, node)
    assert node.workers["a"] == 2  # the fewest the profile allows, less the count that just failed at 53 qps
    rmu.step(3.0, node)
    assert node.workers["a"] == 2
    rmu.step(4.0, node)  # past the memory's three decisions, but b is as busy as when a failed: still avoided
    assert node.workers["a"] == 2
    node.stats["b"] = WindowStats(85.0, 2, 2.0)  # b goes quiet: the failure beside it is forgotten
    for t in (5.0, 6.0, 7.0):
        rmu.step(t, node)
    assert node.workers["a"] == 1


def test_hera_remembers_a_count_that_fails_again_at_the_same_rate_twice_as_long():
    rmu = HeraRMU({"a": linear_capacity(60.0, False)}, memory_windows=3)
    over, ok = WindowStats(250.0, 50, 53.0), WindowStats(40.0, 53, 53.0)

    def remembered(steps: int) -> int:
        """After one worker fails at 53 qps beside a neighbour that then goes quiet: for how many of the next
        ``steps`` decisions it is avoided."""
        rmu._steps += 1
        rmu._rates = {"b": 10.0}
        rmu._remember("a", 1, over, over.tail_ms / 100.0)
        rmu._rates = {"b": 5.0}
        avoided = 0
        for _ in range(steps):
            rmu._steps += 1
            avoided += rmu._failed_at("a", 1, ok.arrival_qps)
        return avoided

    assert remembered(3) == 2  # remembered for three decisions, the failure's own included
    assert remembered(5) == 5  # tried again as soon as it lapsed and failed at the same rate: six decisions
    assert remembered(12) == 11  # and again: twelve
    rmu._steps += 100  # long after: a failure is new, remembered for three decisions again
    assert remembered(3) == 2
    rmu._steps += 2
    rmu._remember("a", 1, WindowStats(250.0, 50, 30.0), 2.5)  # a failure at a clearly lower rate is new too
    assert rmu._failed["a"][1][2] == 3


def test_hera_keeps_a_failure_past_its_span_while_the_loads_hold_up_to_the_cap():
    rmu = HeraRMU({"a": linear_capacity(60.0, False), "b": linear_capacity(60.0, False)}, memory_windows=3)
    rmu._observe_rates({"a": WindowStats(250.0, 50, 53.0), "b": WindowStats(50.0, 60, 60.0)})
    rmu._steps += 1
    rmu._remember("a", 1, WindowStats(250.0, 50, 53.0), 2.5)
    noisy = [55.0, 70.0, 45.0, 62.0, 58.0]  # b at a steady ~60 qps, one window read at 45 (under 0.8 x 60)
    kept = []
    for i in range(MAX_BACKOFF * 3 + 2):
        rmu._steps += 1
        rmu._observe_rates({"a": WindowStats(40.0, 53, 53.0), "b": WindowStats(50.0, 60, noisy[i % len(noisy)])})
        kept.append(rmu._failed_at("a", 1, 53.0))
    assert all(kept[:MAX_BACKOFF * 3 - 1]) and not any(kept[MAX_BACKOFF * 3 - 1:])  # held to the cap, then tried
    rmu._steps += 1
    rmu._remember("a", 1, WindowStats(250.0, 50, 53.0), 2.5)
    for _ in range(4):  # b drops to a third of its load: past the span the failure is forgotten
        rmu._steps += 1
        rmu._observe_rates({"a": WindowStats(40.0, 53, 53.0), "b": WindowStats(50.0, 20, 20.0)})
    assert not rmu._failed_at("a", 1, 53.0)
    rmu._observe_rates({"a": WindowStats(40.0, 53, 53.0), "b": WindowStats(50.0, 60, 60.0)})
    rmu._steps += 1
    rmu._remember("a", 1, WindowStats(250.0, 50, 53.0), 2.5)
    for _ in range(6):  # b rises to three times its load: a change too (the node is rebalancing), forgotten
        rmu._steps += 1
        rmu._observe_rates({"a": WindowStats(40.0, 53, 53.0), "b": WindowStats(50.0, 180, 180.0)})
    assert not rmu._failed_at("a", 1, 53.0)
    assert rmu.derating("a") == 1.0  # the curve is derated for the span alone


def test_hera_may_return_to_a_failed_worker_count_at_a_lower_rate():
    node = FakeNode({"a": WindowStats(250.0, 50, 53.0), "b": WindowStats(85.0, 10, 10.0)})
    rmu = HeraRMU({"a": linear_capacity(60.0, False), "b": linear_capacity(60.0, False)})
    rmu.start(node)
    node.workers = {"a": 1, "b": 1}
    rmu.step(1.0, node)
    assert node.workers["a"] == 3
    node.stats["a"] = WindowStats(40.0, 45, 45.0)  # below the 53 qps one worker failed at, not clearly (0.8 x 53)
    rmu.step(2.0, node)
    assert node.workers["a"] == 2
    node.stats["a"] = WindowStats(40.0, 40, 40.0)  # clearly below
    rmu.step(3.0, node)
    assert node.workers["a"] == 1


def test_hera_stops_at_the_knee_of_the_worker_curve_when_no_count_covers_the_traffic():
    curve = {1: 87.0, 2: 133.0, 3: 137.0}  # a 2-core node: the third worker adds 3%
    rmu = HeraRMU({"a": CapacityProfile(lambda n: curve[min(n, 3)], lambda _n, _w: 1.0)})
    assert rmu.find_number_of_workers("a", 428.0, 3) == 2
    assert rmu.find_number_of_workers("a", 100.0, 3) == 2  # covered: the fewest that cover it
    steep = HeraRMU({"a": CapacityProfile(lambda n: 100.0 * n, lambda _n, _w: 1.0)})
    assert steep.find_number_of_workers("a", 428.0, 3) == 3


def test_hera_keeps_its_workers_when_every_count_just_failed_at_this_rate():
    flat = {1: 109.0, 2: 109.0, 3: 109.0}  # a flat profile: it cannot tell the counts apart
    rmu = HeraRMU({"a": CapacityProfile(lambda n: flat[min(n, 3)], lambda _n, _w: 1.0)})
    rmu._steps = 1
    rmu._remember("a", 3, WindowStats(float("inf"), 50, 65.0), float("inf"))  # three workers failed at 65 qps
    assert rmu.find_number_of_workers("a", 95.0, 3, current=3) == 3  # and so would one or two: stay
    assert rmu.find_number_of_workers("a", 60.0, 3, current=3) == 3  # not clearly below: still stay
    assert rmu.find_number_of_workers("a", 50.0, 3, current=3) == 1  # clearly below the failed rate: the profile


def test_hera_scales_its_curve_by_what_a_count_just_failed_at():
    # live on 2 cores: three workers of hera-dlrm-b (profiled 56 / 59 / 67 qps) failed at 27 qps; at 26 qps the
    # exclusion alone (a lower rate) let the profile send it back to one worker, which failed again
    curve = {1: 56.0, 2: 59.0, 3: 67.0}
    node = FakeNode({"a": WindowStats(900.0, 20, 27.0), "b": WindowStats(85.0, 10, 10.0)}, cores=4)
    rmu = HeraRMU({"a": CapacityProfile(lambda n: curve[min(n, 3)], lambda _n, _w: 1.0),
                   "b": linear_capacity(60.0, False)})
    node.workers = {"a": 3, "b": 1}
    rmu.step(1.0, node)  # three workers, settled, violate at 27 qps
    assert rmu.derating("a") == 27.0 / 67.0
    node.stats["a"] = WindowStats(70.0, 26, 26.0)  # slack 0.7: the RMU looks for fewer workers
    rmu.step(2.0, node)
    assert node.workers["a"] == 3  # 27/67 of the curve: one worker carries 22.6 qps, two 23.8, three 27


def test_hera_does_not_blame_a_count_for_the_window_it_was_set_in():
    node = FakeNode({"a": WindowStats(250.0, 50, 100.0), "b": WindowStats(85.0, 10, 10.0)})
    rmu = HeraRMU({"a": linear_capacity(60.0, False), "b": linear_capacity(60.0, False)})
    rmu.step(1.0, node)  # one worker (settled) fails at 100 qps: remembered, grows to 5
    assert node.workers["a"] == 5 and rmu.derating("a") == 1.0  # 100 qps is past one worker's 60: no derating
    rmu.step(2.0, node)  # the window the new workers started in fails too: not held against five workers
    assert 5 not in rmu._failed["a"]


def test_capacity_from_points_never_loses_load_with_more_workers():
    cap = CapacityProfile.from_points({1: 33.0, 2: 22.0, 3: 50.0})  # a noisy live measurement
    assert [cap.max_qps(n) for n in (1, 2, 3, 4)] == [33.0, 33.0, 50.0, 50.0]


def test_hera_leaves_models_inside_the_slack_band_alone():
    node = FakeNode({"a": WindowStats(90.0, 10, 10.0), "b": WindowStats(85.0, 10, 10.0)})
    rmu = HeraRMU({"a": linear_capacity(1.0, False), "b": linear_capacity(1.0, False)})
    rmu.start(node)
    rmu.step(1.0, node)
    assert node.workers == {"a": 8, "b": 8} and rmu.log == []


def _parties(stats: dict[str, WindowStats]) -> tuple[FakeNode, PartiesController]:
    node = FakeNode(stats)
    ctl = PartiesController(judge_s=1.0, rest_s=3.0)  # 1-s windows: each adjustment judged over one window
    ctl.start(node)
    return node, ctl


def test_parties_makes_one_adjustment_at_a_time_and_judges_it_before_the_next():
    node, ctl = _parties({"a": WindowStats(150.0, 10, 10.0), "b": WindowStats(50.0, 10, 10.0)})
    ctl.step(1.0, node)
    assert node.workers == {"a": 9, "b": 7}  # a took a core from b (the most slack), and b was not also shrunk
    node.stats["a"] = WindowStats(120.0, 10, 10.0)  # better: the upsize helped, so a grows by cores again
    ctl.step(2.0, node)
    assert node.workers == {"a": 10, "b": 6} and node.ways == {"a": 6, "b": 5}


def test_parties_tries_the_other_resource_when_an_upsize_did_not_help():
    node, ctl = _parties({"a": WindowStats(150.0, 10, 10.0), "b": WindowStats(50.0, 10, 10.0)})
    ctl.step(1.0, node)
    node.stats["a"] = WindowStats(160.0, 10, 10.0)  # worse after the core
    ctl.step(2.0, node)
    assert node.workers["a"] == 9 and node.ways == {"a": 7, "b": 4}


def test_parties_reverts_a_downsize_that_cost_qos_and_rests_the_model():
    node, ctl = _parties({"a": WindowStats(50.0, 10, 10.0), "b": WindowStats(90.0, 10, 10.0)})
    ctl.step(1.0, node)  # a has slack (b, at 0.9 of its SLA, too little to give)
    assert node.workers == {"a": 7, "b": 8}
    node.stats["b"] = WindowStats(97.0, 10, 10.0)  # b lost its slack while a's core was away
    ctl.step(2.0, node)
    assert node.workers == {"a": 8, "b": 8} and ctl.log[-1].action == "revert -1 cores"
    node.stats["b"] = WindowStats(90.0, 10, 10.0)
    ctl.step(3.0, node)
    ctl.step(4.0, node)
    assert node.workers == {"a": 8, "b": 8} and node.ways == {"a": 6, "b": 5}  # a rests (3 s) despite its slack
    ctl.step(5.0, node)
    assert node.workers == {"a": 8, "b": 8} and node.ways == {"a": 5, "b": 5}  # then gives back the other resource


def test_parties_needs_two_windows_over_the_sla_to_act():
    node, ctl = _parties({"a": WindowStats(80.0, 10, 10.0), "b": WindowStats(90.0, 10, 10.0)})
    ctl.step(1.0, node)
    node.stats["a"] = WindowStats(99.0, 10, 10.0)  # one noisy window over 0.95 of the SLA
    ctl.step(2.0, node)
    assert node.workers == {"a": 8, "b": 8} and node.ways == {"a": 6, "b": 5}


def test_static_never_changes_and_violation_fraction_counts_windows():
    node = FakeNode({"a": WindowStats(500.0, 1, 1.0)})
    ctl = StaticController()
    even_split(node)
    ctl.step(1.0, node)
    assert node.workers == {"a": 16}
    windows = [{"a": WindowStats(50.0, 1, 1)}, {"a": WindowStats(150.0, 1, 1)}, {"a": WindowStats(math.inf, 0, 1)}]
    assert violation_fraction(windows, {"a": 100.0}) == pytest.approx(2 / 3)


def test_capacity_profile_reads_per_worker_ways_tables_as_a_3d_lookup():
    from recserve.profiles import ProfileSet, ProfileTable

    def ways_table(workers: int, cond: bool) -> ProfileTable:
        rows = [[float(k), 10.0 * workers * (0.5 + 0.05 * k), float(workers)] for k in range(1, 11)]
        return ProfileTable("m", "s", "maxload_vs_ways", ("ways", "max_qps", "workers"), rows, "modelled",
                            {"workers": workers} if cond else {})

    prof = ProfileSet([ProfileTable("m", "s", "maxload_vs_workers", ("workers", "max_qps"),
                                    [[1.0, 10.0], [8.0, 80.0]], "modelled"),
                       ways_table(8, False), ways_table(2, True)])
    cap = CapacityProfile.from_profiles(prof, "m", "s")
    assert cap.max_qps(4) == pytest.approx(40.0)
    assert cap.qps(8, 10) == pytest.approx(80.0)
    assert cap.qps(2, 5) == pytest.approx(20.0 * 0.75 / 1.0)  # nearest worker table (2), relative to its 10 ways


def test_parties_acts_without_start_on_an_existing_allocation():
    """The live control loop may attach to a running node without calling ``start``."""
    from recserve.policies.parties import PartiesController
    from recserve.policies.rmu import WindowStats

    class Node:
        def __init__(self):
            self.workers = {"a": 1, "b": 1}

        def models(self):
            return ["a", "b"]

        def sla(self, m):
            return (100.0, 95.0)

        def total_cores(self):
            return 4

        def total_ways(self):
            return 2

        def get_workers(self, m):
            return self.workers[m]

        def set_workers(self, m, n):
            self.workers[m] = n

        def get_ways(self, m):
            return 1

        def set_ways(self, m, n):
            pass

        def window_stats(self, m):
            return WindowStats(250.0 if m == "a" else 50.0, 10.0, 10.0, 30)

    node, parties = Node(), PartiesController()
    parties.step(0.0, node)
    assert node.workers["a"] == 2 and parties.log and parties.log[0].model == "a"


def _greedy_lock_in(prior: dict[str, np.ndarray] | None) -> str:
    """FCFS sees one small query on each type first (the fast type's looks slow: a cold start), then is
    asked where a large query should go while both are idle."""
    from recserve.policies.dispatch import FCFSPolicy, Instance, Query

    types = ["fast", "slow"]
    truth = {"fast": lambda b: 5.0 + 0.06 * b, "slow": lambda b: 5.0 + 0.15 * b}
    policy = FCFSPolicy(100.0, predictor=LatencyPredictor(types, prior=prior))
    insts = [Instance(0, "fast", 0), Instance(1, "slow", 1)]
    policy.bind(insts, types)
    bucket = policy.predictor.bucket
    small = Query(0, 10, 0.0, bucket(10))
    policy.on_complete(1.0, small, insts[0], 40.0)  # one slow-looking first call (cold caches)
    policy.on_complete(1.0, Query(1, 20, 0.0, bucket(20)), insts[1], truth["slow"](20))
    big = Query(2, 900, 2.0, bucket(900))
    return policy.assign(2.0, [big], insts)[0][1].type_name


def test_prior_keeps_a_greedy_policy_from_locking_in_a_cold_start_belief():
    assert _greedy_lock_in(None) == "slow"  # the failure mode: a line through one cold call
    grid = LatencyPredictor(["x"]).buckets
    prior = {"fast": 5.0 + 0.06 * grid, "slow": 5.0 + 0.15 * grid}
    assert _greedy_lock_in(prior) == "fast"


def test_prior_is_kept_for_unseen_buckets_and_replaced_where_learned():
    grid = LatencyPredictor(["a"]).buckets
    p = LatencyPredictor(["a"], prior={"a": 1.0 + grid}, min_samples=2)
    b = p.bucket(100)
    for _ in range(40):  # many observations of one bucket: the rest of the row must not become a line
        p.observe(0, b, 7.0)
    assert p.predict(0, b) == pytest.approx(7.0)
    assert p.predict(0, p.bucket(900)) == pytest.approx(1.0 + grid[p.bucket(900)])
    with pytest.raises(ValueError, match="buckets"):
        LatencyPredictor(["a"], prior={"a": np.ones(3)})


def test_pool_file_prior_from_profiles(tmp_path):
    from recserve.errors import SpecError
    from recserve.policies.router import load_pool
    from recserve.profiles import ProfileSet, ProfileTable

    ps = ProfileSet()
    for name, slope in (("dram", 0.06), ("ssd", 0.15)):
        ps.add(ProfileTable("kairos-wnd", name, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
                            [[b, 5 + slope * b, 5 + slope * b, 6 + slope * b] for b in (10, 500, 1000)]))
    ps.save(tmp_path / "p.json")
    text = ("qos_ms: 80\nprior: {profiles: %s, model: %s}\nbackends:\n"
            "  - {url: 'http://127.0.0.1:1', type: dram, base: true}\n  - {url: 'http://127.0.0.1:2', type: ssd}\n")
    (tmp_path / "pool.yaml").write_text(text % (tmp_path / "p.json", "kairos-wnd"))
    pool = load_pool(tmp_path / "pool.yaml")
    assert set(pool.prior) == {"dram", "ssd"}
    policy = pool.make_policy("ribbon")
    assert policy.predictor.rows[1][-1] == pytest.approx(5 + 0.15 * 1000)
    (tmp_path / "bad.yaml").write_text(text % (tmp_path / "p.json", "hera-ncf"))
    with pytest.raises(SpecError, match="no latency_vs_batch table"):
        load_pool(tmp_path / "bad.yaml")


def test_apply_split_shrinks_before_it_grows():
    from recserve.policies.rmu import apply_split

    have = {"a": 10, "b": 1}
    calls = []

    def put(m, v):
        calls.append((m, v))
        if sum({**have, m: v}.values()) > 11:
            raise AssertionError(f"{m}={v} exceeds the 11 ways")
        have[m] = v

    apply_split(["b", "a"], [7, 4], have.get, put)      # b grows only after a shrinks, whatever the order given
    assert have == {"a": 4, "b": 7} and calls == [("a", 4), ("b", 7)]
    apply_split(["a", "b"], [4, 7], have.get, put)      # nothing changes: nothing set
    assert len(calls) == 2


def test_hera_does_not_move_past_the_knee_when_the_counts_below_just_failed():
    # live: two rm3 workers (measured 76 / 138 qps with 1 / 2, flat beyond) failed at 111 qps; three promise no more
    rmu = HeraRMU({"a": CapacityProfile.from_points({1: 76.0, 2: 138.0})})
    rmu._steps = 1
    rmu._remember("a", 2, WindowStats(467.0, 100, 111.0), 1.17)
    assert rmu.find_number_of_workers("a", 116.0, 3, current=2) == 2
    fresh = HeraRMU({"a": CapacityProfile.from_points({1: 76.0, 2: 138.0})})
    assert fresh.find_number_of_workers("a", 200.0, 3, current=3) == 2  # nothing failed: back to the knee


def test_hera_never_grows_a_model_with_slack_to_spare():
    node = FakeNode({"a": WindowStats(60.0, 5, 5.2), "b": WindowStats(90.0, 10, 10.0)})  # a: slack 0.6
    rmu = HeraRMU({"a": linear_capacity(40.0, False), "b": linear_capacity(60.0, False)})
    rmu._steps = 1
    rmu._remember("a", 1, WindowStats(float("inf"), 0, 5.0), float("inf"))  # a neighbour's spike starved it
    rmu.step(2.0, node)
    assert node.workers["a"] == 1  # the remembered failure rules out one worker at 5.2 qps, yet it is not grown


def test_hera_never_shrinks_a_model_over_its_sla_while_some_count_covers_its_traffic():
    # live on a slow host: hera-dlrm-b measured 17.6 / 24.7 qps with 1 / 2 workers alone; beside a busy neighbour
    # one worker failed at 10 qps, two (just started) still violated at 7.7 qps, and it went back to one
    curve = {1: 17.6, 2: 24.7}
    node = FakeNode({"a": WindowStats(127.0, 10, 10.0), "b": WindowStats(85.0, 10, 10.0)}, cores=4)
    rmu = HeraRMU({"a": CapacityProfile.from_points(curve), "b": linear_capacity(60.0, False)})
    rmu.step(1.0, node)  # one worker (settled) fails at 10 qps: remembered, two cover 1.27 x 10
    assert node.workers["a"] == 2
    node.stats["a"] = WindowStats(129.0, 8, 7.66)  # 1.29 x 7.66 = 9.9 qps: one worker (derated) covers it
    rmu.step(2.0, node)
    assert node.workers["a"] == 2
    flat = HeraRMU({"a": CapacityProfile.from_points({1: 76.0, 2: 138.0, 3: 138.0})})
    assert flat.find_number_of_workers("a", 300.0, 3, current=3) == 2  # the knee: the one way over the SLA is down


def test_hera_judges_a_count_it_shrank_to_on_its_first_window():
    node = FakeNode({"a": WindowStats(40.0, 9, 9.0), "b": WindowStats(85.0, 10, 10.0)}, cores=4)
    rmu = HeraRMU({"a": CapacityProfile.from_points({1: 17.6, 2: 24.7}), "b": linear_capacity(60.0, False)})
    node.workers["a"] = 2
    rmu.step(1.0, node)  # slack 0.4: one worker (profiled 17.6 qps) covers 9 qps
    assert node.workers["a"] == 1
    node.stats["a"] = WindowStats(300.0, 9, 9.0)  # and fails in the window it was set in: nothing was starting
    rmu.step(2.0, node)
    assert rmu._failed["a"][1][0] == 9.0 and node.workers["a"] == 2
    node.stats["a"] = WindowStats(40.0, 9, 9.0)  # two hold it with slack; one is not tried again at this rate
    rmu.step(3.0, node)
    assert node.workers["a"] == 2


def _one_step(dlrm_b: WindowStats, rm3: WindowStats, curves: tuple[dict, dict], rm3_workers: int):
    """One RMU step on a 4-slot node (2 cores, two workers per core, as the demo) from a live window."""
    node = FakeNode({"dlrm-b": dlrm_b, "rm3": rm3}, cores=4)
    node.workers["rm3"] = rm3_workers
    rmu = HeraRMU({m: CapacityProfile.from_points(c) for m, c in zip(("dlrm-b", "rm3"), curves, strict=True)})
    rmu._steps = 1
    rmu.step(1.0, node)
    return node, rmu


# live windows from the demos on 2 cores in which dlrm-b, far under its profile, missed its SLA beside rm3's spike and
# was given a second worker on rm3's core, so that both lost windows
STARVED = {
    "rm3 on one worker, past its profile": (WindowStats(170.0, 5, 5.0), WindowStats(float("inf"), 33, 57.8),
                                            ({1: 27.9, 2: 40.6}, {1: 33.1, 2: 72.2}), 1),
    "rm3 at 75 % of its profile": (WindowStats(192.0, 5, 5.67), WindowStats(200.0, 48, 55.0),
                                   ({1: 32.1, 2: 40.9}, {1: 33.7, 2: 73.6}), 2),
    "a failed query: dlrm-b reads infinite slack": (WindowStats(float("inf"), 5, 6.0), WindowStats(160.0, 45, 50.0),
                                                    ({1: 22.9, 2: 39.3}, {1: 34.8, 2: 63.3}), 2),
    "rm3 within its profile by urgency x rate": (WindowStats(128.0, 4, 4.3), WindowStats(106.0, 44, 44.9),
                                                 ({1: 28.9, 2: 44.6}, {1: 27.0, 2: 57.1}), 2),
}


@pytest.mark.parametrize("case", list(STARVED))
def test_hera_leaves_a_model_starved_by_an_overloaded_neighbour_alone(case):
    node, rmu = _one_step(*STARVED[case])
    assert node.workers == {"dlrm-b": 1, "rm3": 2}  # the model nearer its profile gets the core
    assert "dlrm-b" not in rmu._failed  # and dlrm-b's miss is not held against one worker
    # the hold is shown (why a model over its SLA kept its workers), apart from the changes counted as decisions
    assert [(d.model, d.detail["starved_by"]) for d in rmu.held] == [("dlrm-b", "rm3")]
    assert rmu.held[0].detail["use_of_profile"] < rmu.low and rmu.held[0].detail["slack"] > rmu.high
    assert all(d.model != "dlrm-b" for d in rmu.log)


def test_hera_learns_a_miss_no_neighbour_shares():
    node, rmu = _one_step(WindowStats(170.0, 5, 5.0), WindowStats(90.0, 20, 20.0),
                          ({1: 27.9, 2: 40.6}, {1: 33.1, 2: 72.2}), 1)
    assert rmu._failed["dlrm-b"][1][0] == 5.0 and node.workers["dlrm-b"] == 2  # dlrm-b's own: learned, grown
    assert not rmu.held
