"""What an operator watching a node sees: refusals counted the same over HTTP and gRPC, and log lines that stay one
line per event under hostile input."""

from __future__ import annotations

import logging
import urllib.parse

import numpy as np
import pytest
from tritonclient.grpc import InferInput
from tritonclient.utils import InferenceServerException

from tests.support import grpc_client, http
from tests.support.nodes import node_config, started
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

REFUSED = "recserve_requests_refused_total"
# a model no node serves, a version never loaded, a version that is no number: refused before any model counts them
UNSERVED = (("no-such-model", "", "not_found"), ("hercules-rmc1", "7", "not_found"), ("hercules-rmc1", "x", "invalid"))


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    """A node of one catalogue model beside an empty model repository."""
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.repository = str(tmp_path_factory.mktemp("repository"))
    with started(config) as server:
        yield server.ports


def node_refusals(port: int) -> dict[str, float]:
    samples = scrape(port)
    return {reason: metric_value(samples, REFUSED, model="", version="", reason=reason) or 0
            for reason in ("not_found", "invalid")}


def expected(before: dict[str, float]) -> dict[str, float]:
    after = dict(before)
    for _, _, reason in UNSERVED:
        after[reason] += 1
    return after


@pytest.mark.integration  # starts a node
def test_grpc_requests_for_unserved_models_are_counted_as_http_ones_are(ports):
    """The same three requests over HTTP and over gRPC each add the same refusals to /metrics."""
    before = node_refusals(ports.http)
    for name, version, _ in UNSERVED:
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "") + "/infer"
        assert http.post_json(ports.http, path, {"inputs": []}).status in (400, 404)
    after_http = until(lambda: node_refusals(ports.http), lambda now: now == expected(before))
    client = grpc_client.triton(ports.grpc)
    dense = np.zeros((1, 256), np.float32)
    for name, version, _ in UNSERVED:
        tensor = InferInput("dense", list(dense.shape), "FP32")
        tensor.set_data_from_numpy(dense)
        with pytest.raises(InferenceServerException):
            client.infer(name, [tensor], model_version=version)
    assert until(lambda: node_refusals(ports.http), lambda now: now == expected(after_http)) == expected(after_http)


@pytest.mark.integration  # starts a node
def test_loading_a_model_the_repository_does_not_hold_is_the_clients_error_not_a_warning(ports, caplog):
    """Each such load wrote a WARNING naming the client's text: a client repeating it flooded the log."""
    caplog.set_level(logging.INFO)
    for i in range(20):
        name = urllib.parse.quote(f"typo{i}\nforged line", safe="")
        reply = http.post(ports.http, f"/v2/repository/models/{name}/load")
        assert reply.status == 400 and b"no model" in reply.body
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
