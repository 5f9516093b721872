"""Threads sharing one RMC-style model's tables on this host: measured slowdown and op-parallel speed-up against the
perfmodel's.

**Co-runners.** The perfmodel's co-runner term (``perfmodel.corunners``) says a thread's call slows when other
threads run beside it on the same socket: through the LLC (their in-flight data takes LLC from the shared hot rows
and weights) and through memory bandwidth (their DRAM bytes/s and its own against the host's).  This benchmark
checks that prediction: a scaled Hercules DLRM-RMC1 (10 tables, pooling 80) is timed alone, then beside
``--corunners`` N co-runners serving the *same* model object (forked processes: the same physical table pages, their
own queries, no shared interpreter lock), then alone again, repeated; the slowdown is the timed thread's median CPU
ms per call with / alone.  CPU time does not count waits, so the slowdown holds cache and memory contention.  A
GEMM that fits the L2 is the control (modelled 1.00x): what busy cores cost each other here without the memory
system.  Table sizes: one that fits the LLC with room for both, one that fits it once (24 MB of a 32 MB L3: a
per-thread share would not hold it), one far larger than the LLC (DRAM-bound gathers).  The model's number is the
same ratio from ``corunners.back_to_back_ms`` at N + 1 threads over 1 on this host's catalogue entry (its
``mem_bw_gbs``, and the copy bandwidth measured here).

**Op-parallelism.** One call of ``--op-batch`` items with ``--op-threads`` c intra-op threads: the wall-time
speed-up over one thread, against the perfmodel's ``c / (1 + op_serial (c - 1))`` on the call's compute and gathers
(``PerfModel.latency_ms`` with ``cores_per_worker`` c over 1; the calibration's ``op_serial``).  Hercules' search
trades threads for cores per thread on these two terms (its §III-A: 10 threads x 2 cores against 20 x 1), so a
many-core host's numbers here are what its CPU rows need (``benchmarks/device/round.sh threads``).

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_thread_interference [--seconds 1.5] [--repeats 3]
        [--corunners 1,3,7,15|all] [--op-threads 1,2,4,8,16|all] [--op-batch 256]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import torch

from benchmarks import harness
from recserve.measure.interference import CallTimer, median_call_ms
from recserve.perfmodel import PerfModel
from recserve.perfmodel.corunners import back_to_back_ms
from recserve.perfmodel.cost import scaled_spec
from recserve.perfmodel.hostbench import calibration_host
from recserve.perfmodel.model import Allocation
from recserve.specs import get_model

MODEL = "hercules-rmc1"
TABLE_MB = (6.0, 24.0, 1024.0)  # fits twice, fits once, DRAM-bound
BATCH = 64


class GemmTimer:
    """The control: twenty 256x256 GEMMs a call (operands fit the L2), timed like ``CallTimer``."""

    def __init__(self) -> None:
        self.queries = [(torch.rand(256, 256), torch.rand(256, 256)) for _ in range(4)]

    @staticmethod
    def model(q: tuple[torch.Tensor, torch.Tensor]) -> None:
        for _ in range(20):
            torch.mm(q[0], q[1])

    def median_ms(self, seconds: float) -> float:
        return median_call_ms(self.model, self.queries, seconds)


def _serve(timer: CallTimer | GemmTimer, stop, busy, first: int) -> None:
    """A co-runner: calls on the same model object, its own queries, until ``stop``; its CPU seconds in ``busy``."""
    torch.set_num_threads(1)
    i = first
    with torch.no_grad():
        while not stop.is_set():
            t0 = time.thread_time()
            timer.model(timer.queries[i % len(timer.queries)])
            busy.value += time.thread_time() - t0
            i += 1


def corunner_slowdown(timer: CallTimer | GemmTimer, seconds: float, corunners: int = 1
                      ) -> tuple[float, float, float, float]:
    """(alone ms, with ms, alone ms, co-runners' duty): the timed thread's median CPU ms per call, ``corunners``
    co-runners serving the same model object on their own queries during the middle leg.  Each co-runner is a
    forked process, so all share the tables' physical pages (nothing writes them) but not the interpreter lock,
    whose hand-offs would otherwise be measured too; the duty is the mean share of the leg each spent in calls
    (below 1 when other processes on the host took their cores)."""
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    busy = [ctx.Value("d", 0.0) for _ in range(corunners)]
    before = timer.median_ms(seconds)
    others = [ctx.Process(target=_serve, args=(timer, stop, b, 7 + 3 * k), daemon=True) for k, b in enumerate(busy)]
    for other in others:
        other.start()
    try:
        time.sleep(0.3)
        for b in busy:
            b.value = 0.0
        start = time.perf_counter()
        during = timer.median_ms(seconds)
        duty = sum(b.value for b in busy) / corunners / (time.perf_counter() - start)
    finally:
        stop.set()
        for other in others:
            other.join(timeout=60)
            if other.is_alive():
                other.kill()
    after = timer.median_ms(seconds)
    return before, during, after, min(duty, 1.0)


def op_speedups(timer: CallTimer, threads: list[int], seconds: float) -> dict[int, float]:
    """Wall-time speed-up of one call with c intra-op threads over one thread, for each c of ``threads``."""
    wall = {}
    try:
        for c in sorted({1, *threads}):
            torch.set_num_threads(c)
            wall[c] = timer.median_ms(seconds, clock=time.perf_counter)
    finally:
        torch.set_num_threads(1)
    return {c: wall[1] / wall[c] for c in threads}


def modelled_op_speedup(pm: PerfModel, spec, host, batch: int, c: int) -> float:
    """The perfmodel's speed-up of one call of ``batch`` items on a thread of ``c`` cores over one core."""
    one = pm.latency_ms(spec, host, batch, Allocation(workers=1, cores_per_worker=1, batch=batch))
    return one / pm.latency_ms(spec, host, batch, Allocation(workers=1, cores_per_worker=c, batch=batch))


def stream_gbs(threads: int, seconds: float = 1.0) -> float:
    """Bytes/s ``threads`` threads copying buffers far larger than the LLC read and write together (numpy copies
    release the GIL): this host's memory bandwidth as that many cores see it (2 GB of buffers in all up to 4
    threads, 2 x 128 MB a thread past that)."""
    mb = max(128, 1024 // threads)
    src = [np.ones(mb * 2**20 // 8) for _ in range(threads)]
    dst = [np.empty_like(s) for s in src]
    moved = [0] * threads

    def copy(k: int, until: float) -> None:
        while time.perf_counter() < until:
            np.copyto(dst[k], src[k])
            moved[k] += 2 * src[k].nbytes

    until = time.perf_counter() + seconds
    start = time.perf_counter()
    workers = [threading.Thread(target=copy, args=(k, until)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(moved) / (time.perf_counter() - start) / 1e9


def counts(text: str, most: int, first: int) -> list[int]:
    """A comma-separated list of counts; "all" is ``most``, and counts over ``most`` are dropped."""
    wanted = [most if t.strip() == "all" else int(t) for t in text.split(",") if t.strip()]
    if any(n < first for n in wanted):
        raise SystemExit(f"bench_thread_interference: counts must be at least {first}, got {text!r}")
    return sorted({n for n in wanted if n <= most})


def headline(rows: list[dict]) -> list[dict]:
    """Per table size and co-runner count: the median measured slowdown against the model's (catalogue bandwidth);
    per table size and op-thread count: the measured speed-up against the model's."""
    out = [harness.row(f"{r['corunners'] + 1}-thread slowdown, {r['table_mb']:g} MB tables (target: modelled)",
                       float(np.median(r["measured"])), "x", r["modelled"]["catalogue"])
           for r in rows if "table_mb" in r and "corunners" in r]
    out += [harness.row(f"{r['op_threads']}-core call speed-up, {r['table_mb']:g} MB tables, batch {r['batch']} "
                        "(target: modelled)", r["measured"], "x", r["modelled"])
            for r in rows if "op_threads" in r]
    return out


def corunner_rows(args, pm, hosts, full, corunners: list[int]) -> list[dict]:
    print("| tables (MB) | threads | measured slowdown (each repeat) | co-runners' duty | "
          "modelled (catalogue bw) | modelled (measured bw) |")
    print("|---|---|---|---|---|---|")
    rows = []
    for n in corunners:
        legs = [corunner_slowdown(GemmTimer(), args.seconds, n) for _ in range(args.repeats)]
        control = [d / ((b + a) / 2) for b, d, a, _ in legs]
        rows.append({"control": "gemm 256", "corunners": n, "legs_ms": legs, "measured": control, "modelled": 1.0})
        print(f"| control: GEMM in the L2 | {n + 1} | {' / '.join(f'{m:.2f}x' for m in control)} | "
              f"{' / '.join(f'{leg[3]:.0%}' for leg in legs)} | 1.00x | 1.00x |", flush=True)
    for mb in TABLE_MB:
        scale = mb * 2**20 / full.embedding_bytes
        spec = scaled_spec(full, scale)
        timer = CallTimer(full, scale, BATCH)
        for n in corunners:
            legs = [corunner_slowdown(timer, args.seconds, n) for _ in range(args.repeats)]
            measured = [d / ((b + a) / 2) for b, d, a, _ in legs]
            modelled = {k: back_to_back_ms(pm, spec, h, BATCH, n + 1) / back_to_back_ms(pm, spec, h, BATCH, 1)
                        for k, h in hosts.items()}
            rows.append({"table_mb": mb, "batch": BATCH, "corunners": n, "legs_ms": legs, "measured": measured,
                         "modelled": modelled})
            print(f"| {mb:g} | {n + 1} | {' / '.join(f'{m:.2f}x' for m in measured)} | "
                  f"{' / '.join(f'{leg[3]:.0%}' for leg in legs)} | "
                  f"{modelled['catalogue']:.2f}x | {modelled['measured bandwidth']:.2f}x |", flush=True)
        del timer
    return rows


def op_rows(args, pm, host, full, threads: list[int]) -> list[dict]:
    print(f"\n| tables (MB) | batch {args.op_batch}: cores of the call | measured speed-up (wall) | modelled |")
    print("|---|---|---|---|")
    rows = []
    for mb in TABLE_MB:
        scale = mb * 2**20 / full.embedding_bytes
        spec = scaled_spec(full, scale)
        timer = CallTimer(full, scale, args.op_batch)
        for c, measured in op_speedups(timer, threads, args.seconds).items():
            modelled = modelled_op_speedup(pm, spec, host, args.op_batch, c)
            rows.append({"table_mb": mb, "batch": args.op_batch, "op_threads": c, "measured": measured,
                         "modelled": modelled})
            print(f"| {mb:g} | {c} | {measured:.2f}x | {modelled:.2f}x |", flush=True)
        del timer
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.5, help="timing per bracket leg")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corunners", default="1", help="co-runner counts, comma separated ('all': cores - 1)")
    parser.add_argument("--op-threads", default="2",
                        help="intra-op thread counts of one call, comma separated ('all': the host's cores); "
                             "'' skips the op-parallel part")
    parser.add_argument("--op-batch", type=int, default=256, help="items of the op-parallel call")
    parser.add_argument("--out", default="results/thread_interference.json")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    corunners = counts(args.corunners, cores - 1, 1)
    op_threads = counts(args.op_threads, cores, 1)
    torch.set_num_threads(1)
    pm, host = PerfModel(), calibration_host()
    measured_bw = max(stream_gbs(min(cores, 16)), stream_gbs(1))
    hosts = {"catalogue": host, "measured bandwidth": replace(host, mem_bw_gbs=round(measured_bw, 1))}
    full = get_model(MODEL)
    load = os.getloadavg()
    print(f"host: {cores} cores here (catalogue entry {host.name}: {host.cores} cores, LLC {host.llc_mb:g} MB, "
          f"mem_bw {host.mem_bw_gbs:g} GB/s), measured copy bandwidth {measured_bw:.1f} GB/s; load average "
          f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    rows = corunner_rows(args, pm, hosts, full, corunners) if corunners else []
    rows += op_rows(args, pm, host, full, op_threads) if op_threads else []
    body = {"model": MODEL, "host": {"cores": cores, "catalogue": host.name, "llc_mb": host.llc_mb,
                                     "mem_bw_gbs": host.mem_bw_gbs, "measured_copy_gbs": measured_bw},
            "load_average": load, "rows": rows}
    out = harness.write_result(args.out, args, headline(rows), body)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
