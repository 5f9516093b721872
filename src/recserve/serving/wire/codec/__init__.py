"""Open Inference Protocol (KServe v2) tensors on the wire: JSON, the HTTP binary extension, gRPC raw contents.

Only numpy and the standard library are imported, so the router, the load generator and benchmark
peers encode and decode queries without torch, aiohttp or grpc (gRPC messages are duck-typed: the
caller owns the protobuf classes).

Server side, :func:`parse_http_infer` and :func:`parse_grpc_infer` validate the *whole* request
(inputs, request and output ``parameters``, ``outputs``, ``id``) before anything runs: every
malformed field is ``InferError("invalid", "<field>: …", field)`` (HTTP 400 / gRPC INVALID_ARGUMENT),
never an exception after the model has run.  Given the process's ``regions``
(:class:`recserve.serving.wire.shm.Regions`), an input or output whose parameters name a ``shared_memory_region`` is
read from or written to that region (Triton's system shared-memory extension) on every transport alike.

Client side, the ``encode_*``/``decode_*`` functions raise ``ValueError`` on a malformed response.

One module per role, all re-exported here (``codec.parse_http_infer``):

- ``tensors``: the datatypes, a tensor from JSON ``data``, raw bytes or shared memory, the checks of a whole query;
- ``json_tensors``: a plain-JSON request's ``data`` arrays read straight into numpy, and its containers bounded;
- ``http_requests`` and ``http_responses``: the HTTP side, server side (``HttpPlans``: repeated headers by plan);
- ``grpc_requests``: a ``ModelInferRequest`` walked, validated and planned, and its answer's output entry;
- ``plans``: a request read by its plan, for both transports;
- ``clients``: what recserve's clients encode and decode.
"""

from __future__ import annotations

from recserve.serving.wire.codec.clients import (
    RETRY_BUFFER_BYTES,
    decode_http_response,
    decode_raw_outputs,
    encode_http_request,
    grpc_client_options,
    triton_inputs,
)
from recserve.serving.wire.codec.grpc_requests import (
    MAX_REQUEST_FIELDS,
    RAW_INPUT_CONTENTS,
    TooManyFields,
    check_request_fields,
    earliest,
    first_raw_content,
    grpc_output_entry,
    grpc_output_target,
    grpc_raw_plan,
    grpc_timeout_s,
    largest_raw_content,
    parse_grpc_infer,
    protobuf_field,
    raw_content_starts,
    split_raw_input_contents,
)
from recserve.serving.wire.codec.http_requests import (
    MAX_JSON_BYTES,
    MAX_TIMEOUT_US,
    HttpPlans,
    batch_size_of,
    dense_rows,
    http_raw_plan,
    parse_header,
    parse_http_infer,
    request_timeout_s,
    timeout_s,
)
from recserve.serving.wire.codec.http_responses import (
    http_infer_response,
    output_target,
    wants_binary_output,
)
from recserve.serving.wire.codec.json_tensors import (
    DATA_BYTES,
    JSON_FAST_BYTES,
    MAX_JSON_CONTAINERS,
    json_request,
    json_skeleton,
)
from recserve.serving.wire.codec.plans import (
    PLAN_KEY_BYTES,
    PLANS,
    PlanStore,
    RawPlan,
    parse_raw,
)
from recserve.serving.wire.codec.tensors import (
    DATATYPES,
    DTYPES,
    EXPECTED,
    GRPC_CONTENTS,
    HEADER_LENGTH,
    LITTLE_ENDIAN,
    MAX_ELEMENTS,
    RANKS,
    TENSOR_ALIGN,
    Target,
    aligned,
    aligned_buffer,
    check_inputs,
    check_outputs,
    finite_scores,
    from_list,
    from_raw,
    invalid,
    json_dumps,
    json_loads,
    raw_tensor,
)
from recserve.wire import OUTPUT_SCORES

__all__ = ["DATATYPES", "DATA_BYTES", "DTYPES", "EXPECTED", "GRPC_CONTENTS", "HEADER_LENGTH", "HttpPlans",
           "JSON_FAST_BYTES", "LITTLE_ENDIAN", "MAX_ELEMENTS", "MAX_JSON_BYTES", "MAX_JSON_CONTAINERS",
           "MAX_REQUEST_FIELDS", "MAX_TIMEOUT_US", "OUTPUT_SCORES", "PLANS", "PLAN_KEY_BYTES", "PlanStore", "RANKS",
           "RAW_INPUT_CONTENTS", "RETRY_BUFFER_BYTES", "RawPlan", "TENSOR_ALIGN", "Target", "TooManyFields",
           "aligned", "aligned_buffer", "batch_size_of", "check_inputs", "check_outputs", "check_request_fields",
           "decode_http_response", "decode_raw_outputs", "dense_rows", "earliest", "encode_http_request",
           "finite_scores", "first_raw_content", "from_list", "from_raw", "grpc_client_options", "grpc_output_entry",
           "grpc_output_target", "grpc_raw_plan", "grpc_timeout_s", "http_infer_response", "http_raw_plan", "invalid",
           "json_dumps",
           "json_loads", "json_request", "json_skeleton", "largest_raw_content", "output_target", "parse_grpc_infer",
           "parse_header", "parse_http_infer", "parse_raw", "protobuf_field", "raw_content_starts", "raw_tensor",
           "request_timeout_s", "split_raw_input_contents", "timeout_s", "triton_inputs", "wants_binary_output"]
