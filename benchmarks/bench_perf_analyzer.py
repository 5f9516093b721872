"""NVIDIA perf_analyzer against a recserve node, unchanged (issue #14): HTTP, gRPC and gRPC streaming.

Starts a node (``--workers`` CPU workers), writes perf_analyzer's ``--input-data`` JSON from the model's query
mix (real shapes and in-range ids: the table-major inputs cannot be random data, see docs/serving.md), then runs
the perf_analyzer binary with a Poisson request distribution at each ``--rates`` rate over HTTP, gRPC and
gRPC streaming, and prints perf_analyzer's own throughput and latency percentiles.  perf_analyzer's PyPI wheel
needs glibc >= 2.38 (the GPU machines have it; this project's 2-core VM, Debian 12, has 2.36):
``bash benchmarks/perf_analyzer_here.sh`` writes ``.pa/bin/perf_analyzer``, the wheel's binary run by a newer
glibc's loader, which this script uses when it is there.

    PYTHONPATH=src python3 -m benchmarks.bench_perf_analyzer --model hera-dlrm-a --workers 8 --rates 500,2000

With ``--concurrency 1`` it keeps one request in flight instead (perf_analyzer's default load mode) and also times
the same queries in process: perf_analyzer's p50 minus that is the serving overhead measured by NVIDIA's C++ client
(batch 1: ``--model hercules-rmc1 --scale 0.001 --workers 1 --mix fixed:1 --concurrency 1``).  The in-process p50
is taken again just before and after each run (the reference is their mean), and each row also shows the worker's
own pass time (the node's ``compute_infer``): overhead = (served p50 - that pass) + (that pass - in process).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.measure.requests import RequestPool
from recserve.specs import get_model

PROTOCOLS = {"http": ["-i", "http"], "grpc": ["-i", "grpc"], "grpc_stream": ["-i", "grpc", "--streaming"]}


def input_data(pool: RequestPool) -> dict[str, Any]:
    """perf_analyzer's ``--input-data`` document: one entry per query, each input with its content and shape."""
    entries = []
    for batch in pool.batches():
        arrays = batch.as_arrays()
        entries.append({name: {"content": a.reshape(-1).tolist(), "shape": list(a.shape)}
                        for name, a in arrays.items()})
    return {"data": entries}


def binary(given: str | None = None) -> str:
    """The perf_analyzer to run: ``given``, else this tree's ``.pa`` wrapper, else one on PATH, else the wheel's."""
    here = ROOT / ".pa" / "bin" / "perf_analyzer"
    for found in (given, str(here) if here.exists() else None, shutil.which("perf_analyzer")):
        if found:
            return found
    try:
        import perf_analyzer
    except ImportError as exc:
        raise SystemExit("perf_analyzer is not installed: pip install perf-analyzer where glibc >= 2.38, "
                         "else bash benchmarks/perf_analyzer_here.sh") from exc
    return str(Path(perf_analyzer.__file__).parent / "bin" / "perf_analyzer")


def run_one(exe: str, model: str, port: int, proto: str, rate: float, data: Path, interval_ms: int,
            work: Path, stability: float, concurrency: int = 0) -> dict[str, Any]:
    """One perf_analyzer run: Poisson arrivals at ``rate``, or ``concurrency`` requests kept in flight."""
    report = work / f"{proto}_{rate:g}_{concurrency}.csv"
    load = [f"--concurrency-range={concurrency}"] if concurrency else [
        "--request-distribution=poisson", f"--request-rate-range={rate:g}"]
    cmd = [exe, "-m", model, "-u", f"127.0.0.1:{port}", *PROTOCOLS[proto], "--input-data", str(data),
           *load, "--measurement-interval",
           str(interval_ms), "--percentile=99", "--max-threads=64", f"--stability-percentage={stability:g}",
           "--max-trials=6", "-f", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    row: dict[str, Any] = {"protocol": proto, "rate": rate, "concurrency": concurrency, "rc": proc.returncode}
    if proc.returncode != 0 or not report.exists():
        row["error"] = (proc.stderr or proc.stdout)[-2000:]
        return row
    with report.open() as f:
        line = next(csv.DictReader(f))
    row["csv"] = line
    row.update(throughput=float(line["Inferences/Second"]),
               p50_ms=float(line["p50 latency"]) / 1e3, p90_ms=float(line["p90 latency"]) / 1e3,
               p99_ms=float(line["p99 latency"]) / 1e3, server_queue_us=float(line.get("Server Queue", 0) or 0),
               server_compute_us=float(line.get("Server Compute Infer", 0) or 0))
    return row


def server_cpu(server: Any, model: str) -> tuple[float, int, int]:
    """The node's workers' CPU seconds, and its ``/stats`` count and ns of ``compute_infer`` for ``model``."""
    from benchmarks.common.timing import cpu_s, stats_reader
    from recserve.serving.node.control_client import ControlClient

    state = ControlClient("127.0.0.1", server.ports.http).get_model(model)
    pids = [w["pid"] for w in state["stages"]["model"]["worker_detail"]]
    count, ns = stats_reader(server.ports.http, model)()
    return sum(cpu_s(pid) for pid in pids), count, ns


def server_cpu_per_query(before: tuple[float, int, int], after: tuple[float, int, int]) -> dict[str, float]:
    """Workers' CPU per query over a run, and of that what is not the model's passes (the node's overhead)."""
    queries = after[1] - before[1]
    if queries <= 0:
        return {}
    cpu_ms = (after[0] - before[0]) / queries * 1e3
    model_ms = (after[2] - before[2]) / queries / 1e6
    return {"queries": queries, "worker_cpu_ms_per_query": cpu_ms, "model_ms_per_query": model_ms,
            "non_model_cpu_ms_per_query": cpu_ms - model_ms}


class InProcess:
    """The pool's queries run in this process by the model as a worker builds it (tables fused), one torch thread:
    the reference the serving overhead is measured against (``bench_serving_overhead``'s ``in_process``).
    Measured again around every perf_analyzer run (``bracketed``): a shared host's speed drifts by 2x within
    minutes, and a reference taken once at the start bent every later run's overhead with it."""

    def __init__(self, model_name: str, scale: float, pool: RequestPool) -> None:
        import torch

        from recserve.serving import build_worker_model, quick_config

        torch.set_num_threads(1)
        self.model = build_worker_model(quick_config(model_name, scale=scale, workers=1, threads=1).models[0])
        self.batches = list(pool.batches())

    def p50(self, rounds: int = 50) -> float:
        import time

        import torch

        samples = []
        with torch.inference_mode():
            for _ in range(5):
                self.model(self.batches[0])
            for _ in range(rounds):
                for batch in self.batches:
                    start = time.perf_counter()
                    self.model(batch)
                    samples.append(time.perf_counter() - start)
        samples.sort()
        return samples[len(samples) // 2] * 1e3


def bracketed(before_ms: float, after_ms: float, row: dict[str, Any]) -> None:
    """``row``'s overhead against the mean of the in-process p50 just before and just after its run, and the worker's
    own pass time beside it: overhead = (served p50 - the worker's pass) + (the worker's pass - in process), the
    serving path's share and the host's slowing of the pass in a worker (cache and core shared with the client)."""
    reference = (before_ms + after_ms) / 2
    row["in_process_p50_ms"], row["in_process_drift_ms"] = reference, after_ms - before_ms
    if "p50_ms" in row:
        row["overhead_p50_ms"] = row["p50_ms"] - reference
    if "model_ms_per_query" in row:
        row["pass_slowdown_ms"] = row["model_ms_per_query"] - reference


def summary(row: dict[str, Any], proto: str, rate: float, concurrency: int) -> str:
    """One run's line: its latencies, and the overhead and CPU split where they were measured."""
    if "error" in row:
        return f"{proto:12s} rate {rate:g}: perf_analyzer rc {row['rc']}: {row['error']}"
    load = f"concurrency {concurrency}" if concurrency else f"rate {rate:7g}/s"
    extra = ""
    if "overhead_p50_ms" in row:
        extra = (f"  overhead p50 {row['overhead_p50_ms']:.3f} ms (in process {row['in_process_p50_ms']:.3f}, the "
                 f"worker's pass {row.get('model_ms_per_query', float('nan')):.3f})")
    if "non_model_cpu_ms_per_query" in row:
        extra += (f"  workers' CPU/query {row['worker_cpu_ms_per_query']:.3f} ms, not the model "
                  f"{row['non_model_cpu_ms_per_query']:.3f}")
    return (f"{proto:12s} {load}  throughput {row['throughput']:8.1f}/s  p50 {row['p50_ms']:7.3f} ms  p90 "
            f"{row['p90_ms']:7.3f} ms  p99 {row['p99_ms']:7.3f} ms{extra}")


def headline(results: dict) -> list[dict]:
    """Each perf_analyzer run's throughput and p99."""
    out = []
    for r in results["runs"]:
        load = f"concurrency {r['concurrency']}" if r.get("concurrency") else f"{r['rate']:g} qps offered"
        out.append(harness.row(f"perf_analyzer {r['protocol']}, {load}: inferences/s", r.get("throughput"), "inf/s"))
        out.append(harness.row(f"perf_analyzer {r['protocol']}, {load}: p99", r.get("p99_ms"), "ms"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hera-dlrm-a")
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mix", default="production")
    parser.add_argument("--queries", type=int, default=32, help="distinct queries in the input data")
    parser.add_argument("--rates", default="200", help="request rates (queries/s), comma separated")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS))
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer's measurement window")
    parser.add_argument("--stability", type=float, default=50.0,
                        help="perf_analyzer's --stability-percentage: Poisson arrivals of a mix of query sizes "
                             "vary more between windows than its default 10%% allows")
    parser.add_argument("--concurrency", type=int, default=0,
                        help="keep this many requests in flight instead of Poisson rates; with 1, also the queries' "
                             "in-process p50 on the model as the worker builds it, and perf_analyzer's p50 minus it "
                             "(the serving overhead measured by NVIDIA's own client), e.g. --mix fixed:1")
    parser.add_argument("--no-forward", action="store_true",
                        help="forward_to_idle: false (a busy worker keeps its queries; one stream uses one worker)")
    parser.add_argument("--perf-analyzer", help="the perf_analyzer binary (default: .pa/bin/perf_analyzer from "
                        "benchmarks/perf_analyzer_here.sh, else PATH, else the perf-analyzer wheel's)")
    parser.add_argument("--out", default="results/bench_perf_analyzer.json")
    args = parser.parse_args()
    from recserve.serving import NodeServer, quick_config

    spec = get_model(args.model)
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=args.queries)
    exe = binary(args.perf_analyzer)
    results: dict[str, Any] = {"model": args.model, "scale": args.scale, "workers": args.workers,
                               "cores": len(os.sched_getaffinity(0)), "perf_analyzer": exe,
                               "forward_to_idle": not args.no_forward,
                               "host_glibc": os.confstr("CS_GNU_LIBC_VERSION"), "runs": []}
    reference = InProcess(args.model, args.scale, pool) if args.concurrency == 1 else None
    last = 0.0  # the latest in-process p50: the one after a run is the one before the next
    if reference is not None:
        results["in_process_p50_ms"] = last = reference.p50()
        print(f"in process (the worker's model, one thread): p50 {results['in_process_p50_ms']:.3f} ms "
              "(measured again around each run)")
    rates = [float(r) for r in args.rates.split(",")] if not args.concurrency else [0.0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "input.json"
        # written before the node starts: encoding a production mix's queries holds the GIL for ~1.5 s, which would
        # starve the node's supervisor (a thread of this process) of its workers' heartbeats
        data.write_text(json.dumps(input_data(pool)))
        with NodeServer(quick_config(args.model, scale=args.scale, workers=args.workers,
                                     deadline_ms=spec.sla.target_ms, forward_to_idle=not args.no_forward)) as server:
            for proto in [p.strip() for p in args.protocols.split(",") if p.strip()]:
                port = server.ports.http if proto == "http" else server.ports.grpc
                for rate in rates:
                    before = server_cpu(server, args.model)
                    row = run_one(exe, args.model, port, proto, rate, data, args.interval_ms, work, args.stability,
                                  args.concurrency)
                    row.update(server_cpu_per_query(before, server_cpu(server, args.model)))
                    if reference is not None:
                        ahead, last = last, reference.p50()
                        bracketed(ahead, last, row)
                    results["runs"].append(row)
                    print(summary(row, proto, rate, args.concurrency), flush=True)
    harness.write_result(args.out, args, headline(results), results)
    print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
