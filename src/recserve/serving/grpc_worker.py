"""gRPC in the worker (data plane v2): a model worker answers its own model's ``ModelInfer`` itself.

Every whole-query worker runs a grpc.aio server on the node's public gRPC port (``SO_REUSEPORT``: the kernel
spreads connections over the workers).  ``ModelInfer`` for this worker's model is decoded with the shared codec,
queued in the worker's one queue (the same admission, deadlines and fused passes as HTTP; the deadline is the
call's gRPC deadline) and answered here.  Every other call (metadata, health, statistics, other models, the
repository API, streams) is forwarded byte for byte to the supervisor's gRPC server on a private Unix socket, so
the worker needs to know no other part of the service and a client sees one server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

from recserve.serving import codec
from recserve.serving.dataplane import WorkerPlane, as_infer_error
from recserve.serving.errors import InferError, grpc_code
from recserve.serving.grpc_service import Undecodable, infer_response, tolerant

SERVICE = "/inference.GRPCInferenceService/"


class WorkerHandler(grpc.GenericRpcHandler):
    """Routes each call: this model's ``ModelInfer`` to the worker's queue, anything else to the supervisor."""

    def __init__(self, plane: WorkerPlane, upstream: grpc.aio.Channel) -> None:
        self.plane = plane
        self.upstream = upstream
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}  # grpc asks on every call: built once per method
        self._forward_infer = self._forward(SERVICE + "ModelInfer")  # another model's or version's queries

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if not method.startswith(SERVICE):
            return None
        if method not in self._handlers:
            self._handlers[method] = self._handler(method)
        return self._handlers[method]

    def _handler(self, method: str) -> grpc.RpcMethodHandler:
        if method == SERVICE + "ModelInfer":
            return grpc.unary_unary_rpc_method_handler(self._infer)
        if method == SERVICE + "ModelStreamInfer":
            return grpc.stream_stream_rpc_method_handler(self._forward_stream(method))
        return grpc.unary_unary_rpc_method_handler(self._forward(method))

    async def _infer(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        arrived = time.perf_counter()
        request = tolerant(service_pb2.ModelInferRequest.FromString)(raw)
        if isinstance(request, Undecodable):
            await context.abort(grpc_code(request.error), request.error.public_message())
        name, version = request.model_name, request.model_version
        if name != self.plane.model_name or not self.plane.answers(version) or not self.plane.serves_queries():
            return await self._forward_infer(raw, context)
        try:
            arrays, items = self.plane.model.validate(codec.parse_grpc_infer(request))
        except Exception as exc:  # noqa: BLE001 - answered as INVALID_ARGUMENT (or INTERNAL for a bug)
            error = as_infer_error(exc)
            self.plane.refused(error.code)
            await context.abort(grpc_code(error), error.public_message())
        answer: asyncio.Future = asyncio.get_running_loop().create_future()

        def reply(scores: np.ndarray | None, error: InferError | None) -> None:
            if not answer.done():
                answer.set_result((scores, error))

        self.plane.enqueue(arrays, items, arrived, context.time_remaining(), reply)
        scores, error = await answer
        if error is not None:
            await context.abort(grpc_code(error), error.public_message())
        return infer_response(name, request.id, scores, self.plane.version).SerializeToString()

    def _forward(self, method: str) -> Any:
        call = self.upstream.unary_unary(method)

        async def forward(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await call(raw, timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return forward

    def _forward_stream(self, method: str) -> Any:
        call = self.upstream.stream_stream(method)

        async def forward(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            try:
                async for response in call(requests, timeout=context.time_remaining()):
                    yield response
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")

        return forward


async def serve_grpc(plane: WorkerPlane, address: str, upstream: str, max_message: int) -> grpc.aio.Server:
    """Start this worker's gRPC server on ``address`` (shared by port reuse) forwarding to ``upstream``."""
    options = [("grpc.max_receive_message_length", max_message), ("grpc.max_send_message_length", max_message)]
    channel = grpc.aio.insecure_channel(upstream, options=options)
    server = grpc.aio.server(options=[*options, ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((WorkerHandler(plane, channel),))
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot bind gRPC address {address}")
    await server.start()
    return server
