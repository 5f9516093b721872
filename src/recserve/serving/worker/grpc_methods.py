"""gRPC in the worker (data plane v2): a model worker answers its own model's ``ModelInfer`` itself.

Every whole-query worker accepts on the node's one gRPC listening socket (inherited, like HTTP's: a retiring or
dying worker leaves no connection in a backlog of its own) with the lean HTTP/2 server of
``serving/transport/h2grpc.py`` (grpc.aio's server cost ~5x its CPU per call; see that module). ``ModelInfer`` for
this worker's model is decoded with the shared codec, queued in the worker's one queue (the same admission,
deadlines and fused passes as HTTP; the deadline is the call's ``grpc-timeout``) and answered from the reply
callback, with no task per call; ``ModelStreamInfer`` is answered here too, request by request. Every other call
(metadata, health, statistics, other models, the repository API) and a streamed request for another model is
forwarded byte for byte to the supervisor's gRPC server on a private Unix socket through a grpc.aio channel
(``Forwarder``), so the worker needs to know no other part of the service and a client sees one server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np

from recserve.serving.transport.h2connection import CLIENT_GONE
from recserve.serving.transport.h2frames import MAX_HEADER_LIST
from recserve.serving.transport.h2grpc import GrpcCall, GrpcServer, Method
from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError, grpc_code
from recserve.serving.wire.grpc_messages import Undecodable, infer_response, stream_error, tolerant
from recserve.serving.wire.proto import service_pb2
from recserve.serving.worker.model_path import as_infer_error
from recserve.serving.worker.plane import WorkerPlane

log = logging.getLogger(__name__)

SERVICE = "/inference.GRPCInferenceService/"
FORWARD_LIMIT = 1024  # calls a process forwards at once (``Forwarder``); past it UNAVAILABLE, which clients retry
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # answered by the supervisor (``node.grpc_service.HealthServicer``)
# every request reaching it went through ``_query``'s split, whose walk refuses one of too many fields, or stopped
# at the malformed field where the bound's walk would stop too
decode_infer = tolerant(service_pb2.ModelInferRequest.FromString, fields_bounded=True)
# every request's tensors are split off before protobuf parses the rest (the rest is also the plan's key); from
# this size on that is what keeps a large query from being copied twice (codec.split_raw_input_contents)
SPLIT_BYTES = 64 << 10
RAW_OUTPUT_KEY = 6 << 3 | 2  # ModelInferResponse.raw_output_contents (field 6, length-delimited)
RESPONSE_ID_KEY = 3 << 3 | 2  # ModelInferResponse.id (field 3, a string)
STREAM_INFER_KEY = 2 << 3 | 2  # ModelStreamInferResponse.infer_response (field 2, a message)


def _aligned_request(head: memoryview, size: int, plans: codec.PlanStore,
                     buffer: Callable[[int, int], memoryview] = codec.aligned_buffer) -> memoryview:
    """The buffer a large ``ModelInferRequest`` is received in (from ``buffer(size, lead)``): its largest raw
    content (the ids) aligned.

    Only ``head``, the message's first bytes, has arrived.  A request planned before (its fields but the raw
    contents and id seen, ``plans``) gives every content's size, so the ids are found even where a larger-first
    client's dense tensor fills ``head`` (their start has not arrived).  Any other is aligned on the largest content
    whose start has arrived."""
    first = codec.first_raw_content(head)
    if first < 0:  # no raw content has begun (or the head is not walkable): nothing to align on
        return buffer(size, 0)
    split = codec.split_raw_input_contents(head[:first], cut_id=True) if first > 0 else None
    plan = plans.get(split[0]) if split is not None else None
    if plan is None:
        return buffer(size, codec.largest_raw_content(head))
    sizes = [nbytes for *_, nbytes in plan.inputs]
    starts = codec.raw_content_starts(first, sizes)
    return buffer(size, starts[sizes.index(max(sizes))])


Answer = Callable[[bytes | None, InferError | None, str], None]
"""A query's answer: its serialized ``ModelInferResponse`` or its error, and the request's id."""


def _request_id(raw: bytes) -> str:
    """The id of a serialized ``ModelInferRequest`` ("" when it cannot be read): for an error's answer only."""
    try:
        split = codec.split_raw_input_contents(memoryview(raw), cut_id=True)
    except (codec.TooManyFields, UnicodeDecodeError):
        return ""
    return "" if split is None else split[2]


def _fail(call: GrpcCall, error: InferError) -> None:
    call.finish(grpc_code(error).value[0], error.public_message())


class Plan:
    """A request this worker has decoded, validated and answered, but for its tensors: what a request of the same
    bytes (the raw input contents aside) needs, so that protobuf is not asked again (tritonclient and grpcio
    clients send the same names, datatypes and shapes on every call)."""

    __slots__ = ("version", "inputs", "heads", "timeout_s")

    def __init__(self, request: Any, inputs: codec.RawPlan) -> None:
        self.version: str = request.model_version
        self.inputs = inputs
        self.timeout_s = codec.grpc_timeout_s(request)  # its parameters are part of the plan's key
        # per answering version and scores shape: the response's fields before its id, and after it but for its
        # raw contents (a plan serves requests of any id: the id is not part of its key)
        self.heads: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes]] = {}

    def response(self, name: str, version: str, scores: np.ndarray, request_id: str) -> bytes:
        """The serialized ``ModelInferResponse`` for ``scores``, byte for byte as ``infer_response`` makes it: the
        fields before the id and after it made once per answering version and scores shape, the id and the raw
        contents (the last field) put between and after them."""
        scores = codec.finite_scores(scores)
        head = self.heads.get((version, scores.shape))
        if head is None:
            entry, _ = codec.raw_tensor(codec.OUTPUT_SCORES, scores)
            outputs = service_pb2.ModelInferResponse()
            outputs.outputs.add(**entry)
            if len(self.heads) >= 16:
                self.heads.clear()
            head = self.heads[(version, scores.shape)] = (
                service_pb2.ModelInferResponse(model_name=name, model_version=version).SerializeToString(),
                outputs.SerializeToString())
        ident = codec.protobuf_field(RESPONSE_ID_KEY, request_id.encode()) if request_id else b""
        return head[0] + ident + head[1] + codec.protobuf_field(RAW_OUTPUT_KEY,
                                                                  scores.astype("<f4", copy=False).tobytes())


async def _requests(call: GrpcCall) -> AsyncIterator[memoryview]:
    """A streaming call's request messages as they arrive, until the client half-closes."""
    while (message := await call.requests.get()) is not None:  # type: ignore[union-attr]
        yield message


class InOrder:
    """A streaming call's answers, sent in request order as they become known, without a task: each message arriving
    from the read is handed to ``answer`` with a callback that fills its slot, and the answered slots at the head of the
    line are sent at once (a task, two queues and async generators per call cost a streamed query more of a worker's CPU
    than a unary one; docs/decisions/2026-11-28-grpc-plan-key-and-streams.md).  After the half-close the call ends once
    every slot is sent; a cancelled call cancels the answers still being fetched elsewhere (``answer``'s futures)."""

    __slots__ = ("call", "answer", "slots", "closed", "fetching")

    def __init__(self, call: GrpcCall, answer: Callable[[memoryview, GrpcCall, Callable[[bytes], None]],
                                                        asyncio.Future | None]) -> None:
        self.call, self.answer = call, answer
        self.slots: deque[list[bytes | None]] = deque()  # one [answer or None] per request not yet sent
        self.closed = False
        self.fetching: set[asyncio.Future] = set()

    def put_nowait(self, message: memoryview | None) -> None:
        if message is None:
            self.closed = True
            if self.call.done:  # cancelled
                for future in self.fetching:
                    future.cancel()
            self._send_ready()
            return
        slot: list[bytes | None] = [None]
        self.slots.append(slot)

        def answered(response: bytes) -> None:
            slot[0] = response
            self._send_ready()

        try:
            future = self.answer(message, self.call, answered)
        except Exception:  # noqa: BLE001 - a bug answers this request, it must not end the connection's read
            log.exception("streamed request failed")
            answered(service_pb2.ModelStreamInferResponse(error_message="internal error").SerializeToString())
            return
        if future is not None and not future.done():
            self.fetching.add(future)
            future.add_done_callback(self.fetching.discard)

    def _send_ready(self) -> None:
        slots, call = self.slots, self.call
        while slots and slots[0][0] is not None:
            call.send(slots.popleft()[0])  # type: ignore[arg-type]
        if self.closed and not slots:
            call.finish()


class InferCall:
    """One ``ModelInfer`` call's request as far as it has been read: its split bytes (``None``: not split), its
    plan, its protobuf-decoded request (``None`` while the plan serves), id and output target."""

    __slots__ = ("split", "plan", "request", "request_id", "target")

    def __init__(self, split: tuple[Any, ...] | None) -> None:
        self.split = split
        self.plan: Plan | None = None
        self.request: Any = None
        self.request_id: str = split[2] if split is not None else ""
        self.target: Any = None

    def took(self, request: Any) -> None:
        """``request``, decoded from the split bytes (whose id was cut off: put back) or from the whole message."""
        if self.split is not None:
            request.id = self.request_id
        else:
            self.request_id = request.id
        self.request = request


class Forwarder:
    """Calls of the inference service, and health checks, passed on byte for byte through a grpc.aio channel: what
    a worker does not answer itself goes to the supervisor, and the supervisor's cover (no worker accepting)
    forwards every call to its own gRPC service the same way."""

    def __init__(self, channel: grpc.aio.Channel, limit: int = FORWARD_LIMIT) -> None:
        self.channel = channel
        self._methods: dict[str, Method] = {}  # asked on every call: built once per method
        self.limit, self.forwarding = limit, 0  # calls forwarded at once: at most ``limit``

    def _start(self, call: GrpcCall, work: Any) -> None:
        """Run ``work``, the relay of ``call``, unless ``limit`` calls are being forwarded: then UNAVAILABLE at once
        (``work`` is closed unstarted).  Why: each relay holds a task and a grpc.aio call, and a client sending tiny
        calls for the supervisor (metadata, statistics) on thousands of streams made a worker hold 80,000 of them
        (most of a GB) while its loop served little else."""
        if self.forwarding >= self.limit:
            work.close()
            _fail(call, InferError("unavailable", f"this process forwards {self.limit} calls at once; retry"))
            return
        self.forwarding += 1
        call.run(work).add_done_callback(self._forwarded)

    def _forwarded(self, _task: asyncio.Task) -> None:
        self.forwarding -= 1

    def __call__(self, path: str) -> Method | None:
        if not path.startswith(SERVICE) and path != HEALTH_CHECK:
            return None
        if path not in self._methods:
            self._methods[path] = self.method(path)
        return self._methods[path]

    def method(self, path: str) -> Method:
        return self._stream(path) if path == SERVICE + "ModelStreamInfer" else self._unary(path)

    def _unary(self, path: str) -> Method:
        send = self.channel.unary_unary(path)

        async def relay(call: GrpcCall, raw: memoryview) -> None:
            try:
                call.reply(await send(bytes(raw), timeout=call.time_remaining(), metadata=call.metadata or None))
            except grpc.aio.AioRpcError as exc:
                call.finish(exc.code().value[0], exc.details() or "")

        return Method(unary=lambda call, raw: self._start(call, relay(call, raw)))

    def _stream(self, path: str) -> Method:
        open_stream = self.channel.stream_stream(path)

        async def relay(call: GrpcCall) -> None:
            try:
                requests = (bytes(message) async for message in _requests(call))
                async for response in open_stream(requests, timeout=call.time_remaining(),
                                                  metadata=call.metadata or None):
                    call.send(response)
                call.finish()
            except grpc.aio.AioRpcError as exc:
                call.finish(exc.code().value[0], exc.details() or "")

        return Method(stream=lambda call: self._start(call, relay(call)))


class WorkerMethods(Forwarder):
    """Routes each call: this model's ``ModelInfer`` to the worker's queue, anything else to the supervisor."""

    def __init__(self, plane: WorkerPlane, upstream: grpc.aio.Channel, regions: Any = None) -> None:
        super().__init__(upstream)
        self.plane = plane
        self.regions = regions  # the node's shared-memory regions, for tensors that name one (serving/wire/shm.py)
        self._forward_infer = super().method(SERVICE + "ModelInfer").unary  # another model's or version's queries
        self._send_infer = upstream.unary_unary(SERVICE + "ModelInfer")  # the same, for a streamed request
        self._plans = codec.PlanStore()  # by the request's bytes without its raw contents

    def method(self, path: str) -> Method:
        if path == SERVICE + "ModelInfer":
            return Method(unary=self._infer, land=lambda head, size: _aligned_request(head, size, self._plans,
                                                                                      self._buffer))
        if path == SERVICE + "ModelStreamInfer":
            return Method(sink=self._stream)
        return super().method(path)

    def _buffer(self, size: int, lead: int) -> memoryview:
        """A large request's buffer: in the landing arena its siblings map, where the worker has siblings."""
        siblings = self.plane.siblings
        return codec.aligned_buffer(size, lead) if siblings is None else siblings.buffer(size, lead)

    def _infer(self, call: GrpcCall, raw: memoryview) -> None:
        def answer(response: bytes | None, error: InferError | None, _request_id: str) -> None:
            if error is not None:
                _fail(call, error)
            elif not call.done:
                call.reply(response)  # type: ignore[arg-type]

        if not self._query(raw, call.time_remaining(), answer):
            self._forward_infer(call, raw)  # type: ignore[misc]

    def _query(self, raw: memoryview, timeout_s: float | None, answer: Answer) -> bool:
        """Decode, validate and queue a ``ModelInferRequest`` for this worker's model; ``answer`` gets the
        serialized ``ModelInferResponse`` or the error, and the request's id.  False (nothing done) when the query
        is not this worker's.

        A request whose bytes but for its raw contents were seen before (``Plan``) is read without protobuf: its
        tensors viewed where they arrived, only their sizes checked here and their values by the worker that
        computes it (a sibling, if this one forwards it); any other is decoded whole and, once accepted,
        remembered."""
        arrived = time.perf_counter()
        call = self._head(raw)
        if isinstance(call, InferError):
            answer(None, call, "")
            return True
        if not self._ours(call):
            return False
        try:
            arrays, items, owed = self._tensors(call)
        except Exception as exc:  # noqa: BLE001 - answered as INVALID_ARGUMENT (or INTERNAL for a bug)
            error = as_infer_error(exc)
            self.plane.refused(error.code)
            answer(None, error, call.request_id)
            return True
        own = call.plan.timeout_s if call.plan is not None else codec.grpc_timeout_s(call.request)
        self.plane.enqueue(arrays, items, arrived, codec.earliest(timeout_s, own), self._replier(call, answer),
                           owed=owed)
        return True

    def _head(self, raw: memoryview) -> InferCall | InferError:
        """The request's fields but its tensors: from its plan where its bytes (raw contents and id aside) were
        seen before, else decoded by protobuf; the error where it cannot be read."""
        try:
            split = codec.split_raw_input_contents(raw, cut_id=True)  # (fields but raw contents and id, contents, id)
        except codec.TooManyFields as exc:
            return exc.error()
        call = InferCall(split)
        call.plan = self._plans.get(split[0]) if split is not None else None
        if call.plan is None:
            request = decode_infer(raw if split is None else split[0])
            if isinstance(request, Undecodable):
                return request.error
            call.took(request)
        return call

    def _ours(self, call: InferCall) -> bool:
        """Whether this worker answers the call: its model and a version it serves, while it serves queries (a
        plan is only ever made for this worker's model)."""
        name, version = ((call.request.model_name, call.request.model_version) if call.plan is None else
                         (self.plane.model_name, call.plan.version))
        return name == self.plane.model_name and self.plane.answers(version) and self.plane.serves_queries()

    def _tensors(self, call: InferCall) -> tuple[tuple, int, bool]:
        """The query's tensors and items, and whether their value checks are owed by whichever worker computes it
        (``ModelPath.owed``): a planned request's read where they arrived, any other (or one whose tensors do not
        fit its plan) decoded whole, with the error named, and planned for next time.  Raises what is refused."""
        plan, split = call.plan, call.split
        arrays = None if plan is None else codec.parse_raw(plan.inputs, split[1], checked=False)  # type: ignore
        owed = None
        if arrays is not None and (owed := self.plane.model.owed(arrays, plan.inputs)) is None:  # type: ignore
            codec.check_inputs(arrays)
        if arrays is None:
            if call.request is None:
                call.took(decode_infer(split[0]))  # type: ignore[index]
            call.plan = None
            arrays = codec.parse_grpc_infer(call.request, split and split[1], self.regions)
            call.target = codec.grpc_output_target(call.request.outputs)
            if split is not None and (inputs := codec.grpc_raw_plan(call.request, len(split[1]))) is not None:
                call.plan = Plan(call.request, inputs)
                self._plans.remember(split[0], call.plan)
        query, items = owed or self.plane.model.validate(arrays, call.plan and call.plan.inputs)
        return query, items, owed is not None

    def _replier(self, call: InferCall, answer: Answer) -> Callable[[np.ndarray | None, InferError | None], None]:
        """The reply callback of a queued query: its scores serialized (by its plan where it has one) or its error,
        passed to ``answer``."""
        plane, regions = self.plane, self.regions

        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            response = None
            if error is None:
                name, version = plane.model_name, plane.version  # the version answering now
                try:  # scores into a shared-memory region may fail (too small): answered, never raised to the pass
                    response = (call.plan.response(name, version, scores, call.request_id) if call.plan is not None
                                else infer_response(name, call.request.id, scores, version, call.target,
                                                    regions).SerializeToString())
                except Exception as exc:  # noqa: BLE001
                    error = as_infer_error(exc)
            answer(response, error, call.request_id)

        return reply

    def _stream(self, call: GrpcCall) -> InOrder:
        """``ModelStreamInfer`` (tritonclient's ``start_stream``, perf_analyzer ``--streaming``) answered here as
        the server process answers it: each request starts as it arrives, answers leave in request order, an
        error is that request's ``error_message`` and does not end the stream.  Requests for this worker's model
        are queued like unary calls, straight from the read (no task per request or per call); any other is sent
        to the server process as a unary ``ModelInfer``."""
        return InOrder(call, self._stream_answer)

    def _stream_answer(self, raw: memoryview, call: GrpcCall, answered: Callable[[bytes], None]
                       ) -> asyncio.Future | None:
        """One streamed request's serialized ``ModelStreamInferResponse``, given to ``answered`` once known; the
        future of a request answered by the server process."""

        def answer(response: bytes | None, error: InferError | None, request_id: str) -> None:
            answered(stream_error(error.public_message(), request_id).SerializeToString()
                     if error else codec.protobuf_field(STREAM_INFER_KEY, response))  # type: ignore[arg-type]

        timeout_s = call.time_remaining()
        if self._query(raw, timeout_s, answer):
            return None
        forwarded = asyncio.ensure_future(self._forwarded_answer(bytes(raw), timeout_s))
        forwarded.add_done_callback(lambda done: None if done.cancelled() else answered(done.result()))
        return forwarded

    async def _forwarded_answer(self, raw: bytes, timeout_s: float | None) -> bytes:
        try:
            response = service_pb2.ModelInferResponse.FromString(await self._send_infer(raw, timeout=timeout_s))
            return service_pb2.ModelStreamInferResponse(infer_response=response).SerializeToString()
        except grpc.aio.AioRpcError as exc:
            return stream_error(exc.details() or "", _request_id(raw)).SerializeToString()
        except Exception:  # noqa: BLE001 - this request's answer; the stream goes on
            log.exception("forwarding a streamed request failed")
            return service_pb2.ModelStreamInferResponse(error_message="internal error").SerializeToString()


RELAY_METADATA = 4 * MAX_HEADER_LIST  # grpc-core's metadata limits on the private hop: past any public block's


def relay_options(max_message: int) -> list[tuple[str, int]]:
    """grpc-core's options on both ends of the private hop to the server process: messages to the node's limit, and
    metadata well past what the public port accepts (``MAX_HEADER_LIST``), so that grpc-core's own 8 KiB soft limit
    never refuses, at random, a call the public port took."""
    return [("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message),
            ("grpc.max_metadata_size", RELAY_METADATA), ("grpc.absolute_max_metadata_size", RELAY_METADATA)]


def channel_to(upstream: str, max_message: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(upstream, options=relay_options(max_message))


async def serve_grpc(plane: WorkerPlane, sock: socket.socket, upstream: str, max_message: int,
                     regions: Any = None) -> GrpcServer:
    """Accept gRPC connections on the node's listening socket ``sock`` (inherited, shared with the node's other
    workers and the supervisor's cover), forwarding what this worker does not answer to ``upstream``."""
    methods = WorkerMethods(plane, channel_to(upstream, max_message), regions)
    server = GrpcServer(methods, max_message, plane.limits.flood,
                        on_abuse=lambda reason: plane.refused(reason if reason == CLIENT_GONE else f"h2_{reason}"),
                        max_connections=plane.limits.max_connections, idle_timeout_s=plane.limits.keep_alive_s,
                        request_timeout_s=plane.limits.read_timeout_s,
                        on_release=lambda: setattr(plane.reporter, "trim_wanted", True))
    await server.start(sock)
    return server
