"""`recserve deploy local --plan fleet.json`: a FleetPlan's server groups as node servers on this host (issue #49)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import tritonclient.http as thttp

from recserve.cli import main
from recserve.deploy.local_fleet import _ready, fleet_node_configs, keep_nodes, start_nodes, stop_nodes
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetGroup, FleetPlan
from recserve.serving import build_worker_model, config_from_dict
from recserve.zoo import sample_batch
from tests.support.oip_inputs import http_inputs
from tests.support.procs import live_with
from tests.support.wait import until


def _plan() -> FleetPlan:
    return FleetPlan(groups=[
        FleetGroup("pair", "hercules-t2", 2, 2, {"hercules-rmc1": 1200.0, "kairos-rm2": 140.0},
                   {"hercules-rmc1": "dram", "kairos-rm2": "dram"}, "", "Hera pair",
                   {"hercules-rmc1": {"workers": 10, "threads": 1}, "kairos-rm2": {"workers": 10, "threads": 1}}),
        FleetGroup("single", "sdm-hw-ss", 1, 1, {"sdm-m1": 400.0}, {"sdm-m1": "ssd"}, "", "SDM tiering",
                   {"sdm-m1": {"workers": 20, "threads": 1}}),
        FleetGroup("shards", "hercules-t2", 1, 3, {"elasticrec-rm1": 900.0}, {"elasticrec-rm1": "dram"}, "", "shards",
                   {}),
    ])


def _one_worker_plan() -> FleetPlan:
    """One server running hercules-rmc1 on one worker: the smallest node a test can start."""
    return FleetPlan(groups=[FleetGroup("single", "hercules-t1", 1, 1, {"hercules-rmc1": 1500.0},
                                        {"hercules-rmc1": "dram"}, "", "Hercules search",
                                        {"hercules-rmc1": {"workers": 1, "threads": 1}})])


def test_node_configs_one_per_group_scaled_onto_this_hosts_cores(tmp_path):
    host = sorted(os.sched_getaffinity(0))
    configs, notes = fleet_node_configs(_plan(), scale=1e-4, tier_dir=tmp_path)
    assert len(configs) == 2  # the shard block is left to `recserve shards serve`
    assert any("shards" in n for n in notes)
    pair, tiered = configs
    assert [m["model"] for m in pair["models"]] == ["hercules-rmc1", "kairos-rm2"]
    for cfg in configs:
        for m in cfg["models"]:
            assert 1 <= m["workers"] <= len(host) and m["scale"] == 1e-4
            assert all(c[0] in host for c in m["cores"]) and len(m["cores"]) == m["workers"]
    assert tiered["models"][0]["options"]["tier"]["tables"] == "user"
    assert "options" not in pair["models"][0]
    _, notes = fleet_node_configs(_plan(), scale=1e-4, cores=[0], tier_dir=tmp_path)  # 3 models, 1 core each at least
    assert any(n.startswith("2 node(s) run 3 worker threads on 1 core(s) of this host: they take turns") for n in notes)
    _, notes = fleet_node_configs(_one_worker_plan(), scale=1e-4, cores=[0])
    assert not any("take turns" in n for n in notes)
    for cfg in configs:  # the node server accepts every config as written
        config_from_dict({k: v for k, v in cfg.items() if not k.startswith("_")}, "test")


def test_dry_run_writes_node_configs(tmp_path, capsys):
    path = _plan().save(tmp_path / "fleet.json")
    assert main(["deploy", "local", "--plan", str(path), "--dry-run", "--dir", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "node0.yaml").exists() and (tmp_path / "out" / "node1.yaml").exists()
    assert "pair on hercules-t2" in capsys.readouterr().out


def test_a_non_fleet_plan_is_refused(tmp_path, capsys):
    from recserve.planners.plan import PoolPlan

    path = PoolPlan("kairos").save(tmp_path / "pool.json")
    assert main(["deploy", "local", "--plan", str(path), "--dry-run"]) == 2
    assert "not a `recserve plan fleet` plan" in capsys.readouterr().err


@pytest.mark.integration  # starts a node process
@pytest.mark.timeout(300)
def test_deployed_node_answers_its_models(tmp_path):
    configs, _ = fleet_node_configs(_one_worker_plan(), scale=1e-4)
    nodes = start_nodes(configs, tmp_path)
    try:
        cfg = config_from_dict({k: v for k, v in configs[0].items() if not k.startswith("_")}, "test").models[0]
        model = build_worker_model(cfg)
        batch = sample_batch(model, 8, rng=3)
        client = thttp.InferenceServerClient(nodes[0].url.removeprefix("http://"), network_timeout=60)
        scores = client.infer("hercules-rmc1", http_inputs(batch)).as_numpy("scores")
        with torch.no_grad():
            expected = model(batch).numpy()
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    finally:
        stop_nodes(nodes)
    assert all(n.process.poll() is not None for n in nodes)


@pytest.mark.integration  # starts a node process, twice
@pytest.mark.timeout(300)
def test_a_node_that_dies_is_reported_and_started_again_on_its_port_until_its_restarts_run_out(tmp_path):
    configs, _ = fleet_node_configs(_one_worker_plan(), scale=1e-4)
    nodes = start_nodes(configs, tmp_path)
    node, said = nodes[0], []
    try:
        os.kill(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=30)
        deadline = time.monotonic() + 180
        while not any("ready again" in line for line in said) and time.monotonic() < deadline:
            keep_nodes(nodes, 1.0, max_restarts=1, progress=said.append, poll_s=0.2)
        assert "node 0 (hercules-rmc1) killed by SIGKILL (signal 9)" in said[0]
        assert "starting it again (1 of at most 1 in 10 minutes)" in said[0] and str(node.log_path) in said[0]
        assert "node 0 is ready again" in said[-1] and _ready(node.url)  # the same port: endpoints stay valid
        os.kill(node.process.pid, signal.SIGKILL)
        node.process.wait(timeout=30)
        with pytest.raises(RecserveError, match=r"again 1 time\(s\) in the last 10 minutes \(--max-restarts 1\)"):
            keep_nodes(nodes, 30.0, max_restarts=1, progress=said.append, poll_s=0.2)
    finally:
        stop_nodes(nodes)


def test_a_tethered_process_stops_when_its_parent_is_killed(tmp_path):
    child = ("import os, sys, time; from recserve.tethered import tether; "
             "ok = tether(int(sys.argv[1])); print('tethered' if ok else 'parent gone', flush=True); time.sleep(120)")
    parent = ("import os, subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid()), sys.argv[1] + '-child'], "
              "start_new_session=True); time.sleep(120)")
    marker = f"{tmp_path}-child"  # in the child's command line only
    proc = subprocess.Popen([sys.executable, "-c", parent, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "tethered"
        assert len(live_with(marker)) == 1
    finally:
        proc.kill()
        proc.wait()
    assert until(lambda: not live_with(marker), bool, 30), "the child outlived its parent"


@pytest.mark.integration  # starts deploy local and a node process
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_killing_deploy_local_or_closing_its_terminal_stops_its_nodes(tmp_path, sig):
    path = _one_worker_plan().save(tmp_path / "fleet.json")
    workdir = tmp_path / "dep"
    proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "deploy", "local", "--plan", str(path),
                             "--dir", str(workdir), "--scale", "1e-4", "--no-router"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert until(lambda: (workdir / "endpoints.json").exists() or proc.poll() is not None, bool, 240)
        [url] = json.loads((workdir / "endpoints.json").read_text())["hercules-rmc1"]
        assert _ready(url) and live_with(str(workdir / "node0.yaml"))
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert until(lambda: not live_with(str(workdir / "node0.yaml")), bool, 60), "the node outlived deploy"
        assert not _ready(url)
    finally:
        proc.kill()
        proc.wait()
        for pid in live_with(str(workdir)):
            os.kill(pid, signal.SIGKILL)


def test_a_taken_router_port_is_refused_before_any_node_starts(tmp_path, capsys):
    path = _one_worker_plan().save(tmp_path / "fleet.json")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["deploy", "local", "--plan", str(path), "--dir", str(tmp_path / "dep"),
                     "--router-port", str(port)]) == 2
    assert f"--router-port {port}: Address already in use; give another port" in capsys.readouterr().err
    assert not (tmp_path / "dep" / "node0.yaml").exists()


def test_a_searched_configuration_is_deployed_as_planned_only_its_workers_scaled():
    """The plan's threads per worker, sub-batch size and pipeline mode reach the node config (the capacity the plan
    and ``verify`` claim is that configuration's); worker counts scale by the share of the planned cores."""
    alloc = {"workers": 4, "threads": 2, "batch": 64, "mode": "pipeline", "sparse_workers": 2}
    plan = FleetPlan(groups=[FleetGroup("single", "hercules-t2", 1, 1, {"hercules-rmc1": 500.0},
                                        {"hercules-rmc1": "dram"}, "", "Hercules search", {"hercules-rmc1": alloc})])
    (config,), _ = fleet_node_configs(plan, scale=1e-4, cores=list(range(6)))  # half the 12 planned cores
    entry = config["models"][0]
    assert (entry["threads"], entry["sub_batch"], entry["mode"]) == (2, 64, "pipeline")
    assert (entry["workers"], entry["sparse_workers"]) == (2, 1)
    assert entry["cores"] == [[0, 1], [2, 3]]
    host = sorted(os.sched_getaffinity(0))[:2]
    if len(host) == 2:  # what this host's node server accepts: one dense worker on both cores, one sparse
        (config,), _ = fleet_node_configs(plan, scale=1e-4, cores=host)
        assert config["models"][0]["cores"] == [host]
        config_from_dict({k: v for k, v in config.items() if not k.startswith("_")}, "test")


def test_a_directory_another_deploy_local_holds_is_refused(tmp_path, capsys):
    """Its node configs are what that deployment's nodes restart from: a second deploy there would overwrite them."""
    from recserve.commands.deploy_local import _hold

    path = _one_worker_plan().save(tmp_path / "fleet.json")
    held = _hold(tmp_path / "dep")
    try:
        assert main(["deploy", "local", "--plan", str(path), "--dir", str(tmp_path / "dep"), "--dry-run"]) == 2
        assert f"is in use by another `recserve deploy local` (pid {os.getpid()})" in capsys.readouterr().err
        assert not (tmp_path / "dep" / "node0.yaml").exists()
    finally:
        held.close()
    assert main(["deploy", "local", "--plan", str(path), "--dir", str(tmp_path / "dep"), "--dry-run"]) == 0
    assert (tmp_path / "dep" / "node0.yaml").exists()


def test_the_tier_files_left_after_a_deployment_are_named_with_their_size(tmp_path, capsys):
    from recserve.commands.deploy_local import _note_tier_files

    _note_tier_files(tmp_path / "tiers")  # none: nothing said
    assert "SSD-tier" not in capsys.readouterr().err
    (tmp_path / "tiers" / "group0-sdm-m1").mkdir(parents=True)
    (tmp_path / "tiers" / "group0-sdm-m1" / "t0.tbl").write_bytes(b"\0" * (3 << 20))
    _note_tier_files(tmp_path / "tiers")
    assert f"SSD-tier files kept in {tmp_path / 'tiers'} (3 MiB in 1 file)" in capsys.readouterr().err


def test_an_ssd_tiered_model_gets_the_row_cache_its_plan_assumed_scaled_as_its_tables():
    from recserve.deploy.local_fleet import TIER_CACHE_MB, tier_cache_mb

    full = tier_cache_mb("sdm-m1", "sdm-hw-ss", 1.0)
    assert full > 1024  # gigabytes of SDM's DRAM share on a 64 GB server, not the local floor
    (_, tiered), _ = fleet_node_configs(_plan(), scale=1.0, cores=list(range(40)))
    assert tiered["models"][0]["options"]["tier"]["cache_mb"] == full
    assert tier_cache_mb("sdm-m1", "sdm-hw-ss", 1e-4) == TIER_CACHE_MB  # scaled below the floor


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host can run a GPU group")
def test_a_gpu_group_on_a_host_without_one_is_refused_naming_it_before_any_node_starts(tmp_path, capsys):
    spec = tmp_path / "gpu.yaml"
    spec.write_text("models:\n  hera-din: {peak_qps: 2000}\nrentable:\n  g4dn.xlarge: {max: 4}\n")
    assert main(["plan", "fleet", "--spec", str(spec), "--out", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    rc = main(["deploy", "local", "--plan", str(tmp_path / "plan.json"), "--dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "this host cannot run the plan's 1 x single on g4dn.xlarge" in err and "CUDA" in err
    assert not list((tmp_path / "out").glob("node*.log"))  # no node was started


def test_nodes_whose_tables_exceed_this_hosts_memory_are_refused_before_any_starts(tmp_path, capsys, monkeypatch):
    from recserve import hostinfo

    plan = FleetPlan(groups=[FleetGroup("single", "this-host", 1, 1, {"hercules-rmc1": 100.0},
                                        {"hercules-rmc1": "dram"}, "", "", {"hercules-rmc1": {"workers": 1}})])
    path = plan.save(tmp_path / "plan.json")
    monkeypatch.setattr(hostinfo, "memory_mb", lambda: 1.0)  # a host of 1 MiB: rmc1 at 1e-3 holds more
    rc = main(["deploy", "local", "--plan", str(path), "--dir", str(tmp_path / "out"), "--no-router"])
    err = capsys.readouterr().err
    assert rc == 2 and "GiB of embedding tables in DRAM (fp32), more than this host's 0.0 GiB" in err
    assert "--scale" in err and not list((tmp_path / "out").glob("node*.log"))
