"""One gRPC channel against a node of several workers: does the node use them all? (issue #14, idle siblings)

tritonclient's ``InferenceServerClient`` opens one HTTP/2 connection; ``--mode unary`` keeps ``--in-flight`` calls
outstanding on it (``async_infer``), ``--mode stream`` sends them on one ``ModelStreamInfer`` stream (what
perf_analyzer ``--streaming`` does).  Each configuration (``forward_to_idle`` on and off, at each ``--workers``
count) serves the same closed loop for ``--seconds``; the script prints throughput, latency, each worker's CPU
seconds and how many queries went to a sibling, and writes JSON.  Configurations run in turn, twice by default
(``--rounds``), so the host's drift falls on all of them.

    .venv/bin/python -m benchmarks.bench_one_channel --workers 1,2 --batch 256 --in-flight 4
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from typing import Any

import numpy as np
import tritonclient.grpc as tgrpc

from benchmarks import harness
from benchmarks.common.clients import inputs
from benchmarks.common.timing import cpu_s
from recserve.serving import NodeServer, build_worker_model, quick_config
from recserve.serving.node.control_client import ControlClient
from recserve.zoo import sample_batch


def closed_loop(client: Any, model: str, batch: Any, mode: str, in_flight: int, seconds: float) -> list[float]:
    """Latencies (s) of the calls completed in ``seconds`` with ``in_flight`` outstanding on one channel."""
    x = inputs(tgrpc, batch)
    window = threading.Semaphore(in_flight)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    errors: queue.Queue = queue.Queue()

    def done(result: Any, error: Any) -> None:
        if error is not None:
            errors.put(error)
        else:
            latencies.append(time.perf_counter() - sent.pop(result.get_response().id))
        window.release()

    if mode == "stream":
        client.start_stream(callback=done)
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        window.acquire()
        n += 1
        sent[str(n)] = time.perf_counter()
        if mode == "stream":
            client.async_stream_infer(model, x, request_id=str(n))
        else:
            client.async_infer(model, x, done, request_id=str(n))
    for _ in range(in_flight):
        window.acquire()
    if mode == "stream":
        client.stop_stream()
    if not errors.empty():
        raise RuntimeError(f"{errors.qsize()} calls failed, first: {errors.get()}")
    return latencies


def run_one(model: str, scale: float, workers: int, forward: bool, batch: Any, mode: str, in_flight: int,
            seconds: float) -> dict[str, Any]:
    config = quick_config(model, scale=scale, workers=workers, forward_to_idle=forward, deadline_ms=10_000)
    with NodeServer(config) as server:
        control = ControlClient("127.0.0.1", server.ports.http)
        pids = [w["pid"] for w in control.get_model(model)["stages"]["model"]["worker_detail"]]
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports.grpc}")
        closed_loop(client, model, batch, mode, in_flight, min(1.0, seconds / 4))  # warm-up
        before, start = [cpu_s(p) for p in pids], time.perf_counter()
        latencies = closed_loop(client, model, batch, mode, in_flight, seconds)
        elapsed = time.perf_counter() - start
        cpu = [round(cpu_s(p) - b, 3) for p, b in zip(pids, before, strict=True)]
        client.close()
        time.sleep(0.1)
        siblings = control.get_model(model).get("siblings", {})
    lat = np.array(latencies) * 1e3
    return {"workers": workers, "forward_to_idle": forward, "qps": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "worker_cpu_s": cpu, "seconds": elapsed, "siblings": siblings}


def headline(rows: list[dict]) -> list[dict]:
    """Mean QPS over rounds per worker count, forward_to_idle on (target: off)."""
    def mean_qps(workers: int, forward: bool) -> float | None:
        qps = [r["qps"] for r in rows if r["workers"] == workers and r["forward_to_idle"] == forward]
        return float(np.mean(qps)) if qps else None

    return [harness.row(f"one channel QPS, {w} workers, forward_to_idle on (target: off)", mean_qps(w, True), "QPS",
                        mean_qps(w, False)) for w in sorted({r["workers"] for r in rows})]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma separated ('all': this host's cores)")
    parser.add_argument("--batch", type=int, default=256, help="items per query")
    parser.add_argument("--in-flight", type=int, default=4, help="calls outstanding on the one channel")
    parser.add_argument("--mode", choices=("unary", "stream"), default="unary")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="results/one_channel.json")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    counts = [cores if w.strip() == "all" else int(w) for w in args.workers.split(",")]
    model = build_worker_model(quick_config(args.model, scale=args.scale).models[0])
    batch = sample_batch(model, args.batch, rng=1)
    rows = []
    print(f"{args.model} @{args.scale:g}, batch {args.batch}, one gRPC channel ({args.mode}), {args.in_flight} in "
          f"flight, {cores} cores")
    print(f"{'round':>5} {'workers':>7} {'forward':>7} {'QPS':>8} {'p50 ms':>8} {'p99 ms':>8}  worker CPU s   "
          "forwarded/returned")
    for r in range(args.rounds):
        for workers in counts:
            for forward in ((True, False) if workers > 1 else (True,)):
                row = run_one(args.model, args.scale, workers, forward, batch, args.mode, args.in_flight,
                              args.seconds)
                row["round"] = r
                rows.append(row)
                s = row["siblings"]
                print(f"{r:>5} {workers:>7} {str(forward):>7} {row['qps']:8.1f} {row['p50_ms']:8.2f} "
                      f"{row['p99_ms']:8.2f}  {row['worker_cpu_s']}  {s.get('forwarded')}/{s.get('returned')}",
                      flush=True)
    print("mean QPS over rounds:")
    for workers in counts:
        for forward in ((True, False) if workers > 1 else (True,)):
            qps = [row["qps"] for row in rows if row["workers"] == workers and row["forward_to_idle"] == forward]
            print(f"  {workers} workers, forward_to_idle {forward}: {np.mean(qps):.1f}")
    harness.write_result(args.out, args, headline(rows), {"model": args.model, "scale": args.scale,
                                                          "batch": args.batch, "mode": args.mode,
                                                          "in_flight": args.in_flight, "cores": cores, "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
