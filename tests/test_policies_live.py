"""The resource managers drive a real node server through its control API (ServerNodeControl)."""

from __future__ import annotations

import time

import pytest

from recserve.policies.node_control import ControlLoop, ServerNodeControl
from recserve.policies.parties import PartiesController
from recserve.policies.rmu import CapacityProfile, HeraRMU
from recserve.serving.node.control_client import ControlClient
from tests.support import models
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


@pytest.fixture(scope="module")
def server():
    model = models.first_dlrm()
    with started(node_config(model, scale=1e-4, workers=2)) as srv:
        ports = srv.ports
        yield srv, ports, srv.config.models[0].name


def test_server_node_control_reads_and_resizes(server):
    _, ports, name = server
    ctl = ServerNodeControl(ControlClient("127.0.0.1", ports.http), window_s=1.0)
    assert ctl.models() == [name]
    assert ctl.get_workers(name) == 2
    target, pct = ctl.sla(name)
    assert target > 0 and 50 <= pct < 100
    stats = ctl.window_stats(name)
    assert stats.arrival_qps == 0 and stats.tail_ms == 0  # nothing sent yet
    ctl.set_ways(name, 1)  # no resctrl here: kept locally, never an error
    assert ctl.get_ways(name) == 1


def test_hera_rmu_shrinks_an_idle_model_on_the_live_server(server):
    _, ports, name = server
    ctl = ServerNodeControl(ControlClient("127.0.0.1", ports.http), window_s=1.0)
    ctl.set_workers(name, 2)
    rmu = HeraRMU({name: CapacityProfile(lambda n: 100.0 * n, lambda _n, _w: 1.0)})
    rmu.step(0.0, ctl)  # idle: slack 0 < 0.8 -> the fewest workers for 0 qps
    assert ctl.get_workers(name) == 1
    assert rmu.log and rmu.log[0].action == "workers"


def test_control_loop_runs_parties_in_the_background(server):
    _, ports, name = server
    ctl = ServerNodeControl(ControlClient("127.0.0.1", ports.http), window_s=0.5)
    ctl.set_workers(name, 2)
    with ControlLoop(PartiesController(), ctl, period_s=0.3) as loop:
        loop.controller.resource = {name: "cores"}
        deadline = time.monotonic() + 20
        while ctl.get_workers(name) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert ctl.get_workers(name) == 1 and not loop.errors


class _WindowClient:
    """A control client that answers one fixed window (the adapter's arithmetic, no server)."""

    def __init__(self, window: dict) -> None:
        self.window = window

    def node(self) -> dict:
        return {"cores": [0, 1]}

    def models(self) -> list[dict]:
        return [{"name": "m"}]

    def window_stats(self, model: str, seconds: float = 10.0) -> dict:
        return self.window


@pytest.mark.parametrize(("failed", "overloaded"), [(0, False), (5, False), (6, True), (40, True)])
def test_failed_queries_count_as_over_the_sla(failed, overloaded):
    # 100 completed in 230 ms at p95: more than 5% of the window's queries failing breaks the p95 on their own
    window = {"completed": 100, "failed": failed, "arrival_qps": 40.0, "qps": 33.0, "tail_ms": 230.0,
              "percentile": 95.0}
    stats = ServerNodeControl(_WindowClient(window), window_s=3.0).window_stats("m")
    assert (stats.tail_ms == float("inf")) is overloaded
    assert stats.tail_ms in (230.0, float("inf")) and stats.completed == 100


def test_the_window_counts_failed_queries_apart_from_the_tail():
    from recserve.serving.node.metrics import ModelMetrics

    m = ModelMetrics()
    for _ in range(3):
        m.arrived()
        m.done(1, 0.010, 0.0, 0.010, 1)
    for _ in range(2):
        m.arrived()
        m.error("unavailable")
        m.failed(0.001)
    w = m.window(10.0, 95.0)
    assert w["completed"] == 3 and w["failed"] == 2 and w["tail_ms"] == pytest.approx(10.0, rel=0.01)


def test_node_max_loads_measures_each_worker_count_of_a_running_node(server):
    import dataclasses

    from recserve.measure.loadgen import LoadSession
    from recserve.measure.profiler import Budget, node_max_loads
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.specs import SLA, get_model

    srv, ports, name = server
    control = ControlClient("127.0.0.1", ports.http)
    counts: list[int] = []

    def set_workers(n: int) -> None:
        control.set_workers(name, n)
        counts.append(ControlClient("127.0.0.1", ports.http).get_model(name)["stages"]["model"]["workers"])

    pool = RequestPool.from_mix(get_model(name), 1e-4, "production", pool=8, seed=0)
    budget = dataclasses.replace(Budget.of(True), probe_s=0.3, probe_min_requests=5, max_probes=3)
    with LoadSession(HttpTarget(f"http://127.0.0.1:{ports.http}", name), pool, warm=True) as session:
        loads = node_max_loads(session, set_workers, SLA(target_ms=2000.0), (1, 2), start_qps=5.0, budget=budget)
    assert counts == [1, 2] and set(loads) == {1, 2}
    assert all(q >= 5.0 for q in loads.values())  # 5 qps within 2 s is met by any worker of a 1e-4 model


def test_background_load_offers_its_rate_until_the_block_ends(server):
    """The demo measures each model's capacity beside its neighbour's live load: that load must really arrive,
    and stop with the block."""
    from recserve.demo import background_load

    _, ports, name = server
    client = ControlClient("127.0.0.1", ports.http)
    with background_load(f"http://127.0.0.1:{ports.http}", name, 1e-4, qps=40.0, chunk_s=0.5):
        time.sleep(2.0)
        during = client.window_stats(name, seconds=1.5)
    assert during["completed"] >= 20 and not during["failed"]
    time.sleep(1.2)
    assert client.window_stats(name, seconds=1.0)["completed"] == 0  # stopped with the block


def test_background_load_raises_what_failed_in_its_thread():
    from recserve.demo import background_load
    from recserve.errors import RecserveError
    from tests.support.ports import free_port

    with pytest.raises(RecserveError, match="background load failed"):
        with background_load(f"http://127.0.0.1:{free_port()}", "hera-dlrm-b", 1e-4, qps=10.0):
            pass


def test_background_load_at_zero_sends_nothing(server):
    from recserve.demo import background_load

    _, ports, name = server
    with background_load(f"http://127.0.0.1:{ports.http}", name, 1e-4, qps=0.0):
        pass
    time.sleep(0.3)
    assert ControlClient("127.0.0.1", ports.http).window_stats(name, seconds=0.25)["completed"] == 0


def test_neighbour_load_is_what_the_other_model_carries_at_this_ones_peak():
    """Hera Fig. 14 in the demo's shares: beside the memory-bound model's plateau the other is at its T1 level
    (20%), beside the other's spike the memory-bound one has dropped to 10%."""
    from recserve.demo import neighbour_load

    capacity = {"a": CapacityProfile.from_points({1: 30.0, 2: 50.0}),
                "b": CapacityProfile.from_points({1: 40.0, 2: 80.0})}
    load = neighbour_load("fig14", capacity, ("a", "b"), (0.35, 0.2, 0.8))
    assert load["a"] == pytest.approx(0.2 * 80.0, rel=0.02)
    assert load["b"] == pytest.approx(0.1 * 50.0, rel=0.02)
