"""Open Inference Protocol gRPC messages as both the supervisor's gRPC service and the workers' gRPC methods read and
write them: requests decoded tolerantly (bad bytes are the client's, answered INVALID_ARGUMENT) and infer answers."""

from __future__ import annotations

from typing import Any

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.proto import service_pb2


class Undecodable:
    """A request whose bytes are not the method's protobuf message (grpc would answer UNKNOWN)."""

    def __init__(self, reason: str, error: InferError | None = None) -> None:
        self.error = error or InferError("invalid", f"request: not a valid protobuf message ({reason})", "request")


def tolerant(deserialize: Any) -> Any:
    """``deserialize`` returning :class:`Undecodable` instead of raising (also used by the workers' gRPC), and
    instead of decoding a message of more than ``codec.MAX_REQUEST_FIELDS`` top-level fields."""
    def run(data: bytes) -> Any:
        try:
            codec.check_request_fields(memoryview(data))
            return deserialize(data)
        except codec.TooManyFields as exc:
            return Undecodable("too many fields", exc.error())
        except Exception as exc:  # DecodeError and friends: the client's bytes, never our bug
            return Undecodable(type(exc).__name__)
    return run


def infer_response(name: str, request_id: str, scores: Any, version: str = "1", target: Any = None,
                   regions: Any = None) -> Any:
    """A ``ModelInferResponse`` carrying ``scores`` as raw FP32 contents (what tritonclient reads), or without
    contents when the request asked them into a shared-memory region (``target``, written there)."""
    entry, raw = codec.grpc_output_entry(scores, target, regions)
    response = service_pb2.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    response.outputs.add(**entry)
    if raw is not None:
        response.raw_output_contents.append(raw)
    return response
