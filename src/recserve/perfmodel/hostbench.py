"""A small in-process latency measurement of zoo models on this host, for calibrating the perfmodel.

``recserve profile host`` (the measure/ area) is the full profiler; this helper only times
``model(batch)`` for a few batch sizes with one intra-op thread so the calibration and its tests
do not depend on a running server.  Tables carry ``conditions={"scale", "threads"}`` and the
ProfileSet's meta keeps each measured spec so non-catalogue models can be re-read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ModelSpec, ServerType, get_server, to_dict

HOST = "this-host"


def calibration_host() -> ServerType:
    """``this-host`` with the clock and SIMD width read from /proc/cpuinfo (the catalogue entry keeps
    defaults there): the fitted compute efficiency is relative to this peak."""
    host = get_server(HOST)
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return host
    mhz = [float(line.split(":")[1]) for line in info.splitlines() if line.startswith("cpu MHz")]
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    fpc = 32 if " avx512f" in flags else 16 if " avx2" in flags else 8  # one FMA unit of that width, FP32
    return replace(host, freq_ghz=round(mhz[0] / 1000, 2) if mhz else host.freq_ghz, flops_per_cycle=fpc)


def time_model(spec: ModelSpec, batches: Iterable[int], scale: float, budget_s: float = 0.25,
               min_reps: int = 5, max_reps: int = 200, seed: int = 0, max_call_ms: float = 250.0,
               rounds: int = 3) -> list[list[float]]:
    """Rows ``[batch, mean_ms, p50_ms, p99_ms]`` of ``forward`` on fresh random queries.

    Time is the calling thread's CPU time (``time.thread_time``; torch runs one intra-op thread), not
    wall time: on a shared host wall time counts the slices other processes ran in, and that bias grows
    with the call's length.  On an idle host the two agree.  Each batch size is timed in ``rounds``
    interleaved rounds and the round with the lowest median is kept.  Batches after one
    whose mean exceeds ``max_call_ms`` are skipped (keeps the helper quick).
    """
    from recserve.zoo import build, sample_batch

    model = build(spec, scale=scale, seed=seed)
    rng = np.random.default_rng(seed)
    sizes = list(batches)
    best: dict[int, np.ndarray] = {}
    with torch.no_grad():
        # enough distinct queries that their mean pooling is the spec's (multi-hot lengths vary per item)
        queries = {b: [sample_batch(model, b, rng) for _ in range(max(4, min(64, -(-256 // b))))] for b in sizes}
        for _ in range(max(1, rounds)):
            for b in sizes:
                if b not in queries:
                    continue
                n = len(queries[b])
                for q in queries[b][:2]:
                    model(q)  # warm-up
                times: list[float] = []
                start = time.perf_counter()
                while len(times) < max_reps and (len(times) < max(min_reps, min(n, max_reps))
                                                  or time.perf_counter() - start < budget_s / rounds):
                    q = queries[b][len(times) % n]
                    t0 = time.thread_time()
                    model(q)
                    times.append((time.thread_time() - t0) * 1e3)
                arr = np.array(times)
                if b not in best or np.median(arr) < np.median(best[b]):
                    best[b] = arr
                if arr.mean() > max_call_ms:  # too slow to time the larger batches
                    for later in sizes[sizes.index(b) + 1:]:
                        queries.pop(later, None)
    return [[float(b), float(best[b].mean()), float(np.percentile(best[b], 50)), float(np.percentile(best[b], 99))]
            for b in sizes if b in best and b in queries]


def measure_stream_gbs(matrix_mb: float = 128.0, reps: int = 5) -> float:
    """Bytes/s one core streams dense weights from DRAM: a GEMV over a matrix larger than the LLC,
    best of ``reps`` (what a batch-1 call of a model with huge MLPs does)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cols = 4096
        w = torch.rand(int(matrix_mb * 2**20 / 4 / cols), cols)
        v = torch.rand(1, w.shape[0])
        best = float("inf")
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            v @ w
            best = min(best, time.perf_counter() - t0)
        return w.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(previous)


def measured_constants(profiles: ProfileSet) -> dict[str, float]:
    """Calibration constants measured directly (not fitted) and stored with a hostbench ProfileSet."""
    value = profiles.meta.get("stream_gbs_per_core")
    return {"stream_gbs_per_core": float(value)} if value else {}


def measure_host(specs: Iterable[ModelSpec], batches: Iterable[int] = (1, 8, 32, 128, 512),
                 scale: float | dict[str, float] = 1e-3, threads: int = 1, budget_s: float = 0.25,
                 progress: Callable[[str], None] | None = None, max_call_ms: float = 250.0,
                 stream_gbs: float | None = None) -> ProfileSet:
    """latency_vs_batch tables (source="measured") of ``specs`` run in-process on this host, with the
    weight-streaming rate in the meta (``stream_gbs`` when the caller measured it already)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    out = ProfileSet(meta={"source": "recserve.perfmodel.hostbench", "threads": threads, "specs": {},
                           "stream_gbs_per_core": stream_gbs or measure_stream_gbs()})
    try:
        for spec in specs:
            s = scale.get(spec.name, 1e-3) if isinstance(scale, dict) else scale
            if progress:
                progress(f"timing {spec.name} at scale {s:g}")
            rows = time_model(spec, tuple(batches), s, budget_s, max_call_ms=max_call_ms)
            out.add(ProfileTable(spec.name, HOST, "latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
                                 rows, "measured", {"scale": s, "threads": threads}))
            out.meta["specs"][spec.name] = json.loads(json.dumps(to_dict(spec)))  # tuples -> lists
    finally:
        torch.set_num_threads(previous)
    return out
