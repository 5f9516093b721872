"""Two node servers side by side, one from another source tree: worker CPU and latency per query, A/B.

A code change to the worker's query path moves its CPU per query by tens of microseconds, less than the drift of
a shared host within minutes.  So both servers run at once (one worker each, pinned to the same core) and one
client sends sequential queries to each in turn, in ``--rounds`` turns that alternate which goes first; each
server's CPU is read over its own turns only, and so is the time its model's passes took (the node's
``compute_infer``): worker CPU minus that is what the rest of the worker costs.  The other tree is any checkout of
recserve, e.g. ``git worktree add /tmp/base HEAD~1``.

Prints both rows and their difference and writes results/ab_serving.json.  Usage:
    .venv/bin/python -m benchmarks.bench_ab_serving --base-src /tmp/base/src
        [--protocol http|http_json|grpc|grpc_stream|grpc_h2] [--batch 1] [--seconds 16] [--rounds 4]

``http_json`` sends the tensors as plain JSON ``data`` lists and takes JSON scores back (what curl, and tritonclient
with ``binary_data=False``, send: ``json.dumps``' default spelling), on the bare HTTP client.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.common.clients import GrpcStream, MinimalGrpc, MinimalH2Grpc, MinimalHttp
from benchmarks.common.timing import cpu_s, stats_reader
from benchmarks.harness import ServerProcess
from recserve.serving import build_worker_model, quick_config
from recserve.zoo import sample_batch


class MinimalHttpJson(MinimalHttp):
    """:class:`MinimalHttp` with a plain-JSON request (no binary extension) and a JSON answer."""

    def __init__(self, port: int, model: str, batch) -> None:
        import socket

        from recserve.measure.http_client import encode_post
        from recserve.serving.wire.codec import DATATYPES

        inputs = [{"name": name, "shape": list(a.shape), "datatype": DATATYPES[a.dtype], "data": a.reshape(-1).tolist()}
                  for name, a in batch.as_arrays().items()]
        body = json.dumps({"inputs": inputs}).encode()
        self.request = encode_post("127.0.0.1", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


CLIENTS = {"http": MinimalHttp, "http_json": MinimalHttpJson, "grpc": MinimalGrpc, "grpc_stream": GrpcStream,
           "grpc_h2": MinimalH2Grpc}


def started(model: str, scale: float, core: int, src: str | None) -> ServerProcess:
    """A server whose processes import recserve from ``src`` (None: this tree)."""
    return ServerProcess(model, scale, [core], None if src is None else {**os.environ, "PYTHONPATH": src})


def run(args: argparse.Namespace) -> dict:
    model = build_worker_model(quick_config(args.model, scale=args.scale, workers=1, threads=1).models[0])
    batch = sample_batch(model, args.batch, rng=1)
    servers = {"base": started(args.model, args.scale, args.server_core, args.base_src),
               "this": started(args.model, args.scale, args.server_core, None)}
    os.sched_setaffinity(0, [args.client_core])
    client_of = CLIENTS[args.protocol]
    try:
        clients = {k: client_of(s.http if args.protocol.startswith("http") else s.grpc, args.model, batch)
                   for k, s in servers.items()}
        for c in clients.values():
            for _ in range(args.warmup):
                c.infer()
        latency: dict[str, list[float]] = {k: [] for k in servers}
        cpu = dict.fromkeys(servers, 0.0)
        supervisor_cpu = dict.fromkeys(servers, 0.0)  # the node's server process (stats, watchdog): also on a core
        passes = {k: [0, 0] for k in servers}  # the model's passes: count, ns (the node's compute_infer)
        readers = {k: stats_reader(s.http, args.model) for k, s in servers.items()}
        for r in range(args.rounds):
            for k in (("base", "this") if r % 2 == 0 else ("this", "base")):
                pid, client = servers[k].worker_pids[0], clients[k]
                before, model_before, start = cpu_s(pid), readers[k](), time.perf_counter()
                supervisor_before = cpu_s(servers[k].proc.pid)
                while time.perf_counter() - start < args.seconds / args.rounds / 2:
                    t = time.perf_counter()
                    client.infer()
                    latency[k].append(time.perf_counter() - t)
                cpu[k] += cpu_s(pid) - before
                supervisor_cpu[k] += cpu_s(servers[k].proc.pid) - supervisor_before
                time.sleep(0.1)  # the worker reports its passes every 25 ms
                passes[k] = [a + now - was for a, now, was in zip(passes[k], readers[k](), model_before, strict=True)]
        for c in clients.values():
            c.close()
    finally:
        for s in servers.values():
            s.stop()
    rows = {k: {"queries": len(latency[k]), "p50_ms": float(np.median(latency[k]) * 1e3),
                "worker_cpu_ms_per_query": cpu[k] / len(latency[k]) * 1e3,
                "supervisor_cpu_ms_per_query": supervisor_cpu[k] / len(latency[k]) * 1e3,
                "model_ms_per_query": passes[k][1] / max(1, passes[k][0]) / 1e6} for k in servers}
    return {"model": args.model, "scale": args.scale, "protocol": args.protocol, "batch": args.batch,
            "base_src": args.base_src, "rows": rows,
            "delta_worker_cpu_ms": rows["this"]["worker_cpu_ms_per_query"] - rows["base"]["worker_cpu_ms_per_query"],
            "delta_p50_ms": rows["this"]["p50_ms"] - rows["base"]["p50_ms"]}


def headline(result: dict) -> list[dict]:
    """This tree's worker CPU and p50 per query against the base tree's, from the same alternating run."""
    this, base = result["rows"]["this"], result["rows"]["base"]
    return [harness.row(f"worker CPU per query, {result['protocol']}, batch {result['batch']} (target: base tree)",
                        this["worker_cpu_ms_per_query"], "ms", base["worker_cpu_ms_per_query"]),
            harness.row(f"p50, {result['protocol']}, batch {result['batch']} (target: base tree)", this["p50_ms"], "ms",
                        base["p50_ms"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-src", required=True, help="the other tree's src/ directory")
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--protocol", choices=tuple(CLIENTS), default="http",
                        help="the client: bare HTTP (binary tensors or plain JSON), grpcio unary, tritonclient "
                             "stream_infer, or a bare HTTP/2 one")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=16.0, help="client time over both servers")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--server-core", type=int, default=1)
    parser.add_argument("--client-core", type=int, default=0)
    parser.add_argument("--out", default="results/ab_serving.json")
    args = parser.parse_args()
    if not (Path(args.base_src) / "recserve").is_dir():
        parser.error(f"--base-src {args.base_src}: no recserve package there")
    result = run(args)
    for k, row in result["rows"].items():
        print(f"{k:5s} p50 {row['p50_ms']:.3f} ms, worker CPU {row['worker_cpu_ms_per_query']:.3f} ms per query, "
              f"of which its model's passes {row['model_ms_per_query']:.3f} ms; supervisor CPU "
              f"{row['supervisor_cpu_ms_per_query']:.3f} ms per query ({row['queries']} queries)")
    print(f"this - base: worker CPU {result['delta_worker_cpu_ms'] * 1e3:+.0f} us, p50 "
          f"{result['delta_p50_ms'] * 1e3:+.0f} us per query")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    harness.write_result(args.out, args, headline(result), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
