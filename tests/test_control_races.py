"""Control requests racing each other on one model (and two): every answer is true (what it says happened,
happened) and the node ends consistent (its workers, its readiness, its metrics).

A control request names its model before it reads its body; a resize whose model is unloaded meanwhile used to
answer 200 and start workers for a version already retiring."""

from __future__ import annotations

import json
import multiprocessing
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from tritonclient.utils import InferenceServerException

from recserve.serving.node.config import NodeConfig
from recserve.specs import model_from_dict
from recserve.zoo import FAMILY_CLASSES, sample_batch
from recserve.zoo.artifacts import write_version
from tests.support import http
from tests.support.nodes import generous_yaml, started
from tests.support.oip_inputs import http_inputs
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes

SPEC = dict(family="dlrm", dense_in=8, bottom_mlp=[16, 8], top_mlp=[16, 1], interaction="dot",
            tables=[dict(name="t", rows=500, dim=8, pooling=2, repeat=3)], sla=dict(target_ms=50))
MODELS = ("ctr", "other")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    for name in MODELS:
        (root / name).mkdir()
        (root / name / "config.yaml").write_text("workers: 1\nqueue_limit: 32\n" + generous_yaml())
        spec = model_from_dict(name, SPEC)
        torch.manual_seed(0)
        model = FAMILY_CLASSES["dlrm"](spec, tuple(t.rows for t in spec.tables)).eval()
        write_version(model, root / name, 1, "safetensors")
    return root


@pytest.fixture
def node(repo):
    with started(NodeConfig(models=[], repository=str(repo))) as server:
        yield server


def workers_of(name: str) -> list[str]:
    """The worker processes of ``name`` alive in this process (``recserve-<model>-<stage>-<id>``)."""
    return [p.name for p in multiprocessing.active_children() if p.name.startswith(f"recserve-{name}-")]


def model_workers(port: int, name: str) -> int:
    return http.get_json(port, f"/control/models/{name}")["stages"]["model"]["workers"]


def test_a_resize_whose_model_is_unloaded_before_its_body_arrives_says_so(node):
    """The resize names ``ctr``, then waits for its body; ``ctr`` is unloaded meanwhile: the resize answers 404
    saying it was unloaded (it answered 200, and started a worker for the retiring version)."""
    port = node.ports.http
    body = json.dumps({"workers": 2}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as resize:
        resize.sendall(b"POST /control/models/ctr/workers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        aiohttp_server = node.core.own.server
        assert until(lambda: aiohttp_server.requests_count, lambda n: n >= 1) >= 1  # its handler waits for the body
        assert http.post_json(port, "/v2/repository/models/ctr/unload", timeout_s=120).status == 200
        resize.sendall(body)
        answer = b""
        while chunk := resize.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), answer[:400]
    assert "'ctr' version 1 was unloaded while this request waited" in json.loads(payload)["error"]
    assert until(lambda: node.core.loader.retiring, lambda left: not left) == set()
    assert http.get(port, "/v2/health/ready").status == 200  # the unloaded model holds nothing up
    assert "ctr" not in node.core.models


REQUESTS = {
    "resize": ("/control/models/{}/workers", {"workers": 2}),
    "replace": ("/control/models/{}/workers", {"workers": 2, "replace": True}),
    "load": ("/v2/repository/models/{}/load", {}),
    "unload": ("/v2/repository/models/{}/unload", {}),
}


def _control(port: int, what: str) -> tuple[str, int, str]:
    """One control request, ``"<kind> <model>"``: (what, status, error or "")."""
    kind, name = what.split()
    path, document = REQUESTS[kind]
    reply = http.post_json(port, path.format(name), document, timeout_s=180)
    return what, reply.status, "" if reply.status == 200 else reply.json().get("error", "")


CASES = {  # two requests at once -> how ``ctr`` ends: its workers, or 0 (unloaded), or None (either, by order)
    ("resize ctr", "unload ctr"): 0, ("replace ctr", "unload ctr"): 0, ("resize ctr", "load ctr"): 2,
    ("replace ctr", "resize ctr"): 2, ("load ctr", "unload ctr"): None, ("unload ctr", "unload ctr"): 0,
    ("resize ctr", "unload other"): 2, ("replace ctr", "load other"): 2,
}


@pytest.mark.parametrize("pair", list(CASES), ids=["+".join(p).replace(" ", "-") for p in CASES])
def test_concurrent_control_requests_answer_the_truth_and_leave_the_node_consistent(node, pair):
    """Two control requests at once (one model, or two): each 200 is for a change that holds afterwards, each
    error is a 404 saying the model was unloaded, and the node ends consistent: every model served with the
    workers asked for, in the control API, its pool and the metrics alike, or unloaded with no worker process
    left; and ready."""
    port = node.ports.http
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda what: _control(port, what), pair))
    for _what, status, error in answers:
        assert status == 200 or (status == 404 and ("unloaded" in error or "not loaded" in error)), answers
    if pair == ("unload ctr", "unload ctr"):
        assert sorted(status for _, status, _ in answers) == [200, 404], answers
    assert until(lambda: set(node.core.loader.retiring), lambda left: not left) == set()
    want = {"ctr": CASES[pair], "other": 0 if "unload other" in pair else 1}
    for name, workers in want.items():
        served = name in node.core.models
        if workers is None:
            workers = 1 if served else 0
        assert served == (workers > 0), (name, answers)
        if served:
            assert model_workers(port, name) == workers, answers
            assert len(node.core.models[name].pools["model"].workers) == workers, answers
            samples = scrape(port)
            assert metric_value(samples, "recserve_workers", model=name, version="1", stage="model") == workers
        assert until(lambda n=name: len(workers_of(n)), lambda n, w=workers: n == w) == workers, answers
    assert until(lambda: http.get(port, "/v2/health/ready").status, lambda s: s == 200) == 200


def test_a_worker_that_hangs_while_its_unloaded_version_retires_is_killed_and_its_query_answered(tmp_path):
    """The hang watchdog watches retiring versions too: a pipeline model unloaded while its sparse worker is
    frozen on a query's part answers that query 504 once the part is hung, rather than holding it for the whole
    drain and answering 500 when the worker is killed at the end."""
    from tests.test_runtime import MODEL, held_by_the_node, stopped

    folder = tmp_path / "repo" / MODEL
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("mode: pipeline\nsparse_workers: 1\nworkers: 1\n" + generous_yaml())
    spec = model_from_dict(MODEL, SPEC)
    torch.manual_seed(0)
    model = FAMILY_CLASSES["dlrm"](spec, tuple(t.rows for t in spec.tables)).eval()
    write_version(model, folder, 1, "safetensors")
    inputs = http_inputs(sample_batch(model, 8, rng=3))
    with started(NodeConfig(models=[], repository=str(tmp_path / "repo"), drain_timeout_s=60.0)) as node, \
            ThreadPoolExecutor(1) as pool:
        port = node.ports.http
        rt = node.core.models[MODEL]
        with stopped(rt.pools["sparse"].workers[0].pid):
            held = pool.submit(http.triton(port, network_timeout=180).infer, MODEL, inputs)
            held_by_the_node(port, 1)
            assert http.post_json(port, f"/v2/repository/models/{MODEL}/unload", timeout_s=120).status == 200
            assert rt in node.core.loader.retiring
            rt.worker_watch.hang_timeout_s = 0.5  # the part is hung from now on
            with pytest.raises(InferenceServerException, match="stopped responding"):
                held.result(120)
        assert until(lambda: set(node.core.loader.retiring), lambda left: not left) == set()
