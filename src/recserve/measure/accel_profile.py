"""Profile tables of this host's accelerator, under server ``this-host-cuda`` (``cuda:1`` ->
``this-host-cuda1``), so that the Kairos pool planner, Hercules' search and provisioning read measured GPU rows
beside the CPU's ``this-host`` rows instead of the perfmodel's GPU terms.

- ``latency_vs_batch``: what one accelerator worker's pass costs (``serving.accel.device_runner``: tables fused,
  inputs copied from pinned host memory, scores copied back), host arrays in and scores out, in-process;
- ``footprint``: device memory per accelerator worker (the weights it moves there plus the peak of a pass at the
  largest batch, ``torch.cuda.max_memory_allocated``), times the workers;
- ``maxload_vs_workers``: latency-bounded QPS (open-loop Poisson, production size mix, the model's SLA) of a node
  whose CPU workers forward every query (``min_items: 1``) to 1..N accelerator workers sharing the device, over
  HTTP, the accelerator pool resized through the control API.

On ``device="cpu"`` the same code runs with a CPU accelerator worker (what the tests check without a GPU).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from recserve.errors import RecserveError
from recserve.measure.loadgen import LoadSession
from recserve.measure.profiler import SERVER, Budget, _cycling, _search, _start_rate, _timed, log
from recserve.measure.requests import RequestPool, pool_sizes
from recserve.profiles import ProfileTable
from recserve.specs import SLA, ModelSpec

MAX_WORKERS_PER_DEVICE = 8
"""Accelerator workers sharing one device: each is a process with its own device context (hundreds of MB) and its
own copy of the weights, and their passes time-slice the device, so past a few the curve is flat; 8 leaves room to
see where it flattens."""


def check_device_worker_counts(workers: Sequence[int], what: str = "--device-workers") -> None:
    """Refuse accelerator worker counts past ``MAX_WORKERS_PER_DEVICE``, or past the node's own worker limit
    (``worker_limits``: each is a process with a CPU thread; the control API the search resizes through refuses more).
    ``device_maxload`` starts the largest count at once, so an unbounded one would start that many processes."""
    from recserve.serving.node.control_api import MAX_WORKERS_PER_CORE, worker_limits

    most, cores = worker_limits()
    if workers and max(workers) > min(most, MAX_WORKERS_PER_DEVICE):
        raise RecserveError(f"{what} {max(workers)}: at most {min(most, MAX_WORKERS_PER_DEVICE)} per device on this "
                            f"{cores}-core host ({MAX_WORKERS_PER_DEVICE} per device, {MAX_WORKERS_PER_CORE} per core: "
                            "accelerator workers time-slice one device, each with its own context and weights)")


def device_server(device: str) -> str:
    """The Profile server name of this host's ``device``: ``this-host-cuda``, ``this-host-cuda1``."""
    return f"{SERVER}-{device.replace(':', '')}"


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def device_latency(spec: ModelSpec, scale: float, budget: Budget, batches: Sequence[int], device: str,
                   seed: int = 0) -> tuple[ProfileTable, float]:
    """``latency_vs_batch`` of one accelerator worker's pass on ``device`` and its device memory in GB."""
    from recserve.serving.worker.accel import device_runner
    from recserve.zoo import build_or_load

    model = build_or_load(spec, scale, seed=seed).eval()
    on_gpu = device.startswith("cuda")  # on a CPU there is no device allocator to ask: the weights' bytes instead
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    run = device_runner(model, device)
    rows = []
    with torch.inference_mode():
        for b in batches:
            queries = [tuple(q.as_arrays().values()) for q in RequestPool(spec, scale, (b, b, b), seed).batches()]
            for q in queries:
                run(q)  # warm-up (and, on a GPU, the allocator's blocks for this size)
            ms = _timed(_cycling(run, queries), budget.batch_s, budget.min_reps)
            rows.append([b, float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), len(ms)])
            log(f"{spec.name} on {device}: batch {b:5d}: mean {ms.mean():8.3f} ms  p50 {np.percentile(ms, 50):8.3f}"
                f"  p99 {np.percentile(ms, 99):8.3f}  ({len(ms)} runs)")
    mem_gb = (torch.cuda.max_memory_allocated(device) - base) / 1e9 if on_gpu else _weight_bytes(model) / 1e9
    del run, model
    if on_gpu:
        torch.cuda.empty_cache()
    conditions = {"scale": scale, "device": device, "via": "in-process accelerator pass (serving.accel.device_runner)",
                  "includes": "copies to the device from pinned memory, the fused pass, scores back to the host",
                  "torch": torch.__version__,
                  "device_name": torch.cuda.get_device_name(device) if on_gpu else "cpu"}
    table = ProfileTable(spec.name, device_server(device), "latency_vs_batch",
                         ("batch", "mean_ms", "p50_ms", "p99_ms", "runs"), rows, "measured", conditions)
    return table, mem_gb


@contextlib.contextmanager
def _accelerator_node(spec: ModelSpec, scale: float, device: str, workers: int, front: int,
                      sla: SLA) -> Iterator[Any]:
    """A node whose ``front`` CPU workers forward every query to ``workers`` accelerator workers on ``device``;
    its queries' deadline follows the SLA searched against (the node's default follows the catalogue's)."""
    from recserve.measure.served import LocalServer
    from recserve.serving.node.config import default_deadline_ms

    accel = {"device": device, "workers": workers, "threads": 1, "min_items": 1, "fuse_items": 4096}
    with LocalServer(spec.name, scale, workers=front, queue_limit=64 * front, in_process=True, accelerator=accel,
                     deadline_ms=default_deadline_ms(sla.target_ms)) as server:
        yield server


def device_maxload(spec: ModelSpec, scale: float, budget: Budget, workers: Sequence[int], device: str,
                   lat: ProfileTable, front: int | None = None, mix: str = "production", sla: SLA | None = None,
                   seed: int = 0) -> ProfileTable:
    """``maxload_vs_workers`` over accelerator workers sharing ``device`` (workers = accelerator instances)."""
    sla = sla or spec.sla
    front = front or max(1, min(4, len(os.sched_getaffinity(0)) - 1))
    pool = RequestPool(spec, scale, pool_sizes(mix, 32, seed), seed)
    rows = []
    with _accelerator_node(spec, scale, device, max(workers), front, sla) as server, \
            LoadSession(server.target("http"), pool, warm=True, before_run=server.wait_idle) as session:
        for w in workers:
            server.set_workers(w, stage="accel")
            start = _start_rate(lat, pool.mean_size, w)
            # unmeasured: a new accelerator worker's first passes map and pin its arenas and meet new shapes (a
            # cold first search on a fresh node failed far below the next; docs/measured/gpu-sessions.md)
            session.run(start, budget.probe_s, seed=seed + 7919 * w)
            res, unloaded = _search(session, budget, sla, start, seed)
            hi = res.bracket[1] if np.isfinite(res.bracket[1]) else -1.0
            rows.append([w, res.max_qps, hi, len(res.probes), float(res.converged), unloaded])
            log(f"{spec.name} on {device}: {w} accelerator worker(s): max load {res.max_qps:.2f} qps "
                f"(p{sla.percentile:g} <= {sla.target_ms:g} ms, {len(res.probes)} probes, {res.reason})")
    cond = {"scale": scale, "sizes": mix, "sla_ms": sla.target_ms, "percentile": sla.percentile, "device": device,
            "via": f"node server over HTTP: {front} CPU workers forward every query (min_items 1) to the "
                   "accelerator workers, resized by the control API", "front_workers": front,
            "client": "recserve open-loop load generator on the same host"}
    return ProfileTable(spec.name, device_server(device), "maxload_vs_workers",
                        ("workers", "max_qps", "violating_qps", "probes", "converged", "unloaded_pctl_ms"),
                        rows, "measured", cond)


def device_tables(spec: ModelSpec, scale: float, budget: Budget, batches: Sequence[int], device: str,
                  workers: Sequence[int] = (1, 2), skip_maxload: bool = False, sla: SLA | None = None
                  ) -> list[ProfileTable]:
    """Every accelerator table above for one model."""
    lat, mem_gb = device_latency(spec, scale, budget, batches, device)
    foot = ProfileTable(spec.name, device_server(device), "footprint", ("workers", "mem_gb"),
                        [[w, w * mem_gb] for w in workers], "measured",
                        {"scale": scale, "device": device, "method": "per accelerator worker: device memory of the "
                         "weights it moves there + the peak of a pass at the largest batch "
                         "(torch.cuda.max_memory_allocated; on a CPU the weights' bytes), times the workers"})
    tables = [lat, foot]
    if not skip_maxload:
        tables.append(device_maxload(spec, scale, budget, workers, device, lat, sla=sla))
    return tables
