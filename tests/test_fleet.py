"""The fleet plan (issue #49): spec validation, capacity >= peak, owned before rented, budget, Plan JSON round trip."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main
from recserve.errors import SpecError
from recserve.planners.fleet import FleetPlan, plan_fleet
from recserve.planners.fleet_spec import load_fleet, parse_fleet
from recserve.planners.plan import Plan

SMALL = {"models": {"hercules-rmc1": {"peak_qps": 2500}, "kairos-rm2": {"peak_qps": 150}},
         "owned": {"hercules-t2": 1}, "rentable": {"c5n.2xlarge": {"max": 20}, "hercules-t1": {"price": 0.6, "max": 4}},
         "budget": 10}


def _spec(**changes):
    data = json.loads(json.dumps(SMALL))
    data.update(changes)
    return data


@pytest.mark.parametrize("data, message", [
    ({"owned": {"hercules-t2": 1}}, "fleet spec: models: give at least one model"),
    (_spec(models={"no-such-model": {"peak_qps": 1}}), "fleet spec: models.no-such-model: unknown model"),
    (_spec(models={"hercules-rmc1": {"peak_qps": -1}}), "spec: models.hercules-rmc1.peak_qps: must be a number > 0"),
    (_spec(models={"hercules-rmc1": {"peak_qps": "lots"}}), "models.hercules-rmc1.peak_qps: must be a number > 0"),
    (_spec(models={"hercules-rmc1": {}}), "models.hercules-rmc1: give peak_qps"),
    (_spec(models={"hercules-rmc1": {"peak_qps": 1, "trace": [1, 2]}}), "give peak_qps or trace, not both"),
    (_spec(models={"hercules-rmc1": {"trace": [1, "x"]}}), "models.hercules-rmc1.trace[1]: must be a number >= 0"),
    (_spec(models={"hercules-rmc1": {"peak_qps": 1, "percentile": 100}}), "percentile: must be in [50, 100)"),
    (_spec(models={"hercules-rmc1": {"peak_qps": 1, "qps": 3}}), "models.hercules-rmc1: unknown field 'qps'"),
    (_spec(owned={"no-such-server": 2}), "fleet spec: owned.no-such-server: unknown server type"),
    (_spec(owned={"hercules-t2": 1.5}), "owned.hercules-t2: must be an integer >= 0"),
    (_spec(rentable={"hercules-t1": {"max": 3}}), "rentable.hercules-t1.price: hercules-t1 has no catalogue"),
    (_spec(rentable={"c5n.2xlarge": {"price": 0.4}}), "rentable.c5n.2xlarge.max: give how many"),
    (_spec(owned={}, rentable={"c5n.2xlarge": {"max": 0}}), "no server to place models on"),
    (_spec(budget=-1), "fleet spec: budget: must be a number >= 0"),
    (_spec(constraints={"ssd": "maybe"}), "constraints.ssd: must be true or false"),
    (_spec(gpu=True), "fleet spec: unknown field 'gpu'"),
    ([1, 2], "fleet spec: must be a mapping"),
])
def test_spec_errors_are_one_line_naming_the_field(data, message):
    with pytest.raises(SpecError) as err:
        parse_fleet(data)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_spec_defaults_sla_and_prices_from_the_catalogue():
    fleet = parse_fleet(_spec(models={"hercules-rmc1": {"trace": [10, 30, 20]},
                                      "kairos-rm2": {"peak_qps": 5, "sla_ms": 100}}))
    rmc1, rm2 = fleet.models
    assert rmc1.peak_qps == 30 and rmc1.trace == (10, 30, 20) and rmc1.sla.target_ms == 20
    assert rm2.sla.target_ms == 100 and rm2.sla.percentile == 99
    assert fleet.rentable["c5n.2xlarge"].price == pytest.approx(0.432)
    assert fleet.available("hercules-t2") == 1 and fleet.price("hercules-t2") == 0


def test_example_spec_is_valid():
    fleet = load_fleet("examples/fleet.yaml")
    assert {m.name for m in fleet.models} == {"hercules-rmc1", "kairos-rm2", "sdm-m1"}


@pytest.fixture(scope="module")
def small_plan() -> FleetPlan:
    return plan_fleet(parse_fleet(SMALL), pairs=False)


def test_plan_holds_every_peak_within_budget(small_plan):
    assert small_plan.feasible and small_plan.within_budget
    for m, v in small_plan.models.items():
        assert v["capacity_qps"] >= v["peak_qps"], m
        assert v["attainment"] == 1.0
    assert small_plan.cost_per_hr <= SMALL["budget"]
    cost = sum(t["rented"] * t["price"] for t in small_plan.types.values())
    assert small_plan.cost_per_hr == pytest.approx(cost)
    assert all(g.why for g in small_plan.groups)


def test_owned_servers_are_used_before_renting(small_plan):
    assert small_plan.summary["rented"] > 0  # the peak needs more than the one owned server
    assert small_plan.types["hercules-t2"]["owned_used"] == 1


def test_enough_owned_servers_cost_nothing():
    plan = plan_fleet(parse_fleet(_spec(owned={"hercules-t2": 10})), pairs=False)
    assert plan.feasible and plan.cost_per_hr == 0 and plan.summary["rented"] == 0


def test_over_budget_is_said_not_hidden():
    plan = plan_fleet(parse_fleet(_spec(budget=0.01)), pairs=False)
    assert plan.feasible and not plan.within_budget
    assert "CANNOT stay within the budget" in plan.table()


def test_too_few_servers_is_said_with_the_shortfall():
    plan = plan_fleet(parse_fleet(_spec(owned={"hercules-t2": 1}, rentable={})), pairs=False)
    assert not plan.feasible
    assert any(v["attainment"] < 1 for v in plan.models.values())
    assert any(n.startswith("short of peak") for n in plan.notes)


@pytest.mark.integration  # seconds of work
def test_a_model_too_large_for_dram_goes_to_ssd_or_shards():
    plan = plan_fleet(parse_fleet({"models": {"sdm-m1": {"peak_qps": 300}},
                                   "rentable": {"sdm-hw-ss": {"price": 1.0, "max": 4},
                                                "hercules-t2": {"price": 0.5, "max": 4}}}), pairs=False)
    assert plan.feasible
    assert plan.models["sdm-m1"]["tier"] == ["ssd"]
    no_ssd = plan_fleet(parse_fleet({"models": {"sdm-m1": {"peak_qps": 300}}, "constraints": {"ssd": False},
                                     "rentable": {"sdm-hw-ss": {"price": 1.0, "max": 4}}}), pairs=False)
    assert not no_ssd.feasible


def test_plan_round_trips_through_the_registered_plan_json(small_plan, tmp_path):
    path = small_plan.save(tmp_path / "fleet.json")
    again = Plan.load(path)
    assert isinstance(again, FleetPlan)
    assert again.to_dict() == small_plan.to_dict()
    assert json.loads(path.read_text())["kind"] == "fleet"


def test_cli_writes_the_plan_and_exits_3_over_budget(tmp_path, capsys):
    spec = tmp_path / "fleet.yaml"
    spec.write_text(json.dumps(_spec(budget=0.01)))
    rc = main(["plan", "fleet", "--spec", str(spec), "--out", str(tmp_path / "f.json"), "--no-pairs"])
    out = capsys.readouterr().out
    assert rc == 3 and "CANNOT stay within the budget" in out and "predicted SLA attainment" in out
    assert Plan.load(tmp_path / "f.json").kind == "fleet"


def test_cli_spec_error_is_one_line_exit_2(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("models:\n  hercules-rmc1: {peak_qps: 0}\nowned: {hercules-t2: 1}\n")
    assert main(["plan", "fleet", "--spec", str(spec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"recserve: error: {spec}: models.hercules-rmc1.peak_qps: must be a number > 0, got 0"]


def test_a_trace_is_planned_at_its_peak_and_provisioned_per_step():
    trace = [600.0, 2500.0, 1500.0, 300.0]
    plan = plan_fleet(parse_fleet(_spec(models={"hercules-rmc1": {"trace": trace}})), pairs=False)
    assert plan.feasible and plan.models["hercules-rmc1"]["capacity_qps"] >= max(trace)
    assert [s["step"] for s in plan.steps] == [0, 1, 2, 3]
    assert all(not s["short"] for s in plan.steps)
    assert max(s["cost_per_hr"] for s in plan.steps) <= plan.cost_per_hr + 1e-9
    assert plan.steps[3]["servers"] <= plan.steps[1]["servers"]
    assert plan.summary["avg_cost_per_hr_over_trace"] <= plan.cost_per_hr + 1e-9
    again = Plan.from_dict(plan.to_dict())
    assert again.steps == plan.steps


def test_fleet_costs_no_more_than_hercules_alone_or_the_chain():
    """Its columns include every Hercules-searched server and the chain's, so the min-cost cover is never dearer."""
    plan = plan_fleet(parse_fleet(SMALL), baselines=True)
    assert set(plan.baselines) == {"hercules", "kairos", "hera", "elasticrec", "sdm", "sequential"}
    for name in ("hercules", "sequential"):
        b = plan.baselines[name]
        assert b["feasible"], b
        assert plan.cost_per_hr <= b["cost_per_hr"] + 1e-9
    assert "saving_vs_best_single" in plan.summary
    table = plan.baseline_table()  # each row's note in the text, not only in the JSON: why a row is "-"
    assert table.splitlines()[0].split()[-1] == "note"
    for name, b in plan.baselines.items():
        row = next(line for line in table.splitlines() if line.split()[0] == name)
        assert str(b["note"]).splitlines()[0][:40] in row, (name, row)


def test_two_models_served_under_one_name_are_refused_naming_both(tmp_path):
    """REPO_A/ctr and REPO_B/ctr would both be served as 'ctr': one node could not hold both, and the router would
    send both models' queries to one of them."""
    import torch

    from recserve.zoo import FAMILY_CLASSES
    from recserve.zoo.artifacts import write_version
    from tests.support.models import tiny_spec

    spec = tiny_spec()
    torch.manual_seed(0)
    model = FAMILY_CLASSES[spec.family](spec, tuple(t.rows for t in spec.tables))
    first, second = tmp_path / "a" / "ctr", tmp_path / "b" / "ctr"
    for path in (first, second):
        write_version(model, path, 1, "safetensors")
    with pytest.raises(SpecError, match="would both be served as 'ctr'") as err:
        parse_fleet(_spec(models={str(first): {"peak_qps": 5}, str(second): {"peak_qps": 5}}))
    assert str(first) in str(err.value) and str(second) in str(err.value)


def test_among_equal_cost_plans_the_ilp_keeps_the_one_of_least_power(tmp_path):
    """The live example's fleet: a rented SDM server's pair covers the user's model, so a free owned server serving it
    again costs nothing and adds power.  The power tie-break must drop it: with a solver gap wider than the
    tie-break's share of the cost, HiGHS stopped with the redundant server kept."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "fleet_live"))
    try:
        from make_repo_model import make
    finally:
        sys.path.pop(0)
    ctr = str(make(tmp_path / "repo"))
    fleet = parse_fleet({"models": {ctr: {"peak_qps": 100}, "hercules-rmc1": {"peak_qps": 40},
                                    "elasticrec-rm1": {"peak_qps": 20}},
                         "owned": {"this-host": 2}, "rentable": {"sdm-hw-ss": {"price": 0.9, "max": 2}}})
    plan = plan_fleet(fleet)
    serving_ctr = [g for g in plan.groups if ctr in g.qps]
    assert len(serving_ctr) == 1, [(g.server, g.kind, list(g.qps)) for g in plan.groups]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda g: g["alloc"][next(iter(g["alloc"]))].update(workers=0), r"groups\[0\]: alloc\['.*'\]\.workers must be a "
                                                                       r"whole number >= 1, got 0"),
    (lambda g: g["alloc"][next(iter(g["alloc"]))].update(workers="lots"), r"\.workers must be a whole number >= 1, "
                                                                            r"got 'lots'"),
    (lambda g: g.update(kind="bogus"), r"groups\[0\]: kind must be one of \['single', 'pair', 'shards'\], got 'bogus'"),
    (lambda g: g.update(count=-1), r"groups\[0\]: count must be a whole number >= 0, got -1"),
    (lambda g: g.update(qps={}, alloc={}), r"groups\[0\]: qps must name the models the group serves"),
])
def test_a_hand_edited_plan_a_deploy_cannot_carry_out_is_refused_naming_the_group(small_plan, tmp_path, edit,
                                                                                    message):
    """Once a traceback in deploy k8s (workers 0), or a group of an unknown kind silently not deployed."""
    import json

    from recserve.errors import RecserveError
    from recserve.planners.plan import Plan

    data = json.loads(small_plan.to_json())
    edit(data["groups"][0])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecserveError, match=r"plan\.json: .*" + message):
        Plan.load(path)


def test_a_repository_model_is_kept_by_its_absolute_path_and_a_control_character_refused(tmp_path, monkeypatch):
    """A plan is deployed and verified from any directory; ``REPO/ctr/.`` is ``REPO/ctr``."""
    from recserve.planners.fleet_spec import _model_name

    monkeypatch.chdir(tmp_path)
    assert _model_name("repo/ctr/.", "spec: models") == str(tmp_path / "repo" / "ctr")
    assert _model_name("hercules-rmc1", "spec: models") == "hercules-rmc1"
    with pytest.raises(SpecError, match=r"spec: models: model name 'ctr\\rx' has control characters"):
        _model_name("ctr\rx", "spec: models")


@pytest.mark.parametrize("peak", [1e5, 1e7, 1e12])
def test_a_peak_beyond_every_server_uses_them_all_whatever_its_size(peak):
    """Best effort the same way at every scale: once 1e7 QPS kept only the owned servers and 1e12 none at all (each
    server covered too small a share of the peak for its price, or for the solver's tolerance)."""
    from recserve.planners.fleet import plan_fleet
    from recserve.planners.fleet_spec import parse_fleet

    fleet = parse_fleet({"models": {"hercules-rmc1": {"peak_qps": peak}}, "owned": {"hercules-t2": 2},
                         "rentable": {"c5n.2xlarge": {"max": 5}}})
    plan = plan_fleet(fleet)
    assert not plan.feasible and (plan.summary["owned_used"], plan.summary["rented"]) == (2, 5)
    capacity = plan.models["hercules-rmc1"]["capacity_qps"]
    assert plan.models["hercules-rmc1"]["attainment"] == pytest.approx(capacity / peak, rel=1e-6)


def test_a_shorter_trace_is_said_to_be_repeated_and_an_infeasible_plan_says_why_it_has_no_steps():
    from recserve.planners.fleet import _trace_notes
    from recserve.planners.fleet_spec import parse_fleet

    fleet = parse_fleet({"models": {"hercules-rmc1": {"trace": [10, 20, 30]},
                                    "kairos-rm2": {"trace": [5.0] * 24}}, "owned": {"hercules-t2": 2}})
    assert _trace_notes(fleet, True) == ["hercules-rmc1's trace of 3 steps is repeated to fill the longest trace's "
                                         "24 steps"]
    assert _trace_notes(fleet, False)[-1] == ("no step-by-step provisioning over the traces: the servers cannot "
                                              "carry the peak")


def test_a_long_server_type_says_which_model_its_candidates_are_at(monkeypatch):
    from recserve.perfmodel import PerfModel
    from recserve.planners import fleet_candidates
    from recserve.planners.fleet_spec import parse_fleet

    monkeypatch.setattr(fleet_candidates, "PROGRESS_EVERY_S", -1.0)  # every model "late"
    fleet = parse_fleet({"models": {"hercules-rmc1": {"peak_qps": 10}, "hera-ncf": {"peak_qps": 10}},
                         "owned": {"hercules-t2": 1}})
    said: list[str] = []
    fleet_candidates.columns(fleet, PerfModel(), said.append, pairs=False, shards=False)
    assert said == ["candidates on hercules-t2 (1 of 1 types): Hercules search, SDM tiering, ElasticRec shards, "
                    "Hera pairs", "  hercules-t2: model 1 of 2 (hercules-rmc1)",
                    "  hercules-t2: model 2 of 2 (hera-ncf)"]
