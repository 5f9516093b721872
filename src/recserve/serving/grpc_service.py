"""gRPC front end: the standard ``inference.GRPCInferenceService`` (KServe v2 / Triton) on grpc.aio.

The message classes are the generated stubs shipped in ``tritonclient.grpc`` (a runtime
dependency), so the wire format is exactly Triton's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from recserve.serving import protocol
from recserve.serving.llc import LlcUnsupported
from recserve.serving.runtime import InferError, ModelRuntime
from recserve.zoo.batch import OUTPUT_SCORES

if TYPE_CHECKING:
    from recserve.serving.server import NodeCore

CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "unavailable": grpc.StatusCode.UNAVAILABLE,
    "internal": grpc.StatusCode.INTERNAL,
    "unsupported": grpc.StatusCode.UNIMPLEMENTED,
}


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: NodeCore) -> None:
        self.core = core

    def _runtime(self, name: str, version: str = "") -> ModelRuntime:
        rt = self.core.models.get(name)
        if rt is None:
            raise InferError("not_found", f"unknown model {name!r}; served: {sorted(self.core.models)}", "model_name")
        if version not in ("", "1"):
            raise InferError("not_found", f"model {name!r} has only version 1, not {version!r}", "model_version")
        return rt

    async def _guard(self, context: grpc.aio.ServicerContext, fn: Any) -> Any:
        try:
            return await fn()
        except InferError as exc:
            await context.abort(CODES.get(exc.code, grpc.StatusCode.INTERNAL), str(exc))
        except LlcUnsupported as exc:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, str(exc))

    async def ServerLive(self, request, context):  # noqa: N802 (generated names)
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):  # noqa: N802
        return service_pb2.ServerReadyResponse(ready=self.core.ready)

    async def ModelReady(self, request, context):  # noqa: N802
        rt = self.core.models.get(request.name)
        return service_pb2.ModelReadyResponse(ready=bool(rt is not None and rt.ready))

    async def ServerMetadata(self, request, context):  # noqa: N802
        meta = protocol.server_metadata(self.core.config.server_name)
        return service_pb2.ServerMetadataResponse(**meta)

    async def ModelMetadata(self, request, context):  # noqa: N802
        async def run():
            rt = self._runtime(request.name, request.version)
            return json_format.ParseDict(protocol.model_metadata(rt.name, rt.info),
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
            models = [self._runtime(request.name, request.version)] if request.name else self.core.models.values()
            stats = {"model_stats": [rt.metrics.triton_stats(rt.name) for rt in models]}
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())
        return await self._guard(context, run)

    async def ModelInfer(self, request, context):  # noqa: N802
        async def run():
            rt = self._runtime(request.model_name, request.model_version)
            arrays = protocol.parse_grpc_infer(request)
            scores = np.ascontiguousarray(await rt.infer(arrays), dtype=np.float32)
            response = service_pb2.ModelInferResponse(model_name=rt.name, model_version="1", id=request.id)
            out = response.outputs.add()
            out.name, out.datatype = OUTPUT_SCORES, "FP32"
            out.shape.extend(scores.shape)
            response.raw_output_contents.append(scores.tobytes())
            return response
        return await self._guard(context, run)


def add_to_server(server: grpc.aio.Server, core: NodeCore) -> None:
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(core), server)
