"""Clients for one query at a time against a node: tritonclient inputs, bare HTTP/1.1, grpcio with bytes, a bare
HTTP/2 gRPC client and tritonclient's stream, each ``Client(port, model, batch)`` with ``infer()`` and ``close()``."""

from __future__ import annotations

import numpy as np
import tritonclient.grpc as tgrpc

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def inputs(mod, batch):
    out = []
    for name, arr in batch.as_arrays().items():
        x = mod.InferInput(name, list(arr.shape), DTYPE_NAMES[arr.dtype])
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


class MinimalHttp:
    """A blocking keep-alive HTTP/1.1 client that sends one pre-encoded request and reads the answer: the
    ``http_minimal`` row, so the server's own overhead shows apart from tritonclient's (~0.2 ms of client CPU)."""

    def __init__(self, port: int, model: str, batch) -> None:
        import socket

        from recserve.measure.http_client import encode_post
        from recserve.measure.targets import encode_http_request

        body, header_length = encode_http_request(batch)
        self.request = encode_post("127.0.0.1", f"/v2/models/{model}/infer", body,
                                   {"Inference-Header-Content-Length": str(header_length)})
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def infer(self) -> None:
        self.sock.sendall(self.request)
        got = self.sock.recv(1 << 20)
        head_end = got.find(b"\r\n\r\n")
        while head_end < 0:
            got += self.sock.recv(1 << 20)
            head_end = got.find(b"\r\n\r\n")
        if not got.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"server answered {got[:200]!r}")
        length = int(next(line.split(b":", 1)[1] for line in got[:head_end].split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(got) < head_end + 4 + length:
            got += self.sock.recv(1 << 20)

    def close(self) -> None:
        self.sock.close()


class MinimalGrpc:
    """A blocking gRPC client that sends one pre-serialised ``ModelInferRequest`` as bytes and takes the answer
    as bytes (no tritonclient objects, no protobuf work per call): the ``grpc_minimal`` row, so the server's
    gRPC cost shows apart from tritonclient's gRPC client."""

    def __init__(self, port: int, model: str, batch) -> None:
        import grpc as grpcio

        from recserve.measure.targets import encode_grpc_request

        self.request = encode_grpc_request(batch, model).SerializeToString()
        self.channel = grpcio.insecure_channel(f"127.0.0.1:{port}")
        self.call = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    def infer(self) -> None:
        if not self.call(self.request, timeout=10.0):
            raise RuntimeError("empty gRPC answer")

    def close(self) -> None:
        self.channel.close()


class MinimalH2Grpc:
    """A bare HTTP/2 gRPC client over one socket: the call's header block encoded once (HPACK), its HEADERS and DATA
    frames sent in one write, frames read until the call's trailers (decoded, with its ``grpc-status`` checked): the
    ``grpc_h2`` row, so the server's gRPC cost shows apart from grpcio's client (~0.3 ms of CPU a call on the 2-core
    host, this one's ~0.15), as ``http_minimal`` shows HTTP's apart from tritonclient's."""

    PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    WINDOW = 2**31 - 1

    def __init__(self, port: int, model: str, batch) -> None:
        import socket

        import hpack

        from recserve.measure.targets import encode_grpc_request

        message = encode_grpc_request(batch, model).SerializeToString()
        self.data = b"\0" + len(message).to_bytes(4, "big") + message
        fields = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
                  (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"), ("te", "trailers")]
        encoder = hpack.Encoder()
        # the first call's block adds the fields to both HPACK tables; every later call names them by index, as
        # grpcio's client does (a block of literals on every call cost the server ~0.07 ms more per call)
        self.first_block, self.block = encoder.encode(fields), encoder.encode(fields)
        self.decoder = hpack.Decoder()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = (4).to_bytes(2, "big") + self.WINDOW.to_bytes(4, "big")  # SETTINGS_INITIAL_WINDOW_SIZE
        self.sock.sendall(self.PREFACE + self.frame(4, 0, 0, settings)
                          + self.frame(8, 0, 0, (self.WINDOW - 65535).to_bytes(4, "big")))  # the connection's window
        self.stream, self.buf = 1, bytearray()
        self.max_frame = 16384
        self.sock.settimeout(10.0)
        settings_seen = window_seen = False
        while not (settings_seen and window_seen):  # the server's SETTINGS (its frame size) and connection window
            head = self._read(9)
            payload = self._read(int.from_bytes(head[:3], "big"))
            if head[3] == 4 and not head[4] & 0x1:
                for at in range(0, len(payload), 6):
                    if int.from_bytes(payload[at : at + 2], "big") == 5:  # SETTINGS_MAX_FRAME_SIZE
                        self.max_frame = int.from_bytes(payload[at + 2 : at + 6], "big")
                self.sock.sendall(self.frame(4, 0x1, 0, b""))
                settings_seen = True
            window_seen = window_seen or head[3] == 8

    @staticmethod
    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            got = self.sock.recv(1 << 20)
            if not got:
                raise RuntimeError("the server closed the connection")
            self.buf += got
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def infer(self) -> None:
        stream, self.stream = self.stream, self.stream + 2
        step, data = self.max_frame, self.data
        frames = [self.frame(0, 0x1 if at + step >= len(data) else 0, stream, data[at : at + step])
                  for at in range(0, len(data), step)]
        block = self.first_block if stream == 1 else self.block
        self.sock.sendall(b"".join([self.frame(1, 0x4, stream, block), *frames]))
        answered = False
        while True:
            head = self._read(9)
            kind, flags, on = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = self._read(int.from_bytes(head[:3], "big"))
            if kind == 4 and not flags & 0x1:  # SETTINGS: acknowledge
                self.sock.sendall(self.frame(4, 0x1, 0, b""))
            elif kind == 6 and not flags & 0x1:  # PING: answer
                self.sock.sendall(self.frame(6, 0x1, 0, payload))
            elif kind == 7:
                raise RuntimeError("the server sent GOAWAY")
            elif kind == 0 and on == stream:
                answered = answered or len(payload) > 5
            elif kind == 1:  # every header block, to keep the HPACK table in step
                fields = dict(self.decoder.decode(payload))
                if on == stream and flags & 0x1:  # the call's trailers
                    if fields.get("grpc-status") != "0" or not answered:
                        raise RuntimeError(f"gRPC call failed: {fields}")
                    return

    def close(self) -> None:
        self.sock.close()


class GrpcStream:
    """tritonclient's ``ModelStreamInfer`` (``start_stream`` / ``async_stream_infer``, what perf_analyzer
    ``--streaming`` uses), one request in flight at a time on one open stream: the ``grpc_stream`` row."""

    def __init__(self, port: int, model: str, batch) -> None:
        import queue

        self.model, self.inputs = model, inputs(tgrpc, batch)
        self.answers: queue.Queue = queue.Queue()
        self.client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        self.client.start_stream(callback=lambda result, error: self.answers.put(error))

    def infer(self) -> None:
        self.client.async_stream_infer(self.model, self.inputs)
        if (error := self.answers.get(timeout=10.0)) is not None:
            raise RuntimeError(f"stream answered {error}")

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


