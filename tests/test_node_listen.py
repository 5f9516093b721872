"""A node's listening sockets: a port it cannot take is a one-line error naming it, with nothing left behind."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from recserve.errors import RecserveError
from recserve.serving.node.server import listening_socket


def _taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_taken_port_is_a_recserve_error_naming_it_and_the_socket_is_closed():
    with _taken_port() as holder:
        port = holder.getsockname()[1]
        before = len(os.listdir("/proc/self/fd"))
        for what, flag in (("HTTP", "--http-port"), ("gRPC", "--grpc-port")):
            with pytest.raises(RecserveError, match=f"cannot listen for {what} on 127.0.0.1:{port}: "
                                                    f"Address already in use; .*{flag}"):
                listening_socket("127.0.0.1", port, what)
        assert len(os.listdir("/proc/self/fd")) == before
    with listening_socket("127.0.0.1", 0) as free:
        assert free.getsockname()[1] > 0


@pytest.mark.integration  # starts a node (its workers never start: the gRPC port is refused first)
def test_a_node_whose_grpc_port_is_taken_refuses_to_start_and_lets_its_http_port_go():
    from recserve.serving import NodeServer, config_from_dict
    from tests.support.nodes import generous

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        http_port = probe.getsockname()[1]
    with _taken_port() as holder:
        config = config_from_dict({"host": "127.0.0.1", "http_port": http_port, "grpc_port": holder.getsockname()[1],
                                   "models": [generous({"model": "hercules-rmc1", "scale": 1e-4, "workers": 1})]})
        node = NodeServer(config)
        with pytest.raises(RecserveError, match="cannot listen for gRPC"):
            node.start()
        node.stop()
    with listening_socket("127.0.0.1", http_port):  # the node's HTTP socket was closed with it
        pass


@pytest.mark.integration  # starts a node
def test_health_is_answered_while_the_models_start(monkeypatch):
    """From the moment the ports are bound: live (HTTP and gRPC) says yes and ready says no while the workers start,
    rather than connections waiting unanswered in the listen queue (a liveness probe would time out)."""
    import asyncio
    import threading

    import tritonclient.grpc as tgrpc

    from recserve.serving import NodeServer
    from recserve.serving.node.runtime import ModelRuntime
    from tests.support import http
    from tests.support.nodes import node_config
    from tests.support.ports import free_port

    gate, start = threading.Event(), ModelRuntime.start

    async def held(self: ModelRuntime) -> None:
        while not gate.is_set():
            await asyncio.sleep(0.05)
        await start(self)

    monkeypatch.setattr(ModelRuntime, "start", held)
    config = node_config("hercules-rmc1", http_port=free_port(), grpc_port=free_port())
    server = NodeServer(config)
    started = threading.Thread(target=server.start, daemon=True)
    started.start()
    try:
        live = _when_bound(lambda: http.get(config.http_port, "/v2/health/live", timeout_s=10))
        assert live.status == 200, live.body
        assert http.get(config.http_port, "/v2/health/ready", timeout_s=10).status == 503
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{config.grpc_port}")
        assert client.is_server_live(client_timeout=10) and not client.is_server_ready(client_timeout=10)
        gate.set()
        started.join(180)
        assert http.get(config.http_port, "/v2/health/ready", timeout_s=10).status == 200
    finally:
        gate.set()
        started.join(180)
        server.stop()


def _when_bound(probe):
    """``probe()`` once the port takes connections (refused until the node binds it)."""
    import time

    deadline = time.monotonic() + 60
    while True:
        try:
            return probe()
        except OSError as exc:  # urllib's URLError wraps the refusal
            if not isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
                raise
            assert time.monotonic() < deadline, "the node never bound its port"
            time.sleep(0.05)


def test_a_tmpdir_too_deep_for_unix_sockets_is_a_one_line_error_and_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    from recserve.serving.node.launch import socket_folder

    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(RecserveError, match=r"too deep for the node's Unix sockets \(\d+ bytes, at most 107\): set "
                                            "TMPDIR to a shorter folder"):
        socket_folder("grpc", "server.sock")
    assert list(deep.iterdir()) == []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path.parent.parent.parent))
    folder = socket_folder("grpc", "server.sock")
    assert os.path.isdir(folder)
    shutil.rmtree(folder)


def test_the_private_folders_of_processes_that_are_gone_are_removed_and_no_live_ones(tmp_path):
    import subprocess
    import sys

    from recserve.hostinfo import OWNER, private_folder, remove_orphaned

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def folder(name: str, owner: int | None) -> Path:
        (tmp_path / name).mkdir()
        if owner is not None:
            (tmp_path / name / OWNER).write_text(str(owner))
        return tmp_path / name

    orphans = [folder(f"recserve-{kind}-x1y2", gone.pid) for kind in ("grpc", "shm", "siblings", "accel")]
    (orphans[0] / "server.sock").write_text("")
    kept = [folder("recserve-grpc-mine", os.getpid()), folder("recserve-grpc-nobody", None),
            folder("recserve-measure-abc", None), folder("unrelated", gone.pid)]
    assert sorted(remove_orphaned(str(tmp_path))) == sorted(str(p) for p in orphans)
    assert sorted(tmp_path.iterdir()) == sorted(kept)
    made = private_folder("grpc")  # its owner this process: never removed while it lives
    try:
        assert os.path.basename(made).startswith("recserve-grpc-")
        assert made not in remove_orphaned(os.path.dirname(made))
    finally:
        shutil.rmtree(made)
