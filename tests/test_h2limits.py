"""Budgets for HTTP/2 frames that carry no request (serving/transport/h2limits.py), in the connection and in a node."""

from __future__ import annotations

import socket
import time

import pytest

from recserve.serving.transport.h2frames import ENHANCE_YOUR_CALM, PREFACE
from recserve.serving.transport.h2frames import frame as _frame
from recserve.serving.transport.h2grpc import GrpcConnection, Method
from recserve.serving.transport.h2limits import MAX_UPDATE_CREDIT, FloodGuard, FloodLimits, Rate
from tests.support import grpc_client, http
from tests.support.h2_transport import Transport
from tests.support.nodes import started
from tests.support.oip_inputs import grpc_inputs
from tests.support.scrape import metric_value, scrape

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rate_budget_allows_its_burst_then_refills_at_its_rate():
    clock = Clock()
    guard = FloodGuard(FloodLimits(pings=Rate(3, 2)), clock)
    assert [guard.ping() for _ in range(4)] == [None, None, None, "too_many_pings"]
    clock.now += 0.5  # one token back at 2 a second
    assert [guard.ping() for _ in range(2)] == [None, "too_many_pings"]
    clock.now += 60  # refilled to the burst, never past it
    assert [guard.ping() for _ in range(4)] == [None, None, None, "too_many_pings"]


def test_window_updates_are_taken_from_those_earned_then_from_the_glitch_budget():
    guard = FloodGuard(FloodLimits(glitches=Rate(2, 1)), Clock())
    guard.earned_updates()  # one DATA frame sent, or one stream opened: two updates
    assert [guard.window_update() for _ in range(5)] == [None, None, None, None, "too_many_glitches"]
    for _ in range(5000):
        guard.earned_updates()
    assert guard.update_credit == MAX_UPDATE_CREDIT  # banked up to a bound


def test_counted_budgets_count_in_a_row_and_start_again_when_told():
    guard = FloodGuard(FloodLimits(empty_data=2, continuations=1))
    assert [guard.empty_data() for _ in range(3)] == [None, None, "too_many_empty_frames"]
    guard.empty_in_a_row = 0
    assert guard.empty_data() is None
    assert [guard.continuation() for _ in range(2)] == [None, "too_many_continuations"]


class _Transport(Transport):
    def goaway_codes(self) -> list[tuple[int, bytes]]:
        """(error code, debug data) of each GOAWAY written."""
        return [(int.from_bytes(p[4:8], "big"), p[8:]) for kind, _, p in self.frames(keep=True) if kind == GOAWAY]


def _open(limits: FloodLimits | None = None) -> tuple[GrpcConnection, _Transport, list[str]]:
    echo = Method(unary=lambda call, raw: call.reply(bytes(raw)))
    abused: list[str] = []
    conn = GrpcConnection(lambda path: echo, 1 << 20, limits=limits, on_abuse=abused.append)
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0))
    transport.data = b""
    return conn, transport, abused


def _feed(conn: GrpcConnection, data: bytes) -> None:
    """``data`` as one read, on a loop run until the frames it leaves for later turns are handled too."""
    import asyncio

    async def read() -> None:
        conn.data_received(data)
        for _ in range(200):
            await asyncio.sleep(0)

    asyncio.run(read())


def _headers(stream: int, flags: int, path: str = "/t.S/Echo") -> bytes:
    from hpack import Encoder

    block = Encoder().encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                              (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    return _frame(HEADERS, flags, stream, block)


FLOODS = {  # name: (a frame a flood repeats, frames sent before it, the reason)
    "ping": (_frame(PING, 0, 0, b"12345678"), b"", "too_many_pings"),
    "settings": (_frame(SETTINGS, 0, 0), b"", "too_many_settings"),
    "rapid reset": (None, b"", "too_many_resets"),
    "empty data": (_frame(DATA, 0, 1), _headers(1, END_HEADERS), "too_many_empty_frames"),
    "continuation": (_frame(CONTINUATION, 0, 1), _headers(1, 0), "too_many_continuations"),
    "priority": (_frame(PRIORITY, 0, 3, b"\x00\x00\x00\x00\x10"), b"", "too_many_glitches"),
    "unknown frames": (_frame(0x42, 0, 0, b"x" * 8), b"", "too_many_glitches"),
    "window updates": (_frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01"), b"", "too_many_glitches"),
}


def _flood(name: str, count: int) -> bytes:
    frame, before, _ = FLOODS[name]
    if frame is None:  # a new stream, reset at once: CVE-2023-44487
        return b"".join(_headers(2 * i + 1, END_HEADERS) + _frame(RST_STREAM, 0, 2 * i + 1, b"\x00\x00\x00\x08")
                        for i in range(count))
    return before + frame * count


@pytest.mark.parametrize("name", sorted(FLOODS))
def test_a_flood_past_its_budget_gets_goaway_enhance_your_calm_and_is_counted(name):
    conn, transport, abused = _open()
    _feed(conn, _flood(name, 2000))
    assert transport.goaway_codes() == [(ENHANCE_YOUR_CALM, FLOODS[name][2].encode())]
    assert transport.closed and abused == [FLOODS[name][2]]


@pytest.mark.parametrize("name", sorted(FLOODS))
def test_what_a_well_behaved_client_sends_stays_within_every_budget(name):
    conn, transport, abused = _open()
    count = {"continuation": 8, "empty data": 16, "settings": 99}.get(name, 100)  # SETTINGS: the first was sent
    _feed(conn, _flood(name, count))
    assert transport.goaway_codes() == [] and not transport.closed and abused == []


def _reply_of(size: int, stream: int = 1) -> bytes:
    """A call to the echo method on ``stream`` whose answer is ``size`` bytes."""
    return _headers(stream, END_HEADERS) + _frame(DATA, END_STREAM, stream,
                                                  b"\x00" + size.to_bytes(4, "big") + b"r" * size)


def _update(stream: int, increment: int) -> bytes:
    return _frame(WINDOW_UPDATE, 0, stream, increment.to_bytes(4, "big"))


def test_an_answer_dribbled_through_a_window_kept_tiny_ends_the_connection():
    """CVE-2019-9511: the client's stream window kept at 16 bytes, so the answer goes out 16 bytes a frame, each
    WINDOW_UPDATE earning the next; none of those frames earns an update, and the glitch budget ends it."""
    conn, transport, abused = _open()
    now = conn.h2.guard.clock()
    conn.h2.guard.clock = lambda: now  # no refill while a busy host feeds the 1,200 updates: the count is exact
    _feed(conn, _frame(SETTINGS, 0, 0, b"\x00\x04" + (16).to_bytes(4, "big")) + _reply_of(64 << 10))
    _feed(conn, _update(1, 16) * 1200)
    sent = [p for kind, _, p in transport.frames(keep=True) if kind == DATA]
    assert 1000 <= len(sent) <= 1004 and {len(p) for p in sent} == {16}  # the burst, and what opening earned
    assert transport.goaway_codes() == [(ENHANCE_YOUR_CALM, b"too_many_glitches")] and abused == ["too_many_glitches"]


def test_a_client_that_reopens_both_windows_for_every_frame_it_reads_stays_within_the_budget():
    """The most eager well-behaved client: a connection and a stream WINDOW_UPDATE for every DATA frame read, over
    answers larger than the default windows, many calls on one connection."""
    conn, transport, abused = _open()
    received = 0
    for call in range(100):  # 100 x 7 frames x 2 updates: past the glitch budget's burst, were they not earned
        _feed(conn, _reply_of(100_000, 2 * call + 1))
        while frames := [(s, len(p)) for kind, s, p in transport.frames() if kind == DATA]:
            received += sum(n for _, n in frames)
            _feed(conn, b"".join(_update(0, n) + _update(s, n) for s, n in frames))
    assert received == 100 * 100_005
    assert transport.goaway_codes() == [] and not transport.closed and abused == []


def test_the_budgets_are_the_connections_own_setting():
    conn, transport, _ = _open(FloodLimits(pings=Rate(2, 1)))
    conn.data_received(_flood("ping", 3))
    assert transport.goaway_codes() == [(ENHANCE_YOUR_CALM, b"too_many_pings")]


@pytest.mark.integration
def test_a_ping_flood_on_a_worker_ends_that_connection_counted_in_metrics_and_the_node_serves_on():

    from recserve.serving import build_worker_model
    from recserve.zoo import sample_batch
    from tests.support.nodes import node_config

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    with started(config) as server:
        ports = server.ports
        with socket.create_connection(("127.0.0.1", ports.grpc), timeout=30) as sock:
            sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _frame(PING, 0, 0, b"12345678") * 5000)
            received = b""
            try:
                while chunk := sock.recv(1 << 16):
                    received += chunk
            except (ConnectionResetError, TimeoutError):
                pass
        assert ENHANCE_YOUR_CALM.to_bytes(4, "big") + b"too_many_pings" in received
        labels = {"model": config.models[0].name, "version": "1", "reason": "h2_too_many_pings"}
        deadline = time.monotonic() + 30
        while True:
            refused = metric_value(scrape(ports.http), "recserve_requests_refused_total", **labels)
            if refused or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert refused == 1
        model = build_worker_model(server.config.models[0])
        client = grpc_client.triton(ports.grpc)
        inputs = grpc_inputs(sample_batch(model, 4, rng=1))
        assert client.infer(config.models[0].name, inputs).as_numpy("scores").shape == (4, 1)


def _partial_request(stream: int, declared: int, sent: int, path: str = "/t.S/Echo") -> bytes:
    """A unary request whose message declares ``declared`` bytes, of which ``sent`` arrive, never ended."""
    body = b"\x00" + declared.to_bytes(4, "big") + b"x" * (sent - 5)
    return _headers(stream, END_HEADERS, path) + _frame(DATA, 0, stream, body)


def _trailer_statuses(data: bytes) -> list[bytes]:
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if data[3] == HEADERS and b"grpc-status" in data[9:9 + length]:
            out.append(data[9:9 + length])
        data = data[9 + length:]
    return out


def test_incomplete_requests_are_bounded_per_connection_and_per_server_and_let_go_on_close():
    from recserve.serving.transport.h2limits import ByteBudget

    echo = Method(unary=lambda call, raw: call.reply(b"ok"))
    shared = ByteBudget(24 << 20)
    conns = []
    for _ in range(2):
        conn, transport = GrpcConnection(lambda path: echo, 8 << 20, held=shared), _Transport()
        conn.connection_made(transport)
        conn.data_received(PREFACE + _frame(SETTINGS, 0, 0))
        transport.data = b""
        conns.append((conn, transport))
    first, second = conns
    # 40 streams x 1 MiB of an 8 MiB message on one connection: its own 16 MiB budget refuses the 17th on
    first[0].data_received(b"".join(_partial_request(2 * i + 1, 8 << 20, 1 << 20) for i in range(40)))
    assert len(_trailer_statuses(first[1].data)) == 40 - 16 and not first[1].closed
    assert first[0].h2.streams.held.used == 16 << 20 and shared.used == 16 << 20
    # the second connection fills the server's 24 MiB
    second[0].data_received(b"".join(_partial_request(2 * i + 1, 8 << 20, 1 << 20) for i in range(12)))
    assert len(_trailer_statuses(second[1].data)) == 12 - 8 and shared.used == 24 << 20
    # a complete request still goes through on either
    message = b"\x00\x00\x00\x00\x02hi"
    first[1].data = b""
    first[0].data_received(_headers(101, END_HEADERS) + _frame(DATA, END_STREAM, 101, message))
    assert b"grpc-status\x010" in first[1].data or b"\x00\x00\x00\x00\x02ok" in first[1].data
    first[0].connection_lost(None)
    assert shared.used == 8 << 20
    second[0].connection_lost(None)
    assert shared.used == 0


@pytest.fixture()
def grpc_server():
    """A GrpcServer on its own loop thread; ``start(**options)`` returns its port."""
    import asyncio
    import threading

    from recserve.serving.transport.h2grpc import GrpcServer

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    servers = []

    def start(**options) -> int:
        server = GrpcServer(lambda path: Method(unary=lambda call, raw: call.reply(b"ok")), 1 << 20, **options)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        asyncio.run_coroutine_threadsafe(server.start(sock), loop).result(30)
        servers.append((server, sock))
        return sock.getsockname()[1]

    yield start
    for server, sock in servers:
        asyncio.run_coroutine_threadsafe(server.stop(grace=0.5), loop).result(30)
        sock.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := sock.recv(1 << 16):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def _ping_on_a_new_connection(port: int) -> bytes:
    """What a new connection's preface and PING are answered with: the PING's echo, or a refusal."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _frame(PING, 0, 0, b"12345678"))
        data = b""
        while b"12345678" not in data and b"too_many_connections" not in data and (more := sock.recv(1 << 16)):
            data += more
    return data


def test_a_connection_past_the_cap_closes_the_one_idle_longest_and_is_served(grpc_server):
    """Connections with no call open cannot hold every slot: the one that read nothing for longest gets GOAWAY and
    is closed, and the new one is served."""
    port = grpc_server(max_connections=2)
    kept = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    for sock in kept:
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
        sock.recv(1 << 16)  # our SETTINGS: the connection is served
        time.sleep(0.05)
    data = _ping_on_a_new_connection(port)
    assert b"12345678" in data and b"too_many_connections" not in data
    closed = _read_until_closed(kept[0])
    assert b"\x07\x00\x00\x00\x00\x00" in closed  # a GOAWAY frame header (type 7, flags 0, stream 0)
    for sock in kept:
        sock.close()


def test_connections_past_the_cap_get_goaway_while_every_one_has_a_call_open(grpc_server):
    port = grpc_server(max_connections=2)
    kept = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    for sock in kept:
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _headers(1, END_HEADERS))  # a call whose message never comes
        sock.recv(1 << 16)  # our SETTINGS: the connection is served
    time.sleep(0.2)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as third:
        assert ENHANCE_YOUR_CALM.to_bytes(4, "big") + b"too_many_connections" in _read_until_closed(third)
    kept.pop().close()
    deadline = time.monotonic() + 30
    while True:  # the server sees the close, then takes a new connection again
        with socket.create_connection(("127.0.0.1", port), timeout=30) as again:
            again.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _frame(PING, 0, 0, b"12345678"))
            data = again.recv(1 << 16)
            while len(data) < 9 + 18 + 9 + 8 and b"too_many_connections" not in data and (more := again.recv(1 << 16)):
                data += more
        if b"too_many_connections" not in data or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert b"too_many_connections" not in data and b"12345678" in data
    kept[0].close()


def test_past_the_cap_a_connection_whose_open_call_stalled_makes_room(grpc_server, monkeypatch):
    """A call opened and left there (its message never sent) does not hold its connection's place at the cap:
    once the connection read nothing for ``STALLED_S``, it is closed for a new one."""
    from recserve.serving.transport import h2grpc

    monkeypatch.setattr(h2grpc, "STALLED_S", 0.3)
    port = grpc_server(max_connections=2)
    kept = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(2)]
    for sock in kept:
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _headers(1, END_HEADERS))
        sock.recv(1 << 16)
    time.sleep(0.6)
    data = _ping_on_a_new_connection(port)
    assert b"12345678" in data and b"too_many_connections" not in data
    assert b"\x07\x00\x00\x00\x00\x00" in _read_until_closed(kept[0])  # GOAWAY, then the close
    for sock in kept:
        sock.close()


def test_a_connection_silent_before_its_preface_is_closed_and_an_idle_one_gets_goaway(grpc_server):
    port = grpc_server(preface_timeout_s=0.3, idle_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as silent:
        began = time.monotonic()
        _read_until_closed(silent)  # closed by the server (a socket timeout here would fail the test)
        assert time.monotonic() - began < 25
    with socket.create_connection(("127.0.0.1", port), timeout=30) as idle:
        idle.sendall(PREFACE + _frame(SETTINGS, 0, 0))
        received = b""
        while b"\x07\x00\x00\x00\x00\x00" not in received:  # a GOAWAY frame header (type 7, flags 0, stream 0)
            received += idle.recv(1 << 16)


def test_a_read_of_many_frames_is_handled_a_slice_per_turn_of_the_loop_with_reading_paused():
    """Frames past ``FRAMES_PER_TURN`` in one read wait for the next turn (other connections run between), with
    the connection's reading paused meanwhile; none is lost and order is kept."""
    import asyncio

    from recserve.serving.transport.h2grpc import FRAMES_PER_TURN

    class Transport(_Transport):
        def __init__(self) -> None:
            super().__init__()
            self.paused, self.pauses = False, 0

        def pause_reading(self) -> None:
            self.paused, self.pauses = True, self.pauses + 1

        def resume_reading(self) -> None:
            self.paused = False

        def is_closing(self) -> bool:
            return self.closed

    async def run() -> tuple[Transport, list[bool]]:
        echo = Method(unary=lambda call, raw: call.reply(b"ok"))
        conn, transport = GrpcConnection(lambda path: echo, 1 << 20), Transport()
        conn.connection_made(transport)
        updates = _frame(8, 0, 0, (1).to_bytes(4, "big")) * (3 * FRAMES_PER_TURN)  # WINDOW_UPDATE: no budget
        call = _headers(1, END_HEADERS) + _frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x02hi")
        transport.data = b""
        conn.data_received(PREFACE + _frame(SETTINGS, 0, 0) + updates + call)
        seen = [transport.paused and b"ok" not in transport.data]
        for _ in range(10):
            await asyncio.sleep(0)
        seen.append(not transport.paused and b"\x00\x00\x00\x00\x02ok" in transport.data)
        return transport, seen

    transport, seen = asyncio.run(run())
    assert seen == [True, True] and transport.pauses == 1


def test_a_server_wide_reset_budget_is_not_renewed_by_reconnecting():
    from recserve.serving.transport.h2limits import Bucket

    clock = Clock()
    shared = Bucket(Rate(5, 1), clock())
    limits = FloodLimits(resets=Rate(3, 1))
    first, second = FloodGuard(limits, clock, shared), FloodGuard(limits, clock, shared)
    assert [first.reset() for _ in range(4)] == [None, None, None, "too_many_resets"]  # its own budget
    assert [second.reset() for _ in range(3)] == [None, None, "too_many_resets"]  # the server's: 5 in all


def test_a_connection_that_held_a_large_incomplete_request_asks_for_free_memory_back_when_it_closes(grpc_server):
    import threading

    released = threading.Event()
    # this raw client ignores flow control: the connection's window is widened so that its budget is reached
    port = grpc_server(on_release=released.set, limits=FloodLimits(connection_window=64 << 20))
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:  # small requests: no release
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _partial_request(1, 1 << 20, 1 << 16))
        sock.recv(1 << 16)
    time.sleep(0.5)
    assert not released.is_set()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0)
                     + b"".join(_partial_request(2 * i + 1, 1 << 20, (1 << 20) - 16) for i in range(17)))
        received = b""
        while b"grpc-status" not in received:  # the 17th is refused: all was read (closing earlier could reset)
            received += sock.recv(1 << 16)
    assert released.wait(30)


def test_free_memory_goes_back_to_the_system_on_glibc():
    import platform

    from recserve.zoo.allocator import release_free_memory

    assert release_free_memory() in (True, False)  # never raises, whatever the C library
    if platform.libc_ver()[0] == "glibc":
        import ctypes

        assert ctypes.CDLL(None).malloc_trim  # the call it makes exists here


@pytest.mark.integration
def test_a_worker_returns_what_a_clients_incomplete_requests_took_once_the_client_leaves():
    from tests.support.nodes import node_config

    config = node_config("hercules-rmc1", scale=1e-4, workers=1)
    with started(config) as server:
        def worker_rss_mb() -> float:
            state = http.get_json(server.ports.http, f"/control/models/{config.models[0].name}")
            return sum(w["rss_mb"] for stage in state["stages"].values() for w in stage["worker_detail"])

        before = worker_rss_mb()
        with socket.create_connection(("127.0.0.1", server.ports.grpc), timeout=30) as sock:
            sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
            for i in range(100):  # 100 MiB of requests never completed, within the connection's budget
                sock.sendall(_partial_request(2 * i + 1, 32 << 20, 1 << 20,
                                              "/inference.GRPCInferenceService/ModelInfer"))
            deadline = time.monotonic() + 60
            while worker_rss_mb() < before + 64 and time.monotonic() < deadline:
                time.sleep(0.2)
            held = worker_rss_mb()
        assert held >= before + 64  # the worker did hold them
        deadline = time.monotonic() + 60
        while worker_rss_mb() > before + 32 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert worker_rss_mb() <= before + 32, (before, held, worker_rss_mb())


def test_a_client_that_opens_many_streams_at_once_may_announce_each_ones_window():
    """grpc-core sends a WINDOW_UPDATE on every stream it opens, before any answer: 1,500 open calls, each
    announcing its window, stay within the budget (its burst is 1,000)."""
    conn, transport, abused = _open()
    _feed(conn, b"".join(_headers(2 * i + 1, END_HEADERS) + _update(2 * i + 1, 1 << 20) for i in range(1500)))
    assert transport.goaway_codes() == [] and not transport.closed and abused == []


def _rst_codes(data: bytes) -> list[tuple[int, int]]:
    """(stream, error code) of each RST_STREAM in ``data``."""
    out = []
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        if data[3] == RST_STREAM:
            out.append((int.from_bytes(data[5:9], "big"), int.from_bytes(data[9:13], "big")))
        data = data[9 + length:]
    return out


def test_calls_open_over_a_servers_connections_are_bounded_and_a_client_with_few_is_served():
    """HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS bounds one connection's calls; calls that never finish their request
    over many connections meet the server's budget: past it, a connection holding more than ``FEW_STREAMS`` has new
    calls refused with RST_STREAM REFUSED_STREAM (retried by gRPC clients: none of it ran), counted, while a
    client with a few calls is still served.  The budget is given back as calls end and connections close."""
    from recserve.serving.transport.h2frames import FEW_STREAMS
    from recserve.serving.transport.h2limits import StreamBudget

    echo = Method(unary=lambda call, raw: call.reply(b"ok"))
    budget, abused = StreamBudget(10), []

    def connect() -> tuple[GrpcConnection, _Transport]:
        conn, transport = GrpcConnection(lambda path: echo, 1 << 20, on_abuse=abused.append, streams=budget), \
            _Transport()
        conn.connection_made(transport)
        conn.data_received(PREFACE + _frame(SETTINGS, 0, 0))
        transport.data = b""
        return conn, transport

    message = b"\x00\x00\x00\x00\x02hi"
    (many, many_out), (few, few_out), (good, good_out) = connect(), connect(), connect()
    many.data_received(b"".join(_headers(2 * i + 1, END_HEADERS) for i in range(12)))  # requests never finished
    assert many.open_streams == 10 and _rst_codes(many_out.data) == [(21, 0x7), (23, 0x7)]  # REFUSED_STREAM
    few.data_received(b"".join(_headers(2 * i + 1, END_HEADERS) for i in range(FEW_STREAMS + 1)))
    assert few.open_streams == FEW_STREAMS and _rst_codes(few_out.data) == [(2 * FEW_STREAMS + 1, 0x7)]
    assert budget.open == 10 + FEW_STREAMS and abused == ["too_many_streams"] * 3 and not many_out.closed
    good.data_received(_headers(1, END_HEADERS) + _frame(DATA, END_STREAM, 1, message))  # past the budget: served
    assert b"\x00\x00\x00\x00\x02ok" in good_out.data and budget.open == 10 + FEW_STREAMS
    many.data_received(_frame(DATA, END_STREAM, 1, message))  # one finishes: its place is given back
    assert b"\x00\x00\x00\x00\x02ok" in many_out.data and budget.open == 9 + FEW_STREAMS
    for conn in (many, few, good):
        conn.connection_lost(None)
    assert budget.open == 0


def test_a_unary_request_not_arrived_whole_in_time_is_answered_deadline_exceeded_and_reset():
    """A unary call whose request stops arriving ends with grpc-status DEADLINE_EXCEEDED (an HTTP request's 408)
    and RST_STREAM NO_ERROR once ``request_timeout_s`` has passed since its HEADERS; a streaming call, whose client
    sends messages when it likes, and a unary call still within its time are left open."""
    echo = Method(unary=lambda call, raw: call.reply(b"ok"))
    chat = Method(stream=lambda call: None)
    abused: list[str] = []
    conn = GrpcConnection(lambda path: chat if path == "/t.S/Chat" else echo, 1 << 20, on_abuse=abused.append)
    transport = _Transport()
    conn.connection_made(transport)
    conn.data_received(PREFACE + _frame(SETTINGS, 0, 0) + _partial_request(1, 1000, 100)
                       + _headers(3, END_HEADERS, "/t.S/Chat"))
    transport.data = b""
    conn.h2.expire_requests(time.monotonic() - 30, 30)  # opened since: still within its time
    assert transport.data == b"" and conn.open_streams == 2
    conn.h2.expire_requests(time.monotonic() + 1, 30)  # opened before: late
    statuses = _trailer_statuses(transport.data)
    assert len(statuses) == 1 and b"grpc-status\x014" in statuses[0] and b"received" in statuses[0]
    assert _rst_codes(transport.data) == [(1, 0)] and conn.open_streams == 1 and abused == ["slow_client"]


def test_a_server_ends_late_unary_requests_on_its_sweep_and_serves_on(grpc_server):
    port = grpc_server(request_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
        slow.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _partial_request(1, 1000, 100))
        received = b""
        while b"grpc-status" not in received:
            received += slow.recv(1 << 16)  # a socket timeout (30 s) here fails the test
        assert b"grpc-status\x014" in received
        slow.sendall(_headers(3, END_HEADERS) + _frame(DATA, END_STREAM, 3, b"\x00\x00\x00\x00\x02hi"))
        while b"\x00\x00\x00\x00\x02ok" not in received:
            received += slow.recv(1 << 16)
