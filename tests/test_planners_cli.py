"""`recserve plan colocate|provision|pool` end to end on small inputs (profiles given as files)."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main
from recserve.profiles import ProfileSet, ProfileTable
from recserve.reference import reference_path
from tests.support.planner_fixtures import NODE, efficiency_profiles, hera_like_profiles

REF = reference_path("kairos_aws_latency.json")


def _rename_server(profiles: ProfileSet, server: str) -> ProfileSet:
    return ProfileSet([ProfileTable(t.model, server, t.kind, t.columns, t.rows, t.source, t.conditions)
                       for t in profiles])


def test_colocate_writes_plan_and_figure(tmp_path, capsys):
    profiles, classes = hera_like_profiles(NODE)
    path = _rename_server(profiles, "hera-xeon").save(tmp_path / "p.json")
    traffic = tmp_path / "t.yaml"
    traffic.write_text("models: {dlrm-b: 200, dlrm-d: 500, ncf: 20000, din: 900}\n")
    rc = main(["plan", "colocate", "--server", "hera-xeon", "--profiles", str(path), "--traffic", str(traffic),
               "--seeds", "3", "--json", str(tmp_path / "plan.json"), "--plot", str(tmp_path / "emu.png")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "EMU" in out and "deeprecsys" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["kind"] == "colocate" and plan["summary"]["servers"] == len(plan["servers"])
    assert (tmp_path / "emu.png").stat().st_size > 1000


def test_provision_over_capacity_exits_3(tmp_path, capsys):
    path = efficiency_profiles({("w", "a"): 100.0, ("w", "b"): 300.0},
                               {("w", "a"): 200.0, ("w", "b"): 400.0}).save(tmp_path / "e.json")
    day = tmp_path / "day.yaml"
    day.write_text("available: {a: 10, b: 2}\npeak_qps: {w: 2500}\nsteps: 4\n")
    assert main(["plan", "provision", "--traffic", str(day), "--profiles", str(path)]) == 3
    assert "exceeds cluster capacity" in capsys.readouterr().err
    day.write_text("available: {a: 10, b: 2}\npeak_qps: {w: 1000}\nsteps: 4\n")
    assert main(["plan", "provision", "--traffic", str(day), "--profiles", str(path),
                 "--json", str(tmp_path / "prov.json"), "--plot", str(tmp_path / "prov.png")]) == 0
    assert json.loads((tmp_path / "prov.json").read_text())["kind"] == "provision"


@pytest.mark.skipif(not REF.exists(), reason="reference data absent")
def test_pool_on_reference_and_budget_too_small(tmp_path, capsys):
    assert main(["plan", "pool", "--reference", str(REF), "--models", "kairos-rm2",
                 "--json", str(tmp_path / "pool.json")]) == 0
    plan = json.loads((tmp_path / "pool.json").read_text())
    assert plan["pools"][0]["config"]["g4dn.xlarge"] >= 1
    assert main(["plan", "pool", "--reference", str(REF), "--budget", "0.3"]) == 3
    assert "below one g4dn.xlarge" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "1e8"],  # a plan printed, marked infeasible
    ["plan", "tier", "--model", "hera-ncf", "--dram-gb", "0.01", "--qps", "10"],  # InfeasibleError raised
    ["plan", "search", "--model", "hercules-rmc1", "--server", "hera-xeon", "--sla-ms", "0.001", "--no-exhaustive"],
])
def test_every_plan_command_exits_3_on_an_infeasible_request_2_on_a_bad_one(argv, capsys):
    assert main(argv) == 3
    assert main([*argv[:2], "--no-such-flag"]) == 2
    assert main([*argv[:2], "--help"]) == 0
    assert "3 a valid request that no plan meets" in " ".join(capsys.readouterr().out.split())
