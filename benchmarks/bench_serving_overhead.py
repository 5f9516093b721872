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
    .venv/bin/python -m benchmarks.bench_serving_overhead [--model NAME] [--requests 200] [--mem-scale 0.02]
        [--split-cores] [--no-null]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import tritonclient.grpc as tgrpc

from benchmarks import harness
from benchmarks.common.clients import inputs
from benchmarks.common.overhead import NULL_MODEL, PATHS, log, null_repository, overhead
from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.serving.node.handle import memory_of
from recserve.specs import catalogue_models
from recserve.zoo import sample_batch


def throughput(model_name: str, scale: float, share: bool, workers: int, seconds: float, clients: int,
               batch_size: int) -> dict:
    config = quick_config(model_name, scale=scale, workers=workers, threads=1, share_tables=share,
                          queue_limit=1000)
    with harness.node(config) as server:
        return _throughput(server, config, model_name, scale, share, workers, seconds, clients, batch_size)


def _throughput(server, config, model_name: str, scale: float, share: bool, workers: int, seconds: float,
                clients: int, batch_size: int) -> dict:
    ports = server.ports
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


def headline(result: dict) -> list[dict]:
    """In-process p50 against HTTP's and gRPC's at batch 1 and 256; worker PSS with tables shared vs copied."""
    out = []
    for b in ("1", "256"):
        local = harness.dig(result, "overhead", b, "in_process", "p50_ms")
        for proto in ("http", "grpc"):
            out.append(harness.row(f"{proto} p50 at batch {b} (target: in-process p50)",
                                   harness.dig(result, "overhead", b, proto, "p50_ms"), "ms", local))
    tables = result.get("tables") or []
    shared = next((t for t in tables if t.get("share_tables")), {})
    copied = next((t for t in tables if t.get("share_tables") is False), {})
    out.append(harness.row("worker PSS, tables shared (target: copied)", shared.get("worker_pss_mb_sum"), "MB",
                           copied.get("worker_pss_mb_sum")))
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
    out = harness.write_result(args.out, args, headline(result), result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
