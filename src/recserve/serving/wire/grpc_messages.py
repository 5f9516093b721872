"""Open Inference Protocol gRPC messages as both the supervisor's gRPC service and the workers' gRPC methods read and
write them: requests decoded tolerantly (bad bytes are the client's, answered INVALID_ARGUMENT) and infer answers."""

from __future__ import annotations

from typing import Any

from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.proto import service_pb2


class Undecodable:
    """A request that is not the method's protobuf message (grpc would answer UNKNOWN), or one of more top-level
    fields than are read (``codec.MAX_REQUEST_FIELDS``): ``error`` says which."""

    def __init__(self, error: InferError) -> None:
        self.error = error


def tolerant(deserialize: Any, fields_bounded: bool = False) -> Any:
    """``deserialize`` returning :class:`Undecodable` instead of raising (also used by the workers' gRPC), and
    instead of decoding a message of more than ``codec.MAX_REQUEST_FIELDS`` top-level fields; ``fields_bounded``:
    the caller's own walk has bounded them already (the workers' ``codec.split_raw_input_contents``)."""
    def run(data: bytes) -> Any:
        try:
            if not fields_bounded:
                codec.check_request_fields(memoryview(data))
            return deserialize(data)
        except codec.TooManyFields as exc:
            return Undecodable(exc.error())
        except Exception as exc:  # DecodeError and friends: the client's bytes, never our bug
            return Undecodable(InferError("invalid", f"request: not a valid protobuf message ({type(exc).__name__})",
                                          "request"))
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


def stream_error(message: str, request_id: str = "") -> Any:
    """A ``ModelStreamInferResponse`` answering one streamed request with an error; it names the request's id, as
    Triton's does, so that a client knows which of its requests failed."""
    return service_pb2.ModelStreamInferResponse(error_message=message,
                                                infer_response=service_pb2.ModelInferResponse(id=request_id))
