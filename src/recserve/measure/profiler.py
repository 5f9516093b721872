"""Profile tables measured on this host (``server="this-host"``, ``source="measured"``).

What is measured, and how:

- host microbenchmarks (ProfileSet ``meta["host"]``): random-read bandwidth (``index_select`` of
  random 64-byte rows from an array several times the LLC), sequential-read bandwidth, and peak
  FP32 GEMM GFLOP/s, each with 1 thread and with every core;
- ``latency_vs_batch``: one worker (one intra-op thread) running whole queries in-process,
  repeated; mean, p50, p99 per batch size;
- ``maxload_vs_workers``: the latency-bounded QPS (open-loop Poisson load, production size mix,
  the model's SLA) with 1..cores workers, through the real node server over HTTP (``via="server"``,
  workers resized through its control API) or an in-process process pool (``via="inprocess"``);
- ``footprint``: proportional set size (PSS, from ``/proc/<pid>/smaps_rollup``) of those workers;
- ``membw_vs_workers``: an *estimate*, not a counter reading: max load × mean items per query ×
  embedding bytes gathered per item (no DRAM-traffic counters are readable in this VM);
- ``gather_qps`` (ElasticRec Fig. 9): QPS of one embedding-gather operator vs gathers per query
  over a table larger than the LLC, with the least-squares fit ``ms = ms0 + ms_per_gather × x``
  stored in ``conditions``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recserve.errors import RecserveError
from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import MaxLoadResult, confirm_max_load, find_max_load, unloaded_miss
from recserve.measure.requests import RequestPool, pool_sizes
from recserve.measure.targets import InProcessTarget
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import SLA, ModelSpec, to_dict

SERVER = "this-host"
DEFAULT_START_QPS = 10.0  # where a max-load search starts with nothing measured to seed it
BATCHES = (1, 8, 32, 64, 128, 256, 512, 1024)
GATHERS = (1, 4, 16, 64, 256, 1024, 4096, 16384)


def log(msg: str) -> None:
    print(f"[profile] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Budget:
    """How long each measurement may take: ``quick`` fits two models in about a minute."""

    quick: bool
    array_mb: int
    batch_s: float
    min_reps: int
    gather_rows: int
    gather_s: float
    probe_s: float
    probe_min_requests: int
    max_probes: int
    rtol: float

    @classmethod
    def of(cls, quick: bool) -> Budget:
        if quick:
            return cls(True, 256, 0.15, 3, 1 << 20, 0.06, 0.6, 12, 4, 0.25)
        return cls(False, 1024, 2.0, 20, 1 << 23, 0.5, 4.0, 100, 14, 0.05)


def _timed(fn: Callable[[], Any], seconds: float, min_reps: int, max_reps: int = 100_000,
           with_cpu: bool = False) -> Any:
    """Per-call wall times (ms) of ``fn``, repeated for ``seconds`` but at least ``min_reps`` times.

    With ``with_cpu`` also the calling thread's CPU time per call: on a shared host the wall time
    includes time descheduled by other tenants, the CPU time of a single-threaded call does not."""
    wall, cpu = [], []
    end = time.perf_counter() + seconds
    while len(wall) < max_reps and (len(wall) < min_reps or time.perf_counter() < end):
        c0, t0 = time.thread_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.thread_time() - c0) * 1000.0)
    return (np.asarray(wall), np.asarray(cpu)) if with_cpu else np.asarray(wall)


def _cycling(fn: Callable[..., Any], items: Sequence[Any], *extra: Any) -> Callable[[], Any]:
    """A no-argument call of ``fn`` on ``items`` in turn (different inputs each repetition)."""
    state = {"k": 0}

    def call() -> Any:
        state["k"] += 1
        return fn(items[state["k"] % len(items)], *extra)

    return call


class _threads:
    """Temporarily run torch with ``n`` intra-op threads."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.before)


# ---------------------------------------------------------------- host microbenchmarks


def _rate(amount: float, ms: np.ndarray) -> float:
    """``amount`` per second at the median time of ``ms`` (in units of 1e9)."""
    return amount / (float(np.median(ms)) / 1000.0) / 1e9


def random_read_gbs(array_mb: int, row_bytes: int = 64, threads: int = 1, seconds: float = 0.5
                    ) -> tuple[float, float]:
    """GB/s (wall, CPU-time) of random row gathers from an array of ``array_mb`` MiB.

    One thread: the faster of ``numpy.take`` and ``torch.index_select``; more: ``index_select``."""
    dim = row_bytes // 4
    rows = array_mb * (1 << 20) // row_bytes
    table = torch.empty(rows, dim, dtype=torch.float32)
    table.fill_(1.0)  # fault every page in before timing
    gen = torch.Generator().manual_seed(0)
    n = 1 << 19
    idx = [torch.randint(0, rows, (n,), generator=gen) for _ in range(4)]
    out = torch.empty(n, dim)
    ops = [_cycling(lambda i: torch.index_select(table, 0, i, out=out), idx)]
    if threads == 1:
        np_table, np_out = table.numpy(), out.numpy()
        ops.append(_cycling(lambda i: np.take(np_table, i, axis=0, out=np_out), [i.numpy() for i in idx]))
    best = (0.0, 0.0)
    with _threads(threads):
        for op in ops:
            op()
            wall, cpu = _timed(op, seconds / len(ops), 3, with_cpu=True)
            best = max(best, (_rate(n * row_bytes, wall), _rate(n * row_bytes, cpu) if threads == 1 else 0.0))
    return best


def sequential_read_gbs(array_mb: int, threads: int = 1, seconds: float = 0.5) -> tuple[float, float]:
    table = torch.ones(array_mb * (1 << 20) // 4, dtype=torch.float32)
    with _threads(threads):
        wall, cpu = _timed(lambda: table.sum(), seconds, 3, with_cpu=True)
    return _rate(table.numel() * 4, wall), (_rate(table.numel() * 4, cpu) if threads == 1 else 0.0)


def gemm_gflops(n: int = 1024, threads: int = 1, seconds: float = 0.5) -> tuple[float, float]:
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    with _threads(threads):
        torch.mm(a, b, out=out)
        wall, cpu = _timed(lambda: torch.mm(a, b, out=out), seconds, 3, with_cpu=True)
    return _rate(2.0 * n**3, wall), (_rate(2.0 * n**3, cpu) if threads == 1 else 0.0)


def measure_host(budget: Budget, cores: int) -> dict[str, Any]:
    """Host microbenchmarks.  ``*_Nt`` are wall-clock rates with N threads; ``*_1t_cpu`` divide by the
    thread's CPU time instead (what the core does when it runs, excluding time stolen by other
    tenants: compare the two to see how contended the host was)."""
    log(f"host: random-read bandwidth over {budget.array_mb} MiB, sequential read, FP32 GEMM (1 and {cores} threads)")
    secs = 0.3 if budget.quick else 1.5
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out: dict[str, Any] = {"cores": cores, "array_mb": budget.array_mb, "row_bytes": 64}
    for t in sorted({1, cores}):
        for name, fn, args in (("random_read_gbs", random_read_gbs, (budget.array_mb, 64, t, secs)),
                               ("seq_read_gbs", sequential_read_gbs, (budget.array_mb, t, secs)),
                               ("gemm_gflops", gemm_gflops, (1024, t, secs))):
            wall, cpu = fn(*args)
            out[f"{name}_{t}t"] = round(wall, 3)
            if t == 1:
                out[f"{name}_1t_cpu"] = round(cpu, 3)
    for name in ("random_read_gbs", "seq_read_gbs", "gemm_gflops"):
        out[name] = max(v for k, v in out.items() if k.startswith(name + "_") and not k.endswith("_cpu"))
    out["cpu_share"] = round((time.process_time() - cpu0) / max(time.perf_counter() - wall0, 1e-9), 2)
    out["method"] = ("median of repeated runs; random read = 2^19 random 64-byte rows by torch.index_select "
                     "(and numpy.take with 1 thread, the faster kept); sequential = torch.sum over the array; "
                     "GEMM = torch.mm 1024x1024 FP32; *_cpu = per thread-CPU-second instead of per wall second")
    log("host: " + ", ".join(f"{k}={v}" for k, v in out.items() if k[0] in "rsgc" and k not in ("row_bytes",)))
    return out


# ---------------------------------------------------------------- per-model tables


def latency_vs_batch(spec: ModelSpec, scale: float, budget: Budget, batches: Sequence[int] = BATCHES,
                     seed: int = 0) -> ProfileTable:
    """In-process latency of one single-threaded worker per batch size (mean, p50, p99 in ms)."""
    from recserve.zoo import build_or_load

    model = build_or_load(spec, scale, seed=seed)
    rows = []
    with _threads(1), torch.no_grad():
        for b in batches:
            pool = RequestPool(spec, scale, (b, b, b), seed)
            queries = pool.batches()
            for q in queries:
                model(q)  # warm-up
            ms, cpu = _timed(_cycling(model, queries), budget.batch_s, budget.min_reps, with_cpu=True)
            rows.append([b, float(ms.mean()), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), len(ms),
                         float(cpu.mean())])
            log(f"{spec.name}: batch {b:5d}: mean {ms.mean():8.3f} ms  p50 {np.percentile(ms, 50):8.3f}  "
                f"p99 {np.percentile(ms, 99):8.3f}  ({len(ms)} runs)")
    columns = ("batch", "mean_ms", "p50_ms", "p99_ms", "runs", "cpu_mean_ms")
    conditions = {"scale": scale, "threads": 1, "index": "uniform", "via": "in-process"}
    return ProfileTable(spec.name, SERVER, "latency_vs_batch", columns, rows, "measured", conditions)


def gather_profile(dim: int, budget: Budget, gathers: Sequence[int] = GATHERS, seed: int = 0
                   ) -> tuple[list[list[float]], dict[str, Any]]:
    """ElasticRec Fig. 9: one embedding gather+pool operator over a table beyond the LLC.

    Returns rows ``[gathers, qps, ms_per_query]`` and the linear fit of ms per query."""
    rows_n = budget.gather_rows
    table = torch.nn.EmbeddingBag(rows_n, dim, mode="sum")
    torch.nn.init.uniform_(table.weight, -0.05, 0.05)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    offsets = torch.zeros(1, dtype=torch.int64)
    with _threads(1), torch.no_grad():
        for x in gathers:
            idx = [torch.randint(0, rows_n, (x,), generator=gen) for _ in range(8)]
            table(idx[0], offsets)
            ms = _timed(_cycling(table, idx, offsets), budget.gather_s, 5)
            t = float(np.median(ms))
            rows.append([x, 1000.0 / t, t])
    x = np.array([r[0] for r in rows], dtype=float)
    y = np.array([r[2] for r in rows])
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / y)  # relative error: x spans 4 orders of magnitude
    pred = intercept + slope * x
    r2 = 1.0 - float(np.sum((y - pred) ** 2) / max(np.sum((y - y.mean()) ** 2), 1e-30))
    fit = {"fit_ms0": float(intercept), "fit_ms_per_gather": float(slope), "fit_r2": r2,
           "table_rows": rows_n, "dim": dim, "threads": 1, "op": "EmbeddingBag(sum), one bag per query",
           "fit": "least squares on relative error of ms per query"}
    log(f"gather (dim {dim}): ms/query = {intercept:.4f} + {slope * 1e3:.3f}e-3 x gathers  (R^2 {r2:.3f}); "
        + ", ".join(f"{int(r[0])}:{r[1]:.0f}qps" for r in rows))
    return rows, fit


def pss_gb(pid: int) -> float:
    """Proportional set size of ``pid`` in GB (shared pages split among sharers); RSS if PSS is unavailable."""
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) / 1024**2
        except OSError:
            continue
    return float("nan")


def _start_rate(lat: ProfileTable | None, mean_size: float, workers: int) -> float:
    """A first probe at ~30% of the service capacity the latency profile predicts."""
    if lat is None:
        return 1.0
    service_ms = max(lat.interp(mean_size, "mean_ms"), 1e-3)
    return max(0.25, 0.3 * workers * 1000.0 / service_ms)


def _probe_fn(session: LoadSession, budget: Budget, sla_ms: float, seed: int) -> Callable[[float], Any]:
    """``rate → LoadResult`` for the max-load search; each probe gets its own arrival seed and at least
    ``probe_min_requests`` queries, but a low-rate probe never runs longer than 4 × ``probe_s`` + 10 s."""
    seeds = iter(range(seed, seed + 10_000))

    def run_at(rate: float) -> Any:
        cap = int(rate * (4 * budget.probe_s + 10.0))
        return session.run(rate, budget.probe_s, seed=next(seeds),
                           min_requests=max(5, min(budget.probe_min_requests, cap)),
                           timeout_s=max(1.0, 4 * sla_ms / 1000.0))

    return run_at


def _search(session: LoadSession, budget: Budget, sla: SLA, start: float, seed: int
            ) -> tuple[MaxLoadResult, float]:
    """The max-load search, after checking the SLA is reachable at all: if queries sent one at a time
    already miss it, no rate can meet it (max load 0) and probing ever lower rates would only take time."""
    unloaded = session.unloaded_latency_ms()
    floor = float(np.percentile(unloaded, sla.percentile, method="higher"))
    missed = unloaded_miss(unloaded, sla.target_ms, sla.percentile)
    if missed is not None:
        return missed, floor
    return find_max_load(_probe_fn(session, budget, sla.target_ms, seed), sla.target_ms, sla.percentile,
                         start_qps=start, rtol=budget.rtol, max_probes=budget.max_probes,
                         min_qps=max(0.05, start / 32)), floor


def check_node_deadline(deadline_ms: float, sla: SLA) -> None:
    """Refuse a max-load search whose node sheds queries the SLA would still count as met: it would measure the
    node's deadline, not the SLA asked about."""
    if deadline_ms < sla.target_ms:
        from recserve.serving.node.config import default_deadline_ms

        raise RecserveError(
            f"the node's deadline ({deadline_ms:g} ms) is tighter than the SLA asked for (p{sla.percentile:g} <= "
            f"{sla.target_ms:g} ms): it would shed queries the SLA allows; start the node with deadline_ms >= "
            f"{default_deadline_ms(sla.target_ms):g} or search at an SLA within its deadline")


@contextlib.contextmanager
def _worker_pool(spec: ModelSpec, scale: float, pool: RequestPool, max_workers: int, via: str, server: Any = None,
                 sla: SLA | None = None):
    """A load session over ``max_workers`` workers, with ``set(w)`` to use only ``w`` of them and
    ``pss(w)`` for their memory.  ``via="server"``: a real node server over HTTP (``server``, a started
    :class:`~recserve.measure.served.LocalServer`, or a new one whose queries' deadline follows ``sla``: the
    node's default follows the catalogue's, and would shed what a looser ``--sla-ms`` allows), resized through its
    control API;
    ``via="inprocess"``: a process pool where only ``w`` workers may run at once."""
    if via == "server":
        from recserve.measure.served import LocalServer
        from recserve.serving.node.config import default_deadline_ms

        with contextlib.ExitStack() as stack:
            if server is None:
                deadline = {"deadline_ms": default_deadline_ms(sla.target_ms)} if sla is not None else {}
                server = stack.enter_context(LocalServer(spec.name, scale, workers=max_workers, **deadline))
            elif sla is not None:
                check_node_deadline(server.config.models[0].deadline_ms, sla)
            with LoadSession(server.target("http"), pool, warm=True, before_run=server.wait_idle) as session:
                yield session, server.set_workers, lambda w: server.worker_pss_gb()
        return
    if via != "inprocess":
        raise RecserveError(f"via must be 'server' or 'inprocess', got {via!r}")
    target = InProcessTarget(workers=max_workers, mode="process")
    with LoadSession(target, pool) as session:
        pids = target.worker_pids()
        yield session, target.set_active_workers, lambda w: sum(pss_gb(p) for p in pids[:w])


def maxload_tables(spec: ModelSpec, scale: float, budget: Budget, workers: Sequence[int],
                   lat: ProfileTable | None = None, mix: str = "production", seed: int = 0,
                   sla: SLA | None = None, start_qps: float | None = None, via: str = "inprocess",
                   server: Any = None) -> list[ProfileTable]:
    """``maxload_vs_workers``, ``footprint`` and (estimated) ``membw_vs_workers`` for each worker count
    (``server``: reuse a started LocalServer of this model when ``via="server"``)."""
    pool = RequestPool(spec, scale, pool_sizes(mix, 32, seed), seed)
    sla = sla or spec.sla
    maxload, foot, membw = [], [], []
    gather_bytes = spec.gather_bytes_per_item
    with _worker_pool(spec, scale, pool, max(workers), via, server, sla) as (session, set_workers, pss):
        for w in workers:
            set_workers(w)
            res, unloaded = _search(session, budget, sla, start_qps or _start_rate(lat, pool.mean_size, w), seed)
            mem = pss(w)
            hi = res.bracket[1] if math.isfinite(res.bracket[1]) else -1.0  # lowest violating rate (-1: none;
            # 0: the SLA is missed even with no load)
            maxload.append([w, res.max_qps, hi, len(res.probes), float(res.converged), unloaded])
            foot.append([w, mem])
            membw.append([w, res.max_qps * pool.mean_size * gather_bytes / 1e9])
            log(f"{spec.name}: {w} worker(s): max load {res.max_qps:.2f} qps (p{sla.percentile:g} <= "
                f"{sla.target_ms:g} ms, {len(res.probes)} probes, {res.reason}); PSS {mem * 1024:.0f} MiB")
    how = "node server over HTTP (binary tensors), workers resized by the control API" if via == "server" else \
        "in-process process pool, w of the workers admitted at once"
    cond = {"scale": scale, "sizes": mix, "sla_ms": sla.target_ms, "percentile": sla.percentile, "via": how,
            "threads_per_worker": 1, "client": "recserve open-loop load generator on the same host"}
    return [
        ProfileTable(spec.name, SERVER, "maxload_vs_workers",
                     ("workers", "max_qps", "violating_qps", "probes", "converged", "unloaded_pctl_ms"),
                     maxload, "measured", cond),
        ProfileTable(spec.name, SERVER, "footprint", ("workers", "mem_gb"), foot, "measured",
                     {"scale": scale, "via": how, "method": "sum of the workers' PSS (/proc/<pid>/smaps_rollup)"}),
        ProfileTable(spec.name, SERVER, "membw_vs_workers", ("workers", "gbs"), membw, "measured",
                     {**cond, "method": "estimate: max_qps x mean items/query x embedding bytes gathered per item"}),
    ]


def node_max_loads(session: LoadSession, set_workers: Callable[[int], None], sla: SLA, workers: Sequence[int],
                   start_qps: float, budget: Budget | None = None, seed: int = 0, confirm: int = 0,
                   model: str = "the model") -> dict[int, float]:
    """Max load of one model of a running node at each worker count, resized through ``set_workers``; ``confirm``
    > 0 probes each result again (stepping down on a violation, see :func:`confirm_max_load`).

    Why beside the profile: a controller acting on a live node needs what that node sustains now, with its neighbours,
    router and load generator on the same cores; a profile taken alone, or at another hour on a shared host, was up to
    2x off live (docs/decisions/2026-11-28-demo-live-load-sized-live.md).  Each count's search starts near the previous
    count's result."""
    budget = budget or dataclasses.replace(Budget.of(False), probe_s=2.5, probe_min_requests=20, max_probes=7,
                                           rtol=0.1)
    out: dict[int, float] = {}
    start = start_qps if start_qps > 0 else DEFAULT_START_QPS  # a seed measured at 0 (a busy host) seeds nothing
    for w in workers:
        set_workers(w)
        res, _ = _search(session, budget, sla, start, seed + w)
        if confirm:
            res = confirm_max_load(_probe_fn(session, budget, sla.target_ms, seed + 7919 * (w + 1)), res,
                                   step=budget.rtol, tries=confirm)
        out[w] = res.max_qps
        log(f"{model}: {w} worker(s): max load {res.max_qps:.1f} qps ({len(res.probes)} probes, {res.reason})")
        fewer = [n for n in out if n < w and out[n] > res.max_qps]
        if fewer:  # more workers carrying less: the host's other work took the cores the search measured
            log(f"warning: {model} carries less with {w} workers than with {fewer[-1]} ({res.max_qps:.1f} < "
                f"{out[fewer[-1]]:.1f} qps): this host is busy, and what is sized from these numbers may not hold")
        start = max(start, 0.7 * res.max_qps)
    return out


def check_worker_counts(workers: Sequence[int], what: str = "--workers") -> None:
    """Refuse worker counts past the node server's own limit (``worker_limits``: 4 per usable core, at most 256).

    Each count is a max-load search over that many worker processes, each holding the model: past a few per core
    the extra ones only wait for a core (the curve is flat from about the core count on, and planners resample it
    at 1..cores), while each costs a process, its memory and a search that slows as they contend.  Some
    oversubscription is kept on purpose (the point where more workers stop helping is worth seeing); the node's
    control API, which ``via="server"`` resizes through, refuses more anyway."""
    from recserve.serving.node.control_api import MAX_WORKERS, MAX_WORKERS_PER_CORE, worker_limits

    most, cores = worker_limits()
    if workers and max(workers) > most:
        raise RecserveError(f"{what} {max(workers)}: at most {most} on this {cores}-core host ({MAX_WORKERS_PER_CORE} "
                            f"per core, at most {MAX_WORKERS}: more workers only wait for a core)")


def profile_host(specs: Sequence[ModelSpec], scale: float, quick: bool = False,
                 batches: Sequence[int] = BATCHES, workers: Sequence[int] | None = None,
                 skip_maxload: bool = False, sla: SLA | None = None, array_mb: int | None = None,
                 via: str = "server") -> ProfileSet:
    """Every table above for ``specs`` on this host, plus the host microbenchmarks in ``meta``.

    ``sla`` overrides every model's SLA for the max-load tables (recorded in their conditions)."""
    budget = Budget.of(quick)
    if array_mb:
        budget = dataclasses.replace(budget, array_mb=array_mb, gather_rows=0)
    cores = len(os.sched_getaffinity(0))
    workers = list(workers or range(1, cores + 1))
    check_worker_counts(workers)
    started = time.perf_counter()
    meta = {"server": SERVER, "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "quick": quick, "scale": scale, "torch": torch.__version__, "load_avg_before": os.getloadavg(),
            "host": measure_host(budget, cores),
            "specs": {spec.name: to_dict(spec) for spec in specs}}  # perfmodel.fit reads specs from here
    tables: list[ProfileTable] = []
    gathers: dict[int, tuple[list[list[float]], dict[str, Any]]] = {}
    for spec in specs:
        lat = latency_vs_batch(spec, scale, budget, batches)
        tables.append(lat)
        dim = int(np.bincount([t.dim for t in spec.tables]).argmax())
        if dim not in gathers:
            rows_n = budget.gather_rows or budget.array_mb * (1 << 20) // (4 * dim)  # as large as the array
            gathers[dim] = gather_profile(dim, dataclasses.replace(budget, gather_rows=rows_n))
        rows, fit = gathers[dim]
        tables.append(ProfileTable(spec.name, SERVER, "gather_qps", ("gathers", "qps", "ms_per_query"), rows,
                                   "measured", fit))
        if not skip_maxload:
            tables.extend(maxload_tables(spec, scale, budget, workers, lat, sla=sla, via=via))
    meta["load_avg_after"] = os.getloadavg()
    meta["seconds"] = round(time.perf_counter() - started, 1)
    log(f"done in {meta['seconds']} s")
    return ProfileSet(tables, meta)
