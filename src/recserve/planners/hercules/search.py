"""Hercules' node-level task-scheduling search (Hercules §IV-B, Algorithm 1) and its baselines.

A configuration fixes op-parallelism (cores per inference thread), model-parallelism (threads)
and data-parallelism (sub-batch size), either for *model-based* scheduling (each thread runs the
whole model) or for the *sparse-dense pipeline* (``sparse_threads`` threads × ``cores_per_thread``
cores gather embeddings, ``threads`` single-core DenseNet threads — on an accelerator server the
DenseNet threads are co-located on the device).

The evaluation function is injected: ``evaluate(config) -> max load (QPS) or None`` when the
configuration is infeasible (SLA unmet even at zero load, memory, power).  The search never models or
measures itself: ``recserve.perfmodel.evaluator.perfmodel_evaluator`` (the analytic model) or
``recserve.measure.config_eval.LiveEvaluator`` (node servers on this host) are passed in by ``commands/``.
Every search counts the distinct configurations it evaluated.

- :func:`search` — gradient-guided: for each op-parallelism, start at the smallest threads and
  batch, step to the best of the "+1" neighbours (batch, threads, both; for the pipeline every
  non-empty subset of sparse threads, dense threads, batch) while throughput improves; stop the
  outer loop over op-parallelism when its peak drops (convexity, Hercules Fig. 11).
- :func:`deeprecsys` — DeepRecSys' hill-climbing over the batch size only (one core per thread,
  one thread per core).
- :func:`baymax` — the GPU baseline: model-based threads co-located on the device (Baymax-style), thread
  count and batch hill-climbed, no query fusion (each query or sub-batch its own launch); every mode obeys one
  device-thread cap (``MAX_DEVICE_THREADS``).  Hercules' search fuses queries on the device (§III-B).
- :func:`exhaustive` — every configuration: ground truth on small spaces.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from recserve.perfmodel import Allocation, PerfModel, SizeMix
from recserve.profiles import ProfileTable
from recserve.specs import ModelSpec, ServerType

DEFAULT_BATCHES = (16, 32, 64, 128, 256, 512, 1024)
MODES = ("model", "pipeline")
MAX_DEVICE_THREADS = 8
INFEASIBLE_PATIENCE = 3  # op-parallelism levels in a row with no feasible configuration before giving up


@dataclass(frozen=True)
class SchedConfig:
    mode: str  # "model" or "pipeline"
    threads: int  # model-based inference threads, or DenseNet threads in the pipeline
    cores_per_thread: int  # op-parallelism (of the SparseNet threads in the pipeline)
    batch: int  # sub-batch size
    sparse_threads: int = 0
    fuse: bool = False  # accelerator: fuse waiting queries into one launch of up to ``batch`` items (§III-B)

    def allocation(self, base: Allocation | None = None) -> Allocation:
        from dataclasses import replace

        return replace(base or Allocation(), workers=self.threads, cores_per_worker=self.cores_per_thread,
                       batch=self.batch, sparse_workers=self.sparse_threads if self.mode == "pipeline" else 0,
                       fuse=self.fuse)

    def label(self) -> str:
        batch = f"fused batch {self.batch}" if self.fuse else f"batch {self.batch}"
        if self.mode == "pipeline":
            return (f"pipeline: {self.sparse_threads} sparse x {self.cores_per_thread} cores + "
                    f"{self.threads} dense, {batch}")
        return f"model-based: {self.threads} threads x {self.cores_per_thread} cores, {batch}"


Evaluator = Callable[[SchedConfig], "float | None"]


@dataclass
class SearchResult:
    method: str
    best: SchedConfig | None
    best_qps: float
    evaluations: int
    space_size: int
    path: list[tuple[SchedConfig, float | None]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "best": asdict(self.best) if self.best else None,
            "best_label": self.best.label() if self.best else None,
            "best_qps": self.best_qps,
            "evaluations": self.evaluations,
            "space_size": self.space_size,
        }


class _Counted:
    """Memoises an evaluator and counts the distinct configurations asked for."""

    def __init__(self, evaluate: Evaluator) -> None:
        self.evaluate = evaluate
        self.seen: dict[SchedConfig, float | None] = {}
        self.path: list[tuple[SchedConfig, float | None]] = []

    def __call__(self, cfg: SchedConfig) -> float | None:
        if cfg not in self.seen:
            q = self.evaluate(cfg)
            self.seen[cfg] = q if q is None or q > 0 else None
            self.path.append((cfg, self.seen[cfg]))
        return self.seen[cfg]

    def best(self) -> tuple[SchedConfig | None, float]:
        feasible = [(q, c) for c, q in self.seen.items() if q is not None]
        if not feasible:
            return None, 0.0
        q, c = max(feasible, key=lambda x: x[0])
        return c, q


# ---------------------------------------------------------------- the space


def device_threads_ok(server: ServerType, threads: int) -> bool:
    """One cap for every mode: at most MAX_DEVICE_THREADS threads share an accelerator (model-based threads run
    on the device as the pipeline's DenseNet threads do)."""
    return not server.accelerator or threads <= MAX_DEVICE_THREADS


def _fits(server: ServerType, cfg: SchedConfig) -> bool:
    accel = bool(server.accelerator)
    if cfg.mode == "pipeline":
        host = cfg.sparse_threads * cfg.cores_per_thread + (0 if accel else cfg.threads)
        return host <= server.cores and device_threads_ok(server, cfg.threads)
    return cfg.threads * cfg.cores_per_thread <= server.cores and device_threads_ok(server, cfg.threads)


def _fusing(server: ServerType, fuse: bool | None) -> bool:
    """Query fusion is Hercules' data-parallelism on accelerators (§III-B): on by default where there is one."""
    return bool(server.accelerator) if fuse is None else bool(fuse and server.accelerator)


def space(server: ServerType, batches: Iterable[int] = DEFAULT_BATCHES,
          modes: Iterable[str] = MODES, fuse: bool | None = None) -> list[SchedConfig]:
    """Every configuration of the parallelism space (what :func:`exhaustive` evaluates); on an accelerator server
    ``batch`` is the largest fused launch (``fuse``, default on there)."""
    fz = _fusing(server, fuse)
    out = []
    n = server.cores
    dense_max = MAX_DEVICE_THREADS if server.accelerator else n
    for mode in modes:
        for c in range(1, n + 1):
            for b in batches:
                if mode == "model":
                    out += [SchedConfig("model", t, c, b, fuse=fz) for t in range(1, min(n // c, dense_max) + 1)]
                else:
                    for s, d in itertools.product(range(1, n // c + 1), range(1, dense_max + 1)):
                        cfg = SchedConfig("pipeline", d, c, b, s, fuse=fz)
                        if _fits(server, cfg):
                            out.append(cfg)
    return out


# ---------------------------------------------------------------- searches


def exhaustive(server: ServerType, evaluate: Evaluator, batches: Iterable[int] = DEFAULT_BATCHES,
               modes: Iterable[str] = MODES, fuse: bool | None = None) -> SearchResult:
    counted = _Counted(evaluate)
    configs = space(server, batches, modes, fuse)
    prefetch = getattr(evaluate, "prefetch", None)
    if prefetch is not None:  # evaluators that can score many configurations at once
        prefetch(configs)
    for cfg in configs:
        counted(cfg)
    best, q = counted.best()
    return SearchResult("exhaustive", best, q, len(counted.seen), len(configs))


def deeprecsys(server: ServerType, evaluate: Evaluator, batches: Iterable[int] = DEFAULT_BATCHES) -> SearchResult:
    """DeepRecSys: one single-core thread per core; hill-climb the batch size while max load rises."""
    batches = sorted(batches)
    counted = _Counted(evaluate)
    threads = server.cores if not server.accelerator else 1
    best_q: float | None = None
    for b in batches:
        q = counted(SchedConfig("model", threads, 1, b))
        if best_q is not None and (q is None or q <= best_q):
            break
        if q is not None:
            best_q = q
    best, q = counted.best()
    return SearchResult("deeprecsys", best, q, len(counted.seen), len(batches), counted.path)


def baymax(server: ServerType, evaluate: Evaluator, batches: Iterable[int] = DEFAULT_BATCHES) -> SearchResult:
    """Baymax-style GPU baseline (Hercules' GPU comparison): co-locate model-based inference threads on the
    device (one host core each, up to the device-thread cap) and hill-climb the thread count while max load
    rises, at each of DeepRecSys' batch sizes (also hill-climbed).  On a CPU server it is DeepRecSys."""
    if not server.accelerator:
        res = deeprecsys(server, evaluate, batches)
        return SearchResult("baymax", res.best, res.best_qps, res.evaluations, res.space_size, res.path)
    counted = _Counted(evaluate)
    cap = min(MAX_DEVICE_THREADS, server.cores)
    best_b: float | None = None
    for b in sorted(batches):
        best_t: float | None = None
        for t in range(1, cap + 1):
            q = counted(SchedConfig("model", t, 1, b))
            if best_t is not None and (q is None or q <= best_t):
                break
            if q is not None:
                best_t = q
        if best_b is not None and (best_t is None or best_t <= best_b):
            break
        if best_t is not None:
            best_b = best_t
    best, q = counted.best()
    return SearchResult("baymax", best, q, len(counted.seen), len(list(batches)) * cap, counted.path)


MODEL_MOVES = ((0, 1), (1, 0), (1, 1))  # batch only, threads only, both (Hercules Alg. 1)
PIPELINE_MOVES = ((1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1))  # sparse, dense, both, batch


def _climb(start: tuple[int, ...], make: Callable[[tuple[int, ...]], SchedConfig | None],
           counted: _Counted) -> tuple[SchedConfig | None, float]:
    """Gradient ascent over "+1" moves: to the best feasible candidate while max load improves."""
    moves = MODEL_MOVES if len(start) == 2 else PIPELINE_MOVES
    point = start
    walk = sorted(moves, key=lambda m: (m[-1], -sum(m)))  # more threads first, larger batch last
    q = None
    while True:  # infeasible start: walk towards more resources, one evaluation per step
        cfg = make(point)
        if cfg is None:
            return None, 0.0
        q = counted(cfg)
        if q is not None:
            break
        steps = [tuple(a + b for a, b in zip(point, m, strict=True)) for m in walk]
        steps = [p for p in steps if make(p) is not None]
        if not steps:
            return None, 0.0
        point = steps[0]
    best_cfg, best_q = cfg, q
    while True:
        candidates = []
        for m in moves:
            p = tuple(a + b for a, b in zip(point, m, strict=True))
            c = make(p)
            if c is not None:
                candidates.append((p, c, counted(c)))
        valid = [x for x in candidates if x[2] is not None]
        best_step = max(valid, key=lambda x: x[2]) if valid else None
        if best_step is None or best_step[2] <= q:
            best_step = _beyond(point, q, walk[0], make, counted)
        if best_step is None:
            return best_cfg, best_q
        point, best_cfg, q = best_step
        best_q = q


def _beyond(point: tuple[int, ...], q: float, move: tuple[int, ...],
            make: Callable[[tuple[int, ...]], SchedConfig | None], counted: _Counted
            ) -> tuple[tuple[int, ...], SchedConfig, float] | None:
    """When no move from ``point`` improves on ``q``: the first point further along ``move`` (more threads) that
    does, or None at the lattice's edge.  The space is not convex where co-running threads push shared hot rows out
    of the LLC: one more thread can serve less, or miss the SLA, where a few more serve more again (each thread's
    share of the cache falls past the hot set, then the added parallelism wins the load back)."""
    while True:
        point = tuple(a + b for a, b in zip(point, move, strict=True))
        cfg = make(point)
        if cfg is None:
            return None
        found = counted(cfg)
        if found is not None and found > q:
            return point, cfg, found


def _maker(mode: str, c: int, server: ServerType, batches: tuple[int, ...],
           fuse: bool = False) -> Callable[[tuple[int, ...]], SchedConfig | None]:
    """Lattice point -> configuration at op-parallelism ``c``: (threads, batch index) for model-based,
    (sparse threads, dense threads, batch index) for the pipeline; None outside the space."""
    n = server.cores
    dense_max = MAX_DEVICE_THREADS if server.accelerator else n

    def make(p: tuple[int, ...]) -> SchedConfig | None:
        if c < 1 or c > n or p[-1] < 0 or p[-1] >= len(batches):
            return None
        if mode == "model":
            t, bi = p
            return SchedConfig("model", t, c, batches[bi], fuse=fuse) if 1 <= t <= min(n // c, dense_max) else None
        s, d, bi = p
        if s < 1 or d < 1 or d > dense_max:
            return None
        cfg = SchedConfig("pipeline", d, c, batches[bi], s, fuse=fuse)
        return cfg if _fits(server, cfg) else None

    return make


def _point(cfg: SchedConfig, batches: tuple[int, ...]) -> tuple[int, ...]:
    bi = batches.index(cfg.batch)
    return (cfg.threads, bi) if cfg.mode == "model" else (cfg.sparse_threads, cfg.threads, bi)


def _polish(best: SchedConfig, best_q: float, server: ServerType, batches: tuple[int, ...],
            counted: _Counted) -> None:
    """Local refinement around the climb's optimum: ±1 along each axis (and op-parallelism) while it improves.

    The climb only moves towards more threads and larger batches; this catches a neighbour just
    behind it where the space is not exactly convex.
    """
    while True:
        point = _point(best, batches)
        axis = [tuple(d if i == k else 0 for i in range(len(point))) for k in range(len(point)) for d in (-1, 1)]
        neighbours = [(best.cores_per_thread, tuple(a + b for a, b in zip(point, m, strict=True))) for m in axis]
        neighbours += [(best.cores_per_thread + dc, point) for dc in (-1, 1)]
        improved = False
        for c, p in neighbours:
            cfg = _maker(best.mode, c, server, batches, best.fuse)(p)
            if cfg is None:
                continue
            q = counted(cfg)
            if q is not None and q > best_q * (1 + 1e-9):
                best, best_q, improved = cfg, q, True
        if not improved:
            return


def search(server: ServerType, evaluate: Evaluator, batches: Iterable[int] = DEFAULT_BATCHES,
           modes: Iterable[str] = MODES, spec: ModelSpec | None = None, polish: bool = True,
           fuse: bool | None = None) -> SearchResult:
    """Hercules' gradient-guided search over op-, model- and data-parallelism for each scheduling mode; on an
    accelerator server data-parallelism is query fusion (``fuse``, default on there: ``batch`` is the largest
    fused launch).  Model-based threads are climbed from two starts at each op-parallelism: Alg. 1's origin (one
    thread, the smallest batch) and the corner where the threads take every core; with locality in the ids the
    space has a second ridge the origin's climb does not reach (small batches, many threads), and the corner's climb
    is the DeepRecSys baseline's own, so the search never returns less than it."""
    batches = tuple(sorted(batches))
    fz = _fusing(server, fuse)
    counted = _Counted(evaluate)
    n = server.cores
    optima: list[tuple[SchedConfig | None, float]] = []
    for mode in modes:
        last_peak = -1.0
        infeasible_run = 0
        mode_best: tuple[SchedConfig | None, float] = (None, 0.0)
        for c in range(1, n + 1):
            if mode == "pipeline" and c >= n and not server.accelerator:
                break
            make = _maker(mode, c, server, batches, fz)
            cfg, peak = _climb((1, 0) if mode == "model" else (1, 1, 0), make, counted)
            corner = min(n // c, MAX_DEVICE_THREADS) if server.accelerator else n // c
            if mode == "model" and corner > 1:  # and from the corner where every core runs a thread (DeepRecSys' start)
                cfg, peak = max((cfg, peak), _climb((corner, 0), make, counted), key=lambda x: x[1])
            if cfg is not None and peak > mode_best[1]:
                mode_best = (cfg, peak)
            infeasible_run = infeasible_run + 1 if peak <= 0 else 0
            if (last_peak > 0 and peak < last_peak) or infeasible_run >= INFEASIBLE_PATIENCE:
                break  # peak throughput dropped, or op-parallelism stopped making the SLA reachable
            last_peak = peak if peak > 0 else (0.0 if last_peak <= 0 else last_peak)
        optima.append(mode_best)
    top, top_q = max(optima, key=lambda x: x[1], default=(None, 0.0))
    if polish and top is not None:  # only the better mode's optimum: the other mode's neighbourhood is below it
        _polish(top, top_q, server, batches, counted)
    best, q = counted.best()
    return SearchResult("hercules", best, q, len(counted.seen), len(space(server, batches, modes, fz)), counted.path)


def efficiency_tables(pm: PerfModel, spec: ModelSpec, server: ServerType, mix: SizeMix) -> list[ProfileTable]:
    """Hercules' efficiency tuple (max QPS, provisioned power) at the searched optimum on the modelled server, as
    an ``efficiency`` Profile table for the provisioning planner; none without a power figure or a feasible config.
    Pass it as ``model_profiles(..., extra=efficiency_tables)``."""
    if server.power_w is None:
        return []
    from recserve.perfmodel.evaluator import perfmodel_evaluator

    evaluate = perfmodel_evaluator(spec, server, pm, mix)
    res = search(server, evaluate, spec=spec)
    if res.best is None:
        return []
    cfg = res.best
    detail = evaluate.detail(cfg)
    return [ProfileTable(spec.name, server.name, "efficiency",
                         ("max_qps", "power_w", "workers", "cores_per_worker", "batch", "sparse_workers"),
                         [[res.best_qps, detail.power_w, cfg.threads, cfg.cores_per_thread, cfg.batch,
                           cfg.sparse_threads]], "modelled", {"mode": cfg.mode})]
