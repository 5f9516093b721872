"""The load generator and profiler against the real node server (``recserve.serving``) on loopback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.errors import RecserveError
from recserve.measure.loadgen import LoadSession
from recserve.measure.profiler import Budget, maxload_tables
from recserve.measure.requests import RequestPool
from recserve.specs import SLA, catalogue_models, get_model
from tests.support.procs import live_with
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

served = pytest.importorskip("recserve.measure.served")
pytest.importorskip("recserve.serving")
pytest.importorskip("tritonclient.grpc.service_pb2")

MODEL = "hera-ncf" if "hera-ncf" in catalogue_models() else next(iter(catalogue_models()))
SCALE = 1e-4
DEADLINE_MS = 60_000.0  # not the catalogue's (10 ms for hera-ncf): these tests are not about shedding


@pytest.fixture(scope="module")
def server():
    with served.LocalServer(MODEL, SCALE, workers=2, in_process=True,  # in a thread: quick to start
                            deadline_ms=DEADLINE_MS) as s:
        yield s


@pytest.fixture(scope="module")
def pool():
    return RequestPool.from_mix(get_model(MODEL), SCALE, "normal:mean=40,sd=20", pool=6, seed=3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_scores_over_the_wire_equal_the_in_process_model(server, pool, protocol):
    from recserve.serving import build_worker_model

    reference = build_worker_model(server.config.models[0])
    target = server.target(protocol)
    with LoadSession(target, pool) as session:
        for i in range(len(pool)):
            scores = session.outputs(i)["scores"]
            with torch.no_grad():
                expected = reference(pool.batch(i)).numpy()
            assert scores.shape == expected.shape
            np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_open_loop_run_against_the_server(server, pool, protocol):
    with LoadSession(server.target(protocol), pool, warm=True) as session:
        result = session.run(20.0, None, max_requests=30, seed=1)
    assert result.errors == {} and result.ok == 30
    assert 0 < result.p50 <= result.p99 < 10_000


def test_maxload_and_footprint_through_the_server(server):
    spec = get_model(MODEL)
    budget = Budget(True, 16, 0.05, 2, 1 << 10, 0.01, 0.3, 8, 3, 0.5)
    tables = {t.kind: t for t in maxload_tables(spec, SCALE, budget, [1, 2], mix="fixed:8", sla=SLA(2000.0),
                                                start_qps=20.0, via="server", server=server)}
    load = tables["maxload_vs_workers"]
    assert "node server" in load.conditions["via"] and [r[0] for r in load.rows] == [1, 2]
    assert all(r[1] > 0 for r in load.rows)  # 8-item queries meet a 2 s SLA at 20 qps on any host
    mem = tables["footprint"].column("mem_gb")
    assert mem[0] > 0.005 and mem[1] > mem[0]  # a second worker process costs memory
    assert all(0 < r[5] < 2000 for r in load.rows)  # unloaded p95 latency, recorded per worker count

    # an SLA below the latency of a query sent alone: max load 0 at once, without probing lower rates
    impossible = maxload_tables(spec, SCALE, budget, [1], mix="fixed:8", sla=SLA(1e-3), start_qps=20.0,
                                via="server", server=server)[0]
    assert impossible.rows[0][1] == 0 and impossible.rows[0][2] == 0 and impossible.rows[0][3] == 1


def test_maxload_refuses_a_node_whose_deadline_is_tighter_than_the_sla(server):
    """The node would shed what the SLA allows, so the search would measure its deadline: refused up front."""
    budget = Budget(True, 16, 0.05, 2, 1 << 10, 0.01, 0.3, 8, 3, 0.5)
    with pytest.raises(RecserveError, match=r"node's deadline \(60000 ms\) is tighter than the SLA .*p95 <= 120000"):
        maxload_tables(get_model(MODEL), SCALE, budget, [1], mix="fixed:8", sla=SLA(2 * DEADLINE_MS),
                       start_qps=20.0, via="server", server=server)


def test_wait_idle_outlasts_work_left_by_timed_out_queries(server, pool):
    with LoadSession(server.target("http", timeout_s=0.001), pool) as session:
        result = session.run(200.0, None, max_requests=10, timeout_s=0.001)
    assert result.errors.get("timeout", 0) >= 1
    assert server.wait_idle(timeout_s=60) and not server.busy()


@pytest.mark.slow  # a fresh interpreter importing torch and starting workers: ~10 s idle, a minute when busy
def test_server_as_its_own_process_serves_and_stops(pool):
    with served.LocalServer(MODEL, SCALE, workers=1) as s:
        assert s.pid != __import__("os").getpid()
        with LoadSession(s.target("grpc"), pool, before_run=s.wait_idle) as session:
            result = session.run(20.0, None, max_requests=10)
        assert result.ok == 10 and s.worker_pss_gb() > 0.005
        proc = s._proc
    assert proc.poll() is not None  # terminated on exit


def test_a_spawned_server_keeps_the_deadline_it_was_given():
    """``profile host --sla-ms`` looser than the catalogue's: the spawned node must not shed by the catalogue's."""
    cfg = served.LocalServer(MODEL, SCALE, workers=1, deadline_ms=1234.0).node_config(1, 2)
    assert cfg["models"][0]["deadline_ms"] == 1234.0
    from recserve.serving import config_from_dict

    assert config_from_dict(cfg).models[0].deadline_ms == 1234.0  # a config `recserve serve` accepts


def _node_ready(folder) -> bool:
    """The node a bench started under ``folder`` answers ready (on the port its ready line names)."""
    import re
    import urllib.request

    for log in folder.glob("recserve-measure-*/server.log"):
        found = re.search(rb"on http://127\.0\.0\.1:(\d+) grpc", log.read_bytes())
        if found is None:
            return False
        port = int(found[1])
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False
    return False


@pytest.mark.integration  # starts bench, which starts a node server
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_bench_stopped_or_killed_leaves_no_node_server_behind(tmp_path, sig):
    """``bench --target serve-http`` starts a node of its own; SIGTERM stops it as Ctrl-C does (and removes its
    folder), and SIGKILL leaves it to stop by itself (tethered: the parent-death signal)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the node's folder: recserve-measure-* under tmp_path
    bench = subprocess.Popen([sys.executable, "-m", "recserve.cli", "bench", "--model", "hercules-rmc1", "--scale",
                              "1e-4", "--target", "serve-http", "--workers", "1", "--rate", "5", "--duration", "120"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 180
        while not _node_ready(tmp_path):
            assert bench.poll() is None and time.monotonic() < deadline, "bench ended or never started its node"
            time.sleep(0.5)
        time.sleep(3)  # into the run: its tasks are pending when the signal comes
        bench.send_signal(getattr(signal, sig))
        rc = bench.wait(timeout=90)
        assert rc == (143 if sig == "SIGTERM" else -signal.SIGKILL)
        assert not until(lambda: live_with(f"{tmp_path}/recserve-measure-"), lambda pids: not pids, 60), \
            "the node outlived bench"
        if sig == "SIGTERM":
            err = bench.stderr.read()
            assert not list(tmp_path.glob("recserve-measure-*")) and "stopped (SIGTERM)" in err
            assert "Task was destroyed" not in err  # the run's tasks are cancelled, not left pending
    finally:
        bench.kill()
        bench.wait()
        for pid in live_with(f"{tmp_path}/recserve-measure-"):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.integration  # starts a node server
@pytest.mark.timeout(300)
def test_bench_says_why_the_server_refused_its_queries(capsys):
    from recserve.cli import main

    rc = main(["bench", "--model", "hercules-rmc1", "--scale", "1e-4", "--target", "serve-http", "--rate", "10",
               "--duration", "1", "--sizes", "fixed:2000"])  # over the node's max_batch_size of 1024
    err = capsys.readouterr().err
    assert rc == 1 and "[bench] the server refused queries: dense: batch N exceeds max_batch_size N (x" in err
    assert "no query was answered with scores (http_400=" in err and "is a server up" not in err
