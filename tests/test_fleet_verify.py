"""`recserve verify` (issue #49): a deployed fleet plan measured against its prediction, and `--replan`'s refit."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main
from recserve.planners import fleet as fleet_mod
from recserve.planners.fleet import FleetGroup, FleetPlan, plan_changes, plan_fleet, refit_corrections, replan
from recserve.planners.fleet_candidates import Column
from recserve.planners.fleet_spec import parse_fleet
from tests.support.nodes import generous

MODEL = "hercules-rmc1"


@pytest.fixture
def one_column(monkeypatch):
    """The planner's options replaced by one: a hercules-t2 server carrying 100 QPS of hercules-rmc1 (no perfmodel)."""
    col = Column("single", "hercules-t2", {MODEL: 100.0}, config="test", why="test",
                 alloc={MODEL: {"workers": 4, "threads": 1}})
    monkeypatch.setattr(fleet_mod, "columns", lambda fleet, pm, progress=None, pairs=True, shards=True: ([col], []))


def _plan() -> FleetPlan:
    fleet = parse_fleet({"models": {MODEL: {"peak_qps": 300}}, "owned": {"hercules-t2": 10}}, "test")
    return plan_fleet(fleet, perfmodel=object())


def test_replan_adds_servers_when_measured_max_load_is_below_the_prediction(one_column):
    plan = _plan()
    assert plan.groups[0].count == 3 and plan.models[MODEL]["capacity_qps"] == pytest.approx(300)
    corrections, off = refit_corrections(plan, {MODEL: 150.0}, {MODEL: 300.0}, threshold=0.2)
    assert off == {MODEL: pytest.approx(0.5)} and corrections == {MODEL: pytest.approx(0.5)}
    new = replan(plan, corrections)
    assert new.groups[0].count == 6 and new.groups[0].qps[MODEL] == pytest.approx(50.0)
    assert new.models[MODEL]["capacity_qps"] >= 300 and new.summary["capacity_corrections"] == corrections
    assert any("capacities corrected by measurement" in n for n in new.notes)
    assert any("3 x single on hercules-t2 -> 6 x single" in c for c in plan_changes(plan, new))


def test_replan_drops_servers_when_measured_max_load_is_above_the_prediction(one_column):
    plan = _plan()
    corrections, _ = refit_corrections(plan, {MODEL: 600.0}, {MODEL: 300.0})
    new = replan(plan, corrections)
    assert new.groups[0].count == 2 and new.groups[0].qps[MODEL] == pytest.approx(200.0)


def test_within_threshold_no_model_disagrees_and_corrections_compose(one_column):
    plan = _plan()
    corrections, off = refit_corrections(plan, {MODEL: 330.0}, {MODEL: 300.0}, threshold=0.2)
    assert off == {} and corrections == {}
    once = replan(plan, {MODEL: 0.5})
    # predictions of the corrected plan already carry 0.5: a further 0.7 makes 0.35 of the perfmodel's capacity
    again, off = refit_corrections(once, {MODEL: 0.7 * 300}, {MODEL: 300.0})
    assert again == {MODEL: pytest.approx(0.35)}


def test_verify_refuses_a_missing_endpoint(tmp_path, capsys):
    plan = FleetPlan(groups=[FleetGroup("single", "this-host", 1, 1, {MODEL: 20.0}, {MODEL: "dram"}, "", "",
                                        {MODEL: {"workers": 1, "threads": 1}})],
                     models={MODEL: {"peak_qps": 10.0, "capacity_qps": 20.0, "sla_ms": 500.0, "percentile": 95.0}})
    path = plan.save(tmp_path / "fleet.json")
    (tmp_path / "endpoints.json").write_text(json.dumps({"other": ["http://127.0.0.1:9"]}))
    assert main(["verify", "--plan", str(path), "--target", str(tmp_path / "endpoints.json")]) == 2
    assert "no endpoint for planned model 'hercules-rmc1'" in capsys.readouterr().err
    assert main(["verify", "--plan", str(path), "--target", "nowhere"]) == 2
    assert "neither an http:// URL nor an endpoints.json" in capsys.readouterr().err


@pytest.mark.integration  # starts a node server and measures for seconds
@pytest.mark.timeout(600)
def test_verify_a_tiny_deployed_plan(tmp_path, capsys):
    from recserve.deploy.local_fleet import fleet_node_configs, start_nodes, stop_nodes

    # rates high enough that each max-load probe's minimum sample (50 queries) takes about its second
    plan = FleetPlan(groups=[FleetGroup("single", "this-host", 1, 1, {MODEL: 200.0}, {MODEL: "dram"}, "", "test",
                                        {MODEL: {"workers": 2, "threads": 1}})],
                     models={MODEL: {"peak_qps": 100.0, "capacity_qps": 200.0, "sla_ms": 500.0, "percentile": 95.0,
                                     "served_by": ["1 x single on this-host"]}})
    path = plan.save(tmp_path / "fleet.json")
    configs, _ = fleet_node_configs(plan, scale=1e-4, cores=[0])
    for cfg in configs:
        cfg["models"] = [generous(m) for m in cfg["models"]]
    nodes = start_nodes(configs, tmp_path / "dep")
    try:
        (tmp_path / "dep" / "endpoints.json").write_text(json.dumps({MODEL: [nodes[0].url]}))
        rc = main(["verify", "--plan", str(path), "--target", str(tmp_path / "dep" / "endpoints.json"),
                   "--seconds", "3", "--max-load", "--probe-seconds", "1", "--max-probes", "4",
                   "--out", str(tmp_path / "v.json")])
    finally:
        stop_nodes(nodes)
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "v.json").read_text())["models"][MODEL]
    # one worker deployed of the two planned: half the plan's capacity and half the peak offered
    assert result["predicted_qps"] == pytest.approx(100.0) and result["offered_qps"] == pytest.approx(50.0)
    assert result["ok"] > 0 and result["achieved_qps"] > 0
    assert result["max_load_qps"] > 0 and result["max_load_error"] is not None
    assert len(result["max_load_probes"]) <= 4 + 3  # the search, then at most three confirming probes
    assert rc == (0 if result["sla_held"] else 1)
    assert "measured max load" in out and MODEL in out


def test_a_repository_model_is_served_under_its_directory_name():
    from recserve.deploy.local_fleet import fleet_node_configs, served_name

    assert served_name("out/repo/ctr") == "ctr" and served_name("out/repo/ctr/2") == "ctr-v2"
    assert served_name(MODEL) == MODEL
    plan = FleetPlan(groups=[FleetGroup("pair", "this-host", 1, 1, {"out/repo/ctr": 5.0, MODEL: 5.0}, {}, "", "",
                                        {})])
    configs, _ = fleet_node_configs(plan, cores=[0])
    assert [(m["model"], m["name"]) for m in configs[0]["models"]] == [("out/repo/ctr", "ctr"), (MODEL, MODEL)]


def test_targets_take_the_deployed_share_and_served_name_from_the_node_configs(tmp_path):
    import yaml

    from recserve.deploy.fleet_verify import load_targets

    plan = FleetPlan(groups=[FleetGroup("single", "this-host", 2, 2, {"out/repo/ctr": 50.0}, {}, "", "",
                                        {"out/repo/ctr": {"workers": 2, "threads": 2}})],
                     models={"out/repo/ctr": {"peak_qps": 60.0, "capacity_qps": 100.0, "sla_ms": 20.0,
                                              "percentile": 95.0}})
    (tmp_path / "endpoints.json").write_text(json.dumps({"out/repo/ctr": ["http://127.0.0.1:1/"]}))
    (tmp_path / "node0.yaml").write_text(yaml.safe_dump({"models": [{"model": "out/repo/ctr", "name": "ctr",
                                                                     "workers": 2, "scale": 1e-4}]}))
    dep = load_targets(plan, str(tmp_path / "endpoints.json"))["out/repo/ctr"]
    assert dep.fraction == pytest.approx(2 / 8) and dep.served == "ctr" and dep.scale == 1e-4
    assert dep.urls == ["http://127.0.0.1:1"] and dep.workers == 2
    plain = load_targets(plan, "http://127.0.0.1:1")["out/repo/ctr"]
    assert plain.fraction == 1.0 and plain.served == "ctr"


def _measured_as(monkeypatch, max_load_qps: float, reason: str = "test") -> None:
    """verify's measurements replaced: the model held its SLA under the mix, its max load ``max_load_qps``."""
    from recserve.deploy import fleet_verify
    from recserve.specs import SLA

    def replay(plan, deployed, **_kwargs):
        return {MODEL: fleet_verify.ModelCheck(MODEL, SLA(500.0), 300.0, 300.0, 300.0, offered_qps=300.0,
                                               achieved_qps=300.0, latency_ms=10.0, ok=100)}

    def max_loads(checks, deployed, **_kwargs):
        checks[MODEL].max_load_qps, checks[MODEL].max_load_reason = max_load_qps, reason

    monkeypatch.setattr(fleet_verify, "load_targets", lambda plan, target, scale=None: {
        MODEL: fleet_verify.Deployed(MODEL, ["http://127.0.0.1:9"], 1e-3, 1.0, "test")})
    monkeypatch.setattr(fleet_verify, "replay_mix", replay)
    monkeypatch.setattr(fleet_verify, "measure_max_loads", max_loads)


def test_a_model_whose_sla_no_load_met_is_left_as_planned(one_column, monkeypatch, tmp_path, capsys):
    _measured_as(monkeypatch, 0.0, "unloaded p95 45.0 ms misses the SLA")
    path = _plan().save(tmp_path / "fleet.json")
    assert main(["verify", "--plan", str(path), "--target", "http://127.0.0.1:9", "--replan"]) == 0
    out = capsys.readouterr().out
    assert f"replan: {MODEL} is left as planned: no load met its SLA here (unloaded p95 45.0 ms" in out
    assert "plan kept" in out and not (tmp_path / "fleet-replanned.json").exists()


def test_a_replan_that_cannot_serve_every_peak_says_so_and_exits_1(one_column, monkeypatch, tmp_path, capsys):
    _measured_as(monkeypatch, 15.0)  # 5% of the prediction: ten owned servers no longer carry the 300 QPS peak
    path = _plan().save(tmp_path / "fleet.json")
    assert main(["verify", "--plan", str(path), "--target", "http://127.0.0.1:9", "--replan"]) == 1
    captured = capsys.readouterr()
    assert "feasible True -> False" in captured.out and (tmp_path / "fleet-replanned.json").exists()
    assert "replan: the new plan does NOT serve every peak with the measured capacities (short of peak: " \
           f"{MODEL} by" in captured.err


def test_verify_says_what_failed_when_nothing_answers(tmp_path, capsys):
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    plan = FleetPlan(groups=[FleetGroup("single", "this-host", 1, 1, {MODEL: 20.0}, {MODEL: "dram"}, "", "",
                                        {MODEL: {"workers": 1, "threads": 1}})],
                     models={MODEL: {"peak_qps": 10.0, "capacity_qps": 20.0, "sla_ms": 500.0, "percentile": 95.0}})
    path = plan.save(tmp_path / "fleet.json")
    assert main(["verify", "--plan", str(path), "--target", f"http://127.0.0.1:{port}", "--seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert f"{MODEL}: no query was answered with scores (connection=" in err
    assert f"is the deployment up at http://127.0.0.1:{port}?" in err


def test_verify_tells_a_deployment_that_answers_errors_from_one_that_is_down(tmp_path, capsys):
    import http.server
    import threading

    class Overloaded(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(503)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Overloaded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        plan = FleetPlan(groups=[FleetGroup("single", "this-host", 1, 1, {MODEL: 20.0}, {MODEL: "dram"}, "", "",
                                            {MODEL: {"workers": 1, "threads": 1}})],
                         models={MODEL: {"peak_qps": 10.0, "capacity_qps": 20.0, "sla_ms": 500.0, "percentile": 95.0}})
        path = plan.save(tmp_path / "fleet.json")
        assert main(["verify", "--plan", str(path), "--target", f"http://127.0.0.1:{port}", "--seconds", "1"]) == 1
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr().err
    assert "(http_503=" in err and "answers, with errors or not in time: overloaded or hung?" in err
    assert "is the deployment up" not in err
