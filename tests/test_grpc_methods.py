"""The worker's gRPC fast path (issue #14): a request whose bytes but for its raw contents were seen before is read
without protobuf (``grpc_worker.Plan``, ``codec.parse_raw``) and answered with a response encoded from a cached
head.  Every answer and every refusal must equal what the whole decode gives."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from recserve.serving.wire import codec
from recserve.serving.wire.codec import PLAN_KEY_BYTES, PLANS, protobuf_field
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.grpc_messages import infer_response
from recserve.serving.worker.grpc_methods import STREAM_INFER_KEY, Plan, WorkerMethods
from tests.support.oip_inputs import small_query as query


def request_of(arrays: dict[str, np.ndarray], request_id: str = "", model: str = "m", version: str = "",
               outputs: bool = True) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=codec.DATATYPES[array.dtype], shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    if outputs:
        request.outputs.add(name="scores")
    return request


def split(request: service_pb2.ModelInferRequest) -> tuple[bytes, list[memoryview]]:
    parts = codec.split_raw_input_contents(memoryview(request.SerializeToString()))
    assert parts is not None
    return parts


def test_a_plan_reads_the_same_arrays_as_the_whole_decode():
    for lengths_dtype in (np.int32, np.int64):
        request = request_of(query(lengths_dtype=lengths_dtype))
        rest, raw = split(request)
        plan = codec.grpc_raw_plan(service_pb2.ModelInferRequest.FromString(rest), len(raw))
        assert plan is not None
        for seed in range(3):  # other values, the same shapes: the same plan
            rest2, raw2 = split(request_of(query(lengths_dtype=lengths_dtype, seed=seed)))
            assert rest2 == rest
            fast = codec.parse_raw(plan, raw2)
            whole = codec.parse_grpc_infer(service_pb2.ModelInferRequest.FromString(rest2), raw2)
            assert list(fast) == list(whole)
            assert all(fast[n].dtype == whole[n].dtype and np.array_equal(fast[n], whole[n]) for n in whole)
            assert all(np.shares_memory(fast[n], np.frombuffer(raw2[k], np.uint8)) for k, n in enumerate(fast))


def test_contents_that_do_not_fit_the_plan_are_left_to_the_whole_decode():
    rest, raw = split(request_of(query()))
    plan = codec.grpc_raw_plan(service_pb2.ModelInferRequest.FromString(rest), len(raw))
    assert codec.parse_raw(plan, raw[:2]) is None
    assert codec.parse_raw(plan, [raw[0], raw[1][:-8], raw[2]]) is None
    bad = query()
    bad["dense"][0, 0] = np.nan  # the values are checked on every request
    with pytest.raises(InferError) as info:
        codec.parse_raw(plan, split(request_of(bad))[1])
    assert info.value.field == "dense"


def test_no_plan_for_typed_contents_or_shared_memory():
    request = request_of(query())
    del request.raw_input_contents[:]
    assert codec.grpc_raw_plan(request, 0) is None
    request = request_of(query())
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    assert codec.grpc_raw_plan(request, 3) is None
    request = request_of(query())
    request.outputs[0].parameters["shared_memory_region"].string_param = "r"
    assert codec.grpc_raw_plan(request, 3) is None


def test_the_split_keeps_fields_that_follow_the_raw_contents():
    request = request_of(query(batch=40, ids=200))  # contents over 127 bytes: two-byte lengths
    message = request.SerializeToString()
    tail = service_pb2.ModelInferRequest(id="after")  # field 3 again, after field 7: protobuf keeps the last
    rest, raw = codec.split_raw_input_contents(memoryview(message + tail.SerializeToString()))
    assert [bytes(r) for r in raw] == list(request.raw_input_contents)
    parsed = service_pb2.ModelInferRequest.FromString(rest)
    assert parsed.id == "after" and len(parsed.inputs) == 3 and not parsed.raw_input_contents


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (200, 1), (1,)])
@pytest.mark.parametrize("request_id", ["", "q7", "é" * 70])
def test_a_planned_response_is_the_bytes_protobuf_makes(shape, request_id):
    rest, raw = split(request_of(query(), request_id=request_id))
    request = service_pb2.ModelInferRequest.FromString(rest)
    plan = Plan(request, codec.grpc_raw_plan(request, len(raw)))
    for seed, answered_id in enumerate([request_id, request_id, "other", ""]):  # later ones from the cached head
        scores = np.random.default_rng(seed).random(shape).astype(np.float32)
        expected = infer_response("model", answered_id, scores, "3").SerializeToString()
        assert plan.response("model", "3", scores, answered_id) == expected  # a plan serves requests of any id
        streamed = service_pb2.ModelStreamInferResponse(infer_response=service_pb2.ModelInferResponse.FromString(
            expected)).SerializeToString()
        assert protobuf_field(STREAM_INFER_KEY, expected) == streamed
    with pytest.raises(InferError):
        plan.response("model", "3", np.array([[np.inf]], np.float32), request_id)


class FakePlane:
    """What ``WorkerMethods._query`` asks of a worker's plane and model path; a query is answered at once with one
    score per item.  As the real path, a plan whose shapes passed once leaves its values' checks owed, and the plane
    runs them (as a sibling would, had it been sent the query)."""

    model_name, version = "m", "1"
    siblings = None  # a lone worker: large requests land in private memory

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.model = self
        self.shaped: set = set()
        self.owed_checks = 0

    def answers(self, version: str) -> bool:
        return version in ("", "1")

    def serves_queries(self) -> bool:
        return True

    def validate(self, arrays: dict[str, np.ndarray], plan=None) -> tuple[tuple, int]:
        query = (arrays["dense"], arrays["sparse_values"], arrays["sparse_lengths"])
        self.check_owed(query)
        if plan is not None:
            self.shaped.add(plan)
        return query, arrays["dense"].shape[0]

    def owed(self, arrays: dict[str, np.ndarray], plan) -> tuple[tuple, int] | None:
        query = (arrays["dense"], arrays["sparse_values"], arrays["sparse_lengths"])
        return (query, arrays["dense"].shape[0]) if plan in self.shaped else None

    def check_owed(self, query: tuple) -> None:
        codec.check_inputs(dict(zip(("dense", "sparse_values", "sparse_lengths"), query, strict=True)))
        if int(query[1].max()) >= 10:
            raise InferError("invalid", "sparse_values: id out of range", "sparse_values")

    def refused(self, code: str) -> None:
        self.refusals.append(code)

    def enqueue(self, arrays: tuple, items: int, arrived: float, timeout_s: float | None, reply,
                owed: bool = False) -> None:
        if owed:
            self.owed_checks += 1
            try:
                self.check_owed(arrays)
            except InferError as exc:
                self.refused(exc.code)
                reply(None, exc)
                return
        reply(arrays[0].sum(axis=1, keepdims=True), None)


def ask(methods: WorkerMethods, request: service_pb2.ModelInferRequest) -> tuple[bool, bytes | None, str | None]:
    got: list = []
    taken = methods._query(memoryview(request.SerializeToString()), None, lambda r, e, _id: got.append((r, e)))
    if not got:
        return taken, None, None
    response, error = got[0]
    return taken, response, None if error is None else error.public_message()


def test_the_worker_answers_planned_requests_as_it_answers_new_ones():
    plane = FakePlane()
    methods = WorkerMethods(plane, upstream=_NoChannel())
    for seed in range(4):
        arrays = query(batch=2, seed=seed)
        taken, response, error = ask(methods, request_of(arrays, request_id="r"))
        assert taken and error is None
        expected = infer_response("m", "r", arrays["dense"].sum(axis=1, keepdims=True), "1").SerializeToString()
        assert response == expected
    assert len(methods._plans) == 1
    assert plane.owed_checks == 3  # the first validated whole; the planned ones' values checked by the plane
    # refusals through a plan name the same field with the same message as the whole decode
    short = request_of(query(batch=2))
    short.raw_input_contents[1] = short.raw_input_contents[1][:-8]
    fresh = WorkerMethods(FakePlane(), upstream=_NoChannel())
    assert ask(methods, short)[2] == ask(fresh, short)[2] and "sparse_values" in ask(methods, short)[2]
    out_of_range = query(batch=2)
    out_of_range["sparse_values"][0] = 99
    assert "id out of range" in ask(methods, request_of(out_of_range, request_id="r"))[2]
    # a planned request's lengths are checked (codec.check_inputs) where its values are, by the plane
    overrun = query(batch=2)
    overrun["sparse_lengths"][0, 0] += 1
    assert ask(methods, request_of(overrun, request_id="r"))[2] == ask(fresh, request_of(overrun, request_id="r"))[2]
    # another model's or version's request is not this worker's, planned or not
    assert ask(methods, request_of(query(), model="other"))[0] is False
    assert ask(methods, request_of(query(), version="2"))[0] is False


def test_requests_differing_only_in_their_id_share_a_plan_and_each_answer_carries_its_own():
    """perf_analyzer ``--streaming`` numbers every request; the id is no part of a plan's key."""
    methods = WorkerMethods(FakePlane(), upstream=_NoChannel())
    arrays = query(batch=2)
    for request_id in ("1", "2", "", "é" * 70, "2"):
        taken, response, error = ask(methods, request_of(arrays, request_id=request_id))
        expected = infer_response("m", request_id, arrays["dense"].sum(axis=1, keepdims=True), "1")
        assert taken and error is None and response == expected.SerializeToString()
    assert len(methods._plans) == 1


def padded(request: service_pb2.ModelInferRequest, size: int) -> service_pb2.ModelInferRequest:
    request.parameters["pad"].string_param = "x" * size  # bytes besides the tensors that are part of the key
    return request


def test_plans_are_bounded():
    methods = WorkerMethods(FakePlane(), upstream=_NoChannel())
    for k in range(PLANS + 5):
        assert ask(methods, padded(request_of(query()), k))[2] is None
    assert 0 < len(methods._plans) <= PLANS


def test_a_request_too_long_besides_its_tensors_is_answered_but_not_remembered():
    methods = WorkerMethods(FakePlane(), upstream=_NoChannel())
    for size in (PLAN_KEY_BYTES + 1, PLAN_KEY_BYTES - 200):
        taken, response, error = ask(methods, padded(request_of(query()), size))
        assert taken and error is None and response is not None
    assert len(methods._plans) == 1  # the shorter one


def test_a_request_of_too_many_fields_is_refused_and_the_worker_answers_the_next():
    """A message of empty inputs (two bytes a field) is refused INVALID_ARGUMENT, naming the limit, before protobuf
    or the model sees it; neither forwarded (``_NoChannel`` fails the test) nor remembered as a plan."""
    plane = FakePlane()
    methods = WorkerMethods(plane, upstream=_NoChannel())
    message = request_of(query()).SerializeToString() + b"\x2a\x00" * codec.MAX_REQUEST_FIELDS
    got: list = []
    assert methods._query(memoryview(message), None, lambda r, e, _id: got.append((r, e))) is True
    (response, error), = got
    assert response is None and error.code == "invalid"
    assert f"more than {codec.MAX_REQUEST_FIELDS} top-level fields" in error.public_message()
    assert len(methods._plans) == 0 and plane.owed_checks == 0
    taken, response, error = ask(methods, request_of(query()))
    assert taken and error is None and response is not None


class _NoChannel:
    """A grpc.aio channel that is never called (no request here is forwarded)."""

    def unary_unary(self, path: str):
        return lambda *args, **kwargs: pytest.fail(f"forwarded {path}")

    def stream_stream(self, path: str):
        return self.unary_unary(path)


def test_the_largest_raw_content_is_found_from_a_requests_first_bytes():
    """What a worker aligns a large gRPC request on: the ids' data, found as soon as their field's start arrives."""
    arrays = query(batch=4, ids=5000)
    message = request_of(arrays).SerializeToString()
    ids = arrays["sparse_values"].tobytes()
    start = codec.largest_raw_content(memoryview(message))
    assert message[start : start + len(ids)] == ids
    dense = arrays["dense"].tobytes()
    dense_start = message.index(dense)
    for cut in (start, start - 1, start + 100, len(message)):  # from the ids' length varint on, the ids are known
        found = codec.largest_raw_content(memoryview(message)[:cut])
        assert found == (start if cut >= start else dense_start)
    assert codec.largest_raw_content(memoryview(message)[:dense_start - 3]) == 0  # no content has begun
    assert codec.largest_raw_content(memoryview(b"\xff\xff")) == 0  # garbage: nothing to align on


def test_a_planned_request_lands_with_its_ids_aligned_whatever_has_arrived():
    """A client that sends the dense tensor first fills a request's first bytes with it, so the ids' start has not
    arrived when the buffer is taken; a request planned before knows where they will be.  The first of a kind is
    aligned on the largest content whose start has arrived, as before."""
    from recserve.serving.worker.grpc_methods import SERVICE

    arrays = query(batch=4, ids=5000)
    assert list(arrays)[0] == "dense"
    message = request_of(arrays, request_id="a").SerializeToString()
    ids_at = message.index(arrays["sparse_values"].tobytes())
    dense_at = message.index(arrays["dense"].tobytes())
    heads = (dense_at + 8, ids_at - 16, ids_at + 8, len(message))
    methods = WorkerMethods(FakePlane(), upstream=_NoChannel())
    land = methods.method(SERVICE + "ModelInfer").land

    def aligned_at(cut: int) -> int:
        buffer = land(memoryview(message)[:cut], len(message))
        assert len(buffer) == len(message)
        return next(k for k in (ids_at, dense_at, 0) if np.frombuffer(buffer, np.uint8)[k:].ctypes.data % 64 == 0)

    assert [aligned_at(cut) for cut in heads] == [dense_at, dense_at, ids_at, ids_at]
    assert ask(methods, request_of(arrays, request_id="first"))[2] is None  # planned (the id is no part of the key)
    assert [aligned_at(cut) for cut in heads] == [ids_at] * 4
    assert aligned_at(dense_at - 40) == 0  # the raw contents not begun: nothing to find the plan by
    assert land(memoryview(b"\xff\xff"), 100) is not None  # garbage: any buffer, the decode says why


class FakeCall:
    """What ``InOrder`` asks of a streaming call: the messages it sends and how it ended."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.finished = self.done = False

    def send(self, message: bytes) -> None:
        assert not self.finished
        if not self.done:
            self.sent.append(message)

    def finish(self) -> None:
        self.finished = True

    def time_remaining(self) -> None:
        return None


def test_a_stream_sends_its_answers_in_request_order_and_ends_after_the_last():
    """Answers known out of order (a forwarded one later, one at once) leave in request order; the half-close ends
    the call only when every answer is out; a request whose answering raises gets its own error message."""
    import asyncio

    from recserve.serving.worker.grpc_methods import InOrder

    call, later = FakeCall(), {}

    def answer(message, call_, answered):
        if message == b"boom":
            raise RuntimeError("a bug")
        if message.startswith(b"later"):
            later[bytes(message)] = answered
            return None
        answered(b"=" + bytes(message))
        return None

    sink = InOrder(call, answer)
    for message in (b"later1", b"a", b"boom", b"later2", b"b"):
        sink.put_nowait(message)
    assert call.sent == []  # the first is not answered yet
    later[b"later2"](b"=later2")
    assert call.sent == []
    sink.put_nowait(None)  # half-closed with answers pending: not finished yet
    assert not call.finished
    later[b"later1"](b"=later1")
    errors = service_pb2.ModelStreamInferResponse.FromString(call.sent[2]).error_message
    assert call.sent[:2] + call.sent[3:] == [b"=later1", b"=a", b"=later2", b"=b"] and errors == "internal error"
    assert call.finished

    async def cancelled_forward() -> bool:
        fetching = asyncio.get_running_loop().create_future()
        cancelled_call = FakeCall()
        sink = InOrder(cancelled_call, lambda message, call_, answered: fetching)
        sink.put_nowait(b"x")
        cancelled_call.done = True  # what GrpcCall.cancel sets before it closes the sink
        sink.put_nowait(None)
        await asyncio.sleep(0)
        return fetching.cancelled() and cancelled_call.sent == []

    assert asyncio.run(cancelled_forward())


def test_forwarded_calls_past_the_limit_are_unavailable_at_once_and_a_finished_one_frees_its_place():
    """Each forwarded call holds a task and a grpc.aio call: thousands of tiny calls must not all be held."""
    import asyncio
    from queue import SimpleQueue

    from hpack import Encoder

    from recserve.serving.transport.h2connection import H2Connection
    from recserve.serving.transport.h2frames import DATA, END_HEADERS, END_STREAM, HEADERS, PREFACE, SETTINGS, frame
    from recserve.serving.transport.h2grpc import GrpcCall
    from recserve.serving.worker.grpc_methods import SERVICE, Forwarder
    from tests.test_h2connection import REQUEST, Host, Wire

    async def run() -> None:
        release = asyncio.Event()

        class Channel:
            def unary_unary(self, path):  # type: ignore[no-untyped-def]
                async def send(request, timeout=None, metadata=None):  # type: ignore[no-untyped-def]
                    await release.wait()
                    return b"up"
                return send

        forwarder, wire = Forwarder(Channel(), limit=2), Wire()  # type: ignore[arg-type]
        conn = H2Connection(forwarder, 1 << 20, Host(), GrpcCall, SimpleQueue)
        conn.connection_made(wire)
        encoder = Encoder()
        request = [(k, SERVICE + "ServerMetadata" if k == ":path" else v) for k, v in REQUEST]

        def call(stream: int) -> bytes:
            return (frame(HEADERS, END_HEADERS, stream, encoder.encode(request))
                    + frame(DATA, END_STREAM, stream, b"\x00\x00\x00\x00\x00"))

        conn.receive(PREFACE + frame(SETTINGS, 0, 0) + call(1) + call(3) + call(5))
        await asyncio.sleep(0)
        written = b"".join(wire.writes)
        assert forwarder.forwarding == 2 and written.count(b"grpc-status\x0214") == 1  # the third: UNAVAILABLE
        release.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert forwarder.forwarding == 0 and b"".join(wire.writes).count(b"\x00\x00\x00\x00\x02up") == 2
        conn.receive(call(7))  # a place again
        for _ in range(20):
            await asyncio.sleep(0)
        assert forwarder.forwarding == 0 and b"".join(wire.writes).count(b"\x00\x00\x00\x00\x02up") == 3

    asyncio.run(run())


class TimedPlane(FakePlane):
    """A plane that records the timeout each query is queued with."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def enqueue(self, arrays: tuple, items: int, arrived: float, timeout_s: float | None, reply,
                owed: bool = False) -> None:
        self.timeouts.append(timeout_s)
        super().enqueue(arrays, items, arrived, timeout_s, reply, owed)


def test_a_requests_timeout_parameter_bounds_its_query_as_over_http_and_a_malformed_one_is_refused_alike():
    """tritonclient.grpc's ``infer(..., timeout=µs)`` sends ``parameters["timeout"]``: it bounds the query (the
    earlier of it and the call's deadline), planned or not, and a timeout HTTP refuses is refused with its words."""
    plane = TimedPlane()
    methods = WorkerMethods(plane, upstream=_NoChannel())
    timed = request_of(query(batch=2))
    timed.parameters["timeout"].int64_param = 5000
    errors: list = []
    for deadline in (None, None, 60.0, 0.001):  # the second and later are read by the plan the first made
        methods._query(memoryview(timed.SerializeToString()), deadline, lambda r, e, _id: errors.append(e))
    assert errors == [None] * 4
    assert plane.timeouts == [0.005, 0.005, 0.005, 0.001]
    assert ask(methods, request_of(query(batch=2)))[2] is None and plane.timeouts[-1] is None
    for bad in ("5", True, 0, 3600 * 10**6 + 1):
        malformed = request_of(query(batch=2))
        param = malformed.parameters["timeout"]
        if isinstance(bad, str):
            param.string_param = bad
        elif isinstance(bad, bool):
            param.bool_param = bad
        else:
            param.int64_param = bad
        with pytest.raises(InferError) as http_error:
            codec.timeout_s({"timeout": bad})
        fresh = WorkerMethods(TimedPlane(), upstream=_NoChannel())
        assert ask(fresh, malformed)[2] == http_error.value.public_message()
        with pytest.raises(InferError):
            codec.parse_grpc_infer(malformed)  # the server process's path (grpc_service) decodes with it too
