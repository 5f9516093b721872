"""Accelerator workers (issue #16): large queries go from the CPU workers to a fusing accelerator worker.

On a CPU-only host the accelerator is ``device: cpu`` (DeepRecSys' offload of large queries to a many-threaded
worker), which runs every path but the device copies; CUDA tests skip without a GPU.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import torch

from recserve.errors import SpecError
from recserve.serving import config_from_dict
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.accel import AcceleratorClient, AcceleratorServer
from recserve.serving.worker.links import (
    ACK,
    ERROR_CODES,
    HELLO,
    INLINE,
    OK,
    REPLY,
    Arena,
    read_reply,
    read_request,
    reply_frame,
    request_frame,
)
from recserve.zoo import sample_batch
from tests.support import grpc_client, http, models
from tests.support.accel import (
    ACCEL,
    ACCEL_CORE,
    MIN_ITEMS,
    MODEL,
    accel_state,
    accel_state_after,
    infer_many,
)
from tests.support.nodes import started
from tests.support.oip_inputs import grpc_inputs
from tests.support.scrape import metric_value, scrape
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def node():
    with started(config_from_dict({"models": [{**MODEL, "accelerator": ACCEL}]})) as server:
        yield server, server.ports


@pytest.fixture(scope="module")
def model(node):
    server, _ = node
    return models.reference(server.config.models[0])


# ---------------------------------------------------------------------------------------- config


def test_accelerator_config_is_validated_naming_the_field():
    def load(accel: dict, **node: object) -> None:
        config_from_dict({"models": [{**MODEL, "accelerator": accel}], **node})

    for bad, field in (({"device": "tpu"}, "device"), ({"device": "cpu", "workers": 0}, "workers"),
                       ({"device": "cpu", "min_items": True}, "min_items"),
                       ({"device": "cpu", "fuse_delay_us": -1}, "fuse_delay_us"),
                       ({"device": "cpu", "staging_mb": -1}, "staging_mb"),
                       ({"device": "cpu", "cores": [100_000]}, "cores"),
                       ({"device": "cpu", "workers": 2, "cores": [[0]]}, "cores")):
        with pytest.raises(SpecError, match=field):
            load(bad)
    with pytest.raises(SpecError, match="cannot serve tiering"):  # SSD tiers are read on the host
        config_from_dict({"models": [{**MODEL, "options": {"tier": {"dir": "/x"}}, "accelerator": {"device": "cuda"}}]})
    with pytest.raises(SpecError, match="front_end: workers"):
        load({"device": "cpu"}, front_end="server")
    with pytest.raises(SpecError, match="mode: model"):
        config_from_dict({"models": [{**MODEL, "mode": "pipeline", "accelerator": {"device": "cpu"}}]})


def test_a_repository_model_takes_the_same_accelerator_section(tmp_path):
    from recserve.serving.node.repository import Repository

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text("workers: 1\naccelerator: {device: cpu, min_items: 64}\n")
    accelerator = Repository(tmp_path).settings("m").serving["accelerator"]
    assert (accelerator.device, accelerator.min_items, accelerator.workers) == ("cpu", 64, 1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_a_cuda_device_on_a_host_without_cuda_is_refused_with_one_clear_error():
    for device in ("cuda", "cuda:1"):
        with pytest.raises(SpecError) as info:
            config_from_dict({"models": [{**MODEL, "accelerator": {"device": device}}]})
        message = str(info.value)
        assert "accelerator: device" in message and "CUDA is not available on this host" in message, message


# ---------------------------------------------------------------------------------------- frames and fusion


async def _connect(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw link to an accelerator worker, as a CPU worker opens one without a staging arena."""
    reader, writer = await asyncio.open_unix_connection(path)
    writer.write(HELLO.pack(os.getpid(), 0, 0, 0, 0))
    assert ACK.unpack(await reader.readexactly(ACK.size)) == (0,)
    return reader, writer


def _feed(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_frames_carry_the_arrays_exactly():
    async def run() -> None:
        dense = np.arange(6, dtype=np.float32).reshape(3, 2)
        values = np.array([5, 1, 2, 7], np.int64)
        lengths = np.array([[1, 0, 2], [0, 1, 0]], np.int64)  # int64 on the wire too: sent as int32
        before = time.perf_counter()
        request_id, arrays, deadline = await read_request(_feed(b"".join(request_frame(9, (dense, values, lengths),
                                                                                       before + 2.0))))
        assert request_id == 9 and deadline == pytest.approx(before + 2.0, abs=1e-6)  # absolute: same clock
        for got, want in zip(arrays, (dense, values, lengths), strict=True):
            np.testing.assert_array_equal(got, want)
        assert arrays[2].dtype == np.int32
        rid, scores, error = await read_reply(_feed(reply_frame(4, None, InferError("deadline", "too late"))))
        assert (rid, scores, error.code, str(error)) == (4, None, "deadline", "too late")
        rid, scores, error = await read_reply(_feed(reply_frame(5, dense)))
        assert rid == 5 and error is None and np.array_equal(scores, dense)

    asyncio.run(run())


def test_the_accelerator_server_fuses_up_to_fuse_items_within_the_delay(tmp_path):
    """Queries arriving within the delay share one pass, never more than ``fuse_items`` items; each gets its
    own scores back; a query alone waits only the delay."""
    passes: list[list[int]] = []

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        passes.append([q[0].shape[0] for q in queries])
        return [q[0][:, :1] * 2 for q in queries]

    async def run() -> None:
        server = AcceleratorServer(compute, fuse_items=10, fuse_delay_us=200_000, report=lambda *a: None)
        listening = await server.serve(str(tmp_path / "a.sock"))
        reader, writer = await _connect(str(tmp_path / "a.sock"))
        sizes = [4, 4, 4, 1]
        for i, b in enumerate(sizes):
            dense = np.full((b, 2), i, np.float32)
            writer.writelines(request_frame(i, (dense, np.zeros(0, np.int64), np.zeros((1, b), np.int32)),
                                            time.perf_counter() + 30.0))
        got = {}
        for _ in sizes:
            rid, scores, _ = await read_reply(reader)
            got[rid] = scores
        start = time.perf_counter()
        one = (np.ones((1, 2), np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32))
        writer.writelines(request_frame(9, one, time.perf_counter() + 30.0))
        await read_reply(reader)
        alone_s = time.perf_counter() - start
        writer.writelines(request_frame(10, one, time.perf_counter()))  # its deadline passes while it waits for company
        late = await read_reply(reader)
        writer.close()
        listening.close()
        for i, b in enumerate(sizes):
            np.testing.assert_array_equal(got[i], np.full((b, 1), 2 * i, np.float32))
        assert alone_s >= 0.2  # it waited for company up to the delay (a lower bound: not a speed assertion)
        assert late[0] == 10 and late[1] is None and late[2].code == "deadline"

    asyncio.run(run())
    assert passes[0] == [4, 4] and sum(len(p) for p in passes[:-1]) == 4, passes  # 12 items > 10: two passes
    assert all(sum(p) <= 10 for p in passes)


@pytest.mark.parametrize("pass_thread", [True, False])
def test_queries_are_read_during_a_pass_on_the_pass_thread(tmp_path, pass_thread):
    """With ``pass_thread`` the loop reads and queues queries while a pass runs (they make the next pass, fused),
    and the heartbeat's pass age counts the pass in flight; inline, nothing is read until the pass ends."""
    passes: list[int] = []
    release = threading.Event()

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        passes.append(len(queries))
        if len(passes) == 1:
            release.wait(10)
        return [q[0][:, :1] for q in queries]

    async def run() -> tuple[int, float]:
        server = AcceleratorServer(compute, fuse_items=100, fuse_delay_us=0, report=lambda *a: None,
                                   pass_thread=pass_thread)
        listening = await server.serve(str(tmp_path / "t.sock"))
        reader, writer = await _connect(str(tmp_path / "t.sock"))
        one = (np.ones((1, 2), np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32))
        writer.writelines(request_frame(0, one, time.perf_counter() + 30.0))
        while not passes:
            await asyncio.sleep(0.01)
        for rid in (1, 2, 3):
            writer.writelines(request_frame(rid, one, time.perf_counter() + 30.0))
        await asyncio.sleep(0.3)
        queued, age = len(server.queue), server.pass_age()
        release.set()
        for _ in range(4):
            await read_reply(reader)
        writer.close()
        listening.close()
        return queued, age

    if pass_thread:
        queued, age = asyncio.run(run())
        assert queued == 3 and age >= 0.2  # read while the first pass ran
        assert passes == [1, 3]  # ... and fused into the next one
    else:
        threading.Timer(0.5, release.set).start()  # the inline pass blocks the loop that would set it
        queued, age = asyncio.run(run())
        assert queued == 0 and age == 0.0


def test_the_accelerator_server_sheds_what_its_fit_says_cannot_finish_in_time(tmp_path):
    """After one observed 0.4 s pass, queries queued behind another that would end past their deadline get 503 at
    once instead of waiting (no backlog of abandoned work); the one in front is computed."""

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        time.sleep(0.4)
        return [q[0][:, :1] for q in queries]

    def query(i: int) -> tuple[np.ndarray, ...]:
        return np.full((1, 2), i, np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32)

    async def run() -> list:
        server = AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None)
        listening = await server.serve(str(tmp_path / "a.sock"))
        reader, writer = await _connect(str(tmp_path / "a.sock"))
        writer.writelines(request_frame(0, query(0), time.perf_counter() + 30.0))
        await read_reply(reader)  # the fit has seen one pass
        # two passes ahead (>= 0.8 s) miss it whatever the host; the first is taken long before it on a busy one too
        deadline = time.perf_counter() + 0.75
        writer.writelines([piece for i in (1, 2, 3) for piece in request_frame(i, query(i), deadline)])
        replies = [await read_reply(reader) for _ in range(3)]
        writer.close()
        listening.close()
        return replies

    replies = {rid: (scores, error) for rid, scores, error in asyncio.run(run())}
    assert replies[1][1] is None and replies[1][0][0, 0] == 1
    assert [replies[i][1].code for i in (2, 3)] == ["unavailable", "unavailable"]


def test_a_query_that_waited_unread_in_the_socket_keeps_its_deadline(tmp_path):
    """The deadline is absolute: a frame that sat in the socket while the worker computed another pass is
    answered 504 when read after its deadline, not computed with a fresh budget (that was wasted device time
    under overload: goodput fell from 291 to 127 QPS at 2x overload)."""
    computed: list[float] = []
    computing, late = threading.Event(), threading.Event()

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        computed.extend(float(q[0][0, 0]) for q in queries)
        computing.set()
        late.wait(30)  # blocks the loop until the next frame's deadline passed: it waits unread
        return [q[0][:, :1] for q in queries]

    def query(i: int) -> tuple[np.ndarray, ...]:
        return np.full((1, 2), i, np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32)

    def client(path: str, replies: list) -> None:  # its own thread: it sends while the server's loop computes
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(path)
            sock.sendall(HELLO.pack(os.getpid(), 0, 0, 0, 0))
            sock.recv(ACK.size)
            sock.sendall(b"".join(request_frame(0, query(0), time.perf_counter() + 30.0)))
            assert computing.wait(30)  # the pass of query 0 has started
            sock.sendall(b"".join(request_frame(1, query(1), time.perf_counter() + 0.1)))
            time.sleep(0.2)  # past query 1's deadline
            late.set()
            stream = sock.makefile("rb")
            for _ in range(2):
                rid, status, _, columns = REPLY.unpack(stream.read(REPLY.size))
                stream.read(columns * (4 if status == 0 else 1))
                replies.append((rid, status))

    async def run() -> list:
        server = AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None)
        listening = await server.serve(str(tmp_path / "a.sock"))
        replies: list = []
        thread = threading.Thread(target=client, args=(str(tmp_path / "a.sock"), replies))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        listening.close()
        return replies

    replies = dict(asyncio.run(run()))
    assert replies == {0: OK, 1: ERROR_CODES.index("deadline") + 1}
    assert computed == [0.0]


def test_a_full_staging_arena_refuses_at_once_instead_of_queueing_without_bound(tmp_path):
    """While the accelerator worker is busy, a query that would fit the arena but finds it full is 503 at once
    (the accelerator is a whole arena behind); a query larger than the whole arena still goes inline."""

    answered_second = threading.Event()

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        answered_second.wait(30)  # busy (holding the first query's arena) until the second was answered
        return [q[0][:, :1] for q in queries]

    def query(items: int, width: int) -> tuple[np.ndarray, ...]:
        return np.ones((items, width), np.float32), np.zeros(0, np.int64), np.zeros((1, items), np.int32)

    server_loop = asyncio.new_event_loop()  # a loop of its own: it computes while the client's loop goes on
    server = AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None)
    listening = server_loop.run_until_complete(server.serve(str(tmp_path / "a.sock")))
    thread = threading.Thread(target=server_loop.run_forever, daemon=True)
    thread.start()

    async def run() -> dict:
        client = AcceleratorClient("m", [str(tmp_path / "a.sock")], 1, limit=8, staging_bytes=4096)
        loop = asyncio.get_running_loop()
        answers = {}
        for name, items, width in (("first", 150, 4), ("second", 150, 4), ("huge", 20, 300)):  # 3, 3, 24 kB
            answers[name] = loop.create_future()
            client.submit(query(items, width), time.perf_counter() + 30,
                          lambda s, e, f=answers[name]: f.set_result((s, e)))
            await asyncio.sleep(0.05)
        answers["second"].add_done_callback(lambda _: answered_second.set())
        return {name: await f for name, f in answers.items()}

    try:
        results = asyncio.run(run())
    finally:
        server_loop.call_soon_threadsafe(listening.close)
        server_loop.call_soon_threadsafe(server_loop.stop)
        thread.join(timeout=5)
    assert results["first"][1] is None and results["huge"][1] is None
    assert results["second"][1].code == "unavailable" and "arena is full" in str(results["second"][1])


def test_links_open_before_the_first_query_and_idle_accelerator_workers_take_turns(tmp_path):
    """A CPU worker opens (and offers its arena on) every accelerator link as soon as it learns the sockets, so
    the arenas are pinned before load arrives; with no query outstanding, successive queries alternate between
    the accelerator workers instead of all going to the first."""
    adopted: dict[str, int] = {"a": 0, "b": 0}
    computed: dict[str, int] = {"a": 0, "b": 0}

    def worker(name: str) -> AcceleratorServer:
        def compute(queries: list[tuple]) -> list[np.ndarray]:
            computed[name] += len(queries)
            return [q[0][:, :1] for q in queries]

        def adopt(arena: np.ndarray) -> None:
            adopted[name] += 1

        return AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None, adopt=adopt)

    async def run() -> None:
        servers = [await worker(n).serve(str(tmp_path / f"{n}.sock")) for n in ("a", "b")]
        client = AcceleratorClient("m", [str(tmp_path / "a.sock"), str(tmp_path / "b.sock")], 1, limit=8,
                                   staging_bytes=4096)
        deadline = time.monotonic() + 60
        while adopted != {"a": 1, "b": 1} and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert adopted == {"a": 1, "b": 1} and computed == {"a": 0, "b": 0}  # opened, no query yet
        one = (np.ones((1, 2), np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32))
        for _ in range(4):
            answer = asyncio.get_running_loop().create_future()
            client.submit(one, time.perf_counter() + 30, lambda s, e, f=answer: f.set_result((s, e)))
            assert (await answer)[1] is None
        for server in servers:
            server.close()

    asyncio.run(run())
    assert computed == {"a": 2, "b": 2}


def test_pinning_a_new_links_arena_does_not_hold_the_other_links_queries(tmp_path):
    """Mapping and pinning an arena runs off the accelerator worker's loop: a query on an open link is answered
    while another CPU worker's link is still being pinned (0.5 s here)."""

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        return [q[0][:, :1] for q in queries]

    async def run() -> float:
        server = AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None,
                                   adopt=lambda arena: time.sleep(0.5))
        listening = await server.serve(str(tmp_path / "p.sock"))
        reader, writer = await _connect(str(tmp_path / "p.sock"))  # open, no arena
        arena = Arena(4096)
        _, slow = await asyncio.open_unix_connection(str(tmp_path / "p.sock"))
        start = time.perf_counter()
        slow.write(HELLO.pack(os.getpid(), arena.fd, arena.size, 0, 0))  # this hello's pinning takes 0.5 s
        await asyncio.sleep(0.05)
        one = (np.ones((1, 2), np.float32), np.zeros(0, np.int64), np.zeros((1, 1), np.int32))
        writer.writelines(request_frame(1, one, time.perf_counter() + 30.0))
        await read_reply(reader)
        answered = time.perf_counter() - start
        writer.close()
        slow.close()
        listening.close()
        return answered

    assert asyncio.run(run()) < 0.4


def test_a_worker_refuses_queries_for_an_accelerator_that_is_behind():
    """The congestion signal is the wait of the oldest query outstanding at the least-loaded accelerator worker:
    over half of a new query's time left means 503 (before decoding, from the JSON header), else it is sent."""
    client = AcceleratorClient("m", ["/nonexistent/a.sock", "/nonexistent/b.sock"], 1, limit=8)
    now = time.perf_counter()
    assert client.behind(now + 0.1) is None  # nothing outstanding
    busy, idle = client.links
    busy.outstanding[1] = busy.outstanding[2] = lambda *a: None
    busy.sent_at.update({1: now - 5.0, 2: now - 0.01})
    assert client.behind(now + 0.1) is None  # the least-loaded link (idle) has waited for nothing
    idle.outstanding[3] = lambda *a: None
    idle.sent_at[3] = now - 0.08
    refusal = client.behind(now + 0.1)  # 80 ms waited > half of 100 ms left
    assert refusal is not None and refusal.code == "unavailable" and "behind" in str(refusal)
    assert client.behind(now + 1.0) is None  # a query with a second left can wait behind it
    del idle.outstanding[3]  # answered: its entry is pruned lazily
    assert client.behind(now + 0.1) is None and idle.sent_at == {}


def test_the_staging_arena_hands_out_aligned_slots_and_reuses_released_ones():
    arena = Arena(1024)
    try:
        a = (np.ones(10, np.float32),)  # 40 bytes
        first, second = arena.put(a), arena.put(a)
        assert (first, second) == (0, 64)  # each slot starts on a 64-byte boundary
        np.testing.assert_array_equal(arena.view[:40].view(np.float32), a[0])
        assert arena.put((np.ones(300, np.float32),)) is None  # 1200 bytes: never fits, the caller goes inline
        big = arena.put((np.ones(220, np.float32),))  # 880 bytes fit after the two slots
        assert big == 128
        assert arena.put(a) is None  # full
        arena.release(first)
        assert arena.put(a) == 0  # the released slot is taken again
        arena.release(None)  # an inline query had no slot: nothing happens
    finally:
        arena.close()


def test_an_arena_no_longer_referenced_closes_its_memfd():
    """A link dropped when the accelerator pool shrinks is never closed explicitly: its memfd goes with it."""
    arena = Arena(4096)
    fd = arena.fd
    os.fstat(fd)
    del arena
    with pytest.raises(OSError):
        os.fstat(fd)


def test_queries_cross_through_the_staging_arena_and_fall_back_to_the_socket_when_it_is_full(tmp_path):
    """A CPU worker's link offers its arena; the accelerator worker maps it (``adopt`` sees it) and reads the
    queries in place; one larger than the arena crosses the socket; every slot is free once answered."""
    adopted: list[np.ndarray] = []
    in_arena: list[bool] = []

    def compute(queries: list[tuple]) -> list[np.ndarray]:
        start = adopted[0].ctypes.data
        in_arena.extend(start <= q[0].ctypes.data < start + adopted[0].shape[0] for q in queries)
        return [q[0][:, :1] + q[1][: q[0].shape[0], None] for q in queries]

    def query(items: int, fill: int) -> tuple[np.ndarray, ...]:
        return (np.full((items, 4), fill, np.float32), np.arange(items, dtype=np.int64),
                np.ones((1, items), np.int32))

    async def run() -> tuple[list, AcceleratorClient]:
        server = AcceleratorServer(compute, fuse_items=1, fuse_delay_us=0, report=lambda *a: None,
                                   adopt=adopted.append)
        listening = await server.serve(str(tmp_path / "a.sock"))
        client = AcceleratorClient("m", [str(tmp_path / "a.sock")], 1, limit=8, staging_bytes=4096)
        loop = asyncio.get_running_loop()
        results = []
        for items, fill in ((8, 1), (16, 2), (200, 3)):  # 200 items = 5.6 kB > the 4 kB arena: inline
            answer = loop.create_future()
            client.submit(query(items, fill), time.perf_counter() + 30, lambda s, e, f=answer: f.set_result((s, e)))
            results.append(await answer)
        listening.close()
        return results, client

    results, client = asyncio.run(run())
    for (scores, error), (items, fill) in zip(results, ((8, 1), (16, 2), (200, 3)), strict=True):
        assert error is None
        np.testing.assert_array_equal(scores[:, 0], fill + np.arange(items, dtype=np.float32))
    assert [a.shape[0] for a in adopted] == [4096]
    assert in_arena == [True, True, False]
    link = client.links[0]
    assert link.arena is not None and link.arena.taken == {} and link.slots == {}
    assert link.stage(99, query(200, 0)) == INLINE


# ---------------------------------------------------------------------------------------- a node


def test_queries_are_routed_by_size_and_scored_like_the_in_process_model(node, model):
    _, ports = node
    before = accel_state(ports.http)
    small, large = sample_batch(model, 4, rng=1), sample_batch(model, 64, rng=2)
    (s1, small_scores), (s2, large_scores) = infer_many(ports.http, [small, large])
    assert s1 == s2 == 200
    np.testing.assert_allclose(small_scores, models.scores(model, small), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(large_scores, models.scores(model, large), rtol=1e-5, atol=1e-6)
    after = accel_state_after(ports.http, before, 2)
    assert after["queries"]["cpu"] - before["queries"]["cpu"] == 1
    assert after["queries"]["accelerator"] - before["queries"]["accelerator"] == 1
    assert after["items"]["accelerator"] - before["items"]["accelerator"] == 64
    assert after["passes"] > before["passes"]
    assert after["device"] == "cpu" and after["min_items"] == MIN_ITEMS and after["workers"] == 1


def test_grpc_queries_take_the_same_routes(node, model):

    _, ports = node
    before = accel_state(ports.http)
    client = grpc_client.triton(ports.grpc)
    try:
        for size in (2, 32):
            batch = sample_batch(model, size, rng=size)
            scores = client.infer("ncf", grpc_inputs(batch), client_timeout=30).as_numpy("scores")
            np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)
    finally:
        client.close()
    after = accel_state_after(ports.http, before, 2)
    assert after["queries"]["cpu"] - before["queries"]["cpu"] == 1
    assert after["queries"]["accelerator"] - before["queries"]["accelerator"] == 1


def test_queries_in_shared_memory_regions_reach_the_accelerator_and_score_like_the_in_process_model(node, model):
    """A query whose inputs sit in a registered system shared-memory region (how rmc2-sized queries are offered) is
    read in place by the CPU worker, staged for the accelerator worker like any other, and scored exactly."""
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget, SharedMemoryHttpTarget
    from recserve.specs import get_model
    from recserve.wire import OUTPUT_SCORES

    _, ports = node
    pool = RequestPool(get_model(MODEL["model"]), MODEL["scale"], (4, 40, 200, 8))  # two small, two offloaded
    url = f"http://127.0.0.1:{ports.http}"
    inline, shared = HttpTarget(url, "ncf"), SharedMemoryHttpTarget(url, "ncf")
    before = accel_state(ports.http)

    async def run() -> None:
        await inline.prepare(pool)
        await shared.prepare(pool)
        try:
            for i in range(len(pool)):
                want = (await inline.infer_outputs(i))[OUTPUT_SCORES]
                np.testing.assert_allclose((await shared.infer_outputs(i))[OUTPUT_SCORES], want, rtol=1e-6, atol=1e-7)
        finally:
            await inline.close()
            await shared.close()

    asyncio.run(run())
    offloaded = sum(size >= MIN_ITEMS for size in pool.sizes)
    assert offloaded > 0
    state = accel_state_after(ports.http, before, 2 * len(pool))
    assert state["queries"]["accelerator"] - before["queries"]["accelerator"] == 2 * offloaded


def test_concurrent_large_queries_are_fused_into_fewer_passes(node, model):
    _, ports = node
    before = accel_state(ports.http)
    batches = [sample_batch(model, MIN_ITEMS + i, rng=10 + i) for i in range(6)]
    answers = infer_many(ports.http, batches)
    for (status, scores), batch in zip(answers, batches, strict=True):
        assert status == 200
        np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)
    after = accel_state_after(ports.http, before, len(batches))
    queries = after["queries"]["accelerator"] - before["queries"]["accelerator"]
    passes = after["passes"] - before["passes"]
    assert queries == len(batches) and 1 <= passes < queries, (queries, passes)
    assert after["pass_items"] - before["pass_items"] <= passes * ACCEL["fuse_items"]


def test_the_threshold_moves_queries_at_run_time_and_is_validated(node, model):
    _, ports = node
    path = "/control/models/ncf/accelerator"
    status, body = http.post_json(ports.http, path, {"min_items": 0}).status_and_json()
    assert status == 400 and "min_items" in body["error"]
    status, body = http.post_json(ports.http, path, {"min_items": 257, "x": 1}).status_and_json()
    assert status == 400 and "x" in body["error"]
    batch = sample_batch(model, 32, rng=5)
    try:
        # max_batch_size + 1: none offloaded
        status, state = http.post_json(ports.http, path, {"min_items": 257}).status_and_json()
        assert status == 200 and state["accelerator"]["min_items"] == 257  # answered once the workers apply it
        before = accel_state(ports.http)
        [(code, scores)] = infer_many(ports.http, [batch])
        assert code == 200
        np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)
        after = accel_state_after(ports.http, before, 1)
        assert after["queries"]["cpu"] - before["queries"]["cpu"] == 1
        assert after["queries"]["accelerator"] == before["queries"]["accelerator"]
    finally:
        http.post_json(ports.http, path, {"min_items": MIN_ITEMS})
    samples, ncf = scrape(ports.http), {"model": "ncf", "version": "1"}
    assert metric_value(samples, "recserve_routed_queries_total", **ncf, kind="accelerator") is not None
    assert metric_value(samples, "recserve_accelerator_passes_total", **ncf) is not None
    assert metric_value(samples, "recserve_workers", **ncf, stage="accel") == 1


def test_accelerator_workers_are_resized_through_the_control_api(node, model):
    """The accelerator pool grows and shrinks at run time; the CPU workers get the new socket list and every
    large query is answered with its scores throughout."""
    _, ports = node
    status, state = http.post_json(ports.http, "/control/models/ncf/workers",
                                    {"workers": 2, "stage": "accel"}).status_and_json()
    try:
        assert status == 200 and state["accelerator"]["workers"] == 2, state
        assert len({w["pid"] for w in state["stages"]["accel"]["worker_detail"]}) == 2
        batches = [sample_batch(model, 200, rng=20 + i) for i in range(6)]
        answers = infer_many(ports.http, batches)
        assert [status for status, _ in answers] == [200] * len(batches)
        for (_, scores), batch in zip(answers, batches, strict=True):
            np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)
    finally:
        status, state = http.post_json(ports.http, "/control/models/ncf/workers",
                                       {"workers": 1, "stage": "accel"}).status_and_json()
    assert status == 200 and state["accelerator"]["workers"] == 1
    [(status, scores)] = infer_many(ports.http, [sample_batch(model, 40, rng=8)])
    assert status == 200


def test_accelerator_workers_run_on_their_own_cores(node):
    """``accelerator.cores`` pins them (a GPU node and a CPU node on one host split its cores)."""
    _, ports = node
    [detail] = http.get_json(ports.http, "/control/models/ncf")["stages"]["accel"]["worker_detail"]
    assert os.sched_getaffinity(detail["pid"]) == {ACCEL_CORE}


def test_a_dead_accelerator_worker_is_an_explicit_503_and_is_replaced(node, model):
    _, ports = node
    pid = http.get_json(ports.http, "/control/models/ncf")["stages"]["accel"]["worker_detail"][0]["pid"]
    batch = sample_batch(model, 40, rng=7)
    os.kill(pid, signal.SIGSTOP)  # the query waits at the stopped worker, then the worker dies holding it
    killer = threading.Timer(0.5, lambda: os.kill(pid, signal.SIGKILL))
    killer.start()
    try:
        [(status, _)] = infer_many(ports.http, [batch])
    finally:
        killer.join()
    assert status == 503
    assert replaced(ports.http, pid)
    [(status, scores)] = infer_many(ports.http, [batch])  # the replacement serves the same socket
    assert status == 200
    np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)


def replaced(port: int, pid: int) -> bool:
    """Whether the accelerator worker ``pid`` has a ready replacement (waited for, up to 60 s)."""
    detail = until(lambda: http.get_json(port, "/control/models/ncf")["stages"]["accel"]["worker_detail"],
                   lambda d: bool(d) and d[0]["ready"] and d[0]["pid"] != pid)
    return bool(detail) and detail[0]["ready"] and detail[0]["pid"] != pid


def test_a_hung_accelerator_worker_is_replaced_and_its_queries_get_503_before_their_deadline():
    """A stopped accelerator worker sends no heartbeat: after ``hang_timeout_s`` the watchdog kills it, the CPU
    worker's link closes and the query it held is 503 at once (not 504 at its 30 s deadline); a new one serves."""
    config = config_from_dict({"models": [{**MODEL, "hang_timeout_s": 1.0, "accelerator": ACCEL}]})
    with started(config) as server:
        port = server.ports.http
        model = models.reference(server.config.models[0])
        pid = http.get_json(port, "/control/models/ncf")["stages"]["accel"]["worker_detail"][0]["pid"]
        batch = sample_batch(model, 40, rng=9)
        os.kill(pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            [(status, _)] = infer_many(port, [batch])
            waited = time.monotonic() - start
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed by the watchdog, as intended
        assert status == 503 and waited < 10.0
        assert replaced(port, pid)
        [(status, scores)] = infer_many(port, [batch])
        assert status == 200
        np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-5, atol=1e-6)


@CUDA
def test_cuda_accelerator_scores_equal_cpu_scores():
    config = config_from_dict({"models": [{**MODEL, "accelerator": {**ACCEL, "device": "cuda"}}]})
    with started(config) as server:
        model = models.reference(server.config.models[0])
        batch = sample_batch(model, 128, rng=3)
        [(status, scores)] = infer_many(server.ports.http, [batch])
        assert status == 200
        np.testing.assert_allclose(scores, models.scores(model, batch), rtol=1e-4, atol=1e-5)
