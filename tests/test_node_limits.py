"""A node's resource bounds against many or idle clients: open files, connections per worker, idle timeouts."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration  # a fresh interpreter
def test_the_soft_open_file_limit_is_raised_to_the_hard_limit_at_start():
    code = """
import resource
from recserve.serving.node.server import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
now = raise_open_file_limit()
print(now, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    now, soft, hard = (int(x) for x in out.stdout.split())
    assert now == soft and (soft == hard or (hard == -1 and soft > 256))


def test_connection_limits_are_validated_naming_the_field():

    from recserve.errors import SpecError
    from recserve.serving import config_from_dict

    model = {"model": "hercules-rmc1", "scale": 1e-4}
    for key, bad in (("keep_alive_timeout_s", 0), ("keep_alive_timeout_s", "5"), ("max_connections", 0),
                     ("max_connections", 1.5)):
        with pytest.raises(SpecError, match=key):
            config_from_dict({key: bad, "models": [model]})
    config = config_from_dict({"keep_alive_timeout_s": 5, "max_connections": 8, "models": [model]})
    assert (config.keep_alive_timeout_s, config.max_connections) == (5, 8)


def _exchange(port: int, request: bytes) -> bytes:
    """``request`` on a connection of its own; everything answered until the server closes it."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    return answer


LIVE_CLOSE = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def _accepted(port: int, pid: int, socks: list) -> int:
    """How many of ``socks`` (connected to ``port``) the worker ``pid`` holds (accepted, per /proc)."""
    from tests.support.proc_net import holder, tcp_inodes

    ends = {s.getsockname()[1] for s in socks}
    return sum(holder(tcp_inodes(lambda local, remote, _, end=end: (local, remote) == (port, end)), [pid])
               is not None for end in ends)


def _worker_pid(server) -> int:
    (pid,) = [w.pid for rt in server.core.models.values() for pool in rt.pools.values() for w in pool.workers]
    return pid


@pytest.mark.integration  # starts a node
def test_a_worker_at_its_cap_closes_its_longest_idle_connection_for_a_new_one_and_idle_ones_time_out():
    """Connections that send nothing cannot hold a worker's every slot: a new client is served and the connection
    idle longest closed (503 only when none is idle); the idle keep-alive timeout closes the rest."""
    import socket
    import time

    from tests.support.nodes import node_config, started
    from tests.support.wait import until

    pytest.importorskip("httptools")
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    # idle long enough that the third connection comes while the first two are still open, on a busy host too
    config.keep_alive_timeout_s, config.max_connections = 3.0, 2
    with started(config) as server:
        port = server.ports.http
        pid = _worker_pid(server)
        kept = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
        assert until(lambda: _accepted(port, pid, kept), lambda n: n == 2) == 2  # both accepted by the worker
        answer = _exchange(port, LIVE_CLOSE)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert kept[0].recv(1 << 16) == b""  # the one idle longest made room
        began = time.monotonic()
        assert kept[1].recv(1 << 16) == b""  # idle past keep_alive_timeout_s: closed by the worker
        assert time.monotonic() - began < 25
        for sock in kept:
            sock.close()
        assert _exchange(port, LIVE_CLOSE).startswith(b"HTTP/1.1 200")


@pytest.mark.integration  # starts a node
def test_a_worker_at_its_cap_refuses_while_requests_are_arriving_then_closes_the_slowest_for_a_new_one():
    import socket
    import time

    from tests.support.nodes import node_config, started
    from tests.support.wait import until

    pytest.importorskip("httptools")
    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.max_connections = 2
    with started(config) as server:
        port = server.ports.http
        slow = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
        for sock in slow:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")  # a head begun, never finished
        assert until(lambda: _accepted(port, _worker_pid(server), slow), lambda n: n == 2) == 2
        answer = _exchange(port, b"")  # (a request the refusal leaves unread would turn its close into a reset)
        assert answer.startswith(b"HTTP/1.1 503") and b"connections" in answer  # none idle, none slow yet
        time.sleep(1.5)  # both heads arriving for longer than SLOW_FOR_S
        answer = _exchange(port, LIVE_CLOSE)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        refused = 0
        for sock in slow:
            sock.settimeout(10)
            try:
                refused += sock.recv(1 << 16).startswith(b"HTTP/1.1 408")
            except TimeoutError:
                pass
            sock.close()
        assert refused >= 1


@pytest.mark.integration  # starts a node
def test_the_server_process_at_its_cap_closes_the_connection_idle_longest_for_a_handed_over_one():
    """Keep-alive connections handed to the server process (health, metrics, control) cannot hold its every slot:
    a new probe is answered and the connection idle longest closed."""
    import socket
    import time

    from tests.support.nodes import node_config, started

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.max_connections = 2
    with started(config) as server:
        port = server.ports.http
        kept = []
        for _ in range(2):  # each handed over by the worker, answered, then idle in the server process
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(1 << 16).startswith(b"HTTP/1.1 200")
            kept.append(sock)
            time.sleep(0.1)
        answer = _exchange(port, LIVE_CLOSE)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert kept[0].recv(1 << 16) == b""  # the one idle longest made room
        for sock in kept:
            sock.close()


@pytest.mark.integration  # starts a node
def test_large_bodies_a_worker_receives_at_once_are_bounded_and_a_stalled_one_gives_its_room_back():
    """Clients that send all of a large body but its last byte cannot make a worker hold bodies without bound: past
    its budget (four largest bodies) a new one is refused 503 before it is received; a closed one frees its room."""
    import socket
    import time

    from recserve.serving.transport.h2frames import HELD_WORKER
    from tests.support.nodes import node_config, started

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.max_body_bytes = size = HELD_WORKER // 4
    head = (b"POST /v2/models/hercules-rmc1/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n" % size)
    with started(config) as server:
        port = server.ports.http
        held = []
        for _ in range(4):  # the budget's worth, each a byte short
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(head + b" " * (size - 1))
            held.append(sock)
        time.sleep(0.5)
        answer = _exchange(port, head + b" " * (256 << 10))
        assert answer.startswith(b"HTTP/1.1 503") and b"request bodies" in answer, answer[:300]
        held.pop().close()
        deadline = time.monotonic() + 20
        while True:  # once the worker saw the close, a body is received again (and answered: not valid JSON)
            answer = _exchange(port, head + b" " * size)
            if not answer.startswith(b"HTTP/1.1 503") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        for sock in held:
            sock.close()


@pytest.mark.integration  # a fresh interpreter, its open files limited
def test_a_worker_out_of_descriptors_closes_idle_connections_to_accept_a_new_one():
    """Idle connections that take every descriptor a worker may open (below ``max_connections``) do not leave new
    clients waiting unanswered: the worker closes the connections idle longest and accepts again."""
    code = """
import resource, socket, time
resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))
from tests.support.nodes import node_config, started
config = node_config("hercules-rmc1", scale=1e-4, workers=1)
with started(config) as server:
    port = server.ports.http
    idle = []
    for _ in range(260):  # past what the worker can hold: two descriptors a connection
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
    time.sleep(1.0)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        try:
            answer = sock.recv(1 << 16)
        except TimeoutError:
            answer = b"timed out"
    print(answer[:12].decode("latin-1"))
    for sock in idle:
        sock.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().endswith("HTTP/1.1 200"), out.stdout[-500:] + out.stderr[-2000:]


def test_grpc_limits_are_validated_naming_the_field():
    from recserve.errors import SpecError
    from recserve.serving import config_from_dict
    from recserve.serving.transport.h2limits import FloodLimits, Rate

    model = {"model": "hercules-rmc1", "scale": 1e-4}
    for bad, field in (({"pingz": [1, 1]}, "pingz"), ({"pings": 5}, "pings"), ({"pings": [0, 1]}, "pings"),
                       ({"continuations": -1}, "continuations"), ([1], "grpc_limits"),
                       ({"stream_window": 1000}, "stream_window"), ({"connection_window": 2**31}, "connection_window")):
        with pytest.raises(SpecError, match=field):
            config_from_dict({"grpc_limits": bad, "models": [model]})
    given = {"pings": [5, 2], "glitches": [50, 1], "continuations": 4}
    limits = config_from_dict({"grpc_limits": given, "models": [model]}).grpc_limits
    assert limits == FloodLimits(pings=Rate(5.0, 2.0), glitches=Rate(50.0, 1.0), continuations=4)
    windows = config_from_dict({"grpc_limits": {"stream_window": 65_535, "connection_window": 1 << 24},
                                "models": [model]}).grpc_limits
    assert (windows.stream_window, windows.connection_window) == (65_535, 1 << 24)
    assert config_from_dict({"models": [model]}).grpc_limits == FloodLimits()


@pytest.mark.integration  # starts a node
def test_a_nodes_grpc_limits_reach_its_workers():
    import socket

    from recserve.serving.node.config import flood_limits
    from recserve.serving.transport.h2frames import PREFACE
    from recserve.serving.transport.h2frames import frame as _frame
    from tests.support.nodes import node_config, started

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    config.grpc_limits = flood_limits({"pings": [3, 0.1]})
    with started(config) as server:
        with socket.create_connection(("127.0.0.1", server.ports.grpc), timeout=30) as sock:
            sock.sendall(PREFACE + _frame(4, 0, 0) + _frame(6, 0, 0, b"12345678") * 10)  # default burst: 100
            received = b""
            while b"too_many_pings" not in received and (chunk := sock.recv(1 << 16)):
                received += chunk
    assert b"too_many_pings" in received
