"""gRPC in the worker (data plane v2): a model worker answers its own model's ``ModelInfer`` itself.

Every whole-query worker accepts on the node's one gRPC listening socket (inherited, like HTTP's: a retiring or
dying worker leaves no connection in a backlog of its own) with the lean HTTP/2 server of ``serving/h2grpc.py``
(grpc.aio's server cost ~5x its CPU per call; see that module).  ``ModelInfer`` for this worker's model is
decoded with the shared codec, queued in the worker's one queue (the same admission, deadlines and fused passes
as HTTP; the deadline is the call's ``grpc-timeout``) and answered from the reply callback, with no task per
call; ``ModelStreamInfer`` is answered here too, request by request.  Every other call (metadata, health,
statistics, other models, the repository API) and a streamed request for another model is forwarded
byte for byte to the supervisor's gRPC server on a private Unix socket through a grpc.aio channel
(``Forwarder``), so the worker needs to know no other part of the service and a client sees one server.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from recserve.serving import codec
from recserve.serving.dataplane import WorkerPlane, as_infer_error
from recserve.serving.errors import InferError, grpc_code
from recserve.serving.grpc_service import Undecodable, answered_in_order, infer_response, tolerant
from recserve.serving.h2grpc import GrpcCall, GrpcServer, Method

SERVICE = "/inference.GRPCInferenceService/"
decode_infer = tolerant(service_pb2.ModelInferRequest.FromString)
SPLIT_BYTES = 64 << 10  # from this size on the tensors are split off before protobuf parses the request


def _fail(call: GrpcCall, error: InferError) -> None:
    call.finish(grpc_code(error).value[0], error.public_message())


async def _requests(call: GrpcCall) -> AsyncIterator[memoryview]:
    """A streaming call's request messages as they arrive, until the client half-closes."""
    while (message := await call.requests.get()) is not None:  # type: ignore[union-attr]
        yield message


class Forwarder:
    """Calls of the inference service passed on byte for byte through a grpc.aio channel: what a worker does
    not answer itself goes to the supervisor, and the supervisor's cover (no worker accepting) forwards every
    call to its own gRPC service the same way."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._methods: dict[str, Method] = {}  # asked on every call: built once per method

    def __call__(self, path: str) -> Method | None:
        if not path.startswith(SERVICE):
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
                call.reply(await send(bytes(raw), timeout=call.time_remaining()))
            except grpc.aio.AioRpcError as exc:
                call.finish(exc.code().value[0], exc.details() or "")

        return Method(unary=lambda call, raw: call.run(relay(call, raw)))

    def _stream(self, path: str) -> Method:
        open_stream = self.channel.stream_stream(path)

        async def relay(call: GrpcCall) -> None:
            try:
                requests = (bytes(message) async for message in _requests(call))
                async for response in open_stream(requests, timeout=call.time_remaining()):
                    call.send(response)
                call.finish()
            except grpc.aio.AioRpcError as exc:
                call.finish(exc.code().value[0], exc.details() or "")

        return Method(stream=lambda call: call.run(relay(call)))


class WorkerMethods(Forwarder):
    """Routes each call: this model's ``ModelInfer`` to the worker's queue, anything else to the supervisor."""

    def __init__(self, plane: WorkerPlane, upstream: grpc.aio.Channel) -> None:
        super().__init__(upstream)
        self.plane = plane
        self._forward_infer = super().method(SERVICE + "ModelInfer").unary  # another model's or version's queries
        self._send_infer = upstream.unary_unary(SERVICE + "ModelInfer")  # the same, for a streamed request

    def method(self, path: str) -> Method:
        if path == SERVICE + "ModelInfer":
            return Method(unary=self._infer)
        if path == SERVICE + "ModelStreamInfer":
            return Method(stream=lambda call: call.run(self._stream(call)))
        return super().method(path)

    def _infer(self, call: GrpcCall, raw: memoryview) -> None:
        def answer(response: Any, error: InferError | None) -> None:
            if error is not None:
                _fail(call, error)
            elif not call.done:
                call.reply(response.SerializeToString())

        if not self._query(raw, call.time_remaining(), answer):
            self._forward_infer(call, raw)  # type: ignore[misc]

    def _query(self, raw: memoryview, timeout_s: float | None, answer: Callable[[Any, InferError | None], None]
               ) -> bool:
        """Decode, validate and queue a ``ModelInferRequest`` for this worker's model; ``answer`` gets the
        ``ModelInferResponse`` or the error.  False (nothing done) when the query is not this worker's."""
        arrived = time.perf_counter()
        split = codec.split_raw_input_contents(raw) if len(raw) >= SPLIT_BYTES else None
        request = decode_infer(raw if split is None else split[0])
        if isinstance(request, Undecodable):
            answer(None, request.error)
            return True
        name, version = request.model_name, request.model_version
        if name != self.plane.model_name or not self.plane.answers(version) or not self.plane.serves_queries():
            return False
        regions = self.plane.regions
        try:
            arrays, items = self.plane.model.validate(codec.parse_grpc_infer(request, split and split[1], regions))
            target = codec.grpc_output_target(request.outputs)
        except Exception as exc:  # noqa: BLE001 - answered as INVALID_ARGUMENT (or INTERNAL for a bug)
            error = as_infer_error(exc)
            self.plane.refused(error.code)
            answer(None, error)
            return True

        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            response = None
            if error is None:
                try:  # scores into a shared-memory region may fail (too small): answered, never raised to the pass
                    response = infer_response(name, request.id, scores, self.plane.version, target, regions)
                except Exception as exc:  # noqa: BLE001
                    error = as_infer_error(exc)
            answer(response, error)

        self.plane.enqueue(arrays, items, arrived, timeout_s, reply)
        return True

    async def _stream(self, call: GrpcCall) -> None:
        """``ModelStreamInfer`` (tritonclient's ``start_stream``, perf_analyzer ``--streaming``) answered here as
        the server process answers it: each request starts as it arrives, answers leave in request order, an
        error is that request's ``error_message`` and does not end the stream.  Requests for this worker's model
        are queued like unary calls; any other is sent to the server process as a unary ``ModelInfer``."""
        async for answer in answered_in_order(_requests(call),
                                              lambda raw: self._stream_answer(raw, call.time_remaining())):
            call.send(answer)
        call.finish()

    def _stream_answer(self, raw: memoryview, timeout_s: float | None) -> asyncio.Future:
        """The serialized ``ModelStreamInferResponse`` for one streamed request, as a future."""
        done: asyncio.Future = asyncio.get_running_loop().create_future()

        def answer(response: Any, error: InferError | None) -> None:
            if not done.done():
                message = (service_pb2.ModelStreamInferResponse(error_message=error.public_message()) if error
                           else service_pb2.ModelStreamInferResponse(infer_response=response))
                done.set_result(message.SerializeToString())

        if self._query(raw, timeout_s, answer):
            return done
        return asyncio.ensure_future(self._forwarded_answer(bytes(raw), timeout_s))

    async def _forwarded_answer(self, raw: bytes, timeout_s: float | None) -> bytes:
        try:
            response = service_pb2.ModelInferResponse.FromString(await self._send_infer(raw, timeout=timeout_s))
            return service_pb2.ModelStreamInferResponse(infer_response=response).SerializeToString()
        except grpc.aio.AioRpcError as exc:
            return service_pb2.ModelStreamInferResponse(error_message=exc.details() or "").SerializeToString()


def channel_to(upstream: str, max_message: int) -> grpc.aio.Channel:
    options = [("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message)]
    return grpc.aio.insecure_channel(upstream, options=options)


async def serve_grpc(plane: WorkerPlane, sock: socket.socket, upstream: str, max_message: int) -> GrpcServer:
    """Accept gRPC connections on the node's listening socket ``sock`` (inherited, shared with the node's other
    workers and the supervisor's cover), forwarding what this worker does not answer to ``upstream``."""
    server = GrpcServer(WorkerMethods(plane, channel_to(upstream, max_message)), max_message)
    await server.start(sock)
    return server
