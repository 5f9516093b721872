"""GPU serving (issue #16): in-process CPU vs GPU latency per step, and the served GPU path against it.

Part 1, in process (inputs start as numpy arrays on the host and scores end there, as in a worker):

- ``cpu1`` / ``cpuN``: the zoo model on 1 and on all of the host's threads (the per-table path CPU workers run);
- ``gpu_tables``: the same model moved to the GPU as it is (one ``EmbeddingBag`` per table, pageable copies);
- ``gpu_pageable``: tables fused, inputs copied from pageable host memory;
- ``gpu``: what an accelerator worker runs (``accel.device_runner``: tables fused by ``zoo.fused``, pinned
  staging), and its max abs score difference from the CPU.

Part 2, served: a node whose queries all go to one ``device: cuda`` accelerator worker (``min_items: 1``),
queried with tritonclient over HTTP and gRPC at each ``--served-batches`` size: p50 latency, the ratio to the
in-process ``gpu`` p50 (issue #16's goal: <= 1.3 at batch >= 1024), the accelerator worker's own mean pass time
(``pass_ms``: host-to-device copy from the staging arena, model, scores back; from the node's control API) and
its ratio to the in-process time, and the max abs difference of the served scores from the CPU model's.

    PYTHONPATH=src python3 -m benchmarks.bench_gpu --models hera-din,hera-wnd,hercules-rmc2 --scale 0.01
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from recserve.serving.worker.accel import device_runner
from recserve.specs import get_model
from recserve.zoo import build, sample_batch


def timed(run, arrays: tuple, min_s: float, max_reps: int) -> tuple[float, np.ndarray]:
    """Median wall time (ms) of ``run(arrays)`` after two warm-ups, and its scores."""
    scores = run(arrays)
    run(arrays)
    times: list[float] = []
    end = time.perf_counter() + min_s
    while len(times) < 3 or (time.perf_counter() < end and len(times) < max_reps):
        t0 = time.perf_counter()
        run(arrays)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), scores


def cpu_runner(model: Any, threads: int):
    """The CPU workers' path (``device_runner`` on ``cpu``) on ``threads`` threads."""
    forward = device_runner(model, "cpu")

    def run(arrays: tuple) -> np.ndarray:
        torch.set_num_threads(threads)
        return forward(arrays)
    return run


def gpu_tables_runner(model: Any, device: str):
    """The unfused baseline: the model as it is, moved whole to the GPU, pageable copies."""
    from recserve.zoo.batch import QueryBatch

    moved = copy.deepcopy(model).to(device)

    def run(arrays: tuple) -> np.ndarray:
        return moved(QueryBatch(*(torch.from_numpy(a).to(device) for a in arrays))).cpu().numpy()
    return run


def in_process(args: argparse.Namespace, name: str) -> dict[str, Any]:
    model = build(get_model(name), scale=args.scale)
    threads = len(os.sched_getaffinity(0))
    runners = {"cpu1": cpu_runner(model, 1), f"cpu{threads}": cpu_runner(model, threads)}
    if torch.cuda.is_available():
        runners["gpu_tables"] = gpu_tables_runner(model, args.device)
        runners["gpu_pageable"] = device_runner(copy.deepcopy(model), args.device, pinned=False)
        runners["gpu"] = device_runner(copy.deepcopy(model), args.device)
    rows = []
    with torch.inference_mode():
        for size in args.batches:
            arrays = tuple(sample_batch(model, size, rng=size).as_arrays().values())  # dense, values, lengths
            row: dict[str, Any] = {"batch": size}
            reference = None
            for label, run in runners.items():
                if label.startswith("cpu") and size > args.max_cpu_batch:
                    continue
                ms, scores = timed(run, arrays, args.min_s, args.max_reps)
                row[f"{label}_ms"] = round(ms, 3)
                if label == "cpu1":
                    reference = scores
                elif reference is not None and label.startswith("gpu"):
                    row[f"{label}_max_abs_diff"] = float(np.abs(scores - reference).max())
            rows.append(row)
            print(f"in-process {name:14s} " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    torch.set_num_threads(threads)
    return {"model": name, "rows": rows}


def accel_busy(port: int, name: str) -> tuple[int, float]:
    """(passes, seconds in passes) of the model's accelerator workers so far (the node's control API)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/control/models/{name}", timeout=30) as r:
        accel = json.loads(r.read())["accelerator"]
    return accel["passes"], accel["pass_seconds"]


def served(args: argparse.Namespace, name: str, gpu_ms: dict[int, float]) -> dict[str, Any]:
    """Latency and scores of a node whose every query goes to one GPU accelerator worker."""
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    from recserve.serving import NodeServer, quick_config
    from recserve.serving.wire.codec import triton_inputs
    from recserve.serving.worker.main import build_worker_model

    accel = {"device": args.device, "workers": 1, "min_items": 1, "fuse_items": max(args.served_batches),
             "staging_mb": args.staging_mb}
    config = dataclasses.replace(quick_config(name, scale=args.scale, workers=1,
                                              max_batch_size=max(args.served_batches), accelerator=accel,
                                              deadline_ms=60_000), max_body_bytes=1 << 30)
    rows = []
    with NodeServer(config) as server:
        model = build_worker_model(server.config.models[0]).eval()
        clients = {"http": (thttp, thttp.InferenceServerClient(f"127.0.0.1:{server.ports.http}",
                                                               network_timeout=120, connection_timeout=120)),
                   "grpc": (tgrpc, tgrpc.InferenceServerClient(f"127.0.0.1:{server.ports.grpc}"))}
        for size in args.served_batches:
            batch = sample_batch(model, size, rng=size + 1)
            megabytes = sum(a.nbytes for a in batch.as_arrays().values()) / 1e6
            if megabytes > args.served_max_mb:
                print(f"  served {name}: batch {size} skipped ({megabytes:.0f} MB > --served-max-mb)", file=sys.stderr)
                continue
            with torch.inference_mode():
                reference = model(batch).numpy()
            row: dict[str, Any] = {"batch": size}
            for proto, (module, client) in clients.items():
                inputs = triton_inputs(module, batch.as_arrays())

                def call(_arrays: tuple, client=client, inputs=inputs) -> np.ndarray:
                    return client.infer(name, inputs).as_numpy("scores")
                call(())  # first passes on a link map and pin its staging arena: not counted in pass_ms
                call(())
                passes, busy = accel_busy(server.ports.http, name)
                ms, scores = timed(call, (), args.min_s, args.max_reps)
                passes_after, busy_after = accel_busy(server.ports.http, name)
                pass_ms = (busy_after - busy) / max(1, passes_after - passes) * 1e3  # one query per pass here
                row[f"{proto}_ms"] = round(ms, 3)
                row[f"{proto}_pass_ms"] = round(pass_ms, 3)
                row[f"{proto}_max_abs_diff"] = float(np.abs(scores - reference).max())
                if size in gpu_ms:
                    row[f"{proto}_vs_in_process"] = round(ms / gpu_ms[size], 3)
                    row[f"{proto}_pass_vs_in_process"] = round(pass_ms / gpu_ms[size], 3)
            rows.append(row)
            print(f"  served {name:14s} " + " ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr,
                  flush=True)
        for _, client in clients.values():
            client.close()
    return {"model": name, "rows": rows}


def headline(results: dict) -> list[dict]:
    """Per model, largest batch timed on both: the GPU pass (what accelerator workers run) against 1 CPU thread."""
    out = []
    for part in results["in_process"]:
        both = [r for r in part["rows"] if "gpu_ms" in r and "cpu1_ms" in r]
        if both:
            r = max(both, key=lambda r: r["batch"])
            out.append(harness.row(f"{part['model']} in-process ms, batch {r['batch']}, GPU (target: 1 CPU thread)",
                                   r["gpu_ms"], "ms", r["cpu1_ms"]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="hera-din,hera-wnd,hercules-rmc2,hera-dien,hera-dlrm-a,hera-ncf")
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,64,1024,4096")
    parser.add_argument("--served-batches", default="1,1024,4096")
    parser.add_argument("--max-cpu-batch", type=int, default=4096, help="skip the CPU rows above this batch")
    parser.add_argument("--min-s", type=float, default=0.5, help="time each case for at least this long")
    parser.add_argument("--max-reps", type=int, default=50)
    parser.add_argument("--served-max-mb", type=float, default=128.0, help="skip served queries larger than this")
    parser.add_argument("--staging-mb", type=int, default=128, help="the accelerator links' staging arena")
    parser.add_argument("--no-served", action="store_true", help="part 1 only")
    parser.add_argument("--out", default="results/bench_gpu.json")
    args = parser.parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    args.served_batches = [int(x) for x in args.served_batches.split(",")]
    has_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if has_gpu else "none"
    print(f"== GPU: {device}; {len(os.sched_getaffinity(0))} host cores; scale {args.scale:g}", file=sys.stderr)
    results: dict[str, Any] = {"gpu": device, "cores": len(os.sched_getaffinity(0)), "scale": args.scale,
                               "torch": torch.__version__, "in_process": [], "served": []}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        part = in_process(args, name)
        results["in_process"].append(part)
        if (has_gpu or args.device == "cpu") and not args.no_served:
            gpu_ms = {r["batch"]: r["gpu_ms"] for r in part["rows"] if "gpu_ms" in r}
            results["served"].append(served(args, name, gpu_ms))
        harness.write_result(args.out, args, headline(results), results)  # what finished survives a later failure
    for part in results["served"]:
        for row in part["rows"]:
            print(f"served {part['model']:14s} " + " ".join(f"{k}={v}" for k, v in row.items()))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
