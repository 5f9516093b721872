"""What the node server costs on top of running the model in-process, path by path (bench_serving_overhead's first
part; bench_limits runs it too): the paths, the null model and :func:`overhead`."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from benchmarks.common.clients import GrpcStream, MinimalGrpc, MinimalH2Grpc, MinimalHttp, inputs
from benchmarks.common.timing import interleaved, stats_reader, summary, timed_cpu
from benchmarks.harness import ServerProcess
from recserve.serving import build_worker_model, quick_config
from recserve.zoo import sample_batch


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ipc_only(config, batches: dict[int, object], counts: dict[int, int]) -> dict[int, dict[str, float]]:
    """The worker hand-off alone: ModelRuntime.infer on a private event loop, no network protocol."""
    import asyncio

    from recserve.serving.node.forkserver import mp_context
    from recserve.serving.node.runtime import ModelRuntime

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


CLIENTS = {  # path -> (the server port it uses, its client)
    "http_minimal": ("http", MinimalHttp), "grpc_minimal": ("grpc", MinimalGrpc), "grpc_stream": ("grpc", GrpcStream),
    "grpc_h2": ("grpc", MinimalH2Grpc)}
PATHS = ("in_process", "per_table", "worker_ipc", "http", "grpc", "grpc_stream", "http_minimal", "grpc_minimal",
         "grpc_h2")


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
