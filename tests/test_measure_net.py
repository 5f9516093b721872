"""HTTP (binary tensor extension) and gRPC clients against a tiny fake Open Inference Protocol server.

The fake decodes requests with its own parser (not the client's), checks the tensors against what
was sent, and answers ``scores`` FP32 [B, 1] of zeros; an optional per-request delay behind a lock
makes it a one-worker server for queueing checks.
"""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest

from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.targets import GrpcTarget, HttpTarget, make_target
from recserve.specs import SLA, ModelSpec, TableSpec

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
web = pytest.importorskip("aiohttp.web")

NP = {"FP32": np.float32, "INT64": np.int64, "INT32": np.int32}


def spec() -> ModelSpec:
    return ModelSpec(name="tiny", family="dlrm", dense_in=3, interaction="concat", sla=SLA(50.0),
                     tables=(TableSpec("a", 100, 4, pooling=3), TableSpec("b", 50, 4, pooling=1)), top_mlp=(8, 1))


def pool() -> RequestPool:
    return RequestPool.from_mix(spec(), 1.0, "normal:mean=6,sd=3", pool=6, seed=5)


class FakeOIP:
    """aiohttp + grpc.aio OIP server on loopback, in its own event-loop thread."""

    def __init__(self, http_port: int, grpc_port: int, delay_s: float = 0.0, fail_status: int = 0) -> None:
        self.http_port, self.grpc_port, self.delay_s, self.fail_status = http_port, grpc_port, delay_s, fail_status
        self.grpc_deadlines: list[float | None] = []  # each gRPC call's time remaining as it arrived
        self.seen: list[dict[str, np.ndarray]] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _work(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        self.seen.append(arrays)
        async with self.lock:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
        return np.zeros((arrays["dense"].shape[0], 1), dtype=np.float32)

    async def _http_infer(self, request):
        if self.fail_status:
            return web.Response(status=self.fail_status, text="fake failure")
        body = await request.read()
        head_len = int(request.headers["Inference-Header-Content-Length"])
        header, pos, arrays = json.loads(body[:head_len]), head_len, {}
        for t in header["inputs"]:
            size = t["parameters"]["binary_data_size"]
            arrays[t["name"]] = np.frombuffer(body[pos : pos + size], dtype=NP[t["datatype"]]).reshape(t["shape"])
            pos += size
        assert pos == len(body)
        scores = await self._work(arrays)
        raw = scores.tobytes()
        out = {"model_name": request.match_info["model"], "outputs": [
            {"name": "scores", "datatype": "FP32", "shape": list(scores.shape),
             "parameters": {"binary_data_size": len(raw)}}]}
        head = json.dumps(out).encode()
        return web.Response(body=head + raw, headers={"Inference-Header-Content-Length": str(len(head))},
                            content_type="application/octet-stream")

    def _servicer(self):
        fake = self

        class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
            async def ModelInfer(self, request, context):  # noqa: N802 (protocol name)
                fake.grpc_deadlines.append(context.time_remaining())
                if fake.fail_status:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "fake failure")
                arrays = {t.name: np.frombuffer(request.raw_input_contents[k], dtype=NP[t.datatype]).reshape(
                    tuple(t.shape)) for k, t in enumerate(request.inputs)}
                scores = await fake._work(arrays)
                resp = service_pb2.ModelInferResponse(model_name=request.model_name)
                o = resp.outputs.add()
                o.name, o.datatype = "scores", "FP32"
                o.shape.extend(scores.shape)
                resp.raw_output_contents.append(scores.tobytes())
                return resp

        return Servicer()

    async def _start(self) -> None:
        self.lock = asyncio.Lock()
        app = web.Application(client_max_size=1 << 26)
        app.router.add_post("/v2/models/{model}/infer", self._http_infer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.http_port).start()
        self.grpc_server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self._servicer(), self.grpc_server)
        self.grpc_server.add_insecure_port(f"127.0.0.1:{self.grpc_port}")
        await self.grpc_server.start()

    async def _stop(self) -> None:
        await self.grpc_server.stop(0)
        await self.runner.cleanup()

    def __enter__(self) -> FakeOIP:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


@pytest.fixture
def ports():
    from tests.support.ports import free_port

    return free_port(), free_port()


def _targets(ports):
    return {"http": HttpTarget(f"http://127.0.0.1:{ports[0]}", "tiny", timeout_s=5),
            "grpc": GrpcTarget(f"127.0.0.1:{ports[1]}", "tiny", timeout_s=5)}


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_client_round_trips_every_tensor_exactly(ports, kind):
    p = pool()
    with FakeOIP(*ports) as server:
        target = _targets(ports)[kind]
        with LoadSession(target, p) as session:
            outs = [session.outputs(i) for i in range(len(p))]
    for i, (seen, out) in enumerate(zip(server.seen, outs, strict=True)):
        sent = p.batch(i).as_arrays()
        for name, arr in sent.items():
            assert seen[name].dtype == arr.dtype and np.array_equal(seen[name], arr), (kind, name)
        assert out["scores"].shape == (p.sizes[i], 1) and out["scores"].dtype == np.float32


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_open_loop_run_over_the_network_counts_queueing(ports, kind):
    # one-worker fake with 20 ms service, offered 80 qps: queueing must show in the tail
    with FakeOIP(*ports, delay_s=0.02):
        with LoadSession(_targets(ports)[kind], pool(), warm=True) as session:  # warm: connect first
            light = session.run(5.0, None, max_requests=8, seed=1)
            heavy = session.run(80.0, 0.75, seed=2)
    assert light.failed == 0 and light.ok == 8 and heavy.failed == 0 and heavy.ok == heavy.sent
    # ~60 queries in 0.75 s on a one-at-a-time server of 20 ms each: the last cannot be answered before all of
    # them were served, so by construction (any host: a slower one only adds) it waited at least that long
    # minus when it was scheduled; latency counted from the send instead would hide it
    assert heavy.latencies_ms.max() >= 0.9 * (heavy.sent * 20.0 - 750.0) > 200
    assert heavy.p99 > 100


@pytest.mark.parametrize("kind, error", [("http", "http_503"), ("grpc", "grpc_UNAVAILABLE")])
def test_server_errors_are_counted_by_protocol_code(ports, kind, error):
    with FakeOIP(*ports, fail_status=503):
        with LoadSession(_targets(ports)[kind], pool()) as session:
            res = session.run(50.0, None, max_requests=5)
    assert res.errors == {error: 5} and res.ok == 0


def test_connection_refused_is_an_error_not_a_crash(ports):
    with LoadSession(_targets(ports)["http"], pool()) as session:
        res = session.run(50.0, None, max_requests=3)
    assert res.errors == {"connection": 3}


def test_make_target_parses_addresses():
    assert isinstance(make_target("http://127.0.0.1:8000", "m"), HttpTarget)
    assert make_target("grpc://127.0.0.1:8001", "m").address == "127.0.0.1:8001"
    assert make_target("inprocess:thread", "m").mode == "thread"


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_slow_server_answers_count_as_timeouts(ports, kind):
    with FakeOIP(*ports, delay_s=0.4):
        target = _targets(ports)[kind]
        target.timeout_s = 0.1
        with LoadSession(target, pool()) as session:
            res = session.run(20.0, None, max_requests=3, timeout_s=5.0)  # the client's own deadline fires
    assert res.errors == {"timeout": 3}


def test_a_grpc_query_sends_no_deadline_as_an_http_one_sends_no_timeout(ports):
    """The client's timeout stays the client's: over either protocol the server applies its own deadline."""
    with FakeOIP(*ports) as fake:
        with LoadSession(_targets(ports)["grpc"], pool()) as session:
            res = session.run(20.0, None, max_requests=3)
    assert res.ok == 3 and fake.grpc_deadlines and all(d is None for d in fake.grpc_deadlines)
