"""NVIDIA perf_analyzer against a recserve node, unchanged (issue #14): HTTP, gRPC and gRPC streaming.

Starts a node (``--workers`` CPU workers), writes perf_analyzer's ``--input-data`` JSON from the model's query
mix (real shapes and in-range ids: the table-major inputs cannot be random data, see docs/serving.md), then runs
the perf_analyzer binary with a Poisson request distribution at each ``--rates`` rate over HTTP, gRPC and
gRPC streaming, and prints perf_analyzer's own throughput and latency percentiles.  perf_analyzer's PyPI wheel
needs glibc >= 2.38 (the GPU machines have it; this project's 2-core VM, Debian 12, has 2.36):
``bash benchmarks/perf_analyzer_here.sh`` writes ``.pa/bin/perf_analyzer``, the wheel's binary run by a newer
glibc's loader, which this script uses when it is there.

    PYTHONPATH=src python3 benchmarks/bench_perf_analyzer.py --model hera-dlrm-a --workers 8 --rates 500,2000
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from recserve.measure.requests import RequestPool  # noqa: E402
from recserve.specs import get_model  # noqa: E402

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
            work: Path, stability: float) -> dict[str, Any]:
    report = work / f"{proto}_{rate:g}.csv"
    cmd = [exe, "-m", model, "-u", f"127.0.0.1:{port}", *PROTOCOLS[proto], "--input-data", str(data),
           "--request-distribution=poisson", f"--request-rate-range={rate:g}", "--measurement-interval",
           str(interval_ms), "--percentile=99", "--max-threads=64", f"--stability-percentage={stability:g}",
           "--max-trials=6", "-f", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    row: dict[str, Any] = {"protocol": proto, "rate": rate, "rc": proc.returncode}
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
    with tempfile.TemporaryDirectory() as tmp, NodeServer(quick_config(
            args.model, scale=args.scale, workers=args.workers, deadline_ms=spec.sla.target_ms,
            forward_to_idle=not args.no_forward)) as server:
        work = Path(tmp)
        data = work / "input.json"
        data.write_text(json.dumps(input_data(pool)))
        for proto in [p.strip() for p in args.protocols.split(",") if p.strip()]:
            port = server.ports.http if proto == "http" else server.ports.grpc
            for rate in [float(r) for r in args.rates.split(",")]:
                row = run_one(exe, args.model, port, proto, rate, data, args.interval_ms, work, args.stability)
                results["runs"].append(row)
                if "error" in row:
                    print(f"{proto:12s} rate {rate:g}: perf_analyzer rc {row['rc']}: {row['error']}")
                else:
                    print(f"{proto:12s} rate {rate:7g}/s  throughput {row['throughput']:8.1f}/s  p50 "
                          f"{row['p50_ms']:7.2f} ms  p90 {row['p90_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms",
                          flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")
    return 0 if all("error" not in r for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
