"""Hera co-location planner on small synthetic profiles (shapes like Hera's eight models)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recserve.errors import InfeasibleError, ProfileError
from recserve.planners.hera import (
    affinity_matrix,
    all_curves,
    identical_targets,
    pair_allocation,
    plan_colocation,
    targets_at_load,
)
from recserve.planners.plan import Plan
from recserve.profiles import ProfileSet, ProfileTable
from tests.support.planner_fixtures import NODE, hera_like_profiles


@pytest.fixture(scope="module")
def hera():
    profiles, classes = hera_like_profiles()
    curves = all_curves(profiles, list(classes), NODE)
    return profiles, classes, curves


def test_scalability_classes_follow_the_slope(hera):
    _, classes, curves = hera
    assert {c.name: ("high" if c.high else "low") for c in curves} == classes
    capacity_bound = next(c for c in curves if c.name == "dlrm-b")
    assert capacity_bound.feasible_workers == 8  # footprint 23 GB/worker on 192 GB


def _affinity_loop(a, b, server):
    """Alg. 1 written as in the paper, for one pair."""
    K = server.llc_ways
    llc = max((a.ways_ratio[i] + b.ways_ratio[K - i]) / 2 for i in range(1, K))
    half = server.cores // 2
    bw = a.membw[min(half, a.feasible_workers)] + b.membw[min(half, b.feasible_workers)]
    return min(llc, min(server.mem_bw_gbs / bw, 1.0))


def test_vectorised_affinity_equals_algorithm_1(hera):
    _, _, curves = hera
    aff = affinity_matrix(curves, NODE)["affinity"]
    for i, a in enumerate(curves):
        for j, b in enumerate(curves):
            assert aff[i, j] == pytest.approx(_affinity_loop(a, b, NODE))
    assert np.allclose(aff, aff.T)


def test_dram_affinity_drops_when_bandwidth_is_oversubscribed(hera):
    _, _, curves = hera
    names = [c.name for c in curves]
    dram = affinity_matrix(curves, NODE)["dram"]
    a, d = names.index("dlrm-a"), names.index("dlrm-d")
    demand = curves[a].membw[8] + curves[d].membw[8]
    assert demand > NODE.mem_bw_gbs
    assert dram[a, d] == pytest.approx(NODE.mem_bw_gbs / demand)


def test_pair_gives_idle_cores_to_the_partner_and_fits_memory(hera):
    _, _, curves = hera
    by = {c.name: c for c in curves}
    plan = pair_allocation(by["dlrm-b"], by["ncf"], NODE)
    low, high = plan.placements
    assert low.workers <= 8 and low.workers + high.workers == NODE.cores
    assert by["dlrm-b"].mem_gb[low.workers] + by["ncf"].mem_gb[high.workers] <= NODE.mem_gb
    assert low.ways + high.ways == NODE.llc_ways and min(low.ways, high.ways) >= 1
    assert plan.emu > 1.0  # a capacity-bound model leaves room for a compute-bound one


def _serving_from(profiles: ProfileSet, model: str, first: int) -> ProfileSet:
    """``profiles`` with ``model`` missing its SLA even at no load below ``first`` workers (as hera-dien from 10)."""
    out = []
    for t in profiles:
        if t.model == model and t.kind == "maxload_vs_workers":
            t = ProfileTable(t.model, t.server, t.kind, t.columns,
                             [[w, q if w >= first else 0.0] for w, q in t.rows], source=t.source)
        out.append(t)
    return ProfileSet(out)


@pytest.mark.parametrize("first_is_late", [True, False])
def test_pair_gives_a_model_that_serves_nothing_on_half_the_cores_its_fewest_serving_workers(hera, first_is_late):
    profiles, classes, _ = hera
    late = _serving_from(profiles, "dien", 10)
    curves = {c.name: c for c in all_curves(late, list(classes), NODE)}
    assert curves["dien"].qps[NODE.cores // 2] == 0 and curves["dien"].qps[10] > 0
    pair = ("dien", "dlrm-a") if first_is_late else ("dlrm-a", "dien")
    plan = pair_allocation(curves[pair[0]], curves[pair[1]], NODE)
    by = {p.model: p for p in plan.placements}
    assert by["dien"].workers == 10 and by["dlrm-a"].workers == NODE.cores - 10
    assert by["dien"].qps > 0 and by["dlrm-a"].qps > 0
    # a partner that serves on its even share keeps it: the rule moves cores only to a model serving nothing
    even = pair_allocation(curves["dlrm-a"], curves["ncf"], NODE)
    assert [p.workers for p in even.placements] == [NODE.cores // 2, NODE.cores // 2]


@pytest.mark.parametrize("low_share", [None, 0.25, 0.75])
def test_hera_serves_every_target_and_pairs_low_with_high(hera, low_share):
    profiles, classes, curves = hera
    targets = targets_at_load(curves, 3.0, low_share)
    plan = plan_colocation(profiles, NODE, targets, seeds=5)
    served = dict.fromkeys(targets, 0.0)
    for server in plan.servers:
        for p in server.placements:
            served[p.model] += p.qps
        if len(server.placements) == 2:
            assert [classes[m] for m in server.models] == ["low", "high"]
    assert all(served[m] >= targets[m] - 1e-6 for m in targets)
    isolated = {c.name: c.isolated_qps for c in curves}
    assert plan.baselines["deeprecsys"]["servers"] == sum(math.ceil(t / isolated[m] - 1e-9)
                                                          for m, t in targets.items())
    assert plan.summary["servers"] <= plan.baselines["deeprecsys"]["servers"]
    for policy, row in plan.baselines.items():  # every field of a seeded baseline describes the same runs
        assert row["colocated_servers"] <= row["servers"], policy
        if row["mean_pair_emu"] is not None:
            assert row["min_pair_emu"] <= row["mean_pair_emu"] <= row["max_pair_emu"], policy


def test_plan_round_trips_through_json(hera, tmp_path):
    profiles, _, curves = hera
    plan = plan_colocation(profiles, NODE, targets_at_load(curves, 2.0), seeds=2)
    again = Plan.load(plan.save(tmp_path / "plan.json"))
    assert type(again) is type(plan)
    assert [s.emu for s in again.servers] == pytest.approx([s.emu for s in plan.servers])
    assert "EMU" in plan.table()


def test_missing_profile_and_unservable_model_are_clear_errors(hera):
    profiles, _, _ = hera
    with pytest.raises(ProfileError, match="maxload_vs_workers"):
        plan_colocation(profiles, NODE, {"no-such-model": 10.0})
    dead = ProfileSet(list(profiles))
    for kind, cols, rows in [("maxload_vs_workers", ("workers", "max_qps"), [[1.0, 0.0], [16.0, 0.0]]),
                             ("maxload_vs_ways", ("ways", "max_qps"), [[1.0, 0.0], [11.0, 0.0]]),
                             ("membw_vs_workers", ("workers", "gbs"), [[1.0, 1.0], [16.0, 1.0]])]:
        dead.add(ProfileTable("slow", NODE.name, kind, cols, rows, source="modelled"))
    with pytest.raises(InfeasibleError, match="slow"):
        plan_colocation(dead, NODE, {"slow": 1.0})


@pytest.mark.parametrize(("target", "count"), [(1e300, "e+"), (1e9, ",")])
def test_targets_beyond_any_cluster_are_refused_with_a_readable_count(hera, target, count):
    profiles, classes, _ = hera
    model = next(iter(classes))
    with pytest.raises(InfeasibleError, match="servers .one model per server.") as info:
        plan_colocation(profiles, NODE, {model: target})
    message = str(info.value)
    assert len(message) < 200 and count in message.split(" servers")[0]


def test_whole_server_table_wins_over_per_condition_tables(hera):
    profiles, classes, curves = hera
    extra = ProfileSet(list(profiles))
    extra.add(ProfileTable("ncf", NODE.name, "maxload_vs_ways", ("ways", "max_qps"), [[1.0, 1.0], [11.0, 1000.0]],
                           source="modelled", conditions={"workers": 4}))
    again = {c.name: c for c in all_curves(extra, list(classes), NODE)}
    before = {c.name: c for c in curves}
    assert np.allclose(again["ncf"].ways_ratio, before["ncf"].ways_ratio)


def test_identical_targets_make_deeprecsys_spend_servers_on_the_low_scalability_model(hera):
    """Hera §VII-C: one target QPS for every model.  DeepRecSys then needs many whole servers for a model with a
    small isolated max load (the capacity-bound dlrm-b) and few for one with a large one (ncf); Hera pairs the
    low model and saves servers, and its co-located pairs' EMU (Fig. 11) is above DeepRecSys' 100%."""
    profiles, _, curves = hera
    targets = identical_targets(curves, 2.0)
    assert len(set(targets.values())) == 1
    iso = {c.name: c.isolated_qps for c in curves}
    drs = {m: math.ceil(t / iso[m] - 1e-9) for m, t in targets.items()}
    assert drs["dlrm-b"] > drs["ncf"]
    plan = plan_colocation(profiles, NODE, targets, seeds=2)
    assert plan.baselines["deeprecsys"]["servers"] == sum(drs.values())
    assert plan.summary["servers"] < plan.baselines["deeprecsys"]["servers"]
    assert plan.summary["mean_pair_emu"] > 1.0
    pairs = [s.emu for s in plan.servers if len(s.placements) > 1]
    assert plan.summary["mean_pair_emu"] == pytest.approx(np.mean(pairs))
    # per-model "servers' worth" targets do not show it: DeepRecSys then needs the same servers for each model
    even = targets_at_load(curves, 2.0)
    assert len({math.ceil(t / iso[m] - 1e-9) for m, t in even.items()}) == 1


def test_a_seeded_baselines_fields_describe_the_same_runs(tmp_path):
    """Random's servers are a mean over seeds, and so are its co-located servers and pair EMUs: never one seed's
    count beside the mean of all."""
    import json

    from recserve.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "colocate", "--server", "hera-xeon", "--models", "hera-dlrm-a,hera-dlrm-b,hera-ncf",
                 "--level", "4", "--low-share", "0.25", "--json", str(out)]) == 0
    random = json.loads(out.read_text())["baselines"]["random"]
    assert random["runs"] > 1 and random["colocated_servers"] <= random["servers"]
    assert random["servers_min"] <= random["servers"] <= random["servers_max"]


@pytest.mark.parametrize("converged", [1.0, 0.0])
def test_a_capacity_of_zero_says_whether_the_sla_is_missed_or_the_search_stopped_short(hera, converged):
    """A quick profile whose few probes all failed measured no capacity; it was once reported as a model that
    misses its SLA with no load, though its unloaded tail was under the SLA."""
    profiles, _, _ = hera
    dead = ProfileSet(list(profiles))
    cols = ("workers", "max_qps", "violating_qps", "probes", "converged", "unloaded_pctl_ms")
    for kind, columns, rows in [("maxload_vs_workers", cols, [[1.0, 0.0, 87.4, 4.0, converged, 12.2],
                                                               [16.0, 0.0, 87.4, 4.0, converged, 12.2]]),
                                ("maxload_vs_ways", ("ways", "max_qps"), [[1.0, 0.0], [11.0, 0.0]]),
                                ("membw_vs_workers", ("workers", "gbs"), [[1.0, 1.0], [16.0, 1.0]])]:
        dead.add(ProfileTable("slow", NODE.name, kind, columns, rows, source="measured"))
    said = "misses its SLA even at no load" if converged else \
        r"search at 1 worker\(s\) stopped before any rate met the SLA .*unloaded tail 12\.2 ms.*without --quick"
    with pytest.raises(InfeasibleError, match=said):
        plan_colocation(dead, NODE, {"slow": 1.0})


@pytest.mark.parametrize("level", [0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
@pytest.mark.parametrize("low_share", [None, 0.25, 0.5])
def test_hera_never_needs_more_servers_than_deeprecsys(hera, level, low_share):
    """A low model's last pair carries only what it still needs: the RMU sizes its workers to that traffic
    (Alg. 3's find_number_of_workers) and the partner takes the freed cores; planned at full share, a low model
    needing one server's worth took two pairs and its partner a third server (10 servers where DeepRecSys used 8)."""
    profiles, _, curves = hera
    plan = plan_colocation(profiles, NODE, targets_at_load(curves, level, low_share), seeds=3)
    assert plan.summary["servers"] <= plan.baselines["deeprecsys"]["servers"]


def test_a_pair_sized_to_the_low_models_remaining_traffic_gives_the_partner_its_cores(hera):
    _, _, curves = hera
    by = {c.name: c for c in curves}
    full = pair_allocation(by["dlrm-b"], by["dlrm-a"], NODE)
    sized = pair_allocation(by["dlrm-b"], by["dlrm-a"], NODE, need_a=10.0)
    assert sized.placements[0].workers < full.placements[0].workers
    assert sized.placements[0].qps >= 10.0 and sized.placements[1].qps > full.placements[1].qps
    assert pair_allocation(by["dlrm-b"], by["dlrm-a"], NODE, need_a=1e9).placements == full.placements
