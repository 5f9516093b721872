"""How close the live zoo gets to this host's limits: gather bandwidth, GEMM FLOP/s, server overhead.

1. Embedding gathers: bytes of embedding rows the sparse part reads per second (rows actually
   gathered by the query x row bytes) vs the host's random-read bandwidth, measured by the
   profiler's microbenchmark (``measure.profiler.random_read_gbs``) twice: over a large array
   (DRAM-bound) and over an array the size of the model's tables (the same working set: at scale
   1e-3 the tables often fit in the LLC), both with the model's row size.
2. Dense part: ``dense_flops_per_item`` x items / time vs the profiler's peak FP32 GEMM GFLOP/s
   (``gemm_gflops``), at batch 64 / 256 / 1024, one thread.
3. Server overhead at batch 1: in-process p50 vs the node server over HTTP and gRPC, with CPU ms per
   request (``benchmarks.common.overhead.overhead``, shared with bench_serving_overhead).

Every rate is given per wall second and per thread-CPU second (``*_cpu``): on a shared host the
wall rate includes time other tenants took the core; the CPU rate does not.  Ratios compare like
with like (wall/wall, CPU/CPU).  Prints tables and writes results/limits.json.

Caveat: the profiler's random-read microbenchmark copies 2^19 rows into an output array
(``index_select``), so it also writes every byte it reads, into a buffer larger than the LLC; the
pooled ``EmbeddingBag`` kernel only reads and sums.  A ratio above 1 therefore means "faster than
that copy", not "faster than DRAM"; it is expected at scale 1e-3 where the tables sit in the LLC.

    .venv/bin/python -m benchmarks.bench_limits [--models hera-dlrm-a,hercules-rmc1,elasticrec-rm3]
        [--scale 1e-3,0.02] [--batches 64,256,1024] [--seconds 1.0] [--array-mb 512] [--requests 200]
        [--overhead-model hercules-rmc1] [--no-overhead] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from recserve.measure.profiler import gemm_gflops, random_read_gbs
from recserve.specs import catalogue_models, get_model
from recserve.zoo import build, sample_batch
from recserve.zoo.flops import dense_flops_per_item

DEFAULT_MODELS = ("hera-dlrm-a", "hercules-rmc1", "elasticrec-rm3")
QUERIES = 4  # distinct queries cycled per batch size (different rows each repetition)


def log(msg: str) -> None:
    print(f"[limits] {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any], seconds: float, min_reps: int = 3) -> tuple[float, float, int]:
    """Median wall ms and median thread-CPU ms per call of ``fn`` (after one warm-up call)."""
    fn()
    wall, cpu = [], []
    end = time.perf_counter() + seconds
    while len(wall) < min_reps or time.perf_counter() < end:
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return float(np.median(wall)), float(np.median(cpu)), len(wall)


def cycling(fn: Callable[..., Any], arguments: list[tuple[Any, ...]]) -> Callable[[], Any]:
    """A no-argument call of ``fn`` on each argument tuple in turn (different rows each repetition)."""
    state = {"k": 0}

    def call() -> Any:
        state["k"] += 1
        return fn(*arguments[state["k"] % len(arguments)])

    return call


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


class HostPeaks:
    """The profiler's microbenchmarks, cached per (array size, row size): measured once each."""

    def __init__(self, array_mb: int, seconds: float) -> None:
        self.array_mb, self.seconds = array_mb, seconds
        self.reads: dict[tuple[int, int], tuple[float, float]] = {}
        self.gemm: tuple[float, float] | None = None

    def random_read(self, array_mb: int, row_bytes: int) -> tuple[float, float]:
        key = (max(1, array_mb), row_bytes)
        if key not in self.reads:
            self.reads[key] = random_read_gbs(key[0], row_bytes, threads=1, seconds=self.seconds)
            log(f"host random read, {key[0]} MiB array, {row_bytes} B rows: "
                f"{self.reads[key][0]:.2f} GB/s wall, {self.reads[key][1]:.2f} GB/s per CPU-s")
        return self.reads[key]

    def gemm_gflops(self) -> tuple[float, float]:
        if self.gemm is None:
            self.gemm = gemm_gflops(1024, threads=1, seconds=self.seconds)
            log(f"host GEMM 1024^3 FP32, 1 thread: {self.gemm[0]:.1f} GFLOP/s wall, {self.gemm[1]:.1f} per CPU-s")
        return self.gemm

    def to_dict(self) -> dict[str, Any]:
        return {"random_read_gbs": [{"array_mb": k[0], "row_bytes": k[1], "gbs": v[0], "gbs_cpu": v[1]}
                                    for k, v in self.reads.items()],
                "gemm_gflops_1t": self.gemm[0] if self.gemm else None,
                "gemm_gflops_1t_cpu": self.gemm[1] if self.gemm else None,
                "method": "recserve.measure.profiler.random_read_gbs / gemm_gflops, 1 thread, median of repeats"}


def gathered_bytes(model: torch.nn.Module, query: Any) -> int:
    """Bytes of embedding rows ``model.sparse(query)`` reads: ids per table x that table's row bytes."""
    per_table = query.lengths.to(torch.int64).sum(dim=1).tolist()
    return sum(int(n) * table.dim * table.weight.element_size() for n, table in zip(per_table, model.tables,
                                                                                     strict=True))


def measure_model(name: str, scale: float, batches: list[int], seconds: float, host: HostPeaks) -> dict[str, Any]:
    spec = get_model(name)
    model = build(spec, scale)
    table_bytes = sum(t.weight.numel() * t.weight.element_size() for t in model.tables)
    row_bytes = sorted({t.dim * t.weight.element_size() for t in model.tables})
    main_row = max(row_bytes)
    flops_item = dense_flops_per_item(spec)
    dram = host.random_read(host.array_mb, main_row)
    same_set = host.random_read(math.ceil(table_bytes / 2**20), main_row)
    gemm = host.gemm_gflops()
    out: dict[str, Any] = {"model": name, "scale": scale, "family": spec.family, "tables": len(model.tables),
                           "table_mb": table_bytes / 2**20, "row_bytes": row_bytes,
                           "dense_flops_per_item": flops_item, "gather": [], "dense": []}
    with torch.inference_mode():
        for b in batches:
            queries = [sample_batch(model, b, rng=1000 * b + i) for i in range(QUERIES)]
            nbytes = float(np.mean([gathered_bytes(model, q) for q in queries]))
            wall, cpu, reps = timed(cycling(model.sparse, [(q,) for q in queries]), seconds)
            gbs, gbs_cpu = nbytes / wall / 1e6, nbytes / cpu / 1e6 if cpu > 0 else None
            out["gather"].append({"batch": b, "bytes_per_query": nbytes, "wall_ms": wall, "cpu_ms": cpu, "runs": reps,
                                  "gbs": gbs, "gbs_cpu": gbs_cpu,
                                  "ratio_dram": ratio(gbs, dram[0]), "ratio_dram_cpu": ratio(gbs_cpu, dram[1]),
                                  "ratio_same_set": ratio(gbs, same_set[0]),
                                  "ratio_same_set_cpu": ratio(gbs_cpu, same_set[1])})
            pooled = [model.sparse(q) for q in queries]
            wall, cpu, reps = timed(cycling(model.dense, [(q.dense, x) for q, x in zip(queries, pooled,
                                                                                      strict=True)]), seconds)
            flops = float(flops_item * b)
            gf, gf_cpu = flops / wall / 1e6, flops / cpu / 1e6 if cpu > 0 else None
            out["dense"].append({"batch": b, "flops_per_query": flops, "wall_ms": wall, "cpu_ms": cpu, "runs": reps,
                                 "gflops": gf, "gflops_cpu": gf_cpu, "ratio_gemm": ratio(gf, gemm[0]),
                                 "ratio_gemm_cpu": ratio(gf_cpu, gemm[1])})
            g, d = out["gather"][-1], out["dense"][-1]
            log(f"{name} batch {b}: gather {g['gbs']:.2f} GB/s ({g['gbs_cpu'] or 0:.2f} per CPU-s), "
                f"dense {d['gflops']:.2f} GFLOP/s ({d['gflops_cpu'] or 0:.2f} per CPU-s)")
    out["host_dram_gbs"], out["host_dram_gbs_cpu"] = dram
    out["host_same_set_gbs"], out["host_same_set_gbs_cpu"] = same_set
    return out


def server_overhead(model: str, scale: float, requests: int) -> dict[str, Any]:
    """Batch-1 rows of benchmarks.common.overhead.overhead (it also runs batch 256), plus CPU ms totals."""
    from benchmarks.common.overhead import overhead

    rows = overhead(model, scale, requests)
    one = rows["1"]
    local_cpu = one["in_process"].get("cpu_ms_per_request_client")
    out: dict[str, Any] = {"model": model, "scale": scale, "requests": requests, "batch": 1,
                           "in_process_p50_ms": one["in_process"]["p50_ms"], "in_process_cpu_ms": local_cpu}
    for proto in ("http", "grpc"):
        r = one[proto]
        cpu = sum(r.get(f"cpu_ms_per_request_{k}", 0.0) for k in ("client", "server_front_end", "workers"))
        out[proto] = {"p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"], "overhead_p50_ms": r["overhead_p50_ms"],
                      "cpu_ms_per_request": cpu, "cpu_ms_client": r.get("cpu_ms_per_request_client"),
                      "cpu_ms_server_front_end": r.get("cpu_ms_per_request_server_front_end"),
                      "cpu_ms_workers": r.get("cpu_ms_per_request_workers"),
                      "cpu_overhead_ms": cpu - local_cpu if local_cpu is not None else None}
    if "worker_ipc" in one:
        out["worker_ipc_overhead_p50_ms"] = one["worker_ipc"]["overhead_p50_ms"]
    out["raw"] = rows
    return out


def print_report(result: dict[str, Any]) -> None:
    print(f"host: load avg {result['load_average_at_start'][0]:.1f} at start, "
          f"{result['load_average_at_end'][0]:.1f} at end; {result['host_cores']} cores; 1 thread throughout")
    print(f"{'model@scale':22} {'batch':>5} {'table MB':>8} {'gather GB/s':>11} {'/CPU-s':>7} {'x DRAM':>7} "
          f"{'x same':>7} {'GFLOP/s':>8} {'/CPU-s':>7} {'x GEMM':>7}")
    for name, m in result["models"].items():
        for g, d in zip(m["gather"], m["dense"], strict=True):
            print(f"{name:22} {g['batch']:5d} {m['table_mb']:8.1f} {g['gbs']:11.2f} {g['gbs_cpu'] or 0:7.2f} "
                  f"{g['ratio_dram'] or 0:7.2f} {g['ratio_same_set'] or 0:7.2f} {d['gflops']:8.2f} "
                  f"{d['gflops_cpu'] or 0:7.2f} {d['ratio_gemm'] or 0:7.2f}")
        print(f"{'':22} host peaks: random read {m['host_dram_gbs']:.2f} GB/s DRAM-sized array, "
              f"{m['host_same_set_gbs']:.2f} GB/s table-sized; GEMM {result['host']['gemm_gflops_1t']:.1f} GFLOP/s")
    o = result.get("overhead")
    if o:
        print(f"server overhead, {o['model']} batch 1: in-process p50 {o['in_process_p50_ms']:.3f} ms "
              f"({o['in_process_cpu_ms']:.3f} CPU ms)")
        for proto in ("http", "grpc"):
            r = o[proto]
            print(f"  {proto:4}: p50 {r['p50_ms']:.3f} ms (+{r['overhead_p50_ms']:.3f}), "
                  f"CPU {r['cpu_ms_per_request']:.3f} ms/request (client {r['cpu_ms_client']:.3f}, "
                  f"front end {r['cpu_ms_server_front_end']:.3f}, "
                  f"worker {r['cpu_ms_workers']:.3f})")


def headline(d: dict) -> list[dict]:
    """Per model: gather GB/s against the host's random read of the same row size and table size, dense GFLOP/s
    against a 1-thread GEMM (once: it does not depend on the scale); the server's batch-1 overhead."""
    dig, row, num = harness.dig, harness.row, harness.num
    out = []
    models = d.get("models") or {}
    first_scale = min((num(m.get("scale")) or 0 for m in models.values()), default=0)
    for key, m in models.items():
        g = max(m.get("gather") or [{}], key=lambda r: r.get("batch", 0))
        dn = max(m.get("dense") or [{}], key=lambda r: r.get("batch", 0))
        out.append(row(f"{key} gather GB/s per CPU-s, batch {g.get('batch', '?')}, {num(m.get('table_mb')) or 0:.0f} "
                       "MiB tables (target: profiler random read, same row size, table-sized array)",
                       g.get("gbs_cpu"), "GB/s", m.get("host_same_set_gbs_cpu")))
        if m.get("scale") == first_scale:
            out.append(row(f"{key} dense GFLOP/s per CPU-s, batch {dn.get('batch', '?')} (target: 1-thread GEMM)",
                           dn.get("gflops_cpu"), "GFLOP/s", dig(d, "host", "gemm_gflops_1t_cpu")))
    o = d.get("overhead")
    if isinstance(o, dict):
        for proto in ("http", "grpc"):
            out.append(row(f"server p50 at batch 1, {proto}, {o.get('model')} (target: in-process p50)",
                           dig(o, proto, "p50_ms"), "ms", o.get("in_process_p50_ms")))
            out.append(row(f"server CPU per request at batch 1, {proto} (client+front end+worker; target: "
                           "in-process)", dig(o, proto, "cpu_ms_per_request"), "CPU ms", o.get("in_process_cpu_ms")))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated catalogue names")
    p.add_argument("--scale", default="1e-3,0.02",
                   help="comma-separated table scales: 1e-3 is the live scale (tables near or inside a server "
                        "LLC); 0.02 puts every default model's tables beyond it (DRAM-bound gathers)")
    p.add_argument("--batches", default="64,256,1024")
    p.add_argument("--seconds", type=float, default=1.0, help="timed seconds per measurement")
    p.add_argument("--array-mb", type=int, default=512, help="array for the DRAM random-read peak (>> LLC)")
    p.add_argument("--requests", type=int, default=200, help="sequential requests per path for the overhead part")
    p.add_argument("--overhead-model", default="hercules-rmc1")
    p.add_argument("--no-overhead", action="store_true")
    p.add_argument("--quick", action="store_true", help="0.3 s per measurement, 256 MiB array, 60 requests")
    p.add_argument("--out", default="results/limits.json")
    args = p.parse_args()
    if args.quick:
        args.seconds, args.array_mb, args.requests = 0.3, 256, 60
    torch.set_num_threads(1)
    known = catalogue_models()
    names = [n for n in args.models.split(",") if n]
    missing = [n for n in names if n not in known]
    if missing:
        log(f"not in the catalogue, skipped: {', '.join(missing)}")
    host = HostPeaks(args.array_mb, args.seconds)
    scales = [float(x) for x in args.scale.split(",") if x]
    result: dict[str, Any] = {"scales": scales, "threads": 1, "host_cores": len(os.sched_getaffinity(0)),
                              "load_average_at_start": os.getloadavg(), "models": {}}
    batches = [int(b) for b in args.batches.split(",")]
    for scale in scales:
        for name in names:
            if name in known:
                log(f"{name} at scale {scale:g}")
                result["models"][f"{name}@{scale:g}"] = measure_model(name, scale, batches, args.seconds, host)
    if not args.no_overhead:
        log(f"server overhead: {args.overhead_model}, {args.requests} requests per path")
        result["overhead"] = server_overhead(args.overhead_model, scales[0], args.requests)
    result["host"] = host.to_dict()
    result["load_average_at_end"] = os.getloadavg()
    print_report(result)
    out = harness.write_result(args.out, args, headline(result), result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
