"""A sink: an HTTP server that answers every v2 infer request at once with one fixed response.

It exists to measure the load generator itself: whatever latency, send lag and CPU remain against
it are the generator's (and the loopback's).  So it must be cheaper than the generator: a raw
asyncio protocol (no HTTP framework) that only finds each request's end (headers + Content-Length)
and writes a pre-built binary-extension response (``scores`` FP32 ``[batch, 1]`` of zeros), in
``procs`` processes sharing the port (SO_REUSEPORT: the kernel spreads connections between them).
Requests on one connection may be pipelined; HTTP/1.1 keep-alive only, no chunked bodies.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import re
import socket
import time
from typing import Any

CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


def fixed_response(batch: int = 1, model: str = "sink") -> bytes:
    """The whole HTTP response the sink sends: a v2 binary-extension infer answer of zeros."""
    raw = bytes(4 * batch)
    head = json.dumps({"model_name": model, "outputs": [{"name": "scores", "datatype": "FP32", "shape": [batch, 1],
                                                         "parameters": {"binary_data_size": len(raw)}}]},
                      separators=(",", ":")).encode()
    body = head + raw
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nInference-Header-Content-Length: "
            f"{len(head)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


class _SinkProtocol(asyncio.Protocol):
    """Answer each complete request in the buffer with the fixed response."""

    def __init__(self, response: bytes) -> None:
        self.response, self.buffer, self.transport = response, bytearray(), None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            match = CONTENT_LENGTH.search(self.buffer, 0, end + 2)
            total = end + 4 + (int(match.group(1)) if match else 0)
            if len(self.buffer) < total:
                return
            del self.buffer[:total]
            self.transport.write(self.response)


def _sink_main(port: int, batch: int, ready: Any, stop: Any) -> None:
    """One sink process: serve on ``port`` (shared) until ``stop`` is set."""

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        response = fixed_response(batch)
        server = await loop.create_server(lambda: _SinkProtocol(response), "127.0.0.1", port, reuse_port=True,
                                          backlog=1024)
        ready.release()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        server.close()

    asyncio.run(serve())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SinkServer:
    """``with SinkServer(procs=2) as url: ...``: sink processes on a free loopback port."""

    def __init__(self, procs: int = 1, batch: int = 1, port: int = 0) -> None:
        self.procs, self.batch, self.port = procs, batch, port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._procs: list[Any] = []
        self._stop: Any = None

    def __enter__(self) -> str:
        ctx = mp.get_context("spawn")
        self._stop, ready = ctx.Event(), ctx.Semaphore(0)
        try:
            for j in range(self.procs):
                proc = ctx.Process(target=_sink_main, args=(self.port, self.batch, ready, self._stop),
                                   name=f"recserve-sink-{j}", daemon=True)
                proc.start()
                self._procs.append(proc)
            deadline = time.monotonic() + 60.0
            for _ in range(self.procs):
                if not ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise RuntimeError("sink process did not start within 60 s")
        except BaseException:
            self.__exit__()
            raise
        return self.url

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop.set()
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._procs = []


def process_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` have used so far, from ``/proc/<pid>/stat``."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / _CLK_TCK


_CLK_TCK = __import__("os").sysconf("SC_CLK_TCK")
