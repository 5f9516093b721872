"""A node stopping: answers the server process gives while it drains say ``Connection: close``, as the workers'
do, so a keep-alive client sends its next request on a new connection rather than on one the node is about to
close."""

from __future__ import annotations

import os
import signal
import threading
import time
from http.client import HTTPConnection

import pytest

from recserve.serving.node.server import NodeServer
from recserve.specs import get_model
from recserve.zoo.batch import random_batch
from tests.support import http
from tests.support.nodes import node_config

pytestmark = pytest.mark.integration  # starts a node


def _query(port: int) -> None:
    spec = get_model("hercules-rmc1")
    batch = random_batch(spec.dense_in, spec.scaled_rows(1e-4), tuple(t.pooling for t in spec.tables), 2, 0)
    http.infer(port, "hercules-rmc1", batch.as_arrays(), timeout_s=120)


def test_the_server_process_answers_connection_close_while_draining():
    server = NodeServer(node_config("hercules-rmc1"))
    port = server.start().http
    worker = http.get_json(port, "/control/models/hercules-rmc1")["stages"]["model"]["worker_detail"][0]["pid"]
    os.kill(worker, signal.SIGSTOP)  # its query keeps the drain waiting
    stopping = threading.Thread(target=server.stop)
    held = threading.Thread(target=_query, args=(port,))
    try:
        time.sleep(1.5)  # the server process covers the socket of its silent worker: the query waits there
        held.start()
        deadline = time.monotonic() + 30
        while http.get_json(port, "/control/models/hercules-rmc1")["in_flight"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        conn = HTTPConnection("127.0.0.1", port, timeout=30)  # a keep-alive connection to the server process
        conn.request("GET", "/v2/health/live")
        assert conn.getresponse().read() == b'{"live": true}'
        stopping.start()
        while server.core is not None and not server.core.stopping:
            time.sleep(0.01)
        conn.request("GET", "/v2/health/ready")
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 503 and reply.getheader("Connection") == "close", reply.getheaders()
    finally:
        os.kill(worker, signal.SIGCONT)
        held.join(120)
        if stopping.is_alive():
            stopping.join(120)
        server.stop(drain=False)
