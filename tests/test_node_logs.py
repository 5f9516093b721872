"""What an operator reads in a node's log: its models' workers starting, the control API's changes to them, and a
dead worker's replacement, each with the pids concerned."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from tests.support import http
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts a node


def _pids(port: int) -> list[int]:
    state = http.get_json(port, "/control/models/hercules-rmc1")
    return [w["pid"] for w in state["stages"]["model"]["worker_detail"] if w["ready"] and not w["retiring"]]


def _wait_for(caplog, text: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r.getMessage() for r in caplog.records if text in r.getMessage()]
        if found:
            return found[-1]
        time.sleep(0.05)
    raise AssertionError(f"no log line with {text!r}: {[r.getMessage() for r in caplog.records]}")


def test_starts_resizes_and_restarts_are_logged_with_their_pids(caplog):
    caplog.set_level(logging.INFO, logger="recserve")
    with started(node_config("hercules-rmc1")) as server:
        port = server.ports.http
        first = _pids(port)
        assert "model hercules-rmc1 version 1: starting 1 workers" in caplog.text
        assert "model hercules-rmc1 version 1: workers ready in" in caplog.text
        assert f": model pids {first}" in caplog.text
        assert http.post_json(port, "/control/models/hercules-rmc1/workers", {"workers": 2}).status == 200
        assert "model hercules-rmc1: model workers 1 -> 2" in _wait_for(caplog, "workers 1 -> 2")
        both = _pids(port)
        assert _wait_for(caplog, "workers now pids") == f"model hercules-rmc1: model workers now pids {both}"
        os.kill(first[0], signal.SIGKILL)
        died = _wait_for(caplog, f"pid {first[0]} died")
        assert "killed by SIGKILL" in died, died
        replaced = _wait_for(caplog, f"pid {first[0]} replaced by pid")
        assert int(replaced.rsplit(" ", 1)[1]) in _pids(port), replaced
