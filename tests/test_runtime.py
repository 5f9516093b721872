"""Queries the server itself dispatches (pipeline mode, sub-batching) are always answered: a query still queued at
its deadline gets 504, a worker stuck on a part is replaced, a restart that fails with an OSError still answers the
queue, and a node that stops answers what it holds with 503 instead of keeping clients for aiohttp's 60 s grace."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from recserve.serving import NodeServer, build_worker_model, config_from_dict
from recserve.serving.node import pool as pool_module
from recserve.serving.node.config import NodeConfig
from recserve.serving.node.control_client import ControlClient
from recserve.zoo import sample_batch
from tests.support.nodes import started
from tests.support.oip_inputs import http_inputs
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

MODEL = "rmc1-pipeline"


def pipeline_config(**model_overrides) -> NodeConfig:
    """One pipeline-mode model (every query passes through the server's dispatcher), one worker per stage."""
    model = dict(model="hercules-rmc1", name=MODEL, scale=1e-4, mode="pipeline", sparse_workers=1, workers=1,
                 threads=1, sub_batch=0, deadline_ms=60_000, hang_timeout_s=30.0, queue_limit=16)
    model.update(model_overrides)
    return config_from_dict(dict(host="127.0.0.1", http_port=0, grpc_port=0, drain_timeout_s=1.0, models=[model]))


@contextlib.contextmanager
def running(**model_overrides):
    with started(pipeline_config(**model_overrides)) as server:
        yield server, server.ports


@pytest.fixture
def node():
    with running() as node:
        yield node


def sparse_pid(port: int) -> int:
    return ControlClient("127.0.0.1", port).get_model(MODEL)["stages"]["sparse"]["worker_detail"][0]["pid"]


def held_by_the_node(port: int, queries: int) -> None:
    """Waits until the node holds ``queries`` queries (sent from threads, they reach it in no set time)."""
    def read() -> int:
        return ControlClient("127.0.0.1", port).get_model(MODEL)["in_flight"]

    assert until(read, lambda n: n == queries) == queries


@contextlib.contextmanager
def stopped(pid: int):
    """The worker frozen (SIGSTOP): what it was sent stays in its pipe, unanswered, until SIGCONT."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


class Client:
    """Queries sent from threads, each reply (or error) kept with the seconds it took."""

    def __init__(self, server: NodeServer, port: int) -> None:
        self.url = f"127.0.0.1:{port}"
        self.inputs = http_inputs(sample_batch(build_worker_model(server.config.models[0]), 8, rng=3))
        self.pool = ThreadPoolExecutor(4)

    def send(self, **infer_kwargs):
        def one():
            client = thttp.InferenceServerClient(self.url, network_timeout=120)
            start = time.monotonic()
            try:
                return "ok", client.infer(MODEL, self.inputs, **infer_kwargs).as_numpy("scores"), \
                    time.monotonic() - start
            except InferenceServerException as exc:
                return "error", str(exc), time.monotonic() - start
        return self.pool.submit(one)


def test_queued_query_is_shed_at_its_deadline_and_a_stuck_worker_is_replaced():
    with running(hang_timeout_s=4.0) as (server, ports):
        check_deadline_and_hang(server, ports)


def check_deadline_and_hang(server: NodeServer, ports) -> None:
    client, control = Client(server, ports.http), ControlClient("127.0.0.1", ports.http)
    assert client.send().result(60)[0] == "ok"
    pid = sparse_pid(ports.http)
    with stopped(pid):
        held = client.send()  # reaches the frozen worker
        held_by_the_node(ports.http, 1)
        queued = client.send(timeout=300_000)  # 0.3 s (Triton's microseconds), behind it
        kind, message, took = queued.result(30)
        assert kind == "error" and "deadline exceeded" in message and "still queued" in message, message
        assert took < 3.5, took  # at its deadline (0.3 s), not when the watchdog frees the worker (4 s)
        kind, message, took = held.result(30)  # the watchdog: 4 s on one part is a hang
        assert kind == "error" and "stopped responding" in message, message
        assert took < 20.0, took
    def replaced(state: dict) -> bool:
        detail = state["stages"]["sparse"]["worker_detail"]
        return state["worker_restarts"] >= 1 and [w["pid"] != pid and w["ready"] for w in detail] == [True]

    deadline = time.monotonic() + 60
    while not replaced(control.get_model(MODEL)):
        assert time.monotonic() < deadline, control.get_model(MODEL)
        time.sleep(0.1)
    assert client.send().result(60)[0] == "ok"  # the replacement serves


def test_a_restart_that_raises_oserror_still_answers_the_queue(node, monkeypatch):
    server, ports = node
    client = Client(server, ports.http)
    sparse = server.core.models[MODEL].pools["sparse"]
    monkeypatch.setattr(pool_module, "MAX_RESTARTS_IN_A_ROW", 2)

    async def no_fork(*_args, **_kwargs):
        raise OSError(12, "Cannot allocate memory")

    pid = sparse_pid(ports.http)
    with stopped(pid):
        held = client.send()
        held_by_the_node(ports.http, 1)
        queued = client.send()
        held_by_the_node(ports.http, 2)
        monkeypatch.setattr(sparse, "start_worker", no_fork)
        os.kill(pid, signal.SIGKILL)
        kind, message, _ = held.result(30)
        assert kind == "error" and "died" in message, message
        kind, message, took = queued.result(30)
    assert kind == "error" and "no sparse worker could be restarted" in message, message
    kind, message, _ = client.send().result(30)  # and it says so to the next query at once
    assert kind == "error" and "no sparse workers" in message, message


def test_stopping_node_answers_held_queries_at_once():
    server = NodeServer(pipeline_config())  # stopped by the test itself, from a thread
    ports = server.start()
    stopper = None
    try:
        client = Client(server, ports.http)
        pid = sparse_pid(ports.http)
        with stopped(pid):
            held, queued = client.send(), None
            held_by_the_node(ports.http, 1)
            queued = client.send()
            held_by_the_node(ports.http, 2)
            stopper = threading.Thread(target=server.stop)
            started = time.monotonic()
            stopper.start()
            for reply in (held, queued):  # the drain (1 s) waits for them; then they are answered, not dropped
                kind, message, _ = reply.result(30)
                assert kind == "error" and "shutting down" in message, message
            assert time.monotonic() - started < 5.0
    finally:
        if stopper is None:
            server.stop()
        else:
            stopper.join(60)
            assert not stopper.is_alive()


def test_stopping_during_a_restart_leaves_no_worker_behind():
    with started(pipeline_config()) as server:
        os.kill(sparse_pid(server.ports.http), signal.SIGKILL)
        time.sleep(0.2)  # the server sees the exit and starts a replacement
    left = [p.name for p in multiprocessing.active_children() if MODEL in p.name]
    assert not left, left  # (before: the replacement outlived the node and held the interpreter's exit)


def test_a_worker_that_hangs_while_the_node_drains_is_killed_and_its_query_answered():
    """The watchdog keeps watching through the drain: a part stuck on a frozen worker is answered 504 and the
    worker killed then, so the drain ends with it (it used to stop at the drain's start: the query waited out the
    whole drain and heard 503 "shutting down")."""
    server = NodeServer(pipeline_config(hang_timeout_s=60.0).model_copy(update={"drain_timeout_s": 60.0}))
    ports = server.start()
    stopper = threading.Thread(target=server.stop)
    try:
        client = Client(server, ports.http)
        pid = sparse_pid(ports.http)
        with stopped(pid):
            held = client.send()
            held_by_the_node(ports.http, 1)
            stopper.start()
            assert until(lambda: server.core.stopping, bool)
            server.core.models[MODEL].worker_watch.hang_timeout_s = 0.5  # the part is hung from now on
            kind, message, _ = held.result(120)
            assert kind == "error" and "stopped responding" in message, message
    finally:
        if stopper.is_alive() or stopper.ident is not None:
            stopper.join(120)
            assert not stopper.is_alive()
        else:
            server.stop()
