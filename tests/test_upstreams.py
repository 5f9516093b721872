"""The shard services a sharded model calls, as its server process sees them for readiness
(``serving/node/upstreams.py``): a replica counts while it answers ServerReady, not while a TCP connect succeeds."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from recserve.serving.node.forkserver import mp_context
from recserve.serving.node.upstreams import Upstreams
from recserve.serving.shards.service import ReplicaArgs, replica_main
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts a shard replica process


@pytest.fixture
def replica(tmp_path):
    """(pid, address) of a real embedding-shard replica; resumed and stopped whatever the test did to it."""
    weights = tmp_path / "rows.npy"
    np.save(weights, np.zeros((4, 2), dtype=np.float32))
    ctx = mp_context()
    parent, child = ctx.Pipe(duplex=True)
    proc = ctx.Process(target=replica_main, args=(child, ReplicaArgs("s0", 0, str(weights))), daemon=True)
    proc.start()
    child.close()
    try:
        assert parent.poll(120), "the replica did not start"
        state, pid, port = parent.recv()
        assert state == "ready"
        yield pid, f"127.0.0.1:{port}"
    finally:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.join(10)
        parent.close()


def _poked(upstreams: Upstreams):
    def read() -> list[str]:
        upstreams.poke()  # the watchdog's tick, in the server process
        return upstreams.missing()
    return read


def test_a_stopped_replica_is_not_serving_and_is_again_once_resumed(replica):
    pid, address = replica
    upstreams = Upstreams({"s0": [address]})
    try:
        assert until(_poked(upstreams), lambda gone: not gone) == []
        os.kill(pid, signal.SIGSTOP)  # alive, its port still completes TCP handshakes
        assert until(_poked(upstreams), bool) == ["s0"]
        os.kill(pid, signal.SIGCONT)
        assert until(_poked(upstreams), lambda gone: not gone) == []
    finally:
        upstreams.close()


def test_a_hung_replica_holds_one_probe_at_a_time(replica):
    pid, address = replica
    upstreams = Upstreams({"s0": [address]}, probe_timeout_s=30.0, probe_every_s=0.0)
    try:
        assert until(_poked(upstreams), lambda gone: not gone) == []
        os.kill(pid, signal.SIGSTOP)
        seen = until(lambda: (upstreams.poke(), upstreams.in_flight())[1], lambda n: n > 1, timeout_s=1.0)
        assert seen == 1  # every poke of that second found the hung replica's probe still in flight
    finally:
        os.kill(pid, signal.SIGCONT)
        upstreams.close()


def test_an_address_nobody_serves_is_missing():
    upstreams = Upstreams({"s0": ["127.0.0.1:1"]}, probe_timeout_s=0.5, probe_every_s=0.1)
    try:
        assert until(lambda: upstreams.in_flight(), lambda n: n == 0) == 0
        assert upstreams.missing() == ["s0"]
    finally:
        upstreams.close()
