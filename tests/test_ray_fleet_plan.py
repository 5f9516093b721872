"""`recserve deploy ray --plan fleet.json` without Ray: which planned server goes to which Ray node resource, what
each replica's node server runs, and what `recserve verify` reads back (issue #49)."""

from __future__ import annotations

import json

import pytest
import yaml

from recserve.cli import main
from recserve.deploy import ray_fleet
from recserve.deploy.fleet_verify import load_targets
from recserve.planners.fleet import FleetGroup, FleetPlan
from recserve.serving import config_from_dict


def _plan() -> FleetPlan:
    """Two server types: a Hera pair and a single model on `this-host` (2 servers), a single on `sdm-hw-ss`, plus a
    shard block (not deployed, as in `deploy local`)."""
    def g(kind, server, count, qps, workers):
        return FleetGroup(kind, server, count, count, qps, {m: "dram" for m in qps}, "", kind,
                          {m: {"workers": workers, "threads": 1} for m in qps})

    plan = FleetPlan(groups=[
        g("pair", "this-host", 1, {"hercules-rmc1": 100.0, "kairos-rm2": 20.0}, 4),
        g("single", "sdm-hw-ss", 1, {"hercules-rmc2": 30.0}, 8),
        g("single", "this-host", 1, {"kairos-rm2": 50.0}, 4),
        FleetGroup("shards", "this-host", 1, 3, {"elasticrec-rm1": 900.0}, {"elasticrec-rm1": "dram"}, "", "",
                   {}),
    ])
    plan.models = {m: {"peak_qps": 10.0, "capacity_qps": 100.0, "sla_ms": 50.0, "percentile": 95.0}
                   for m in ("hercules-rmc1", "kairos-rm2", "hercules-rmc2")}
    return plan


def _nodes(*typed: tuple[str, float, dict[str, float]]) -> list[dict]:
    return [{"NodeID": f"n{i}", "Alive": True, "Resources": {"CPU": cpus, **res}}
            for i, (_, cpus, res) in enumerate(typed)]


def test_each_group_needs_its_server_types_resource():
    deployments, notes = ray_fleet.fleet_deployments(_plan(), cpus=4, scale=1e-4)
    assert [(d.name, d.server, d.resource, d.models) for d in deployments] == [
        ("fleet-0", "this-host", "recserve_type_this_host", ["hercules-rmc1", "kairos-rm2"]),
        ("fleet-1", "sdm-hw-ss", "recserve_type_sdm_hw_ss", ["hercules-rmc2"]),
        ("fleet-2", "this-host", "recserve_type_this_host", ["kairos-rm2"])]
    assert any("shards" in n for n in notes)  # the shard block is left out, as deploy local does
    # a node per type, offering as many units as that type's planned servers
    assert ray_fleet.node_resources(deployments) == {"this-host": {"recserve_type_this_host": 2},
                                                     "sdm-hw-ss": {"recserve_type_sdm_hw_ss": 1}}


def test_workers_scaled_onto_the_cluster_cpus_without_pinning():
    deployments, _ = ray_fleet.fleet_deployments(_plan(), cpus=4, scale=1e-4)
    workers = {(d.name, m["model"]): m["workers"] for d in deployments for m in d.config["models"]}
    # 20 planned worker cores onto 4 CPUs, every model keeps one: 4 x 4/20 -> 1, 8 x 4/20 -> 2
    assert workers == {("fleet-0", "hercules-rmc1"): 1, ("fleet-0", "kairos-rm2"): 1, ("fleet-1", "hercules-rmc2"): 2,
                       ("fleet-2", "kairos-rm2"): 1}
    for d in deployments:
        assert all("cores" not in m and m["scale"] == 1e-4 for m in d.config["models"])  # a Ray node's own cores
        config_from_dict(ray_fleet.replica_config(d), "test")  # what the replica's node server is given


def test_cluster_checks_and_cpu_share():
    deployments, _ = ray_fleet.fleet_deployments(_plan(), cpus=2, scale=1e-4)
    two = _nodes(("head", 1, {"recserve_type_this_host": 2}), ("node", 1, {"recserve_type_sdm_hw_ss": 1}))
    assert ray_fleet.missing_types(deployments, two) == {}
    assert ray_fleet.cluster_cpus(deployments, two) == 2
    # the head takes both this-host servers (3 workers) on its one CPU: a third of a CPU each
    assert ray_fleet.cpus_per_worker(deployments, two) == pytest.approx(1 / 3)
    short = _nodes(("head", 1, {"recserve_type_this_host": 1}), ("other", 8, {}))
    assert ray_fleet.missing_types(deployments, short) == {"this-host": 2, "sdm-hw-ss": 1}
    assert ray_fleet.cluster_cpus(deployments, short) == 1  # untyped nodes host none of the plan's servers
    with pytest.raises(Exception, match=r"recserve_type_sdm_hw_ss.*ray start --resources"):
        ray_fleet.check_cluster(deployments, short)


def test_placement_says_whether_each_replica_sits_on_its_type(tmp_path):
    deployments, _ = ray_fleet.fleet_deployments(_plan(), cpus=2, scale=1e-4)
    nodes = _nodes(("head", 1, {"recserve_type_this_host": 2}), ("node", 1, {"recserve_type_sdm_hw_ss": 1}))
    where = {"fleet-0": {"node_id": "n0", "url": "u0"}, "fleet-1": {"node_id": "n0", "url": "u1"},
             "fleet-2": {"node_id": "n0", "url": "u2"}}
    placed = ray_fleet.placement(deployments, where, nodes)
    assert [placed[d.name]["as_planned"] for d in deployments] == [True, False, True]


def test_verify_reads_the_ray_endpoints_as_deploy_locals(tmp_path):
    """endpoints.json lists each model's Ray route(s); the node*.yaml beside it give verify the deployed share."""
    plan = _plan()
    deployments, _ = ray_fleet.fleet_deployments(plan, cpus=2, scale=1e-4)
    proxy = {d.name: f"http://127.0.0.1:8000/{d.name}" for d in deployments}
    path = ray_fleet.write_deployment(deployments, tmp_path, proxy, {d.name: f"http://10.0.0.{k}:1"
                                                                     for k, d in enumerate(deployments)})
    assert json.loads(path.read_text())["kairos-rm2"] == ["http://127.0.0.1:8000/fleet-0",
                                                           "http://127.0.0.1:8000/fleet-2"]
    assert json.loads((tmp_path / "endpoints-direct.json").read_text())["hercules-rmc2"] == ["http://10.0.0.1:1"]
    targets = load_targets(plan, str(path))
    assert targets["kairos-rm2"].workers == 2 and targets["kairos-rm2"].fraction == pytest.approx(2 / 8)
    assert targets["hercules-rmc2"].scale == 1e-4 and targets["hercules-rmc2"].urls == ["http://127.0.0.1:8000/fleet-1"]
    assert yaml.safe_load((tmp_path / "node1.yaml").read_text())["models"][0]["model"] == "hercules-rmc2"


def test_repository_models_and_tier_dirs_become_absolute_for_the_replica(tmp_path, monkeypatch):
    repo = tmp_path / "repo" / "ctr"
    repo.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    d = ray_fleet.FleetDeployment("fleet-0", "this-host", "1 x single on this-host", {"models": [
        {"model": "repo/ctr", "name": "ctr", "workers": 1, "options": {"tier": {"dir": "tiers/x", "tables": "user"}}},
        {"model": "hercules-rmc1", "name": "hercules-rmc1", "workers": 1}]})
    models = ray_fleet.replica_config(d)["models"]
    assert models[0]["model"] == str(repo) and models[0]["name"] == "ctr"
    assert models[0]["options"]["tier"] == {"dir": str(tmp_path / "tiers" / "x"), "tables": "user"}
    assert models[1]["model"] == "hercules-rmc1"
    assert d.config["models"][0]["model"] == "repo/ctr"  # verify's node*.yaml keep the plan's names


def test_dry_run_prints_the_ray_start_flags(tmp_path, capsys):
    path = _plan().save(tmp_path / "fleet.json")
    assert main(["deploy", "ray", "--plan", str(path), "--dry-run", "--cluster-cpus", "2",
                 "--dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert """this-host: ray start --resources '{"recserve_type_this_host": 2}'""" in out
    assert """sdm-hw-ss: ray start --resources '{"recserve_type_sdm_hw_ss": 1}'""" in out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["node0.yaml", "node1.yaml", "node2.yaml"]


def _gpu_plan() -> FleetPlan:
    """hera-din on a g4dn.xlarge (a T4), its dense part on the device as Hercules' search configures it there."""
    alloc = {"workers": 4, "threads": 1, "batch": 512, "mode": "model", "sparse_workers": 0}
    return FleetPlan(inputs={"models": {"hera-din": {"peak_qps": 2000.0}}}, groups=[
        FleetGroup("single", "g4dn.xlarge", 1, 1, {"hera-din": 2831.9}, {"hera-din": "dram"}, "", "Hercules search",
                   {"hera-din": alloc}), *_plan().groups[:1]])


def test_a_replica_whose_model_runs_on_the_gpu_asks_ray_for_one_and_its_nodes_must_have_it():
    deployments, _ = ray_fleet.fleet_deployments(_gpu_plan(), cpus=4, scale=1e-4)
    gpu, cpu = deployments
    assert (gpu.gpus, cpu.gpus) == (1, 0)
    assert ray_fleet.actor_options(gpu, 0.5) == {"num_cpus": gpu.workers * 0.5, "num_gpus": 1,
                                                 "resources": {"recserve_type_g4dn_xlarge": 1}}
    assert "num_gpus" not in ray_fleet.actor_options(cpu)
    flags = ray_fleet.start_flags(deployments)
    assert flags["g4dn.xlarge"] == """--resources '{"recserve_type_g4dn_xlarge": 1}' --num-gpus 1"""
    assert "--num-gpus" not in flags["this-host"]
    no_gpu = _nodes(("gpu", 4, {"recserve_type_g4dn_xlarge": 1}), ("cpu", 4, {"recserve_type_this_host": 1}))
    with pytest.raises(Exception, match=r"g4dn.xlarge.*fewer GPUs.*ray start --resources .* --num-gpus 1"):
        ray_fleet.check_cluster(deployments, no_gpu)
    elsewhere = _nodes(("gpu", 4, {"recserve_type_g4dn_xlarge": 1}), ("cpu", 4, {"recserve_type_this_host": 1,
                                                                                 "GPU": 1}))
    with pytest.raises(Exception, match="fewer GPUs"):  # a GPU on a node of another type does not count
        ray_fleet.check_cluster(deployments, elsewhere)
    ray_fleet.check_cluster(deployments, _nodes(("gpu", 4, {"recserve_type_g4dn_xlarge": 1, "GPU": 1}),
                                                ("cpu", 4, {"recserve_type_this_host": 1})))


def test_dry_run_says_which_nodes_need_a_gpu(tmp_path, capsys):
    path = _gpu_plan().save(tmp_path / "gpu.json")
    assert main(["deploy", "ray", "--plan", str(path), "--dry-run", "--dir", str(tmp_path / "out"),
                 "--scale", "1e-4"]) == 0
    out = capsys.readouterr().out
    assert """g4dn.xlarge: ray start --resources '{"recserve_type_g4dn_xlarge": 1}' --num-gpus 1""" in out


def test_a_fleet_comes_up_on_the_typed_nodes_and_reports_where_each_group_runs(tmp_path, monkeypatch, capsys):
    """The whole `deploy ray --plan fleet.json --json` run with Ray faked: the local Ray started with each type's
    resource, the groups served, the placement, endpoints and each model's route reported, then shut down."""
    import signal
    from types import SimpleNamespace

    from recserve.deploy import ray_serve

    nodes = _nodes(("head", 1, {"recserve_type_this_host": 2}), ("node", 1, {"recserve_type_sdm_hw_ss": 1}))
    calls: list = []
    monkeypatch.setattr(ray_serve, "_require_ray", lambda: (SimpleNamespace(nodes=lambda: nodes), None))
    monkeypatch.setattr(ray_serve, "start_ray", lambda address, resources=None: calls.append(("start", resources)))
    monkeypatch.setattr(ray_serve, "shutdown", lambda: calls.append(("shutdown",)))

    def serve_fleet(deployments, share, http_port):
        calls.append(("serve", [d.name for d in deployments], share, http_port))
        return ({d.name: f"http://127.0.0.1:{http_port}/{d.name}" for d in deployments},
                {d.name: {"node_id": "n1" if d.server == "sdm-hw-ss" else "n0", "url": f"http://10.0.0.{k}:1"}
                 for k, d in enumerate(deployments)})

    monkeypatch.setattr(ray_fleet, "serve_fleet", serve_fleet)
    path = _plan().save(tmp_path / "fleet.json")
    report_path = tmp_path / "report.json"
    before = signal.getsignal(signal.SIGTERM)
    try:
        assert main(["deploy", "ray", "--plan", str(path), "--dir", str(tmp_path / "out"), "--scale", "1e-4",
                     "--json", str(report_path)]) == 0
    finally:
        signal.signal(signal.SIGTERM, before)
    assert calls == [("start", {"recserve_type_this_host": 2.0, "recserve_type_sdm_hw_ss": 1.0}),
                     ("serve", ["fleet-0", "fleet-1", "fleet-2"], pytest.approx(1 / 3), 8000), ("shutdown",)]
    report = json.loads(report_path.read_text())
    assert (report["plan"], report["kind"], report["scale"], report["address"]) == (str(path), "fleet", 1e-4, None)
    assert report["endpoints"] == str(tmp_path / "out" / "endpoints.json")
    assert {name: (p["node_id"], p["as_planned"]) for name, p in report["placement"].items()} == {
        "fleet-0": ("n0", True), "fleet-1": ("n1", True), "fleet-2": ("n0", True)}
    out, err = capsys.readouterr()
    assert out.splitlines() == ["hercules-rmc1: http://127.0.0.1:8000/fleet-0/v2/models/hercules-rmc1/infer",
                                "kairos-rm2: http://127.0.0.1:8000/fleet-0/v2/models/kairos-rm2/infer",
                                "hercules-rmc2: http://127.0.0.1:8000/fleet-1/v2/models/hercules-rmc2/infer",
                                "kairos-rm2: http://127.0.0.1:8000/fleet-2/v2/models/kairos-rm2/infer"]
    assert "3 server group(s) onto 2 CPU(s) of 2 Ray node(s), 0.333 Ray CPU per worker" in err
    assert "stopping now (--json)" in err and "fleet-1 (1 x single on sdm-hw-ss: hercules-rmc2): node n1" in err
