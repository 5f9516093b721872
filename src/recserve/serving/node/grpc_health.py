"""The standard gRPC health service's ``Check`` (``grpc.health.v1.Health``: Kubernetes' ``grpc`` probes, load
balancers): SERVING while the node is ready (``ServerReady``, strict readiness included), else NOT_SERVING; a
service name other than ``HEALTH_SERVICES`` is NOT_FOUND.  ``Watch`` is not served: a stream held per watcher
for the server's life, for no probe that needs one.

The two messages are those of grpc/health/v1/health.proto, built by protobuf in a descriptor pool of their own: in
the default pool they would clash with grpcio-health-checking's where a process imports both, and depending on
that package instead ties protobuf's major version to it, which made pip resolve tritonclient back to 2.41 (see
docs/decisions/2026-11-30-grpc-health-without-grpcio-health-checking.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from recserve.serving.worker.grpc_methods import HEALTH_CHECK
from recserve.serving.worker.grpc_methods import SERVICE as INFERENCE

if TYPE_CHECKING:
    from recserve.serving.node.core import NodeCore

SERVICE, METHOD = HEALTH_CHECK.strip("/").split("/")  # the path the workers forward: grpc.health.v1.Health, Check
PACKAGE = SERVICE.rpartition(".")[0]
HEALTH_SERVICES = ("", INFERENCE.strip("/"))  # the whole server, and its one service
STATUSES = ("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")  # HealthCheckResponse.ServingStatus


def _messages() -> tuple[Any, Any]:
    """``HealthCheckRequest {string service = 1}`` and ``HealthCheckResponse {ServingStatus status = 1}``."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="recserve/grpc_health_v1.proto", package=PACKAGE, syntax="proto3")
    request = proto.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    response = proto.message_type.add(name="HealthCheckResponse")
    status = response.enum_type.add(name="ServingStatus")
    for number, name in enumerate(STATUSES):
        status.value.add(name=name, number=number)
    response.field.add(name="status", number=1, type=field.TYPE_ENUM, label=field.LABEL_OPTIONAL,
                       type_name=f".{PACKAGE}.HealthCheckResponse.ServingStatus")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
                 for name in ("HealthCheckRequest", "HealthCheckResponse"))  # type: ignore[return-value]


HealthCheckRequest, HealthCheckResponse = _messages()


def add_to_server(server: grpc.aio.Server, core: NodeCore) -> None:
    """``Check`` on ``server``, answered from ``core``'s readiness."""

    async def check(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:  # parsed here: a malformed request is the client's INVALID_ARGUMENT, not grpc's UNKNOWN and an ERROR log
            request = HealthCheckRequest.FromString(raw)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request: not a valid HealthCheckRequest")
        if request.service not in HEALTH_SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}; known: "
                                                           f"{', '.join(repr(s) for s in HEALTH_SERVICES)}")
        return HealthCheckResponse(status=STATUSES.index("SERVING" if core.ready else "NOT_SERVING"))

    handler = grpc.unary_unary_rpc_method_handler(check, response_serializer=HealthCheckResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
