"""What the node server costs on top of running the model in-process, and what shared tables save.

1. Per-request overhead: sequential requests with tritonclient over HTTP (binary tensors) and gRPC
   to a ``recserve serve`` process, vs the same model called in-process (built as the worker builds it, tables
   fused; the ``per_table`` row times the plain per-table model a user would call), at batch 1 and 256 (one
   worker, one thread, no sub-batching); wall-clock latency and CPU per request of client, server
   front end and worker.  ``http_minimal`` repeats HTTP with a bare keep-alive socket client (one write of a
   pre-encoded request, one read), so the server's own share shows apart from tritonclient's; ``grpc_minimal``
   does the same over gRPC (grpcio's channel, request and answer as bytes), and ``grpc_h2`` with a bare HTTP/2
   client (one socket, its header block encoded once, frames read until the call's trailers), whose own CPU is
   about half of grpcio's (0.12-0.18 vs 0.28-0.34 ms a call on the 2-core host).  Each path is timed alone (with
   its CPU, and the server's own model time from ``/stats``), then all paths in turn, one call each per round
   (``interleaved``: the overhead a drifting host cannot bias).  ``grpc_stream``: tritonclient's streaming
   API on one open stream, one request at a time (perf_analyzer's ``--streaming``).  Then the batch-1 rows again
   with the ``null`` model (rows ``1/null``): a TorchScript program served from a model repository that reads the
   same queries (the model's spec, so they are decoded and validated alike) and returns zeros.  Its
   ``server non-model`` is the node's CPU per query besides any model, measured without the model's own pass
   slowing what runs beside it on the core (the real model's row counts that too); its overhead is what a query
   pays besides its model's pass.
2. Tables shared (one shared-memory copy) vs copied per worker: closed-loop throughput with gRPC
   clients and each worker's RSS / PSS.

Prints a table and writes results/serving_overhead.json.  Usage:
    .venv/bin/python benchmarks/bench_serving_overhead.py [--model NAME] [--requests 200] [--mem-scale 0.02]
        [--split-cores] [--no-null]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from recserve.serving import NodeServer, build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.serving.node.runtime import memory_of
from recserve.specs import catalogue_models
from recserve.zoo import sample_batch

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def inputs(mod, batch):
    out = []
    for name, arr in batch.as_arrays().items():
        x = mod.InferInput(name, list(arr.shape), DTYPE_NAMES[arr.dtype])
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1e3
    return {"mean_ms": float(ms.mean()), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "n": len(ms)}


def interleaved(calls: dict[str, Callable[[], object]], n: int) -> dict[str, dict[str, float]]:
    """Latency of every path taken in turn, one call each per round: a host whose speed drifts over a run (a
    shared VM's does, by 2x within minutes) moves every path alike, so their differences hold."""
    samples: dict[str, list[float]] = {path: [] for path in calls}
    for _ in range(n):
        for path, call in calls.items():
            t = time.perf_counter()
            call()
            samples[path].append(time.perf_counter() - t)
    return {path: summary(s) for path, s in samples.items()}


def cpu_s(pid: int) -> float:
    """CPU seconds of a process: its live threads' run time in ns (``/proc/PID/task/*/schedstat``), else user+system
    clock ticks (``/proc/PID/stat``, 10 ms each: over 400 queries that is 0.025 ms a query, as large as the
    differences issue #14 is about)."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:  # the thread ended meanwhile
                pass
        return total / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_cpu(fn, n: int, server_pids: list[int], worker_pids: list[int],
              model_time: Callable[[], tuple[int, int]] | None = None) -> dict[str, float]:
    """Latency summary plus CPU per request of the client (this process), the server front end and the workers.

    CPU time does not include waiting for a core, so it shows the software overhead even on a
    host whose run queue is long (wall-clock latency there is dominated by wake-up delays).  With
    ``model_time`` (the server's own ``compute_infer`` count and ns), the server's CPU per request
    that is not the model's forward pass is reported too: the client's CPU on a 2-core host slows
    the worker's model beside it, which a comparison with the in-process model would count as overhead.
    """
    for _ in range(10):
        fn()
    groups = {"client": [os.getpid()], "server_front_end": server_pids, "workers": worker_pids}
    before = {k: sum(cpu_s(p) for p in pids) for k, pids in groups.items()}
    model_before = model_time() if model_time else (0, 0)
    out = summary(timed(fn, n, warmup=0))
    for k, pids in groups.items():
        out[f"cpu_ms_per_request_{k}"] = (sum(cpu_s(p) for p in pids) - before[k]) / n * 1e3
    if model_time is not None:
        time.sleep(0.1)  # the workers report completed queries every 25 ms
        count, ns = (a - b for a, b in zip(model_time(), model_before, strict=True))
        out["model_ms_per_request"] = ns / max(1, count) / 1e6
        out["server_non_model_cpu_ms_per_request"] = (out["cpu_ms_per_request_server_front_end"]
                                                      + out["cpu_ms_per_request_workers"] - out["model_ms_per_request"])
    return out


def stats_reader(port: int, model: str) -> Callable[[], tuple[int, int]]:
    """The node's ``compute_infer`` (count, ns) for ``model``, from ``/v2/models/{m}/stats``."""
    def read() -> tuple[int, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.load(r)["model_stats"][0]["inference_stats"]["compute_infer"]
        return stats["count"], stats["ns"]
    return read


def timed(fn, n: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def ipc_only(config, batches: dict[int, object], counts: dict[int, int]) -> dict[int, dict[str, float]]:
    """The worker hand-off alone: ModelRuntime.infer on a private event loop, no network protocol."""
    import asyncio

    from recserve.serving.node.runtime import ModelRuntime, mp_context

    async def run() -> dict[int, dict[str, float]]:
        rt = ModelRuntime(config.models[0], mp_context())
        await rt.start()
        out = {}
        try:
            for b, batch in batches.items():
                arrays = batch.as_arrays()
                for _ in range(10):
                    await rt.infer(arrays)
                samples = []
                for _ in range(counts[b]):
                    t = time.perf_counter()
                    await rt.infer(arrays)
                    samples.append(time.perf_counter() - t)
                out[b] = summary(samples)
                out[b]["worker_compute_mean_ms"] = rt.metrics.compute_d.ns / max(1, rt.metrics.compute_d.count) / 1e6
        finally:
            await rt.stop()
        return out

    return asyncio.run(run())


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


CLIENTS = {  # path -> (the server port it uses, its client)
    "http_minimal": ("http", MinimalHttp), "grpc_minimal": ("grpc", MinimalGrpc), "grpc_stream": ("grpc", GrpcStream),
    "grpc_h2": ("grpc", MinimalH2Grpc)}
PATHS = ("in_process", "per_table", "worker_ipc", "http", "grpc", "grpc_stream", "http_minimal", "grpc_minimal",
         "grpc_h2")


class ServerProcess:
    """``recserve serve`` in its own process, so its CPU time is not mixed with the client's (``served``: the name
    the node serves ``model`` under, when ``model`` is a repository path)."""

    def __init__(self, model: str, scale: float, cores: list[int] | None = None,
                 env: dict[str, str] | None = None, served: str | None = None) -> None:
        import re
        import subprocess

        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None  # its workers inherit it
        self.proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "serve", "--model", model,
                                      "--scale", str(scale), "--workers", "1", "--http-port", "0",
                                      "--grpc-port", "0"], stderr=subprocess.PIPE, text=True, preexec_fn=pin,
                                     env=env)
        pattern = re.compile(r"on http://127\.0\.0\.1:(\d+) grpc 127\.0\.0\.1:(\d+)")
        for line in self.proc.stderr:
            m = pattern.search(line)
            if m:
                self.http, self.grpc = int(m.group(1)), int(m.group(2))
                break
        else:
            raise RuntimeError("server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        state = ControlClient("127.0.0.1", self.http).get_model(served or model)
        self.worker_pids = [w["pid"] for w in state["stages"]["model"]["worker_detail"]]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def null_repository(model_name: str, scale: float, directory: Path) -> Path:
    """A repository model that reads ``model_name``'s queries (its spec, rows at ``scale``) and returns zeros: a
    TorchScript program, loaded as a user's would be.  Served, it costs the node what serving any model costs besides
    the model itself (Triton's advice for measuring a server's overhead: an identity or null model)."""
    import dataclasses

    from recserve.specs import get_model
    from recserve.zoo.artifacts import save_spec

    class NullScores(torch.nn.Module):
        def __init__(self, towers: int) -> None:
            super().__init__()
            self.towers = towers

        def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
            return torch.zeros(dense.shape[0], self.towers)

    spec = get_model(model_name)
    tables = tuple(dataclasses.replace(t, rows=r) for t, r in zip(spec.tables, spec.scaled_rows(scale), strict=True))
    spec = dataclasses.replace(spec, name=NULL_MODEL, tables=tables)
    version = directory / NULL_MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    torch.jit.script(NullScores(spec.towers)).save(str(version / "model.pt"))
    save_spec(spec, version / "spec.yaml")
    return version.parent


NULL_MODEL = "null"
WARM_UP = 100  # queries the server answers before a batch size's rows are timed


def overhead(model_name: str, scale: float, requests: int, server_cores: list[int] | None = None,
             batch_sizes: tuple[int, ...] = (1, 256), queries_of: str | None = None) -> dict:
    """Every path's latency and CPU at each batch size (``queries_of``: the model whose queries are sent, when
    ``model_name`` is the null model that reads them)."""
    import recserve.serving.node.repository  # noqa: F401 - a repository path is a model name

    config = quick_config(model_name, scale=scale, workers=1, threads=1)
    served = config.models[0].name
    model = build_worker_model(config.models[0])  # as the worker runs it (tables fused): the overhead's reference
    source = queries_of or model_name
    plain = build_worker_model(quick_config(source, scale=scale, workers=1, threads=1,
                                            fuse_tables=False).models[0])  # the per-table model a user would run
    queries_model = plain if queries_of else model
    server = ServerProcess(model_name, scale, server_cores, served=served)
    log(f"overhead: server pid {server.proc.pid} up on http {server.http} grpc {server.grpc}")
    results: dict = {}
    batches_used: dict = {}
    model_name = served
    try:
        http = thttp.InferenceServerClient(f"127.0.0.1:{server.http}")
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        for batch_size in batch_sizes:
            batch = sample_batch(queries_model, batch_size, rng=batch_size)
            n = requests if batch_size == 1 else max(20, requests // 4)
            http_in, grpc_in = inputs(thttp, batch), inputs(tgrpc, batch)
            with torch.inference_mode():
                local = timed_cpu(lambda b=batch: model(b), n, [], [])
            pids, model_time = ([server.proc.pid], server.worker_pids), stats_reader(server.http, model_name)
            minimal = {path: client(getattr(server, port_of), model_name, batch)
                       for path, (port_of, client) in CLIENTS.items()}
            for _ in range(WARM_UP):  # a TorchScript program (the null model) optimises itself over its first calls
                minimal["http_minimal"].infer()
            calls = {"http": lambda x=http_in: http.infer(model_name, x),
                     "grpc": lambda x=grpc_in: grpc.infer(model_name, x),
                     **{path: c.infer for path, c in minimal.items()}}
            try:
                row = {"in_process": local, **{path: timed_cpu(call, n, *pids, model_time)
                                               for path, call in calls.items()}}
                local_calls = {"in_process": lambda b=batch: model(b)}
                if not queries_of:  # the null model's run has no per-table twin
                    local_calls["per_table"] = lambda b=batch: plain(b)
                with torch.inference_mode():
                    if not queries_of:
                        row["per_table"] = timed_cpu(local_calls["per_table"], n, [], [])
                    paired = interleaved({**local_calls, **calls}, n)
            finally:
                for c in minimal.values():
                    c.close()
            for path in calls:
                row[path]["overhead_p50_ms"] = row[path]["p50_ms"] - local["p50_ms"]
                row[path]["overhead_mean_ms"] = row[path]["mean_ms"] - local["mean_ms"]
                row[path]["interleaved"] = paired[path]
                row[path]["overhead_p50_interleaved_ms"] = paired[path]["p50_ms"] - paired["in_process"]["p50_ms"]
            for path in local_calls:
                row[path]["interleaved"] = paired[path]
            row["request_bytes"] = sum(a.nbytes for a in batch.as_arrays().values())
            results[str(batch_size)] = row
            batches_used[batch_size] = (batch, n)
            log(f"  batch {batch_size}: in-process p50 {local['p50_ms']:.3f} ms, "
                f"http p50 {row['http']['p50_ms']:.3f} ms, grpc p50 {row['grpc']['p50_ms']:.3f} ms")
    finally:
        server.stop()
    if queries_of:
        return results
    ipc = ipc_only(config, {b: v[0] for b, v in batches_used.items()}, {b: v[1] for b, v in batches_used.items()})
    for b, row in ipc.items():
        results[str(b)]["worker_ipc"] = row
        results[str(b)]["worker_ipc"]["overhead_p50_ms"] = row["p50_ms"] - results[str(b)]["in_process"]["p50_ms"]
    return results


def throughput(model_name: str, scale: float, share: bool, workers: int, seconds: float, clients: int,
               batch_size: int) -> dict:
    config = quick_config(model_name, scale=scale, workers=workers, threads=1, share_tables=share,
                          queue_limit=1000)
    server = NodeServer(config)
    ports = server.start()
    log(f"throughput share_tables={share}: server up")
    model = build_worker_model(config.models[0]) if not share else server.core.models[model_name].shared_model
    batches = [sample_batch(model, batch_size, rng=i) for i in range(4)]
    done = [0] * clients
    errors = [0] * clients
    stop = threading.Event()

    def run(k: int) -> None:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
        ins = [inputs(tgrpc, b) for b in batches]
        i = k
        while not stop.is_set():
            try:
                client.infer(model_name, ins[i % len(ins)])
                done[k] += 1
            except Exception:  # noqa: BLE001
                errors[k] += 1
            i += 1

    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(clients)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # warm up
        start_count, t0 = sum(done), time.perf_counter()
        time.sleep(seconds)
        count, elapsed = sum(done) - start_count, time.perf_counter() - t0
        state = ControlClient("127.0.0.1", ports.http).get_model(model_name)
        stop.set()
        for t in threads:
            t.join(60)
        detail = state["stages"]["model"]["worker_detail"]
        workers_mem = [{k: w[k] for k in ("pid", "rss_mb", "pss_mb")} for w in detail]
        server_mem = memory_of(os.getpid())
    finally:
        server.stop()
    table_mb = catalogue_models()[model_name].scaled_embedding_bytes(scale) / 1e6
    out = {"share_tables": share, "workers": workers, "clients": clients, "batch": batch_size,
           "qps": count / elapsed, "items_per_s": count * batch_size / elapsed, "errors": sum(errors),
           "table_mb_per_copy": table_mb, "worker_memory": workers_mem,
           "worker_rss_mb_sum": sum(w["rss_mb"] for w in workers_mem),
           "worker_pss_mb_sum": sum(w["pss_mb"] for w in workers_mem),
           "server_process": server_mem}
    log(f"  share={share}: {out['qps']:.1f} qps, worker PSS sum {out['worker_pss_mb_sum']:.1f} MB, "
        f"RSS sum {out['worker_rss_mb_sum']:.1f} MB (tables {table_mb:.1f} MB per copy)")
    return out


def main() -> int:
    dlrm = sorted(n for n, s in catalogue_models().items() if s.family == "dlrm")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hercules-rmc1" if "hercules-rmc1" in dlrm else dlrm[0])
    parser.add_argument("--scale", type=float, default=1e-3, help="table scale for the overhead runs")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--mem-scale", type=float, default=0.02, help="table scale for shared-vs-copied")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--out", default="results/serving_overhead.json")
    parser.add_argument("--no-null", action="store_true",
                        help="skip the null-model rows (the same queries answered by a program returning zeros)")
    parser.add_argument("--split-cores", action="store_true",
                        help="overhead runs with the server on the first core and this client (and the in-process "
                             "model) on the others, as a remote client would be; default: all share every core")
    args = parser.parse_args()
    torch.set_num_threads(1)
    server_cores = None
    if args.split_cores:
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < 2:
            parser.error("--split-cores needs at least two cores")
        server_cores = cores[:1]
        os.sched_setaffinity(0, cores[1:])
    result = {"model": args.model, "host_cores": len(os.sched_getaffinity(0)) + len(server_cores or []),
              "server_cores": server_cores, "load_average_at_start": os.getloadavg(), "overhead_scale": args.scale}
    result["overhead"] = overhead(args.model, args.scale, args.requests, server_cores)
    if not args.no_null:
        with tempfile.TemporaryDirectory(prefix="recserve-null-") as repo:
            null = null_repository(args.model, args.scale, Path(repo))
            result["null_model"] = overhead(str(null), args.scale, args.requests, server_cores, (1,), args.model)
    if server_cores:
        os.sched_setaffinity(0, server_cores + sorted(os.sched_getaffinity(0)))  # the table runs use every core
    result["tables"] = [throughput(args.model, args.mem_scale, share, args.workers, args.seconds, 4, 64)
                        for share in (True, False)]
    result["load_average_at_end"] = os.getloadavg()
    print(f"model {args.model}  (host cores {result['host_cores']}, load avg {result['load_average_at_start'][0]:.1f})")
    print("overhead p50 = p50 minus the in-process p50, each path timed alone; 'interleaved': all paths in turn, "
          "one call each per round (robust to the host's drift).  in_process runs the model as the worker does (tables "
          "fused); per_table is the plain model, in process")
    print(f"{'batch':>5} {'path':>12} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'overhead p50 ms':>16} "
          f"{'interleaved':>11} "
          f"{'CPU ms/req: client':>19} {'front end':>10} {'worker':>8} {'model':>7} {'server non-model':>17}")
    rows = [(str(b), row) for b, row in result["overhead"].items()]
    rows += [(f"{b}/null", row) for b, row in result.get("null_model", {}).items()]
    for b, row in rows:
        for path in PATHS:
            if path not in row:
                continue
            r = row[path]
            extra = (f"{r['overhead_p50_ms']:16.3f}" if "overhead_p50_ms" in r else f"{'':>16}") + (
                f" {r['overhead_p50_interleaved_ms']:11.3f}" if "overhead_p50_interleaved_ms" in r else f" {'':>11}")
            cpu = (f"{r['cpu_ms_per_request_client']:19.3f} {r['cpu_ms_per_request_server_front_end']:10.3f} "
                   f"{r['cpu_ms_per_request_workers']:8.3f}" if "cpu_ms_per_request_workers" in r else "")
            if "model_ms_per_request" in r:
                cpu += f" {r['model_ms_per_request']:7.3f} {r['server_non_model_cpu_ms_per_request']:17.3f}"
            print(f"{b:>5} {path:>12} {r['mean_ms']:9.3f} {r['p50_ms']:9.3f} {r['p99_ms']:9.3f} {extra} {cpu}")
    if "null_model" in result:
        print(f"batch 'N/null': the same queries answered by {NULL_MODEL!r}, a TorchScript program returning zeros "
              "(served from a model repository): its 'server non-model' is what the node costs besides any model, "
              "its overhead what a query pays besides its model's pass")
    print(f"\ntables at scale {args.mem_scale:g}, {args.workers} workers, 4 gRPC clients, batch 64:")
    print(f"{'share':>6} {'qps':>8} {'items/s':>9} {'RSS MB/worker':>14} {'PSS MB/worker':>14} {'table MB/copy':>14}")
    for r in result["tables"]:
        n = max(1, len(r["worker_memory"]))
        print(f"{str(r['share_tables']):>6} {r['qps']:8.1f} {r['items_per_s']:9.0f} {r['worker_rss_mb_sum'] / n:14.1f} "
              f"{r['worker_pss_mb_sum'] / n:14.1f} {r['table_mb_per_copy']:14.1f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
