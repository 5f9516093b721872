"""Analytic, calibrated performance model of one model on one server type under one allocation.

Per inference call of ``m`` items (roofline style):

- overhead   ``fixed_ms + per_op_us · operators dispatched + per_module_us · modules invoked`` (counted on the
             zoo module: DIEN's scripted recurrence dispatches thousands of small operators, SDM's M2 730 bags)
- dense      ``FLOPs·m / (cores' speed · freq · flops/cycle · eff(r))``, ``eff(r) = compute_eff · r/(r+batch_half)``
             with ``r = m · GEMM rows per item`` (the sequence length for attention over behaviours); a single-row
             product (an MLP at batch 1: BLAS's GEMV path) runs at ``compute_eff``, its time the weight read below;
             plus streaming the dense weights that do not fit the allocated LLC (sequential: ``stream_gbs_per_core``)
             and page faults of tensors past glibc's 32 MiB mmap cap, mapped fresh every call (``fault_gbs_per_core``)
- sparse     ``m · (lookups · lookup_ns + gathered bytes · (hit/llc_bw + miss·slowdown/dram_bw))``
             with the LLC hit rate from the hot rows (Zipf locality) that fit in the allocated ways and within the
             TLB reach (``tlb_reach_mb``: beyond it a page walk per row costs about a DRAM miss; DRAM traffic still
             counts LLC misses only)
- memory     DRAM bytes/s demanded at the offered load plus co-runners' bandwidth give utilisation
             ``u`` of ``mem_bw_gbs · membw_eff``; DRAM time is slowed by ``1 + u²/(2(1−u))``
- accelerator PCIe transfer of ids/dense inputs (and host-gathered partial sums when the tables do
             not fit device memory; hot rows go to the device), kernel launches, device compute and
             gathers, time-shared by the co-located threads

Op-parallelism inside a model-based thread scales as ``c/(1 + op_serial·(c−1))`` (operator
dependencies leave workers idle, Hercules §III-A); in the sparse-dense pipeline the SparseNet
threads use their cores without that loss and each DenseNet thread has one core.
Max load comes from :mod:`recserve.perfmodel.queueing` over a query-size mix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recserve.errors import SpecError
from recserve.perfmodel.calibration import Calibration, load_calibration
from recserve.perfmodel.corunners import corunner_threads, default_mean_items, displaced_llc_bytes, job_items
from recserve.perfmodel.cost import ModelCost, model_cost, zipf_hit
from recserve.perfmodel.queueing import SizeMix, Station, jitter, sojourn_percentile, solve_max_load
from recserve.perfmodel.service_time import ServiceTimes
from recserve.specs import SLA, ModelSpec, ServerType

TABLE_MODES = ("shared", "copied")
# How a query's ids reach the model: "tensor" = already arrays (recserve's data plane decodes them in bulk); "pylist" =
# Python lists converted per call, one ``np.array`` per table's ids and one per its bag lengths (the DeepRecSys
# harness behind the Kairos artifact: ``FeedBlob(tag, np.array(S_indices[i]))`` in ``run()``, timed as "loading").
FEED_MODES = ("tensor", "pylist")


@dataclass(frozen=True)
class Allocation:
    """How a model is run on a server.

    ``workers`` inference threads (model-parallelism) of ``cores_per_worker`` cores each
    (op-parallelism) serve sub-batches of at most ``batch`` items (data-parallelism; None = whole
    queries).  With ``sparse_workers > 0`` the model runs as a sparse-dense pipeline:
    ``sparse_workers`` threads × ``cores_per_worker`` cores gather embeddings and ``workers``
    DenseNet threads (one core each, or co-located on the accelerator) run the MLPs.
    ``tables="copied"`` gives every worker its own copy of the tables (separate processes).
    ``feed="pylist"`` adds the per-call conversion of ids handed over as Python lists (see ``FEED_MODES``).
    ``fuse=True`` (accelerator threads only; Hercules §III-B "query fusion"): a device thread that becomes free
    launches every job waiting for it, up to ``batch`` items, as one call; without it each query (or sub-batch)
    is its own launch (DeepRecSys, Baymax).
    """

    workers: int = 1
    cores_per_worker: int = 1
    batch: int | None = None
    llc_ways: int | None = None
    corunner_gbs: float = 0.0
    tables: str = "shared"
    accelerator: bool | None = None
    sparse_workers: int = 0
    zipf_s: float | None = None
    feed: str = "tensor"
    fuse: bool = False

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores_per_worker < 1 or self.sparse_workers < 0:
            raise SpecError(f"allocation {self}: workers and cores_per_worker must be >= 1")
        if self.batch is not None and self.batch < 1:
            raise SpecError(f"allocation {self}: batch must be >= 1")
        if self.tables not in TABLE_MODES:
            raise SpecError(f"allocation: tables must be one of {TABLE_MODES}, got {self.tables!r}")
        if self.feed not in FEED_MODES:
            raise SpecError(f"allocation: feed must be one of {FEED_MODES}, got {self.feed!r}")

    @property
    def pipeline(self) -> bool:
        return self.sparse_workers > 0


@dataclass
class LoadResult:
    """What the model predicts for one (model, server, allocation) at its max load."""

    max_qps: float
    feasible: bool
    reason: str = ""
    latency_ms: float = math.nan  # SLA-percentile sojourn at max load
    power_w: float = math.nan
    membw_gbs: float = 0.0
    mem_gb: float = 0.0
    cores_used: int = 0
    details: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Static:
    """Everything about a (spec, server, allocation) that does not depend on load."""

    cost: ModelCost
    on_accel: bool
    cores_used: int
    mem_gb: float
    miss_w: float  # fraction of dense weights streamed from DRAM per call
    miss_e: float  # fraction of gathered bytes missing the LLC (of the host-side gathers)
    host_gather_frac: float  # share of gathers done on the host (1 on CPU; misses of the device hot set)
    reason: str
    nmp_ranks: int = 0  # ranks per channel doing gather-reduce near memory; 0 = plain DIMMs
    table_miss: np.ndarray | None = None  # per table: steady-state fraction of lookups costed as DRAM misses
    cache_bytes: float = 0.0  # bytes of one copy of the tables gathered fast: its LLC share, at most the TLB reach
    table_miss_dram: np.ndarray | None = None  # per table: steady-state fraction missing the LLC (DRAM traffic)
    dram_cache_bytes: float = 0.0  # LLC bytes one copy of the tables may use


class PerfModel:
    """Calibrated analytic latency / max-load model.  Cheap: thousands of evaluations per second."""

    def __init__(self, calibration: Calibration | str | Path | None = None) -> None:
        if isinstance(calibration, Calibration):
            self.cal = calibration
        else:
            self.cal = load_calibration(calibration)
        self.times = ServiceTimes(self.cal)
        self._costs: dict[int, tuple[ModelSpec, ModelCost]] = {}

    def _cost(self, spec: ModelSpec) -> ModelCost:
        """``model_cost(spec)`` looked up by the spec object: a spec of many tables costs far more to hash than to
        find by identity, and the planners evaluate one spec thousands of times."""
        held = self._costs.get(id(spec))
        if held is None or held[0] is not spec:
            if len(self._costs) >= 256:
                self._costs.clear()
            held = self._costs[id(spec)] = (spec, model_cost(spec))
        return held[1]

    def call_times(self, spec: ModelSpec, server: ServerType, alloc: Allocation, st: _Static, m: np.ndarray,
                   slow: float) -> list[np.ndarray]:
        """Per-stage service time (ms) of one call of ``m`` items (``ServiceTimes.call_times``)."""
        return self.times.call_times(spec, server, alloc, st, m, slow)

    # ------------------------------------------------------------------ public API
    def latency_ms(self, spec: ModelSpec, server: ServerType, batch: int, alloc: Allocation | None = None,
                   qps: float = 0.0) -> float:
        """Mean latency of one query of ``batch`` items, with no queueing (``qps`` only sets bandwidth load)."""
        alloc = alloc or Allocation()
        mix = SizeMix(np.array([max(1, int(batch))]), np.array([1.0]))
        st = self._static(spec, server, alloc, job_items(alloc, mix))
        stations = _RateModel(self, spec, server, alloc, st, mix).stations(qps)
        return float(sum(s.span[0] for s in stations))

    def call_ms(self, spec: ModelSpec, server: ServerType, batch: int, alloc: Allocation | None = None) -> float:
        """Service time of one inference call of ``batch`` items on one worker (no splitting)."""
        alloc = alloc or Allocation()
        st = self._static(spec, server, alloc, float(batch))
        times = self.call_times(spec, server, alloc, st, np.array([float(batch)]), self._slowdown(alloc, server, 0.0))
        return float(sum(t[0] for t in times))

    def call_ms_many(self, spec: ModelSpec, server: ServerType, batches: np.ndarray,
                     alloc: Allocation | None = None) -> np.ndarray:
        """``call_ms`` of each batch size, computed together: with no co-runner the load-independent part of the
        model does not depend on the call's size, so it is worked out once."""
        alloc = alloc or Allocation()
        sizes = np.asarray(batches, dtype=float)
        if corunner_threads(alloc) or sizes.size == 0:
            return np.array([self.call_ms(spec, server, int(b), alloc) for b in sizes])
        st = self._static(spec, server, alloc, float(sizes[0]))
        times = self.call_times(spec, server, alloc, st, sizes, self._slowdown(alloc, server, 0.0))
        return np.sum(times, axis=0)

    def max_load(self, spec: ModelSpec, server: ServerType, alloc: Allocation | None = None,
                 sizes: np.ndarray | list[int] | None = None, sla: SLA | None = None) -> float:
        """Highest Poisson arrival rate (QPS) meeting the SLA percentile; 0.0 when none does."""
        return self.evaluate(spec, server, alloc, sizes, sla).max_qps

    def evaluate(self, spec: ModelSpec, server: ServerType, alloc: Allocation | None = None,
                 sizes: np.ndarray | list[int] | SizeMix | None = None, sla: SLA | None = None,
                 with_latency: bool = True) -> LoadResult:
        """Max load and what goes with it; ``with_latency=False`` skips the sojourn percentile (faster)."""
        alloc = alloc or Allocation()
        sla = sla or spec.sla
        mix = sizes if isinstance(sizes, SizeMix) else SizeMix.of(sizes)
        st = self._static(spec, server, alloc, job_items(alloc, mix))
        if st.reason:
            return LoadResult(0.0, False, st.reason, mem_gb=st.mem_gb, cores_used=st.cores_used)
        span_scale = jitter(sla.percentile, self.cal.p99_over_mean)
        at = _RateModel(self, spec, server, alloc, st, mix)

        def at_rate(qps: float) -> list[Station] | None:
            if at.mem_util(qps) >= 0.99:
                return None
            return at.stations(qps)

        upper = at.upper_qps()
        qps = solve_max_load(at_rate, mix.probs, sla.percentile, sla.target_ms, upper, span_scale)
        if qps <= 0:
            return LoadResult(0.0, False, f"p{sla.percentile:g} latency exceeds {sla.target_ms:g} ms even at zero load",
                              mem_gb=st.mem_gb, cores_used=st.cores_used)
        stations = at.stations(qps)
        lat = sojourn_percentile(stations, mix.probs, qps, sla.percentile, span_scale) if with_latency else math.nan
        busy = self._busy_fraction(server, alloc, st, stations, mix, qps)
        return LoadResult(
            max_qps=qps,
            feasible=True,
            latency_ms=lat,
            power_w=self.power_w(server, busy),
            membw_gbs=at.dram_gbs(qps),
            mem_gb=st.mem_gb,
            cores_used=st.cores_used,
            details={"busy": busy, "llc_miss": st.miss_e, "weights_miss": st.miss_w},
        )

    def evaluate_many(self, spec: ModelSpec, server: ServerType, allocs: list[Allocation],
                      sizes: np.ndarray | list[int] | SizeMix | None = None, sla: SLA | None = None
                      ) -> list[LoadResult]:
        """:meth:`evaluate` (without latency) for many allocations at once: CPU allocations share one
        vectorised bisection over arrival rates (what exhaustive search needs); others go one by one."""
        sla = sla or spec.sla
        mix = sizes if isinstance(sizes, SizeMix) else SizeMix.of(sizes)
        out: list[LoadResult | None] = [None] * len(allocs)
        batch: list[tuple[int, _RateModel]] = []
        for i, alloc in enumerate(allocs):
            st = self._static(spec, server, alloc, job_items(alloc, mix))
            if st.reason:
                out[i] = LoadResult(0.0, False, st.reason, mem_gb=st.mem_gb, cores_used=st.cores_used)
            elif st.on_accel:
                out[i] = self.evaluate(spec, server, alloc, mix, sla, with_latency=False)
            else:
                batch.append((i, _RateModel(self, spec, server, alloc, st, mix)))
        if batch:
            qps = _solve_many([rm for _, rm in batch], mix.probs, sla,
                              jitter(sla.percentile, self.cal.p99_over_mean))
            for (i, rm), q in zip(batch, qps, strict=True):
                if q <= 0:
                    out[i] = LoadResult(0.0, False, f"p{sla.percentile:g} latency exceeds {sla.target_ms:g} ms "
                                        "even at zero load", mem_gb=rm.st.mem_gb, cores_used=rm.st.cores_used)
                    continue
                stations = rm.stations(float(q))
                busy = self._busy_fraction(server, rm.alloc, rm.st, stations, mix, float(q))
                out[i] = LoadResult(float(q), True, latency_ms=math.nan, power_w=self.power_w(server, busy),
                                    membw_gbs=rm.dram_gbs(float(q)), mem_gb=rm.st.mem_gb,
                                    cores_used=rm.st.cores_used,
                                    details={"busy": busy, "llc_miss": rm.st.miss_e, "weights_miss": rm.st.miss_w})
        return [r for r in out if r is not None]

    def footprint_gb(self, spec: ModelSpec, server: ServerType, alloc: Allocation | None = None) -> float:
        return self._static(spec, server, alloc or Allocation()).mem_gb

    def max_workers(self, spec: ModelSpec, server: ServerType, alloc: Allocation | None = None) -> int:
        """Most one-core workers that fit memory and cores (Hera's worker limit for capacity-bound models)."""
        alloc = alloc or Allocation()
        best = 0
        for w in range(1, server.cores + 1):
            st = self._static(spec, server, _replace(alloc, workers=w))
            if st.reason:
                break
            best = w
        return best

    def power_w(self, server: ServerType, busy: float) -> float:
        """Power drawn when ``busy`` (0..1) of the server's compute is in use."""
        peak = self.provisioned_power_w(server)
        idle = self.cal.idle_power_frac
        return peak * (idle + (1.0 - idle) * min(max(busy, 0.0), 1.0))

    @staticmethod
    def provisioned_power_w(server: ServerType) -> float:
        if server.power_w is not None:
            return float(server.power_w)
        raise SpecError(f"server {server.name!r} has no power_w; add it to the server spec")

    # ------------------------------------------------------------------ internals
    def _static(self, spec: ModelSpec, server: ServerType, alloc: Allocation, items: float | None = None) -> _Static:
        """``items``: the mean items of one call (a sub-batch), which sizes the co-runners' private LLC data;
        default ``alloc.batch``, else the default query mix's mean."""
        cal = self.cal
        cost = self._cost(spec)
        on_accel = bool(server.accelerator) and alloc.accelerator is not False
        if alloc.accelerator and not server.accelerator:
            raise SpecError(f"server {server.name!r} has no accelerator")
        if alloc.pipeline:
            cores = alloc.sparse_workers * alloc.cores_per_worker + (0 if on_accel else alloc.workers)
        else:
            cores = alloc.workers * alloc.cores_per_worker
        copies = alloc.workers if alloc.tables == "copied" and not alloc.pipeline else 1
        reason = ""
        if cores > server.cores:
            reason = f"needs {cores} cores, server has {server.cores}"
        threads = alloc.workers + alloc.sparse_workers
        host_emb = cost.emb_bytes
        host_gather = 1.0
        if on_accel:
            dev_cap = server.accel_mem_gb * 1e9 * cal.mem_usable_frac - alloc.workers * cost.weight_bytes
            per_copy = max(dev_cap, 0.0) / (alloc.workers if alloc.tables == "copied" else 1)
            if per_copy <= 0:
                reason = reason or "dense weights do not fit accelerator memory"
            hot = self._hit(cost, per_copy, self._zipf(alloc))
            host_gather = 1.0 - hot
            if alloc.pipeline:
                host_gather = 1.0  # SparseNet stays on the host, DenseNet on the device
        mem_gb = (copies * host_emb + threads * cost.weight_bytes) / 1e9 + threads * cal.runtime_gb_per_worker
        if mem_gb > server.mem_gb * cal.mem_usable_frac:
            reason = reason or f"needs {mem_gb:.1f} GB of memory, server has {server.mem_gb:g} GB"
        cache = server.llc_mb * 1e6
        if alloc.llc_ways is not None and server.llc_ways > 0:
            cache *= min(alloc.llc_ways, server.llc_ways) / server.llc_ways
        cache = max(cache - displaced_llc_bytes(cost, alloc, items or alloc.batch or default_mean_items()), 0.0)
        per_copy_cache = cache / copies
        weights = 0.0 if on_accel and not alloc.pipeline else cost.weight_bytes
        miss_w = max(0.0, 1.0 - per_copy_cache / weights) if weights > 0 else 0.0
        emb_cache = max(per_copy_cache - weights, 0.0)
        miss_e = 1.0 - self._hit(cost, emb_cache, self._zipf(alloc))
        # a row is gathered fast only if its page is in the TLB as well as the row in the LLC: beyond the TLB reach a
        # page walk per row costs about a DRAM miss (both hosts: +10-20 ns per lookup from an 8 MB to a 200 MB table,
        # whether the LLC is 32 or 300 MB), while the DRAM traffic is still what misses the LLC
        reach = cal.tlb_reach_mb * 1e6 if cal.tlb_reach_mb > 0 else math.inf
        table_miss = 1.0 - self._table_hits(cost, min(emb_cache, reach), self._zipf(alloc))
        table_miss_dram = 1.0 - self._table_hits(cost, emb_cache, self._zipf(alloc))
        return _Static(cost, on_accel, cores, mem_gb, miss_w, miss_e, host_gather, reason, nmp_ranks(server),
                       table_miss, min(per_copy_cache, reach), table_miss_dram, per_copy_cache)

    @staticmethod
    def _table_hits(cost: ModelCost, cache_bytes: float, s: float) -> np.ndarray:
        rows = np.array(cost.table_rows, dtype=float)
        if cost.emb_bytes <= 0:
            return np.ones_like(rows)
        return zipf_hit(cache_bytes / cost.emb_bytes * rows, rows, s)

    def _zipf(self, alloc: Allocation) -> float:
        return self.cal.zipf_s if alloc.zipf_s is None else alloc.zipf_s

    @staticmethod
    def _hit(cost: ModelCost, cache_bytes: float, s: float) -> float:
        """Byte-weighted hit rate when ``cache_bytes`` hold each table's hottest rows (in proportion to size)."""
        if cost.emb_bytes <= 0:
            return 1.0
        rows = np.array(cost.table_rows, dtype=float)
        row_bytes = np.array(cost.table_row_bytes, dtype=float)
        traffic = np.array(cost.table_lookups, dtype=float) * row_bytes
        cached_rows = cache_bytes / cost.emb_bytes * rows
        hit = zipf_hit(cached_rows, rows, s)
        return float((traffic * hit).sum() / traffic.sum())

    def _slowdown(self, alloc: Allocation, server: ServerType, own_gbs: float) -> float:
        u = (own_gbs + alloc.corunner_gbs) / (server.mem_bw_gbs * self.cal.membw_eff)
        u = min(u, 0.99)
        return 1.0 + u * u / (2.0 * (1.0 - u))

    def _dram_bytes_per_item(self, st: _Static, m: float = 128.0) -> float:
        miss = float(self.times.miss_bytes(st, np.array([m]), bool(st.nmp_ranks), dram=True)[0])
        if st.nmp_ranks:  # gather-reduce happens in the DIMMs: only pooled results cross the memory bus
            miss += st.cost.multihot_pooled_bytes_per_item
        return miss * st.host_gather_frac

    def _busy_fraction(self, server: ServerType, alloc: Allocation, st: _Static, stations: list[Station],
                       mix: SizeMix, qps: float) -> float:
        if st.on_accel:
            return max(min(s.utilisation(qps), 1.0) for s in stations)
        pools_cores = ([alloc.sparse_workers * alloc.cores_per_worker, alloc.workers] if alloc.pipeline
                       else [alloc.workers * alloc.cores_per_worker])
        busy = sum(min(s.utilisation(qps), 1.0) * cores
                   for s, cores in zip(stations, pools_cores, strict=True))
        return busy / server.cores


def nmp_ranks(server: ServerType) -> int:
    """Near-memory-processing parallelism of a server: ``nmp_ranks`` if the spec has it, else the N of
    "NMPxN" in its source (Hercules Table II), else 2; 0 without NMP."""
    if not server.nmp:
        return 0
    ranks = int(getattr(server, "nmp_ranks", 0) or 0)
    if ranks:
        return ranks
    found = re.search(r"NMPx(\d+)", server.source or "")
    return int(found.group(1)) if found else 2


def _replace(alloc: Allocation, **changes: object) -> Allocation:
    from dataclasses import replace

    return replace(alloc, **changes)


class _RateModel:
    """Stations of one (model, server, allocation, mix) as a function of the arrival rate.

    CPU service times are linear in the DRAM slowdown, so they are computed once at two slowdowns
    and interpolated for every rate the max-load bisection tries.
    """

    def __init__(self, pm: PerfModel, spec: ModelSpec, server: ServerType, alloc: Allocation, st: _Static,
                 mix: SizeMix) -> None:
        self.pm, self.spec, self.server, self.alloc, self.st, self.mix = pm, spec, server, alloc, st, mix
        calls_per_query = float((mix.probs * np.ceil(mix.sizes / (alloc.batch or 10**9))).sum())
        self.gb_per_query = (mix.mean * pm._dram_bytes_per_item(st, float(min(alloc.batch or mix.mean, mix.mean)))
                             + calls_per_query * st.cost.weight_bytes
                             * st.miss_w) / 1e9
        self.bw = server.mem_bw_gbs * pm.cal.membw_eff
        n = mix.sizes.astype(float)
        b = float(alloc.batch) if alloc.batch else float(n.max())
        self.full = np.floor(n / b)
        self.rem = n - self.full * b
        self.k = self.full + (self.rem > 0)
        self.b = b
        self.fuse = bool(alloc.fuse and st.on_accel)
        sub = np.concatenate([[b], np.where(self.rem > 0, self.rem, b)])
        self.linear = not st.on_accel
        self.sub = sub
        self.pools = [alloc.sparse_workers, alloc.workers] if alloc.pipeline else [alloc.workers]
        self.has_rem = self.rem > 0
        self.probs = mix.probs
        if self.linear:  # service times are base + slowdown * dram: precompute every moment's coefficients
            t1 = pm.call_times(spec, server, alloc, st, sub, 1.0)
            t2 = pm.call_times(spec, server, alloc, st, sub, 2.0)
            self.coef = [self._coefficients(2 * a - c, c - a, pool) for a, c, pool in zip(t1, t2, self.pools,
                                                                                          strict=True)]

    def _coefficients(self, base: np.ndarray, dram: np.ndarray, c: int) -> tuple:
        p, full, k = self.probs, self.full, self.k
        bf, df = float(base[0]), float(dram[0])
        br, dr = np.where(self.has_rem, base[1:], 0.0), np.where(self.has_rem, dram[1:], 0.0)
        ek, ek2 = float(p @ k), float(p @ (k * k))
        work = (float(p @ (full * bf + br)), float(p @ (full * df + dr)))
        work2 = (float(p @ (full * bf * bf + br * br)), float(p @ (2 * (full * bf * df + br * dr))),
                 float(p @ (full * df * df + dr * dr)))
        single = k <= c
        rounds = np.ceil(k / c)
        span0 = np.where(single, np.where(full > 0, bf, br), rounds * bf)
        span1 = np.where(single, np.where(full > 0, df, dr), rounds * df)
        return c, ek, ek2, work, work2, span0, span1

    def dram_gbs(self, qps: float) -> float:
        return qps * self.gb_per_query

    def mem_util(self, qps: float) -> float:
        return (self.dram_gbs(qps) + self.alloc.corunner_gbs) / self.bw

    def stations(self, qps: float) -> list[Station]:
        slow = self.pm._slowdown(self.alloc, self.server, self.dram_gbs(qps))
        if self.linear:
            return [Station(c, ek, ek2, w[0] + slow * w[1], w2[0] + slow * w2[1] + slow * slow * w2[2],
                            s0 + slow * s1) for c, ek, ek2, w, w2, s0, s1 in self.coef]
        times = self.pm.call_times(self.spec, self.server, self.alloc, self.st, self.sub, slow)
        full, k = self.full, self.k
        out = []
        for t, c in zip(times, self.pools, strict=True):
            t_full = float(t[0])
            t_rem = np.where(self.has_rem, t[1:], 0.0)
            first = np.where(full > 0, t_full, t_rem)
            span = np.where(k <= c, first, np.ceil(k / c) * t_full)
            out.append(Station.from_jobs(c, self.probs, k, full * t_full + t_rem,
                                         full * t_full * t_full + t_rem * t_rem, span))
        if self.fuse and self.b > self.mix.mean / float(self.probs @ self.k):  # room for two jobs in a launch
            out[-1] = self._fused_station(qps, slow, self.pools[-1])
        return out

    def _launch_ms(self, items: float, slow: float) -> float:
        """Service time (ms) of one device launch of ``items`` items (the device stage's call time)."""
        times = self.pm.call_times(self.spec, self.server, self.alloc, self.st, np.array([items]), slow)
        return float(times[-1][0])

    def _fusion(self, qps: float, slow: float, c: int) -> tuple[float, float, float]:
        """(jobs per fused launch ``f``, its largest value, launch ms) at ``qps`` (Hercules §III-B query fusion).

        A free device thread launches every job (query or sub-batch, ``mean_job`` items on average) that arrived
        while it was busy, up to ``batch`` items: with jobs arriving at ``lam`` per ms over ``c`` threads, a launch
        that takes ``T(f)`` ms finds ``f = lam·T(f)/c`` jobs waiting: the smallest fixed point of that map, by
        iteration from 1 (no fusion) and capped at ``batch / mean_job``.  Nothing is fitted: ``T`` is the model's
        own call time at ``f·mean_job`` items (launches, PCIe, device compute: its per-launch costs are amortised
        over ``f`` jobs)."""
        ek = float(self.probs @ self.k)
        mean_job = self.mix.mean / ek
        cap = max(self.b / mean_job, 1.0)
        lam = qps / 1000.0 * ek
        f = 1.0
        t = self._launch_ms(mean_job, slow)
        for _ in range(100):
            nxt = min(max(lam * t / c, 1.0), cap)
            if abs(nxt - f) <= 1e-6 * f:
                break
            f = nxt
            t = self._launch_ms(min(f * mean_job, self.b), slow)
        return f, cap, t

    def _fused_station(self, qps: float, slow: float, c: int) -> Station:
        """The device station with query fusion at ``qps``.  A job that arrives while its thread is busy waits for
        the launch in progress (busy with probability ``rho``; at most one launch) and rides the next one with every
        job that arrived meanwhile, so no queue forms beyond one launch until launches of the full ``batch`` cannot
        keep up (then the station is overloaded).  Its span: that wait plus its own launch (``L`` = the fused launch
        size, or its own size if larger; a query split into full sub-batches takes its rounds of full launches)."""
        f, cap, t = self._fusion(qps, slow, c)
        ek = float(self.probs @ self.k)
        per_job = t / f
        rho = qps / 1000.0 * ek * per_job / c
        if f >= cap * (1 - 1e-9) and rho >= 1.0:
            return Station(c, ek, float(self.probs @ (self.k * self.k)), ek * per_job, ek * per_job * per_job,
                           np.full(len(self.k), np.inf))
        launch = min(f * self.mix.mean / ek, self.b)
        n = self.mix.sizes.astype(float)
        own = self.pm.call_times(self.spec, self.server, self.alloc, self.st, np.maximum(n, launch), slow)[-1]
        own = np.where(self.k <= 1, own, np.ceil(self.k / c) * self._launch_ms(self.b, slow))
        return Station(c, ek, float(self.probs @ (self.k * self.k)), ek * per_job, ek * per_job * per_job,
                       min(rho, 1.0) * t + own, batched=True)

    def upper_qps(self) -> float:
        """An arrival rate no allocation can sustain (every pool saturated at the fastest service)."""
        stations = self.stations(0.0)
        caps = [s.c / max(s.ework, 1e-9) * 1000.0 for s in stations]
        if self.fuse:  # full fused launches: ``batch / mean job`` jobs per launch of ``batch`` items
            ek = float(self.probs @ self.k)
            mean_job = self.mix.mean / ek
            per_job = self._launch_ms(self.b, self.pm._slowdown(self.alloc, self.server, 0.0)) / max(
                self.b / mean_job, 1.0)
            caps[-1] = max(caps[-1], stations[-1].c / max(ek * per_job, 1e-9) * 1000.0)
        cap = min(caps)
        if self.gb_per_query > 0:
            cap = min(cap, max(self.bw - self.alloc.corunner_gbs, 0.0) / self.gb_per_query)
        return max(cap, 1e-6) * 1.0001


def _erlang_c_many(c: np.ndarray, a: np.ndarray) -> np.ndarray:
    b = np.ones_like(a)
    for k in range(1, int(c.max()) + 1):
        b = np.where(k <= c, a * b / (k + a * b), b)
    rho = a / c
    return b / (1.0 - rho * (1.0 - b))


def _solve_many(models: list[_RateModel], probs: np.ndarray, sla: SLA, span_scale: float,
                iterations: int = 24) -> np.ndarray:
    """Vectorised :func:`solve_max_load` over CPU rate models (same queueing formulas, plain bisection)."""
    n_stages = max(len(m.coef) for m in models)
    shape = (len(models), n_stages)
    c, ek, ek2 = np.ones(shape), np.ones(shape), np.ones(shape)
    w = np.zeros(shape + (2,))
    w2 = np.zeros(shape + (3,))
    s0 = np.zeros(shape + (len(probs),))
    s1 = np.zeros(shape + (len(probs),))
    active = np.zeros(shape, dtype=bool)
    for i, m in enumerate(models):
        for j, (cj, ekj, ek2j, wj, w2j, s0j, s1j) in enumerate(m.coef):
            c[i, j], ek[i, j], ek2[i, j] = cj, ekj, ek2j
            w[i, j], w2[i, j], s0[i, j], s1[i, j] = wj, w2j, s0j, s1j
            active[i, j] = True
    gb = np.array([m.gb_per_query for m in models])
    bw = np.array([m.bw for m in models])
    corunner = np.array([m.alloc.corunner_gbs for m in models])
    upper = np.array([m.upper_qps() for m in models])
    allowed = 1.0 - sla.percentile / 100.0

    def violation(qps: np.ndarray) -> np.ndarray:
        u = (qps * gb + corunner) / bw
        uc = np.minimum(u, 0.99)
        slow = (1.0 + uc * uc / (2.0 * (1.0 - uc)))[:, None]
        ework = w[..., 0] + slow * w[..., 1]
        ework2 = w2[..., 0] + slow * w2[..., 1] + slow * slow * w2[..., 2]
        es, es2 = ework / ek, ework2 / ek
        a = qps[:, None] / 1000.0 * ework
        over = active & ((a >= c) | (es <= 0))
        a_ok = np.where(over, 0.0, a)
        cs2 = np.maximum(es2 / np.maximum(es * es, 1e-300) - 1.0, 0.0)
        ca2 = ek2 / ek
        pw = np.where(active, _erlang_c_many(c, a_ok), 0.0)
        theta = np.where(active, (c - a_ok) / np.maximum(es, 1e-300) * 2.0 / (ca2 + cs2), np.inf)
        p_wait = 1.0 - np.prod(1.0 - pw, axis=1)
        th = theta.min(axis=1)
        span = ((s0 + slow[..., None] * s1) * active[..., None]).sum(axis=1) * span_scale
        y = sla.target_ms - span
        tail = np.where(y < 0, 1.0, p_wait[:, None] * np.exp(-th[:, None] * np.maximum(y, 0.0)))
        exceed = tail @ probs
        bad = over.any(axis=1) | (u >= 0.99)
        return np.where(bad, 1.0, exceed - allowed)

    lo, hi = upper * 1e-6, upper.copy()
    feasible = violation(lo) <= 1e-12
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = violation(mid) <= 1e-12
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.where(feasible, lo, 0.0)
