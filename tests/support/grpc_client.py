"""gRPC clients of the tests for a node's Open Inference Protocol port on loopback: tritonclient's, as a user's
client speaks, or a channel and the bare generated stub when a test sends what tritonclient would not build."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
import tritonclient.grpc as tgrpc
from tritonclient.grpc import service_pb2_grpc

from recserve.serving.wire.codec import grpc_client_options


def address(port: int) -> str:
    return f"127.0.0.1:{port}"


def triton(port: int, **options: Any) -> tgrpc.InferenceServerClient:
    """tritonclient's gRPC client of the node whose gRPC port is ``port``, with the channel options recserve
    recommends (``codec.grpc_client_options``: a retry buffer that holds a large query) unless ``channel_args``."""
    options.setdefault("channel_args", grpc_client_options())
    return tgrpc.InferenceServerClient(address(port), **options)


def channel(port: int, credentials: grpc.ChannelCredentials | None = None,
            options: list[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A channel of its own (``credentials``: over TLS); use it in ``with``: closing it ends its connection."""
    if credentials is None:
        return grpc.insecure_channel(address(port), options=options)
    return grpc.secure_channel(address(port), credentials, options=options)


@contextlib.contextmanager
def stub(port: int, credentials: grpc.ChannelCredentials | None = None,
         options: list[tuple[str, Any]] | None = None) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    """The generated stub on a channel of its own, closed on leaving."""
    with channel(port, credentials, options) as opened:
        yield service_pb2_grpc.GRPCInferenceServiceStub(opened)
