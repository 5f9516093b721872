"""The fleet router: one URL for every model of a fleet deployment, each model's queries sent only to the nodes
that serve it (policies/fleet_router.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from recserve.policies.fleet_router import FleetRouter, ModelRoute, fleet_routes
from recserve.policies.router import RouterThread
from tests.support import http

BODY = {"inputs": [{"name": "dense", "shape": [3, 2], "datatype": "FP32", "data": [0.0] * 6}]}


def _backend(name: str, ready: tuple[str, ...] = (), port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """A stand-in node server: answers every infer with which backend and model it was; of the models, those in
    ``ready`` are ready (200), the rest not (503)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            model = self.path.removeprefix("/v2/models/").removesuffix("/ready")
            self.send_response(200 if model in ready else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"backend": name, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _infer(router_url: str, model: str) -> tuple[int, dict]:
    """The test's one query, to ``model`` through the router: (status, JSON answer)."""
    return http.post_json(router_url, f"/v2/models/{model}/infer", BODY, timeout_s=60).status_and_json()


def test_routes_come_from_the_started_nodes_and_the_plans_slas():
    plan = SimpleNamespace(models={"hercules-rmc1": {"sla_ms": 25.0}})
    nodes = [SimpleNamespace(url="http://a"), SimpleNamespace(url="http://b")]
    pair = [{"model": "hercules-rmc1", "name": "hercules-rmc1", "workers": 3},
            {"model": "kairos-rm2", "name": "kairos-rm2"}]
    single = [{"model": "hercules-rmc1", "name": "hercules-rmc1", "workers": 2}]
    configs = [{"_group": "1 x pair on hercules-t2", "_server": "hercules-t2", "models": pair},
               {"_group": "2 x single on hercules-t1", "_server": "hercules-t1", "models": single}]
    routes = {r.served: r for r in fleet_routes(plan, nodes, configs)}
    assert routes["hercules-rmc1"] == ModelRoute("hercules-rmc1", 25.0, (("http://a", "hercules-t2", 3),
                                                                          ("http://b", "hercules-t1", 2)))
    assert routes["kairos-rm2"].backends == (("http://a", "hercules-t2", 1),)
    assert routes["kairos-rm2"].qos_ms > 0  # not in the plan's models: the catalogue's SLA


@pytest.mark.integration  # starts HTTP servers
def test_each_models_queries_reach_only_its_nodes_and_an_unknown_model_is_404():
    (one, url_one), (two, url_two) = _backend("one"), _backend("two")
    router = RouterThread(FleetRouter([ModelRoute("a", 100.0, ((url_one, "t", 2),)),
                                       ModelRoute("b", 100.0, ((url_one, "t", 1), (url_two, "u", 1)))]))
    router.start()
    try:
        answers = [_infer(router.url, "a") for _ in range(6)]
        assert {(status, a["backend"], a["path"]) for status, a in answers} == {(200, "one", "/v2/models/a/infer")}
        answers = [_infer(router.url, "b") for _ in range(6)]
        assert {status for status, _ in answers} == {200} and {a["path"] for _, a in answers} == {"/v2/models/b/infer"}
        status, error = _infer(router.url, "c")
        assert status == 404 and "'c' is not served here" in error["error"] and "a, b" in error["error"]
        stats = http.get_json(router.url, "/router/stats")
        assert stats["a"]["completed"] == 6 and stats["b"]["completed"] == 6
    finally:
        router.stop()
        one.shutdown()
        two.shutdown()


@pytest.mark.integration  # starts HTTP servers
def test_the_router_is_ready_while_a_model_has_a_ready_node_and_names_those_without():
    """Ready (200) while some model has a node that says it is ready, naming each model without one and why each of
    its nodes is not; 503 when no model has one.  A model's own ready is 200 where any of its nodes says so."""
    (one, url_one), (two, url_two) = _backend("one", ready=("a",)), _backend("two", ready=("a", "b"))
    router = RouterThread(FleetRouter([ModelRoute("a", 100.0, ((url_one, "t", 1),)),
                                       ModelRoute("b", 100.0, ((url_one, "t", 1), (url_two, "u", 1)))]))
    router.start()
    try:
        assert http.get(router.url, "/v2/health/ready").json() == {"ready": True}
        assert http.get(router.url, "/v2/models/b/ready").status == 200  # node one says 503, node two 200
        one.shutdown()
        one.server_close()
        reply = http.get(router.url, "/v2/health/ready")
        assert reply.status == 200 and f"model a: backend {url_one}: ClientConnectorError" in reply.json()["unready"]
        assert "model b" not in reply.json()["unready"]
        assert http.get(router.url, "/v2/models/a/ready").status == 502
        assert http.get(router.url, "/v2/models/b/ready").status == 200
        two.shutdown()
        two.server_close()
        reply = http.get(router.url, "/v2/health/ready")
        assert reply.status == 503 and reply.json()["ready"] is False
        assert "model a" in reply.json()["error"] and f"model b: backend {url_one}" in reply.json()["error"]
    finally:
        router.stop()


@pytest.mark.integration  # starts HTTP servers
@pytest.mark.parametrize("policy", ["kairos", "ribbon", "drs", "clockwork"])
def test_a_node_that_cannot_be_reached_is_left_alone_and_its_queries_go_to_the_others(policy):
    """A backend that refuses connections (listed first: the base type) gets its query sent to another backend
    and is left out of service for a while, so every query is answered; once it answers again it takes queries
    again.  With every backend down a query is a 502 at once, naming each."""
    import socket
    import time

    (two, url_two) = _backend("two", ready=("b",))
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = held.getsockname()[1]
    dead = f"http://127.0.0.1:{port}"
    router = RouterThread(FleetRouter([ModelRoute("b", 100.0, ((dead, "t", 1), (url_two, "u", 1)))], policy=policy))
    router.start()
    revived = None
    try:
        answers = [_infer(router.url, "b") for _ in range(30)]
        assert {status for status, _ in answers} == {200}
        stats = http.get_json(router.url, "/router/stats")["b"]
        assert stats["errors"] == 0
        if policy != "drs":  # DRS sends these small queries to the other type: it never tries this one
            assert dead in stats["out_of_service_s"]
            held.close()
            revived, _ = _backend("revived", port=port)
            deadline = time.monotonic() + 30  # its time out of service (1 s, 2 s if it failed twice) ends
            while http.get_json(router.url, "/router/stats")["b"]["out_of_service_s"] and time.monotonic() < deadline:
                time.sleep(0.2)
            backends = {answer["backend"] for _, answer in (_infer(router.url, "b") for _ in range(40))}
            assert "revived" in backends
            revived.shutdown()
            revived.server_close()
        two.shutdown()
        two.server_close()
        started = time.monotonic()
        status, error = _infer(router.url, "b")
        assert status == 502 and url_two in error["error"]
        assert time.monotonic() - started < 10  # not held until the router's 30 s time out
    finally:
        router.stop()
        held.close()


def test_a_router_that_cannot_listen_says_so_and_closes_its_client_sessions():
    import socket

    from recserve.errors import RecserveError

    fleet = FleetRouter([ModelRoute("a", 100.0, (("http://127.0.0.1:1", "t", 1),))])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(RecserveError, match="router failed to start"):
            RouterThread(fleet, port=taken.getsockname()[1]).start()
    assert all(router.session is not None and router.session.closed for router in fleet.routers.values())
