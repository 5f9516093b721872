"""gRPC in the worker (data plane v2): a model worker answers its own model's ``ModelInfer`` itself.

Every whole-query worker serves the node's public gRPC port (``SO_REUSEPORT``: the kernel spreads connections
over the workers) with the lean HTTP/2 server of ``serving/h2grpc.py`` (grpc.aio's server cost ~5x its CPU per
call; see that module).  ``ModelInfer`` for this worker's model is decoded with the shared codec, queued in the
worker's one queue (the same admission, deadlines and fused passes as HTTP; the deadline is the call's
``grpc-timeout``) and answered from the reply callback, with no task per call.  Every other call (metadata,
health, statistics, other models, the repository API, streams) is forwarded byte for byte to the supervisor's
gRPC server on a private Unix socket through a grpc.aio channel, so the worker needs to know no other part of
the service and a client sees one server.
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


def _fail(call: GrpcCall, error: InferError) -> None:
    call.finish(grpc_code(error).value[0], error.public_message())


class WorkerMethods:
    """Routes each call: this model's ``ModelInfer`` to the worker's queue, anything else to the supervisor."""

    def __init__(self, plane: WorkerPlane, upstream: grpc.aio.Channel) -> None:
        self.plane = plane
        self.upstream = upstream
        self._methods: dict[str, Method] = {}  # asked on every call: built once per method
        self._forward_infer = self._forward(SERVICE + "ModelInfer").unary  # another model's or version's queries

    def __call__(self, path: str) -> Method | None:
        if not path.startswith(SERVICE):
            return None
        if path not in self._methods:
            self._methods[path] = self._method(path)
        return self._methods[path]

    def _method(self, path: str) -> Method:
        if path == SERVICE + "ModelInfer":
            return Method(unary=self._infer)
        if path == SERVICE + "ModelStreamInfer":
            return self._forward_stream(path)
        return self._forward(path)

    def _infer(self, call: GrpcCall, raw: memoryview) -> None:
        arrived = time.perf_counter()
        request = decode_infer(raw)
        if isinstance(request, Undecodable):
            _fail(call, request.error)
            return
        name, version = request.model_name, request.model_version
        if name != self.plane.model_name or not self.plane.answers(version) or not self.plane.serves_queries():
            self._forward_infer(call, raw)  # type: ignore[misc]
            return
        try:
            arrays, items = self.plane.model.validate(codec.parse_grpc_infer(request))
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

    def _forward(self, path: str) -> Method:
        send = self.upstream.unary_unary(path)

        async def relay(call: GrpcCall, raw: memoryview) -> None:
            try:
                call.reply(await send(bytes(raw), timeout=call.time_remaining()))
            except grpc.aio.AioRpcError as exc:
                call.finish(exc.code().value[0], exc.details() or "")

        return Method(unary=lambda call, raw: call.run(relay(call, raw)))

    def _forward_stream(self, path: str) -> Method:
        open_stream = self.upstream.stream_stream(path)

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


def _listening_socket(address: str) -> socket.socket:
    """``host:port`` or ``[v6]:port``, bound with ``SO_REUSEPORT`` beside the node's other workers."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind gRPC address {address}: {exc}") from exc
    sock.setblocking(False)
    return sock


async def serve_grpc(plane: WorkerPlane, address: str, upstream: str, max_message: int) -> GrpcServer:
    """Start this worker's gRPC server on ``address`` (shared by port reuse) forwarding to ``upstream``."""
    options = [("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message)]
    channel = grpc.aio.insecure_channel(upstream, options=options)
    server = GrpcServer(WorkerMethods(plane, channel), max_message)
    await server.start(_listening_socket(address))
    return server


