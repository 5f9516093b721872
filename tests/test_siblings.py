"""Idle siblings (serving/worker/siblings.py): a busy worker's query computed by an idle worker of the same model.

The plane-level tests run two planes in one event loop (each with its own model path, so the scores say which one
computed a query); the node test sends one gRPC channel's calls to a two-worker node.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException

from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.serving.wire import codec
from recserve.serving.wire.codec import triton_inputs
from recserve.serving.wire.errors import InferError
from recserve.serving.worker import links
from recserve.serving.worker.http_connection import Request
from recserve.serving.worker.limits import PlaneLimits
from recserve.serving.worker.plane import WorkerPlane
from recserve.serving.worker.siblings import SiblingClient, SiblingServer, socket_path
from recserve.zoo import sample_batch
from tests.support import grpc_client, http
from tests.support.nodes import node_config, started
from tests.support.oip_inputs import grpc_inputs
from tests.support.proc_net import holder, tcp_inodes
from tests.support.wait import until

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

QUERY = (np.zeros((4, 3), np.float32), np.zeros(0, np.int64), np.zeros((0, 4), np.int32))


class ConstantPath:
    """A model path whose scores are ``value``: which plane computed a query shows in its answer."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.checks = 0  # queries whose values this path checked (``check_owed``)
        self.computed: list[tuple] = []  # copies of the queries this path computed

    def check_owed(self, query: tuple) -> None:
        self.checks += 1
        if np.isnan(query[0]).any():
            raise InferError("invalid", "dense holds NaN", "dense")

    def compute(self, queries):
        self.computed.extend(tuple(a.copy() for a in q) for q in queries)
        return [np.full((q[0].shape[0], 1), self.value, np.float32) for q in queries]

    def decode(self, body, header_length):
        return {}, QUERY, 4

    def encode(self, request, scores):
        return scores.tobytes(), {"Content-Type": "application/octet-stream"}


class AnswerSink:
    """An HTTP connection as the plane sees it: what it writes is kept."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes, close: bool = False) -> None:
        self.written.append(data)

    def answered(self, keep_alive: bool) -> None:
        pass


def plane_at(loop, value: float, slot: int, loads: np.ndarray, records: list) -> WorkerPlane:
    plane = WorkerPlane(loop, "m", ConstantPath(value), records.append, lambda *handoff: None,
                        PlaneLimits(queue_limit=8, deadline_s=10.0, fuse_items=0, compute_thread_ms=-1),
                        sub_batch=0, loads=loads, slot=slot)
    plane.reporter.record = records.append  # unbatched: the test reads them at once
    return plane


async def answered(answers: list, n: int = 3) -> None:
    """Until ``n`` answers are in (60 s at most, a busy host's pace), then half a second more for what follows
    them (records, freed slots)."""
    deadline = time.monotonic() + 60
    while len(answers) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.5)


def enqueue_three(plane: WorkerPlane, answers: list) -> None:
    """The 1st query is computed at once, the 2nd queues behind the pass's next turn, the 3rd finds the worker
    busy (one queued): only the 3rd may go to a sibling.  Then the loop runs until the answers are in."""
    async def send() -> None:
        for _ in range(3):
            plane.enqueue(QUERY, 4, time.perf_counter(), 10.0,
                          lambda scores, error: answers.append(float(scores[0, 0]) if error is None else str(error)))
        await answered(answers)

    plane.loop.run_until_complete(send())


def run(loop, coro_or_seconds):
    return loop.run_until_complete(asyncio.sleep(coro_or_seconds) if isinstance(coro_or_seconds, float)
                                   else coro_or_seconds)


@dataclass
class Pair:
    """Plane ``a`` (slot 0, scores 0.0) whose sibling is plane ``b`` (slot 1, scores 1.0) behind its socket."""

    loop: asyncio.AbstractEventLoop
    tmp: str
    loads: np.ndarray
    a: WorkerPlane
    b: WorkerPlane
    server: SiblingServer
    a_records: list
    b_records: list


@contextlib.contextmanager
def two_planes():
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            loads = np.full(4, -1, np.int32)
            a_records, b_records = [], []
            server = SiblingServer()
            run(loop, server.serve(socket_path(tmp, 1)))
            b = server.plane = plane_at(loop, 1.0, 1, loads, b_records)
            a = plane_at(loop, 0.0, 0, loads, a_records)
            a.siblings = SiblingClient("m", tmp, 0, loads, 8)
            a.siblings.record = a_records.append
            yield Pair(loop, tmp, loads, a, b, server, a_records, b_records)
            a.siblings.close()
            server.close()
            run(loop, 0.05)
        finally:
            loop.close()


def test_a_busy_worker_sends_a_query_to_an_idle_sibling_which_computes_and_records_it():
    with two_planes() as p:
        answers: list = []
        assert p.loads[:2].tolist() == [0, 0]
        enqueue_three(p.a, answers)
        assert sorted(answers) == [0.0, 0.0, 1.0]  # two computed here, the third by the sibling
        assert p.a_records.count(("sibling", "forwarded")) == 1 and ("sibling", "returned") not in p.a_records
        assert sum(r[0] == "done" for r in p.a_records) == 2  # the forwarded one is the sibling's to record
        assert sum(r[0] == "done" for r in p.b_records) == 1 and p.b.admission.service.n == 1


def enqueue_owed(plane: WorkerPlane, queries: list[tuple], answers: list) -> None:
    """``enqueue_three`` with the given queries, each with its values' checks owed (a planned gRPC call's)."""
    async def send() -> None:
        for q in queries:
            plane.enqueue(q, 4, time.perf_counter(), 10.0,
                          lambda scores, error: answers.append(float(scores[0, 0]) if error is None else str(error)),
                          owed=True)
        await answered(answers, len(queries))

    plane.loop.run_until_complete(send())


def test_a_forwarded_querys_values_are_checked_by_the_sibling_not_by_the_worker_fronting_it():
    """The worker that reads a gRPC channel checks the values of the queries it computes; those it forwards are
    checked by the sibling, whose refusal is the client's answer and counted there."""
    nan = (np.full((4, 3), np.nan, np.float32), QUERY[1], QUERY[2])
    with two_planes() as p:
        answers: list = []
        enqueue_owed(p.a, [QUERY, QUERY, nan], answers)
        assert answers[:2] == [0.0, 0.0] and "dense holds NaN" in answers[2]
        assert p.a.model.checks == 2 and p.b.model.checks == 1
        assert ("refused", "invalid") in p.b_records and ("refused", "invalid") not in p.a_records
        assert ("sibling", "returned") not in p.a_records and p.b.admission.service.n == 0

        answers.clear()  # a valid query forwarded is checked once, at the sibling, and computed there
        enqueue_owed(p.a, [QUERY, QUERY, QUERY], answers)
        assert sorted(answers) == [0.0, 0.0, 1.0] and p.a.model.checks == 4 and p.b.model.checks == 2


def test_a_query_given_back_unchecked_is_checked_where_it_arrived():
    """A sibling that refuses a query at admission (draining) gives it back; its owed checks then run here."""
    nan = (np.full((4, 3), np.nan, np.float32), QUERY[1], QUERY[2])
    with two_planes() as p:
        p.b.admission.draining = True
        p.b.model.check_owed = lambda query: None  # the sibling passes it, then its admission refuses it
        answers: list = []
        enqueue_owed(p.a, [QUERY, QUERY, nan], answers)
        assert answers[:2] == [0.0, 0.0] and "dense holds NaN" in answers[2]
        assert p.a_records.count(("sibling", "returned")) == 1 and ("refused", "invalid") in p.a_records
        assert p.a.model.checks == 3


def test_http_queries_are_not_forwarded_their_connections_spread_instead():
    """The same three queries as HTTP requests: the busy worker keeps the third (HTTP/1.1 connections spread over
    the workers by themselves; forwarding their queries too shed some at high load)."""
    with two_planes() as p:
        sink = AnswerSink()

        async def send() -> None:
            for _ in range(3):
                p.a.admit(sink, Request("POST", "/v2/models/m/infer", "HTTP/1.1", {}, bytearray(), time.perf_counter()))
            await answered(sink.written)

        p.loop.run_until_complete(send())
        scores = [np.frombuffer(w.split(b"\r\n\r\n", 1)[1], np.float32)[0] for w in sink.written]
        assert scores == [0.0, 0.0, 0.0]  # all three computed here
        assert ("sibling", "forwarded") not in p.a_records


def test_a_query_the_sibling_cannot_take_comes_back_and_is_answered_here():
    """No sibling behind the socket (it died), or a sibling that refuses (draining): the query is queued where it
    arrived, as if it had never left; the refusal is not counted by the sibling."""
    with two_planes() as p:
        p.loads[1] = 5  # the live sibling looks busy; slot 2 looks idle, but nothing serves its socket
        p.loads[2] = 0
        answers: list = []
        enqueue_three(p.a, answers)
        assert answers == [0.0, 0.0, 0.0]
        assert p.a_records.count(("sibling", "forwarded")) == 1 and p.a_records.count(("sibling", "returned")) == 1
        assert sum(r[0] == "done" for r in p.a_records) == 3

        p.loads[1:3] = [0, -1]
        p.b.admission.draining = True  # refuses every query at admission; still publishes load 0
        p.a_records.clear()
        answers.clear()
        enqueue_three(p.a, answers)
        assert answers == [0.0, 0.0, 0.0]
        assert p.a_records.count(("sibling", "returned")) == 1 and p.b_records == []


def test_a_retiring_worker_is_sent_nothing():
    loop = asyncio.new_event_loop()
    try:
        loads = np.full(2, -1, np.int32)
        b = plane_at(loop, 1.0, 1, loads, [])
        assert loads[1] == 0
        b.retire()
        assert loads[1] > 1000
        a = plane_at(loop, 0.0, 0, loads, [])
        a.siblings = SiblingClient("m", "/nonexistent", 0, loads, 8)
        assert a.siblings.less_loaded(1 << 20) is None
    finally:
        loop.close()


@pytest.mark.parametrize("forward", [True, False])
def test_one_grpc_channel_uses_every_worker_of_the_model(forward):
    """tritonclient's one channel with calls in flight: with ``forward_to_idle`` both workers compute (each
    call answered with the model's scores, counted once in /stats); without it only the accepting one does."""
    name, scale, size, calls = "hercules-rmc1", 1e-3, 64, 160
    model = build_worker_model(quick_config(name, scale=scale).models[0])
    batch = sample_batch(model, size, rng=3)
    expected = model(batch).detach().numpy()
    config = node_config(name, scale=scale, workers=2, forward_to_idle=forward)
    with started(config) as server:
        directory = server.core.models[name].sibling_dir
        assert bool(directory) == forward and (not forward or os.path.isdir(directory))
        client = grpc_client.triton(server.ports.grpc)
        answers: queue.Queue = queue.Queue()
        window = threading.Semaphore(6)

        def done(result, error):
            answers.put(error if error is not None else result.as_numpy("scores"))
            window.release()

        for _ in range(calls):
            window.acquire()
            client.async_infer(name, grpc_inputs(batch), done)
        got = [answers.get(timeout=30) for _ in range(calls)]
        # the same calls with an id past its table: refused alike, whichever worker computes (and checks) each
        bad = dict(batch.as_arrays())
        bad["sparse_values"] = bad["sparse_values"].copy()
        bad["sparse_values"][-1] = 1 << 40
        bad_inputs = triton_inputs(tgrpc, bad)
        for _ in range(calls // 4):
            window.acquire()
            client.async_infer(name, bad_inputs, done)
        refused = [answers.get(timeout=30) for _ in range(calls // 4)]
        client.close()
        assert all(isinstance(g, np.ndarray) and np.allclose(g, expected, atol=1e-5) for g in got), got[:3]
        assert all(isinstance(r, InferenceServerException) and r.status() == "StatusCode.INVALID_ARGUMENT"
                   and "index out of range" in r.message() for r in refused), refused[:3]
        def read_stats() -> dict:
            return http.get_json(server.ports.http, f"/v2/models/{name}/stats")["model_stats"][0]["inference_stats"]

        stats = until(read_stats, lambda s: s["success"]["count"] >= calls)  # workers report every 25 ms
        state = ControlClient("127.0.0.1", server.ports.http).get_model(name)
    assert stats["success"]["count"] == calls  # a forwarded query is counted once, by the worker computing it
    if forward:  # every forwarded call was read by its sibling where it landed: none copied
        assert state["siblings"]["forwarded"] > 0 and state["siblings"]["copied"] == 0
    else:
        assert state["siblings"] == {"forwarded": 0, "returned": 0, "copied": 0}
    assert not directory or not os.path.exists(directory)  # removed at stop


def test_one_grpc_channel_kept_busy_is_served_by_both_workers_alike():
    """One channel with 32 small calls in flight, more than one worker keeps up with: the queue at the worker that
    owns the channel is never empty, so a rule that forwards only to an idle sibling left that worker most queries
    (its queued ones fuse into one pass while the sibling takes one at a time); joining the shorter queue gives each
    worker a fair share of the queries computed (per worker ``queries_done``; a quarter each at least, the owner
    paying the channel's protocol for all of them)."""
    name, scale, size, calls = "hercules-rmc1", 1e-3, 16, 800
    model = build_worker_model(quick_config(name, scale=scale).models[0])
    batch = sample_batch(model, size, rng=11)
    cores = sorted(os.sched_getaffinity(0))
    # both workers on every core: the share measures the policy, not which pinned core a busy host's others load
    config = node_config(name, scale=scale, workers=2, cores=[cores, cores])
    with started(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        client = grpc_client.triton(server.ports.grpc)
        client.infer(name, grpc_inputs(batch))
        before = until(lambda: [w["queries_done"] for w in control.get_model(name)["stages"]["model"]["worker_detail"]],
                       lambda done: sum(done) >= 1)  # the first query reported
        errors: queue.Queue = queue.Queue()
        window = threading.Semaphore(32)

        def done(result, error):
            errors.put(error)
            window.release()

        for _ in range(calls):
            window.acquire()
            client.async_infer(name, grpc_inputs(batch), done)
        failed = [e for e in (errors.get(timeout=60) for _ in range(calls)) if e is not None]
        client.close()

        def done_since(state: dict) -> list[int]:
            detail = state["stages"]["model"]["worker_detail"]
            return [w["queries_done"] - b for w, b in zip(detail, before, strict=True)]

        state = until(lambda: control.get_model(name), lambda st: sum(done_since(st)) >= calls - len(failed))
    served = done_since(state)
    assert failed == [] and sum(served) == calls
    assert min(served) >= calls / 4, served
    assert state["siblings"]["forwarded"] >= min(served)


def grpc_connection_owner(port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` holds an established connection on local TCP ``port`` (the channel's server side)."""
    return holder(tcp_inodes(lambda local, _remote, state: local == port and state == "01"), pids)  # ESTABLISHED


def test_a_sibling_killed_with_forwarded_queries_loses_none_of_them():
    """SIGKILL the worker that computes the channel's forwarded queries while it holds some: each comes back to the
    worker that owns the channel and is answered there; no call fails, and the killed worker is replaced."""
    import signal

    name, scale, size, calls = "hercules-rmc1", 1e-3, 512, 120
    model = build_worker_model(quick_config(name, scale=scale).models[0])
    batch = sample_batch(model, size, rng=5)
    config = node_config(name, scale=scale, workers=2, fuse_items=0)
    with started(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        pids = [w["pid"] for w in control.get_model(name)["stages"]["model"]["worker_detail"]]
        client = grpc_client.triton(server.ports.grpc)
        client.infer(name, grpc_inputs(batch))
        origin = grpc_connection_owner(server.ports.grpc, pids)
        assert origin in pids
        sibling = next(p for p in pids if p != origin)
        answers: queue.Queue = queue.Queue()
        window = threading.Semaphore(6)

        def done(result, error):
            answers.put(error)
            window.release()

        for i in range(calls):
            window.acquire()
            client.async_infer(name, grpc_inputs(batch), done)
            if i == calls // 3:
                os.kill(sibling, signal.SIGKILL)
        errors = [e for e in (answers.get(timeout=60) for _ in range(calls)) if e is not None]
        client.close()
        state = until(lambda: control.get_model(name), lambda st: st["siblings"]["forwarded"] > 0)
    assert errors == []
    assert state["siblings"]["forwarded"] > 0 and state["worker_restarts"] >= 1


def test_resizing_under_one_grpc_channel_fails_no_query():
    """Workers resized 2 -> 3 -> 1 -> 2 while one channel keeps calls in flight (some forwarded): every call is
    answered with scores, whichever worker retires (the channel's own included: its GOAWAY moves the client)."""
    name, scale, size = "hercules-rmc1", 1e-3, 128
    model = build_worker_model(quick_config(name, scale=scale).models[0])
    batch = sample_batch(model, size, rng=7)
    expected = model(batch).detach().numpy()
    config = node_config(name, scale=scale, workers=2)
    with started(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        client = grpc_client.triton(server.ports.grpc)
        answers: queue.Queue = queue.Queue()
        window = threading.Semaphore(4)
        stop = threading.Event()
        sent = [0]

        def done(result, error):
            answers.put(error if error is not None else result.as_numpy("scores"))
            window.release()

        def send():
            while not stop.is_set():
                window.acquire()
                sent[0] += 1
                client.async_infer(name, grpc_inputs(batch), done)

        sender = threading.Thread(target=send)
        sender.start()
        try:
            for n in (3, 1, 2):
                time.sleep(0.5)
                control.set_workers(name, n)
        finally:
            stop.set()
            sender.join(timeout=30)
        got = [answers.get(timeout=60) for _ in range(sent[0])]
        client.close()
        state = until(lambda: control.get_model(name), lambda st: st["siblings"]["forwarded"] > 0)
    failed = [str(g) for g in got if not isinstance(g, np.ndarray)]
    assert failed == [] and all(np.allclose(g, expected, atol=1e-5) for g in got), failed
    assert len(got) > 20 and state["siblings"]["forwarded"] > 0


def test_a_query_given_back_during_a_drain_is_still_computed():
    """The worker admitted the query, forwarded it, then began draining (SIGTERM) before the sibling, draining too,
    gave it back: admitted queries finish in a drain, so it is computed here, not refused."""
    with two_planes() as p:
        answers: list = []

        async def send_then_drain() -> None:
            for _ in range(3):
                p.a.enqueue(QUERY, 4, time.perf_counter(), 10.0,
                            lambda s, e: answers.append(float(s[0, 0]) if e is None else str(e)))
            p.a.admission.draining = p.b.admission.draining = True
            await answered(answers)

        run(p.loop, send_then_drain())
        assert answers == [0.0, 0.0, 0.0] and p.a_records.count(("sibling", "returned")) == 1


def test_a_pass_that_fails_at_the_sibling_is_answered_with_its_error_not_computed_again():
    """A corrupt SSD block (``data_loss``) in the sibling's pass: the client gets that error, once, and the query is
    not recomputed where it arrived (only a refusal or a lost sibling sends it back)."""
    class Corrupt(ConstantPath):
        def compute(self, queries):
            raise InferError("data_loss", "table 3: block at 4096 fails its CRC")

    with two_planes() as p:
        p.b.model = Corrupt(1.0)
        answers: list = []
        enqueue_three(p.a, answers)
        assert answers[:2] == [0.0, 0.0] and len(answers) == 3
        assert "fails its CRC" in answers[2] and ("sibling", "returned") not in p.a_records
        assert sum(r[0] == "failed" and r[1] == "data_loss" for r in p.b_records) == 1
        assert sum(r[0] == "done" for r in p.a_records) == 2


# ------------------------------------------------------------------------------ the landing arena: no copy to forward


def test_a_landing_slot_is_aligned_where_asked_and_free_again_with_its_last_view():
    arena = links.Arena(4096, "test-landing")
    try:
        buffer = arena.buffer(1000, 13)
        assert len(buffer) == 1000 and (np.frombuffer(buffer, np.uint8).ctypes.data + 13) % 64 == 0
        view = np.frombuffer(buffer, np.uint8)[100:200]
        assert arena.buffer(4000, 0) is None  # no room beside the taken slot: the caller uses private memory
        del buffer
        assert len(arena.taken) == 1  # a view of the slot is still alive
        inside = (view[:40].view(np.float32), view[40:48].view(np.int64))
        places = arena.locate(inside)
        assert places is not None and places[1] - places[0] == 40
        assert arena.locate((np.zeros(10, np.float32),)) is None  # not in the arena
        assert arena.locate((view[::2],)) is None  # not contiguous
        assert arena.locate((view[:0], np.zeros(0, np.int64))) == (0, 0)  # empty arrays lie anywhere
        del view, inside, places
        assert arena.taken == {}
    finally:
        arena.close()


def test_a_landing_slot_stays_taken_while_a_planned_requests_arrays_live():
    """A repeated gRPC request is read by its plan (``codec.parse_raw``: ``np.ndarray(buffer=...)``), whose arrays
    must keep their slot taken: freed early, the next large request landed over a query still queued or being
    forwarded, and the model read another request's ids and lengths (an id far out of range, lengths not summing
    to the ids, or wrong scores)."""
    from tritonclient.grpc import service_pb2

    tensors = {"dense": np.ones((2, 4), np.float32), "sparse_values": np.arange(6, dtype=np.int64),
               "sparse_lengths": np.full((3, 2), 1, np.int32)}
    request = service_pb2.ModelInferRequest(model_name="m")
    for name, array in tensors.items():
        request.inputs.add(name=name, datatype=codec.DATATYPES[array.dtype], shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    body = request.SerializeToString()
    arena = links.Arena(1 << 16, "test-landing")
    try:
        received = arena.buffer(len(body), 0)
        received[:] = body
        fields, contents, _ = codec.split_raw_input_contents(received, cut_id=True)
        plan = codec.grpc_raw_plan(service_pb2.ModelInferRequest.FromString(bytes(fields)), len(contents))
        arrays = codec.parse_raw(plan, contents, checked=False)
        del received, fields, contents
        assert len(arena.taken) == 1  # the arrays still read the slot
        again = arena.buffer(len(body), 0)
        again[:] = b"\xff" * len(body)  # the next request lands elsewhere
        for name, array in tensors.items():
            np.testing.assert_array_equal(arrays[name], array)
        del arrays, again
        assert arena.taken == {}
    finally:
        arena.close()


def test_a_placed_frame_naming_bytes_outside_the_landing_arena_ends_the_link():
    landing = np.zeros(256, np.uint8)
    dense, values, lengths = links.placed_arrays(landing, (0, 64, 128), 2, 3, 1, 4)
    assert dense.shape == (2, 3) and values.shape == (4,) and lengths.shape == (1, 2)
    with pytest.raises(ConnectionError):
        links.placed_arrays(landing, (0, 64, 250), 2, 3, 1, 4)
    with pytest.raises(ConnectionError):
        links.placed_arrays(None, (0, 64, 128), 2, 3, 1, 4)  # the sender's landing arena is not mapped here


def landed_query(siblings: SiblingClient, fill: float) -> tuple:
    """A query as a large gRPC request's arrays are: views of one buffer from ``SiblingClient.buffer``, the dense
    tensor after a 5-byte head, the others unaligned after it."""
    arrays = (np.full((4, 3), fill, np.float32), np.arange(6, dtype=np.int64), np.array([[1, 2, 0, 3]], np.int32))
    raw = np.frombuffer(siblings.buffer(5 + sum(a.nbytes for a in arrays), 5), np.uint8)
    at, views = 5, []
    for a in arrays:
        view = raw[at : at + a.nbytes].view(a.dtype).reshape(a.shape)
        view[...] = a
        views.append(view)
        at += a.nbytes
    return tuple(views)


def enqueue_landed(plane: WorkerPlane, answers: list) -> None:
    """``enqueue_three`` with queries received as large gRPC requests are (``landed_query``, dense 10.0, 11.0, 12.0):
    the third goes to the sibling."""
    async def send() -> None:
        for k in range(3):
            plane.enqueue(landed_query(plane.siblings, 10.0 + k), 4, time.perf_counter(), 10.0,
                          lambda scores, error: answers.append(float(scores[0, 0]) if error is None else str(error)))
        await answered(answers)

    plane.loop.run_until_complete(send())


def test_a_query_received_in_the_landing_arena_goes_to_the_sibling_by_offsets_and_its_slot_frees_after_the_reply(
        monkeypatch):
    copies: list = []
    put = links.Arena.put
    monkeypatch.setattr(links.Arena, "put", lambda arena, arrays: copies.append(1) or put(arena, arrays))
    with two_planes() as p:
        answers: list = []
        enqueue_landed(p.a, answers)
        assert sorted(answers) == [0.0, 0.0, 1.0]  # the third went to the sibling
        link = p.a.siblings.by_slot[1]
        assert link.landing_mapped and copies == [] and not link.placed and not link.slots
        assert ("sibling", "copied") not in p.a_records
        (dense, values, lengths), = p.b.model.computed  # what the sibling read, in place: the query's values
        np.testing.assert_array_equal(dense, np.full((4, 3), 12.0, np.float32))
        np.testing.assert_array_equal(values, np.arange(6))
        np.testing.assert_array_equal(lengths, [[1, 2, 0, 3]])
        gc.collect()
        assert p.a.siblings.landing.taken == {}  # every query answered: every slot free


def test_a_query_that_found_the_landing_arena_full_is_copied_to_the_sibling_as_before(monkeypatch):
    copies: list = []
    put = links.Arena.put
    monkeypatch.setattr(links.Arena, "put", lambda arena, arrays: copies.append(1) or put(arena, arrays))
    with two_planes() as p:
        p.a.siblings.landing = links.Arena(4096, "test-landing")  # room for no query (each takes ~250 bytes + a slot)
        held = [p.a.siblings.landing.buffer(4000, 0)]  # the arena is full: queries land in private memory
        answers: list = []
        enqueue_landed(p.a, answers)
        assert sorted(answers) == [0.0, 0.0, 1.0] and copies == [1]  # the forwarded one went by the staging arena
        assert p.a_records.count(("sibling", "copied")) == 1  # counted: the node shows a landing arena too small
        np.testing.assert_array_equal(p.b.model.computed[0][0], np.full((4, 3), 12.0, np.float32))
        del held
