"""gRPC in the worker (data plane v2): a model worker answers its own model's ``ModelInfer`` itself.

Every whole-query worker accepts on the node's one gRPC listening socket (inherited, like HTTP's: a retiring or
dying worker leaves no connection in a backlog of its own) with the lean HTTP/2 server of ``serving/h2grpc.py``
(grpc.aio's server cost ~5x its CPU per call; see that module).  ``ModelInfer`` for this worker's model is
decoded with the shared codec, queued in the worker's one queue (the same admission, deadlines and fused passes
as HTTP; the deadline is the call's ``grpc-timeout``) and answered from the reply callback, with no task per
call.  Every other call (metadata, health, statistics, other models, the repository API, streams) is forwarded
byte for byte to the supervisor's gRPC server on a private Unix socket through a grpc.aio channel
(``Forwarder``), so the worker needs to know no other part of the service and a client sees one server.
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from recserve.serving import codec
from recserve.serving.dataplane import WorkerPlane, as_infer_error
from recserve.serving.errors import InferError, grpc_code
from recserve.serving.grpc_service import Undecodable, infer_response, tolerant
from recserve.serving.h2grpc import GrpcCall, GrpcServer, Method

SERVICE = "/inference.GRPCInferenceService/"
decode_infer = tolerant(service_pb2.ModelInferRequest.FromString)
SPLIT_BYTES = 64 << 10  # from this size on the tensors are split off before protobuf parses the request


def _fail(call: GrpcCall, error: InferError) -> None:
    call.finish(grpc_code(error).value[0], error.public_message())


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

        async def requests(call: GrpcCall) -> AsyncIterator[bytes]:
            while (message := await call.requests.get()) is not None:  # type: ignore[union-attr]
                yield bytes(message)

        async def relay(call: GrpcCall) -> None:
            try:
                async for response in open_stream(requests(call), timeout=call.time_remaining()):
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

    def method(self, path: str) -> Method:
        return Method(unary=self._infer) if path == SERVICE + "ModelInfer" else super().method(path)

    def _infer(self, call: GrpcCall, raw: memoryview) -> None:
        arrived = time.perf_counter()
        split = codec.split_raw_input_contents(raw) if len(raw) >= SPLIT_BYTES else None
        request = decode_infer(raw if split is None else split[0])
        if isinstance(request, Undecodable):
            _fail(call, request.error)
            return
        name, version = request.model_name, request.model_version
        if name != self.plane.model_name or not self.plane.answers(version) or not self.plane.serves_queries():
            self._forward_infer(call, raw)  # type: ignore[misc]
            return
        try:
            arrays, items = self.plane.model.validate(codec.parse_grpc_infer(request, split and split[1]))
        except Exception as exc:  # noqa: BLE001 - answered as INVALID_ARGUMENT (or INTERNAL for a bug)
            error = as_infer_error(exc)
            self.plane.refused(error.code)
            _fail(call, error)
            return

        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            if error is not None:
                _fail(call, error)
            elif not call.done:
                call.reply(infer_response(name, request.id, scores, self.plane.version).SerializeToString())

        self.plane.enqueue(arrays, items, arrived, call.time_remaining(), reply)


def channel_to(upstream: str, max_message: int) -> grpc.aio.Channel:
    options = [("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message)]
    return grpc.aio.insecure_channel(upstream, options=options)


async def serve_grpc(plane: WorkerPlane, sock: socket.socket, upstream: str, max_message: int) -> GrpcServer:
    """Accept gRPC connections on the node's listening socket ``sock`` (inherited, shared with the node's other
    workers and the supervisor's cover), forwarding what this worker does not answer to ``upstream``."""
    server = GrpcServer(WorkerMethods(plane, channel_to(upstream, max_message)), max_message)
    await server.start(sock)
    return server
