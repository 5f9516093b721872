"""Profile tables for server types we cannot run, from the analytic model (``source="modelled"``).

Produces the same kinds ``recserve profile host`` measures: latency_vs_batch, maxload_vs_workers,
maxload_vs_ways (one table at the most workers, then one per worker count with
``conditions={"workers": w}``: Hera's (workers, ways) lookup), membw_vs_workers and footprint.  The
``efficiency`` tuple is the Hercules search's result on this model, made by the planner (``extra``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from recserve.perfmodel.calibration import Calibration
from recserve.perfmodel.model import Allocation, PerfModel
from recserve.perfmodel.queueing import SizeMix
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ModelSpec, ServerType

LATENCY_BATCHES = (1, 8, 16, 32, 64, 128, 256, 512, 1024)
SUB_BATCHES = (16, 32, 64, 128, 256, 512, 1024)


def _best_batch(pm: PerfModel, spec: ModelSpec, server: ServerType, alloc: Allocation, mix: SizeMix) -> int:
    """DeepRecSys' knob: the sub-batch size giving the highest max load at this allocation."""
    results = pm.evaluate_many(spec, server, [_with(alloc, batch=b) for b in SUB_BATCHES], mix)
    best_q = max(r.max_qps for r in results)
    return SUB_BATCHES[[r.max_qps for r in results].index(best_q)]


def _with(alloc: Allocation, **changes: object) -> Allocation:
    from dataclasses import replace

    return replace(alloc, **changes)


ExtraTables = Callable[[PerfModel, ModelSpec, ServerType, SizeMix], list[ProfileTable]]


def pair_tables(pm: PerfModel, spec: ModelSpec, server: ServerType, mix: SizeMix,
                tables: str = "shared") -> list[ProfileTable]:
    """All modelled tables of one (model, server type)."""
    cal = pm.cal
    out: list[ProfileTable] = []

    def table(kind: str, columns: tuple[str, ...], rows: list[list[float]], **cond: object) -> None:
        out.append(ProfileTable(spec.name, server.name, kind, columns, rows, "modelled", dict(cond)))

    one = Allocation(tables=tables)
    lat = [pm.call_ms(spec, server, b, one) for b in LATENCY_BATCHES]
    table("latency_vs_batch", ("batch", "mean_ms", "p50_ms", "p99_ms"),
          [[b, m, m, m * cal.p99_over_mean] for b, m in zip(LATENCY_BATCHES, lat, strict=True)])
    wmax = max(pm.max_workers(spec, server, one), 1)
    batch = _best_batch(pm, spec, server, _with(one, workers=wmax), mix)
    workers = list(range(1, server.cores + 1))
    results = pm.evaluate_many(spec, server, [_with(one, workers=w, batch=batch) for w in workers], mix)
    per_w = list(zip(workers, results, strict=True))
    table("maxload_vs_workers", ("workers", "max_qps", "batch"), [[w, r.max_qps, batch] for w, r in per_w])
    table("membw_vs_workers", ("workers", "gbs"), [[w, r.membw_gbs] for w, r in per_w])
    table("footprint", ("workers", "mem_gb"), [[w, r.mem_gb] for w, r in per_w])
    if server.llc_ways > 0:
        worker_counts = [wmax] + [w for w in range(1, server.cores + 1) if w != wmax]
        ways = list(range(1, server.llc_ways + 1))
        grid = [(w, k) for w in worker_counts for k in ways]
        loads = pm.evaluate_many(spec, server, [_with(one, workers=w, batch=batch, llc_ways=k) for w, k in grid], mix)
        qps = {wk: r.max_qps for wk, r in zip(grid, loads, strict=True)}
        for i, w in enumerate(worker_counts):
            rows = [[k, qps[(w, k)], w] for k in ways]
            table("maxload_vs_ways", ("ways", "max_qps", "workers"), rows, **({} if i == 0 else {"workers": w}))
    return out


def model_profiles(specs: list[ModelSpec], servers: list[ServerType],
                   calibration: Calibration | str | None = None, sizes: np.ndarray | list[int] | None = None,
                   tables: str = "shared", extra: ExtraTables | None = None,
                   progress: Callable[[str], None] | None = None) -> ProfileSet:
    """Modelled Profile tables for every (model, server type) pair.

    ``extra(pm, spec, server, mix)`` adds tables per pair that other layers derive from this model: the
    Hercules search's ``efficiency`` tuple (``planners.hercules.search.efficiency_tables``) is passed in by
    ``commands/``, so the performance model never runs a planner (data flows one way)."""
    pm = PerfModel(calibration)
    mix = SizeMix.of(sizes)
    out = ProfileSet(meta={"source": "recserve.perfmodel", "calibration": pm.cal.fitted_on or "bundled defaults",
                           "query_sizes_mean": mix.mean, "tables": tables})
    pairs = len(specs) * len(servers)
    for k, (spec, server) in enumerate((spec, server) for spec in specs for server in servers):
        if progress:
            progress(f"modelling {spec.name} on {server.name}" + (f" ({k + 1}/{pairs})" if pairs > 1 else ""))
        for t in pair_tables(pm, spec, server, mix, tables) + (extra(pm, spec, server, mix) if extra else []):
            out.add(t)
    return out


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
