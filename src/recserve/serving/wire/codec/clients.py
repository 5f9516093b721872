"""The client side, for recserve's load generator, router and benchmark peers: binary-extension requests encoded,
answers over HTTP and gRPC decoded, tritonclient inputs built, and the gRPC channel options recserve recommends."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from recserve.serving.wire.codec.tensors import DATATYPES, DTYPES, json_loads, raw_tensor
from recserve.wire import OUTPUT_SCORES


def triton_inputs(client: Any, arrays: dict[str, np.ndarray], binary: bool = True) -> list[Any]:
    """tritonclient ``InferInput`` objects for ``arrays``, as a user's client builds them; ``client`` is the module
    ``tritonclient.http`` or ``tritonclient.grpc`` (passed in, so this module needs no tritonclient).
    ``binary=False`` (HTTP only) sends the tensors as JSON lists."""
    inputs = []
    for name, arr in arrays.items():
        x = client.InferInput(name, list(arr.shape), DATATYPES[arr.dtype.newbyteorder("=")])
        x.set_data_from_numpy(arr) if binary else x.set_data_from_numpy(arr, binary_data=False)
        inputs.append(x)
    return inputs


def encode_http_request(arrays: dict[str, np.ndarray], request_id: str = "",
                        binary_output: bool = True) -> tuple[bytes, int]:
    """Body and JSON-header length of a binary-extension infer request for ``arrays`` (name -> tensor)."""
    inputs, blobs = [], []
    for name, arr in arrays.items():
        entry, raw = raw_tensor(name, arr)
        entry["parameters"] = {"binary_data_size": len(raw)}
        inputs.append(entry)
        blobs.append(raw)
    header: dict[str, Any] = {"inputs": inputs,
                              "outputs": [{"name": OUTPUT_SCORES, "parameters": {"binary_data": binary_output}}]}
    if request_id:
        header["id"] = request_id
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


def _output_array(datatype: str, shape: Sequence[int], raw: bytes | memoryview) -> np.ndarray:
    return np.frombuffer(raw, dtype=DTYPES[datatype].newbyteorder("<")).reshape(tuple(shape))


def decode_http_response(body: bytes, header_length: int | None) -> dict[str, np.ndarray]:
    """Output tensors of an infer response, binary or plain JSON; ``ValueError`` if malformed."""
    head_len = len(body) if header_length is None else header_length
    try:
        header = json_loads(body[:head_len])
        out, pos = {}, head_len
        for o in header["outputs"]:
            size = (o.get("parameters") or {}).get("binary_data_size")
            if size is None:
                out[o["name"]] = np.asarray(o["data"], dtype=DTYPES[o["datatype"]]).reshape(o["shape"])
            else:
                out[o["name"]] = _output_array(o["datatype"], o["shape"], body[pos : pos + size])
                pos += size
        return out
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed infer response: {exc!r}") from exc


RETRY_BUFFER_BYTES = 64 << 20  # a client channel's grpc.per_rpc_retry_buffer_size: queries up to 64 MiB


def grpc_client_options(max_message: int = -1) -> list[tuple[str, int]]:
    """The channel options recserve's gRPC clients use, and recommend: messages up to ``max_message`` (-1: any),
    and a per-call retry buffer that holds a large query.  grpc-core retries a call refused by a server's GOAWAY
    (a worker retiring, a node draining) only while the call's messages fit that buffer, 256 KiB by default; a
    larger call sent as the GOAWAY arrives fails ``UNAVAILABLE: GOAWAY received`` instead."""
    return [("grpc.max_send_message_length", max_message), ("grpc.max_receive_message_length", max_message),
            ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES)]


def decode_raw_outputs(outputs: Sequence[Any], raw: Sequence[bytes]) -> dict[str, np.ndarray]:
    """Arrays of a ``ModelInferResponse``'s ``outputs`` and ``raw_output_contents``; ``ValueError`` if malformed."""
    try:
        return {o.name: _output_array(o.datatype, o.shape, raw[k]) for k, o in enumerate(outputs)}
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"malformed infer response: {exc!r}") from exc
