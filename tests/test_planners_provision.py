"""Hercules cluster provisioning: the ILP against brute force, the baselines, infeasible loads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from recserve.errors import InfeasibleError, SpecError
from recserve.planners.hercules.provision import (
    Efficiency,
    diurnal_trace,
    efficiency_matrix,
    plan_provision,
    solve_greedy,
    solve_ilp,
    solve_oblivious,
)
from tests.support.planner_fixtures import efficiency_profiles


def _brute_force(eff: Efficiency, need: np.ndarray, avail: np.ndarray) -> float:
    W, H = eff.qps.shape
    best = np.inf
    per_var = [range(int(avail[h]) + 1) for _ in range(W) for h in range(H)]
    for flat in itertools.product(*per_var):
        x = np.array(flat).reshape(W, H)
        if (x.sum(axis=0) > avail).any() or ((eff.qps * x).sum(axis=1) < need - 1e-9).any():
            continue
        best = min(best, float((eff.power * x).sum()))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_ilp_equals_brute_force_on_small_instances(seed):
    rng = np.random.default_rng(seed)
    qps = rng.uniform(50, 300, (2, 3)).round(1)
    qps[rng.random((2, 3)) < 0.15] = 0.0  # a type where the SLA is not met
    qps[:, 0] = np.maximum(qps[:, 0], 60)
    eff = Efficiency(["a", "b"], ["x", "y", "z"], qps, rng.uniform(100, 400, (2, 3)).round(0))
    avail = rng.integers(1, 4, 3)
    need = (eff.qps @ avail) * rng.uniform(0.1, 0.45, 2)
    x = solve_ilp(eff, need, avail)
    assert ((eff.qps * x).sum(axis=1) >= need - 1e-6).all() and (x.sum(axis=0) <= avail).all()
    assert float((eff.power * x).sum()) == pytest.approx(_brute_force(eff, need, avail))
    greedy = solve_greedy(eff, need, avail)
    assert float((eff.power * x).sum()) <= float((eff.power * greedy).sum()) + 1e-9


def test_priority_beats_greedy_when_workloads_compete_for_the_best_type():
    # Hercules Sec. III-C: both workloads rank NMP first, but NMP helps RMC2 far more.
    eff = Efficiency(["rmc1", "rmc2"], ["cpu", "nmp"], np.array([[100.0, 130.0], [100.0, 300.0]]),
                     np.array([[200.0, 220.0], [200.0, 220.0]]))
    avail = np.array([50, 4])
    need = np.array([500.0, 1200.0])
    ilp, greedy = solve_ilp(eff, need, avail), solve_greedy(eff, need, avail)
    assert ilp[1, 1] == 4  # all NMP servers go to RMC2
    assert (eff.power * ilp).sum() < (eff.power * greedy).sum()


def test_baselines_serve_the_load_with_available_servers():
    rng = np.random.default_rng(3)
    eff = Efficiency(["a", "b", "c"], list("pqrs"), rng.uniform(100, 500, (3, 4)), rng.uniform(150, 500, (3, 4)))
    avail = np.array([30, 20, 5, 5])
    need = np.array([2000.0, 1500.0, 1000.0])
    for x in (solve_greedy(eff, need, avail), solve_oblivious(eff, need, avail, rng=np.random.default_rng(1))):
        assert (x.sum(axis=0) <= avail).all()
        assert ((eff.qps * x).sum(axis=1) >= need).all()


def test_load_above_capacity_and_unservable_workload_raise():
    eff = Efficiency(["a"], ["x"], np.array([[100.0]]), np.array([[200.0]]))
    with pytest.raises(InfeasibleError, match="exceeds cluster capacity"):
        solve_ilp(eff, np.array([1001.0]), np.array([10]))
    profiles = efficiency_profiles({("a", "x"): 100.0, ("b", "x"): 0.0}, {("a", "x"): 200.0, ("b", "x"): 200.0})
    with pytest.raises(InfeasibleError, match="'b'"):
        efficiency_matrix(profiles, ["a", "b"], ["x"])


def test_a_day_of_provisioning_never_costs_more_than_greedy(tmp_path):
    rng = np.random.default_rng(7)
    work, types = ["w1", "w2", "w3"], ["t1", "t2", "t3", "t4"]
    qps = {(w, h): float(rng.uniform(200, 800) * (1 + j)) for w in work for j, h in enumerate(types)}
    power = {(w, h): float(200 + 80 * j) for w in work for j, h in enumerate(types)}
    hours, loads = diurnal_trace({w: 6000.0 for w in work}, steps=8)
    assert min(loads["w1"]) == pytest.approx(0.5 * 6000, rel=0.05) and max(loads["w1"]) <= 6000
    plan = plan_provision(efficiency_profiles(qps, power), dict(zip(types, [40, 20, 6, 3], strict=True)),
                          loads, hours, alpha=0.05)
    assert len(plan.steps) == 8 and set(plan.baseline_steps) == {"greedy", "oblivious"}
    for mine, theirs in zip(plan.steps, plan.baseline_steps["greedy"], strict=True):
        assert mine.power_w <= theirs.power_w * (1 + 1e-3)
        assert all(mine.capacity_qps[w] >= 1.05 * mine.load[w] - 1e-6 for w in work)
    assert plan.baselines["greedy"]["hercules_power_saving_avg"] >= 0
    assert "greedy W" in plan.table()
    assert plan.save(tmp_path / "p.json").exists()


def test_alpha_from_history_is_the_largest_growth_per_interval():
    from recserve.planners.hercules.provision import alpha_from_history

    history = {"a": [100, 110, 99, 120], "b": [50, 50, 60, 40]}
    assert alpha_from_history(history) == pytest.approx(120 / 99 - 1)           # a: 99 -> 120 beats b: 50 -> 60
    assert alpha_from_history(history, interval_steps=2) == pytest.approx(0.2)  # b: 50 -> 60 beats a: 110 -> 120
    assert alpha_from_history(history, quantile=0.5) < alpha_from_history(history)
    assert alpha_from_history({"flat": [5, 5, 4]}) == 0.0
    with pytest.raises(SpecError, match="too short"):  # bad input (exit 2), not an infeasible request (3)
        alpha_from_history({"a": [1.0]})


def test_a_long_day_reports_its_progress_in_tenths():
    qps = {("w1", "t1"): 1000.0}
    power = {("w1", "t1"): 100.0}
    hours, loads = diurnal_trace({"w1": 5000.0}, steps=100)
    lines: list[str] = []
    plan_provision(efficiency_profiles(qps, power), {"t1": 10}, loads, hours, alpha=0.0, progress=lines.append)
    assert [line for line in lines if line.startswith("hercules: ")] == [
        *(f"hercules: {k}/100 steps" for k in range(10, 100, 10)), "hercules: 100 steps, peak 500 W"]


@pytest.mark.parametrize(("traffic", "argv", "said"), [
    ("peak_qps: {hercules-rmc1: 5000}\nsteps: 100000\n", [], "100000 steps a day is more than 1440 (one a minute)"),
    ("peak_qps: {hercules-rmc1: 5000}\n", ["--steps", "1441"], "argument --steps: must be an integer in [1, 1440]"),
    ("trace: {loads: {hercules-rmc1: [" + ",".join(["1"] * 1441) + "]}}\n", [], "holds 1441 steps, more than 1440"),
])
def test_a_day_of_more_intervals_than_minutes_is_refused(tmp_path, capsys, traffic, argv, said):
    from recserve.cli import main

    path = tmp_path / "day.yaml"
    path.write_text("available: {hercules-t1: 10}\n" + traffic)
    assert main(["plan", "provision", "--traffic", str(path), *argv]) == 2
    assert said in capsys.readouterr().err


def test_profiles_without_the_workloads_tables_say_so_rather_than_an_sla_miss():
    from recserve.errors import ProfileError

    profiles = efficiency_profiles({("w1", "t1"): 1000.0}, {("w1", "t1"): 100.0})
    with pytest.raises(ProfileError, match=r"no 'efficiency' profile for workload 'w1' on any of \['t2'\]; the "
                                           r"profiles hold \['w1'\] on \['t1'\]"):
        efficiency_matrix(profiles, ["w1"], ["t2"])
    with pytest.raises(ProfileError, match="no 'efficiency' profiles given"):
        efficiency_matrix(type(profiles)(), ["w1"], ["t1"])


def test_a_load_only_the_servers_together_cannot_serve_is_named_in_qps():
    eff = Efficiency(["a", "b"], ["x"], np.array([[100.0], [100.0]]), np.array([[200.0], [200.0]]))
    with pytest.raises(InfeasibleError) as exc:
        solve_ilp(eff, np.array([600.0, 600.0]), np.array([10]))
    assert str(exc.value).endswith("exceeds what the available servers can serve together (needs a 600 QPS, "
                                   "b 600 QPS)")


def test_a_cluster_of_no_servers_is_refused_before_modelling(tmp_path, capsys, monkeypatch):
    import recserve.perfmodel as perfmodel
    from recserve.cli import main

    monkeypatch.setattr(perfmodel, "model_profiles", lambda *a, **k: pytest.fail("modelled"))
    path = tmp_path / "day.yaml"
    path.write_text("peak_qps: {hercules-rmc1: 5000}\n")
    assert main(["plan", "provision", "--traffic", str(path), "--available", "hercules-t1=0,hercules-t2=0"]) == 2
    assert "no servers available: every count is 0" in capsys.readouterr().err
