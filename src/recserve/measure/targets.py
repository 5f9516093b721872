"""Where the load generator sends queries: a node server over HTTP or gRPC, or a model in-process.

All three speak the same protocol to the load generator: ``await prepare(pool)`` encodes every
pooled query once (before the clock starts); ``await infer(i)`` sends pooled query ``i`` and
returns when its scores are back, raising :class:`RequestFailed` with an error *kind* (``http_503``,
``grpc_UNAVAILABLE``, ``connection``, ``bad_response`` …) otherwise.

HTTP uses the Open Inference Protocol (KServe v2) with Triton's binary tensor extension: a JSON
header followed by raw little-endian tensor bytes, the header length in
``Inference-Header-Content-Length``.  gRPC uses ``inference.GRPCInferenceService/ModelInfer`` with
``raw_input_contents``; requests are serialised once, up front, and sent as bytes.  Both encode and
decode tensors with the node server's own codec (:mod:`recserve.serving.wire.codec`).
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import urlparse

import numpy as np

from recserve.errors import RecserveError
from recserve.measure.http_client import Endpoint, HttpClientError, HttpPool, encode_post
from recserve.measure.requests import RequestPool
from recserve.serving.wire import codec
from recserve.serving.wire.codec import HEADER_LENGTH
from recserve.wire import BATCH_SIZE_HEADER
from recserve.zoo.batch import OUTPUT_SCORES, QueryBatch
from recserve.zoo.threads import inherit_torch_threads

INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"


class RequestFailed(Exception):
    """One query failed; ``kind`` is what the load report counts it under."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


class Target(Protocol):
    name: str

    async def prepare(self, pool: RequestPool) -> None: ...

    async def infer(self, i: int) -> None: ...

    async def close(self) -> None: ...


def check_scores(outputs: dict[str, np.ndarray], items: int) -> None:
    """An answer holds one score row per item of its query; else :class:`RequestFailed` ``bad_response``."""
    scores = outputs.get(OUTPUT_SCORES)
    if scores is None or scores.shape[0] != items:
        raise RequestFailed("bad_response", f"scores shape {None if scores is None else scores.shape}")


# ---------------------------------------------------------------- HTTP (binary tensor extension)


def encode_http_request(batch: QueryBatch, request_id: str = "") -> tuple[bytes, int]:
    """Body and JSON-header length of a binary-extension infer request for ``batch`` (binary scores back)."""
    return codec.encode_http_request(batch.as_arrays(), request_id)


def decode_http_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Output tensors of an infer response, binary or plain JSON; :class:`RequestFailed` if malformed."""
    try:
        return codec.decode_http_response(body, header_length)
    except ValueError as exc:
        raise RequestFailed("bad_response", str(exc)) from exc


class HttpTarget:
    """A node server's ``/v2/models/<model>/infer`` over keep-alive connections (``measure/http_client.py``:
    each pooled query's whole request is encoded once, so a query costs the generator one write and one read)."""

    def __init__(self, url: str, model: str, timeout_s: float = 10.0, connections: int = 256,
                 check_outputs: bool = True, size_header: bool = False, reuse: str = "oldest") -> None:
        """``url`` may carry a route prefix (a Ray Serve application); ``size_header`` adds each query's batch
        size as a header (``wire.BATCH_SIZE_HEADER``) for routers that see only headers; ``reuse``: which idle
        connection a query takes (``http_client.HttpPool``)."""
        self.base = url.rstrip("/")
        try:
            self._endpoint = Endpoint.parse(self.base)
        except ValueError as exc:
            raise RecserveError(f"HTTP target {exc}") from exc
        self._path = f"{self._endpoint.prefix}/v2/models/{model}/infer"
        self.size_header = size_header
        self.model = model
        self.name = f"http {self.base} {model}"
        self.timeout_s, self.connections, self.check_outputs = timeout_s, connections, check_outputs
        self._requests: list[tuple[bytes, int]] = []
        self._pool: HttpPool | None = None
        self._reuse = reuse

    async def prepare(self, pool: RequestPool) -> None:
        self._requests = []
        for batch in pool.batches():
            body, headers = self._encode(batch)
            if self.size_header:
                headers[BATCH_SIZE_HEADER] = str(batch.size)
            host = f"{self._endpoint.host}:{self._endpoint.port}"
            self._requests.append((encode_post(host, self._path, body, headers), batch.size))
        if self._pool is None:
            self._pool = self._endpoint.pool(self.connections, self._reuse)

    def _encode(self, batch: QueryBatch) -> tuple[bytes, dict[str, str]]:
        """One query's body and headers: the binary tensor extension."""
        body, head = encode_http_request(batch)
        return body, {HEADER_LENGTH: str(head), "Content-Type": "application/octet-stream"}

    async def infer(self, i: int) -> None:
        outputs = await self.infer_outputs(i)
        if self.check_outputs:
            check_scores(outputs, self._requests[i][1])

    async def infer_outputs(self, i: int) -> dict[str, np.ndarray]:
        try:
            resp = await self._pool.send(self._requests[i][0], self.timeout_s)  # type: ignore[union-attr]
        except TimeoutError as exc:
            raise RequestFailed("timeout", str(exc)) from exc
        except HttpClientError as exc:
            raise RequestFailed("connection", str(exc)) from exc
        if resp.status != 200:
            raise RequestFailed(f"http_{resp.status}", resp.body[:200].decode(errors="replace"))
        length = resp.headers.get(HEADER_LENGTH.lower())
        return decode_http_response(resp.body, int(length) if length is not None else None)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def encode_json_request(batch: QueryBatch) -> bytes:
    """A plain-JSON infer request (tensors as flat ``data`` lists, JSON scores back): what curl, tritonclient with
    ``binary_data=False`` and servers without the binary extension (MLServer) speak."""
    import json

    inputs = [{"name": name, "shape": list(arr.shape), "datatype": codec.DATATYPES[arr.dtype.newbyteorder("=")],
               "data": arr.reshape(-1).tolist()} for name, arr in batch.as_arrays().items()]
    return json.dumps({"inputs": inputs, "outputs": [{"name": OUTPUT_SCORES}]}, separators=(",", ":")).encode()


class JsonHttpTarget(HttpTarget):
    """:class:`HttpTarget` speaking plain JSON (the v2 REST protocol without the binary extension)."""

    def __init__(self, url: str, model: str, timeout_s: float = 10.0, connections: int = 256,
                 check_outputs: bool = True, size_header: bool = False, reuse: str = "oldest") -> None:
        super().__init__(url, model, timeout_s, connections, check_outputs, size_header, reuse)
        self.name = f"http+json {self.base} {model}"

    def _encode(self, batch: QueryBatch) -> tuple[bytes, dict[str, str]]:
        return encode_json_request(batch), {"Content-Type": "application/json"}


class SharedMemoryHttpTarget(HttpTarget):
    """:class:`HttpTarget` whose pooled queries live in shared memory (Triton's system shared-memory extension,
    ``serving/wire/shm.py``): ``prepare`` writes every query once into one POSIX shared-memory object on this host and
    registers it as one region per query; a request then carries only its JSON header naming the regions (the
    scores come back in the body).  How a client on the node's host offers queries too large for the wire (a
    hercules-rmc2 production-mix query is ~19 MB).  ``close`` unregisters the regions and removes the object;
    each generator process (``procs > 1``) prepares its own.  ``token``: the node's control token, if it has one
    (default ``RECSERVE_CONTROL_TOKEN``)."""

    ALIGN = 64

    def __init__(self, url: str, model: str, timeout_s: float = 10.0, connections: int = 256,
                 check_outputs: bool = True, reuse: str = "oldest", token: str | None = None) -> None:
        from recserve.serving.node.control_client import ControlClient

        super().__init__(url, model, timeout_s, connections, check_outputs, reuse=reuse)
        self.name = f"http+shm {self.base} {model}"
        self._control = ControlClient(self._endpoint.host, self._endpoint.port, max(timeout_s, 10.0), token)
        self._segment: Any = None
        self._regions: list[str] = []

    def _aligned(self, nbytes: int) -> int:
        """``nbytes`` rounded up to ``ALIGN``: every tensor starts aligned in the shared object."""
        return -(-nbytes // self.ALIGN) * self.ALIGN

    async def prepare(self, pool: RequestPool) -> None:
        import json
        import uuid
        from multiprocessing import shared_memory

        await self._release()
        arrays = [batch.as_arrays() for batch in pool.batches()]
        spans = [sum(self._aligned(a.nbytes) for a in q.values()) for q in arrays]
        self._segment = shared_memory.SharedMemory(f"recserve-loadgen-{uuid.uuid4().hex[:12]}", create=True,
                                                   size=max(1, sum(spans)))
        self._requests, start = [], 0
        host = f"{self._endpoint.host}:{self._endpoint.port}"
        for i, (query, span) in enumerate(zip(arrays, spans, strict=True)):
            region = f"{self._segment.name}-{i}"
            inputs, pos = [], 0
            for name, arr in query.items():
                self._segment.buf[start + pos : start + pos + arr.nbytes] = np.ascontiguousarray(arr).tobytes()
                inputs.append({"name": name, "datatype": codec.DATATYPES[arr.dtype.newbyteorder("=")],
                               "shape": list(arr.shape),
                               "parameters": {"shared_memory_region": region, "shared_memory_offset": pos,
                                              "shared_memory_byte_size": arr.nbytes}})
                pos += self._aligned(arr.nbytes)
            try:
                self._control.register_system_shared_memory(region, self._segment.name, max(1, span), start)
            except OSError as exc:  # the node unreachable (its refusals are ControlError, a RecserveError)
                raise RecserveError(f"{self.name}: registering {region}: {exc}") from exc
            self._regions.append(region)
            body = json.dumps({"inputs": inputs, "outputs": [{"name": OUTPUT_SCORES,
                                                              "parameters": {"binary_data": True}}]}).encode()
            headers = {HEADER_LENGTH: str(len(body)), "Content-Type": "application/json"}
            self._requests.append((encode_post(host, self._path, body, headers), pool.sizes[i]))
            start += span
        if self._pool is None:
            self._pool = self._endpoint.pool(self.connections, self._reuse)

    async def _release(self) -> None:
        regions, self._regions = self._regions, []
        for region in regions:
            try:
                self._control.unregister_system_shared_memory(region)
            except (RecserveError, OSError):
                pass  # the node is gone: nothing holds the regions any more
        if self._segment is not None:
            segment, self._segment = self._segment, None
            segment.close()
            segment.unlink()

    async def close(self) -> None:
        await self._release()
        await super().close()


# ---------------------------------------------------------------- gRPC


def grpc_messages():
    """The OIP/Triton protobuf messages (``service_pb2``), imported only by gRPC load."""
    from recserve.serving.wire.proto import service_pb2

    return service_pb2


def encode_grpc_request(batch: QueryBatch, model: str, version: str = "") -> Any:
    pb = grpc_messages()
    req = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, arr in batch.as_arrays().items():
        entry, raw = codec.raw_tensor(name, arr)
        req.inputs.add(**entry)
        req.raw_input_contents.append(raw)
    req.outputs.add().name = OUTPUT_SCORES
    return req


# a typed ``InferTensorContents`` field per datatype (servers that answer without raw_output_contents: MLServer)
CONTENTS_FIELDS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                   "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                   "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                   "FP64": "fp64_contents"}


def decode_grpc_response(resp: Any) -> dict[str, np.ndarray]:
    """Output tensors of a ``ModelInferResponse``: raw contents, or typed contents where a server sends those."""
    try:
        if resp.raw_output_contents or not resp.outputs:
            return codec.decode_raw_outputs(resp.outputs, resp.raw_output_contents)
        return {o.name: np.asarray(getattr(o.contents, CONTENTS_FIELDS[o.datatype]),
                                   dtype=codec.DTYPES[o.datatype]).reshape(tuple(o.shape)) for o in resp.outputs}
    except (ValueError, KeyError) as exc:
        raise RequestFailed("bad_response", str(exc)) from exc


class GrpcTarget:
    """``inference.GRPCInferenceService/ModelInfer`` with requests serialised before the run.

    ``timeout_s`` is the client's own: a call sends no deadline, as an HTTP query sends no ``timeout``, so over
    either protocol the server applies its own deadline (a node's ``deadline_ms``) and a comparison of the two
    compares like with like."""

    def __init__(self, address: str, model: str, timeout_s: float = 10.0, check_outputs: bool = True) -> None:
        self.address = address.removeprefix("grpc://")
        self.model = model
        self.name = f"grpc {self.address} {model}"
        self.timeout_s, self.check_outputs = timeout_s, check_outputs
        self._requests: list[tuple[bytes, int]] = []
        self._channel = None
        self._call = None

    async def prepare(self, pool: RequestPool) -> None:
        import grpc

        pb = grpc_messages()
        self._requests = [(encode_grpc_request(b, self.model).SerializeToString(), b.size) for b in pool.batches()]
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=codec.grpc_client_options())
            # request_serializer=None: the pre-serialised bytes go out as they are
            self._call = self._channel.unary_unary(INFER_METHOD, request_serializer=None,
                                                   response_deserializer=pb.ModelInferResponse.FromString)

    async def infer(self, i: int) -> None:
        outputs = await self.infer_outputs(i)
        if self.check_outputs:
            check_scores(outputs, self._requests[i][1])

    async def infer_outputs(self, i: int) -> dict[str, np.ndarray]:
        import grpc

        try:
            async with asyncio.timeout(self.timeout_s):
                resp = await self._call(self._requests[i][0])
        except TimeoutError as exc:
            raise RequestFailed("timeout", f"no answer within {self.timeout_s:g} s") from exc
        except grpc.aio.AioRpcError as exc:  # the server's refusals, its DEADLINE_EXCEEDED among them
            raise RequestFailed(f"grpc_{exc.code().name}", exc.details() or "") from exc
        return decode_grpc_response(resp)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


# ---------------------------------------------------------------- in-process (no network)

_WORKER: dict[str, Any] = {}


def _worker_init(pool: RequestPool, model_seed: int, threads: int) -> None:
    """Process-pool initializer: build the model and materialise the same request pool."""
    import torch

    from recserve.zoo import build_or_load

    torch.set_num_threads(threads)
    _WORKER["model"] = build_or_load(pool.spec, pool.scale, seed=model_seed)
    _WORKER["pool"] = pool
    pool.batches()


def _worker_run(i: int) -> int:
    import torch

    with torch.no_grad():
        scores = _WORKER["model"](_WORKER["pool"].batch(i))
    return int(scores.shape[0])


class InProcessTarget:
    """A zoo model run by ``workers`` threads or processes on this host: the no-network baseline.

    Each worker runs whole queries with ``threads`` intra-op threads (one worker = one inference
    thread, as in Hera).  With processes, every worker builds its own model copy (what a node server
    with N worker processes holds in memory) and receives only a pool index per query.
    """

    def __init__(self, workers: int = 1, mode: str = "process", threads: int = 1, model_seed: int = 0) -> None:
        if mode not in ("thread", "process"):
            raise RecserveError(f"in-process mode must be 'thread' or 'process', got {mode!r}")
        if workers < 1:
            raise RecserveError(f"workers must be >= 1, got {workers}")
        self.workers, self.mode, self.threads, self.model_seed = workers, mode, threads, model_seed
        self.name = f"inprocess {workers} {mode}{'es' if mode == 'process' else 's'}"
        self._executor: Executor | None = None
        self._pool: RequestPool | None = None
        self._run: Any = _worker_run
        self._active = workers
        self._gate: asyncio.Semaphore | None = None
        self._outstanding: set[asyncio.Future] = set()

    async def prepare(self, pool: RequestPool) -> None:
        recipe = pool.recipe()
        if self._executor is not None and self._pool == recipe:
            return
        await self.close()
        self._pool, self._gate = recipe, None
        if self.mode == "thread":
            import torch

            from recserve.zoo import build_or_load

            torch.set_num_threads(self.threads)
            model = build_or_load(recipe.spec, recipe.scale, seed=self.model_seed)
            recipe.batches()

            def run(i: int) -> int:
                with torch.no_grad():
                    return int(model(recipe.batch(i)).shape[0])

            self._run = run
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="recserve-worker",
                                                initializer=inherit_torch_threads)
        else:
            self._run = _worker_run
            import multiprocessing as mp

            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["torch", "recserve.zoo"])
            self._executor = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_worker_init,
                                                 initargs=(recipe, self.model_seed, self.threads))
        # start every worker (and build its model) and run every pooled query once before the clock starts
        loop = asyncio.get_running_loop()
        jobs = [i % len(recipe) for i in range(max(self.workers, len(recipe)))]
        await asyncio.gather(*(loop.run_in_executor(self._executor, self._run, i) for i in jobs))

    def set_active_workers(self, n: int) -> None:
        """Let only ``n`` workers run at once (emulates an ``n``-worker server without restarting the pool);
        change it only between runs."""
        if not 1 <= n <= self.workers:
            raise RecserveError(f"active workers must be in 1..{self.workers}, got {n}")
        self._active, self._gate = n, None

    async def infer(self, i: int) -> None:
        loop = asyncio.get_running_loop()
        if self._gate is None:
            self._gate = asyncio.Semaphore(self._active)
        gate = self._gate
        await gate.acquire()
        try:
            job = loop.run_in_executor(self._executor, self._run, i)
        except BaseException:
            gate.release()
            raise
        # a timed-out query keeps its worker busy until the job really ends: the gate is released then,
        # not when the caller stops waiting (else a timeout would admit more than `active` at once)
        job.add_done_callback(lambda _: gate.release())
        self._outstanding.add(job)
        job.add_done_callback(self._outstanding.discard)
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a worker crash is a failed query, not a load-generator crash
            raise RequestFailed(f"exception_{type(exc).__name__}", str(exc)) from exc

    async def drain(self) -> None:
        """Wait for jobs whose callers gave up (timeouts) so the next run starts on idle workers."""
        if self._outstanding:
            await asyncio.wait(set(self._outstanding))

    def worker_pids(self) -> list[int]:
        if self.mode == "thread":
            return [os.getpid()]
        procs = getattr(self._executor, "_processes", None) or {}
        return sorted(procs)

    async def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


def make_target(spec: str, model: str, workers: int = 1, timeout_s: float = 10.0) -> Target:
    """``http://host:port``, ``http+json://host:port`` (plain JSON), ``http+shm://host:port`` (queries in shared
    memory, a node on this host),
    ``grpc://host:port`` or ``inprocess[:thread|:process]`` → a Target."""
    if spec.startswith("http+shm://"):
        return SharedMemoryHttpTarget("http://" + spec.removeprefix("http+shm://"), model, timeout_s=timeout_s)
    if spec.startswith("http+json://"):
        return JsonHttpTarget("http://" + spec.removeprefix("http+json://"), model, timeout_s=timeout_s)
    if spec.startswith(("http://", "https://")):
        return HttpTarget(spec, model, timeout_s=timeout_s)
    if spec.startswith("grpc://"):
        parsed = urlparse(spec)
        if not parsed.port:
            raise RecserveError(f"gRPC target needs host:port, got {spec!r}")
        return GrpcTarget(f"{parsed.hostname}:{parsed.port}", model, timeout_s=timeout_s)
    if spec.split(":")[0] == "inprocess":
        mode = spec.partition(":")[2] or "process"
        return InProcessTarget(workers=workers, mode=mode)
    raise RecserveError(f"unknown target {spec!r}; use http://HOST:PORT, http+json://HOST:PORT, http+shm://HOST:PORT, "
                        "grpc://HOST:PORT or inprocess[:thread]")
