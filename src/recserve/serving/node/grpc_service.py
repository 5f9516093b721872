"""gRPC front end: the standard ``inference.GRPCInferenceService`` (KServe v2 / Triton) on grpc.aio.

The message classes are generated from Triton's ``.proto`` files (:mod:`recserve.serving.wire.proto`), so the
wire format is exactly Triton's.  Tensor contents are read and written by
:mod:`recserve.serving.wire.codec`; error codes map to gRPC status through :mod:`recserve.serving.wire.errors`.

``ModelReady`` answers ``ready: false`` for an unknown model or version (HTTP answers 404 there;
tritonclient's ``is_model_ready`` reports both as not ready).  ``ModelStreamInfer`` answers every
request of the stream, in order, with its ``infer_response`` or an ``error_message``; requests of
one stream run concurrently and an error does not end the stream.

System shared memory (``serving/wire/shm.py``): ``SystemSharedMemoryRegister``/``Unregister``/``Status`` act on the
node's one registry here (workers forward these calls); ``ModelInfer`` reads inputs from and writes scores to registered
regions.  The ``CudaSharedMemory*`` calls answer ``UNIMPLEMENTED`` with a message saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import json_format

from recserve.serving.node import control_api, grpc_health
from recserve.serving.node.llc import LlcUnsupported
from recserve.serving.wire import codec, protocol
from recserve.serving.wire.errors import InferError, grpc_code
from recserve.serving.wire.grpc_messages import Undecodable, infer_response, stream_error, tolerant
from recserve.serving.wire.proto import model_config_pb2, service_pb2, service_pb2_grpc
from recserve.serving.wire.shm import CUDA_UNSUPPORTED

if TYPE_CHECKING:
    from recserve.serving.node.core import NodeCore
    from recserve.serving.node.runtime import ModelRuntime


def _refusing(behaviour: Any) -> Any:
    """A unary handler that answers INVALID_ARGUMENT to an undecodable request instead of running."""
    async def run(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc_code(request.error), request.error.public_message())
        return await behaviour(request, context)
    return run


def _with_tolerant_decoding(handler: Any) -> Any:
    handler = handler._replace(request_deserializer=tolerant(handler.request_deserializer))
    if handler.unary_unary is not None:
        handler = handler._replace(unary_unary=_refusing(handler.unary_unary))
    return handler  # ModelStreamInfer answers an Undecodable item with its error_message (see _infer)


class _Registrar:
    """Collects the generated method handlers so that they can be wrapped before the server sees them."""

    def __init__(self) -> None:
        self.handlers: dict[str, Any] = {}
        self.service = ""

    def add_generic_rpc_handlers(self, _: Any) -> None:
        pass  # the same handlers arrive below, by name

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    def _runtime(self, name: str, version: str = "") -> ModelRuntime:
        return self.core.runtime(name, version)

    async def _guard(self, context: grpc.aio.ServicerContext, fn: Any, method: str | None = None) -> Any:
        """Run ``fn``, answering its InferError with the one table's gRPC code; ``method`` named in
        ``control_api.GUARDED_GRPC`` needs the node's control token in the ``authorization`` metadata first."""
        try:
            if method is not None:
                self._check_access(context, method)
            return await fn()
        except InferError as exc:
            await context.abort(grpc_code(exc), exc.public_message())
        except LlcUnsupported as exc:
            await context.abort(grpc_code(InferError("unsupported", str(exc))), str(exc))

    def _check_access(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """The control API's access rule, as over HTTP (forwarded calls keep their metadata)."""
        token, what = self.core.config.control_token, control_api.GUARDED_GRPC.get(method)
        if token and what is not None:
            header = dict(context.invocation_metadata() or ()).get("authorization")
            control_api.require_token(what, header, token, "authorization")

    async def ServerLive(self, request, context):  # noqa: N802 (generated names)
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.core.ready)

    async def ModelReady(self, request, context):  # noqa: N802
        try:
            ready = self._runtime(request.name, request.version).ready
        except InferError:
            ready = False
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):  # noqa: N802
        meta = protocol.server_metadata(self.core.config.server_name)
        return service_pb2.ServerMetadataResponse(**meta)

    async def ModelMetadata(self, request, context):  # noqa: N802
        async def run():
            rt = self._runtime(request.name, request.version)
            versions = sorted(self.core.versions.get(rt.name, {}), key=int)
            return json_format.ParseDict(protocol.model_metadata(rt.name, rt.info, versions),
                                         service_pb2.ModelMetadataResponse())
        return await self._guard(context, run)

    async def ModelConfig(self, request, context):  # noqa: N802
        async def run():
            rt = self._runtime(request.name, request.version)
            config = json_format.ParseDict(self.core.model_config(rt), model_config_pb2.ModelConfig())
            return service_pb2.ModelConfigResponse(config=config)
        return await self._guard(context, run)

    async def ModelStatistics(self, request, context):  # noqa: N802
        async def run():
            stats = self.core.statistics(request.name, request.version)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())
        return await self._guard(context, run)

    async def _infer(self, request: Any, timeout_s: float | None = None) -> Any:
        """The ``ModelInferResponse`` to one request, or :class:`InferError`; ``timeout_s``: the call's deadline."""
        try:  # refusals counted as HTTP's are (http._refusal_counter, http._infer): /metrics says the same for both
            if isinstance(request, Undecodable):
                raise request.error
            rt = self._runtime(request.model_name, request.model_version)
        except InferError as exc:
            self.core.refused(exc.code)
            raise
        regions = self.core.shm
        try:
            arrays = codec.parse_grpc_infer(request, regions=regions)
            target = codec.grpc_output_target(request.outputs)
        except InferError as exc:
            rt.metrics.refused(exc.code)
            raise
        scores = await rt.infer(arrays, codec.earliest(timeout_s, codec.grpc_timeout_s(request)))
        return infer_response(rt.name, request.id, scores, rt.version, target, regions)

    async def ModelInfer(self, request, context):  # noqa: N802
        return await self._guard(context, lambda: self._infer(request, context.time_remaining()))

    async def RepositoryIndex(self, request, context):  # noqa: N802
        async def run():
            entries = self.core.loader.index(request.ready)
            return json_format.ParseDict({"models": entries}, service_pb2.RepositoryIndexResponse())
        return await self._guard(context, run)

    async def RepositoryModelLoad(self, request, context):  # noqa: N802
        async def run():
            protocol.check_load_parameters(request.parameters)
            await self.core.loader.load(request.model_name)
            return service_pb2.RepositoryModelLoadResponse()
        return await self._guard(context, run, "RepositoryModelLoad")

    async def RepositoryModelUnload(self, request, context):  # noqa: N802
        async def run():
            await self.core.loader.unload(request.model_name)
            return service_pb2.RepositoryModelUnloadResponse()
        return await self._guard(context, run, "RepositoryModelUnload")

    # ---- system shared memory (serving/wire/shm.py); CUDA shared memory is not supported ----
    async def SystemSharedMemoryStatus(self, request, context):  # noqa: N802
        async def run():
            regions = {r["name"]: r for r in self.core.shm.status(request.name)}
            return json_format.ParseDict({"regions": regions}, service_pb2.SystemSharedMemoryStatusResponse())
        return await self._guard(context, run, "SystemSharedMemoryStatus")

    async def SystemSharedMemoryRegister(self, request, context):  # noqa: N802
        async def run():
            self.core.shm.register(request.name, request.key, request.offset, request.byte_size)
            return service_pb2.SystemSharedMemoryRegisterResponse()
        return await self._guard(context, run, "SystemSharedMemoryRegister")

    async def SystemSharedMemoryUnregister(self, request, context):  # noqa: N802
        async def run():
            self.core.shm.unregister(request.name)
            return service_pb2.SystemSharedMemoryUnregisterResponse()
        return await self._guard(context, run, "SystemSharedMemoryUnregister")

    async def _no_cuda(self, context: grpc.aio.ServicerContext) -> Any:
        return await self._unsupported(context, CUDA_UNSUPPORTED)

    async def CudaSharedMemoryStatus(self, request, context):  # noqa: N802
        return await self._no_cuda(context)

    async def CudaSharedMemoryRegister(self, request, context):  # noqa: N802
        return await self._no_cuda(context)

    async def CudaSharedMemoryUnregister(self, request, context):  # noqa: N802
        return await self._no_cuda(context)

    async def _unsupported(self, context: grpc.aio.ServicerContext, message: str) -> Any:
        async def run():
            raise InferError("unsupported", message)
        return await self._guard(context, run)

    async def TraceSetting(self, request, context):  # noqa: N802
        return await self._unsupported(context, protocol.TRACE_UNSUPPORTED)

    async def LogSettings(self, request, context):  # noqa: N802
        return await self._unsupported(context, protocol.LOGGING_UNSUPPORTED)

    async def _stream_answer(self, request: Any) -> Any:
        """One streamed request's answer; an error names the request's id, as Triton's does, so that a client
        knows which request failed."""
        try:
            return service_pb2.ModelStreamInferResponse(infer_response=await self._infer(request))
        except (InferError, LlcUnsupported) as exc:
            message = exc.public_message() if isinstance(exc, InferError) else str(exc)
            return stream_error(message, getattr(request, "id", ""))

    async def ModelStreamInfer(self, request_iterator, context) -> AsyncIterator[Any]:  # noqa: N802
        async for answer in answered_in_order(request_iterator, self._stream_answer):
            yield answer


async def answered_in_order(requests: AsyncIterator[Any], answer: Callable[[Any], Awaitable[Any]]
                            ) -> AsyncIterator[Any]:
    """``ModelStreamInfer``'s order, for the server process and the workers alike: each request's ``answer``
    starts as the request arrives, answers leave in request order.  The reader always ends the queue with None,
    also when the client goes away, so the loop cannot hang; what is pending when the stream ends is cancelled."""
    answers: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for request in requests:
                answers.put_nowait(asyncio.ensure_future(answer(request)))
        finally:
            answers.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while (task := await answers.get()) is not None:
            yield await task
    finally:
        reader.cancel()
        while not answers.empty():
            pending = answers.get_nowait()
            if pending is not None:
                pending.cancel()


def add_to_server(server: grpc.aio.Server, core: NodeCore) -> None:
    """The inference service with every request decoded tolerantly (bad bytes are INVALID_ARGUMENT, not UNKNOWN),
    and the health service."""
    registrar = _Registrar()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(core), registrar)
    handlers = {name: _with_tolerant_decoding(h) for name, h in registrar.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(registrar.service, handlers),))
    server.add_registered_method_handlers(registrar.service, handlers)
    grpc_health.add_to_server(server, core)
