"""Threads sharing one RMC-style model's tables on this host: measured slowdown against the perfmodel's.

The perfmodel's co-runner term (``perfmodel.corunners``) says a thread's call slows when other threads run beside it
on the same socket: through the LLC (their in-flight data takes LLC from the shared hot rows and weights) and through
memory bandwidth (their DRAM bytes/s and its own against the host's).  This benchmark checks that prediction: a
scaled Hercules DLRM-RMC1 (10 tables, pooling 80) is timed alone, then beside a co-runner serving the *same* model
object (a forked process: the same physical table pages, its own queries, no shared interpreter lock), then alone
again, repeated; the slowdown is the timed thread's median CPU ms per call with / alone.  CPU time does not count
waits, so the slowdown holds cache and memory contention.  A GEMM that fits the L2 is the control (modelled 1.00x):
what two busy cores cost each other here without the memory system.  Table sizes: one that fits the LLC with room
for both, one that fits it once (24 MB of a 32 MB L3: a per-thread share would not hold it), one far larger than
the LLC (DRAM-bound gathers).  The model's number is the same two-thread ratio from ``corunners.back_to_back_ms`` on
this host's catalogue entry (its ``mem_bw_gbs``, and the copy bandwidth measured here).

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_thread_interference [--seconds 1.5] [--repeats 3]
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


def _serve(timer: CallTimer | GemmTimer, stop, busy) -> None:
    """The co-runner: calls on the same model object, its own queries, until ``stop``; its CPU seconds in ``busy``."""
    torch.set_num_threads(1)
    i = 7
    with torch.no_grad():
        while not stop.is_set():
            t0 = time.thread_time()
            timer.model(timer.queries[i % len(timer.queries)])
            busy.value += time.thread_time() - t0
            i += 1


def two_thread_slowdown(timer: CallTimer | GemmTimer, seconds: float) -> tuple[float, float, float, float]:
    """(alone ms, with ms, alone ms, co-runner duty): the timed thread's median CPU ms per call, a co-runner serving
    the same model object on its own queries during the middle leg.  The co-runner is a forked process, so the two
    share the tables' physical pages (nothing writes them) but not the interpreter lock, whose hand-offs would
    otherwise be measured too; its duty is the share of the leg it spent in calls (below 1 when other processes on
    the host took its core)."""
    ctx = mp.get_context("fork")
    stop, busy = ctx.Event(), ctx.Value("d", 0.0)
    before = timer.median_ms(seconds)
    other = ctx.Process(target=_serve, args=(timer, stop, busy), daemon=True)
    other.start()
    try:
        time.sleep(0.3)
        busy.value, start = 0.0, time.perf_counter()
        during = timer.median_ms(seconds)
        duty = busy.value / (time.perf_counter() - start)
    finally:
        stop.set()
        other.join(timeout=60)
        if other.is_alive():
            other.kill()
    after = timer.median_ms(seconds)
    return before, during, after, min(duty, 1.0)


def stream_gbs(threads: int, mb: int = 512, seconds: float = 1.0) -> float:
    """Bytes/s ``threads`` threads copying buffers far larger than the LLC read and write together (numpy copies
    release the GIL): this host's memory bandwidth as two cores see it."""
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


def headline(rows: list[dict]) -> list[dict]:
    """Per table size: the median measured 2-thread slowdown against the model's (catalogue bandwidth)."""
    return [harness.row(f"2-thread slowdown, {r['table_mb']:g} MB tables (target: modelled)",
                        float(np.median(r["measured"])), "x", r["modelled"]["catalogue"])
            for r in rows if "table_mb" in r]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.5, help="timing per bracket leg")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/thread_interference.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pm, host = PerfModel(), calibration_host()
    measured_bw = max(stream_gbs(2), stream_gbs(1))
    hosts = {"catalogue": host, "measured bandwidth": replace(host, mem_bw_gbs=round(measured_bw, 1))}
    full = get_model(MODEL)
    load = os.getloadavg()
    print(f"host: {host.cores} cores, LLC {host.llc_mb:g} MB, catalogue mem_bw {host.mem_bw_gbs:g} GB/s, "
          f"measured copy bandwidth {measured_bw:.1f} GB/s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print("| tables (MB) | batch | measured 2-thread slowdown (each repeat) | co-runner duty | "
          "modelled (catalogue bw) | modelled (measured bw) |")
    print("|---|---|---|---|---|---|")
    rows = []
    legs = [two_thread_slowdown(GemmTimer(), args.seconds) for _ in range(args.repeats)]
    control = [d / ((b + a) / 2) for b, d, a, _ in legs]
    rows.append({"control": "gemm 256", "legs_ms": legs, "measured": control, "modelled": 1.0})
    print(f"| control: GEMM in the L2 | - | {' / '.join(f'{m:.2f}x' for m in control)} | "
          f"{' / '.join(f'{leg[3]:.0%}' for leg in legs)} | 1.00x | 1.00x |", flush=True)
    for mb in TABLE_MB:
        scale = mb * 2**20 / full.embedding_bytes
        spec = scaled_spec(full, scale)
        timer = CallTimer(full, scale, BATCH)
        legs = [two_thread_slowdown(timer, args.seconds) for _ in range(args.repeats)]
        measured = [d / ((b + a) / 2) for b, d, a, _ in legs]
        modelled = {k: back_to_back_ms(pm, spec, h, BATCH, 2) / back_to_back_ms(pm, spec, h, BATCH, 1)
                    for k, h in hosts.items()}
        rows.append({"table_mb": mb, "batch": BATCH, "legs_ms": legs, "measured": measured, "modelled": modelled})
        print(f"| {mb:g} | {BATCH} | {' / '.join(f'{m:.2f}x' for m in measured)} | "
              f"{' / '.join(f'{leg[3]:.0%}' for leg in legs)} | "
              f"{modelled['catalogue']:.2f}x | {modelled['measured bandwidth']:.2f}x |", flush=True)
        del timer
    body = {"model": MODEL, "host": {"llc_mb": host.llc_mb, "mem_bw_gbs": host.mem_bw_gbs,
                                     "measured_copy_gbs": measured_bw}, "load_average": load, "rows": rows}
    out = harness.write_result(args.out, args, headline(rows), body)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
