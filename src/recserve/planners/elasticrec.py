"""ElasticRec (Choi et al.): split a model into a dense shard and hotness-sorted embedding shards,
each replicated only as much as its own traffic needs (Alg. 1 cost, Alg. 2 DP partitioning).

Inputs are a :class:`ShardCostModel` (gather-QPS regression and dense-shard QPS, read from
Profile tables) and the per-table access CDF; the output is a :class:`ShardPlan`.  The exact DP
of the paper is O(S·N²) over row positions; :func:`partition_table` runs the same recurrence
over a candidate grid of boundaries (CDF quantiles ∪ log-spaced row counts), vectorised with
numpy, and :func:`partition_exact` keeps the full recurrence for checking the gap on small tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from recserve.errors import InfeasibleError, ProfileError, SpecError
from recserve.planners.plan import ShardPlan, TableShards
from recserve.planners.replicas import DENSE_LATENCY_FRACTION, replicas_for, sla_bounded_qps, tail_factor
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ModelSpec, ServerType

MiB = 1024**2
MEASURED_REPLICA_BYTES = 30 * MiB  # ≈30 MB PSS per shard replica process, measured live (docs/elasticrec.md)
PAPER_DP_TARGET_QPS = 1000.0       # §IV-B: the DP's constant QPS goal ("we utilized 1000")
PAPER_RPC_MS = 31.0                # §VI-B: "the additional communication overheads of ElasticRec adds 31 ms of
                                   # average latency (8% of SLA)" on the paper's CPU-only cluster
PAPER_GPU_RPC_MS = 60.0            # §VI-C: on the CPU-GPU (GKE) cluster the communication "adds 60 ms of average
                                   # latency (15% of SLA)"
PAPER_NODE_SOCKETS = 2             # §V-A: "each CPU node is equipped with a dual-socket Intel Xeon Gold 6242 ...
                                   # 32 logical cores and 192 GB of DRAM per socket"; Fig. 15 counts such nodes
LOCALITY_MODELS = ("two-level", "zipf")
EXACT_ROWS = 1 << 20  # memory utility reads rows one by one up to here, ...
UTILITY_BLOCKS = 1 << 16  # ... and beyond in this many geometric blocks


@dataclass(frozen=True)
class ShardCostModel:
    """What a shard replica costs and sustains on one server type.

    Gather time per query is ``gather_ms0 + gather_ms_per_row × rows gathered`` (ElasticRec Fig. 9's
    QPS(x) regression in time form); the dense shard sustains ``dense_qps`` per replica, on the accelerator
    ``dense_device`` names ("" = on CPU cores; ElasticRec's CPU-GPU dense shards and model-wise replicas hold a GPU).
    """

    gather_ms0: float
    gather_ms_per_row: float
    dense_qps: float
    min_mem_bytes: float = MEASURED_REPLICA_BYTES
    dense_bytes: float = 0.0
    source: str = ""
    dense_device: str = ""

    def gather_qps(self, rows_gathered: np.ndarray | float) -> np.ndarray | float:
        return 1000.0 / (self.gather_ms0 + self.gather_ms_per_row * np.asarray(rows_gathered, dtype=float))

    def model_qps(self, total_rows_gathered: float) -> float:
        """A monolithic replica runs the gathers and the dense part back to back."""
        return 1000.0 / (1000.0 / self.dense_qps + self.gather_ms0 + self.gather_ms_per_row * total_rows_gathered)

    def shard_replica_bytes(self, rows: np.ndarray | float, row_bytes: float) -> np.ndarray | float:
        """One replica of a shard of ``rows`` rows: its rows and the container's minimum allocation."""
        return rows * float(row_bytes) + self.min_mem_bytes

    def dense_replica_bytes(self) -> float:
        return self.dense_bytes + self.min_mem_bytes

    def modelwise_replica_bytes(self, spec: ModelSpec) -> float:
        """One model-wise replica: every table whole, the dense part and the minimum allocation."""
        return spec.embedding_bytes + self.dense_bytes + self.min_mem_bytes


def fit_gather_regression(table: ProfileTable) -> tuple[float, float]:
    """Least-squares fit of per-query gather time (ms) against gathers per query."""
    x = table.column("gathers")
    ms = 1000.0 / table.column("qps")
    if len(x) < 2:
        raise ProfileError(f"profile {table.key}: need at least two points to fit QPS(x)")
    slope, intercept = np.polyfit(x, ms, 1)
    return max(float(intercept), 1e-6), max(float(slope), 1e-9)


def cost_model_from_profiles(profiles: ProfileSet, model: ModelSpec, server: str, batch: int,
                             min_mem_bytes: float = MEASURED_REPLICA_BYTES) -> ShardCostModel:
    """Read the gather regression (kind ``gather_qps`` on ``server``) and the model's measured
    ``latency_vs_batch``; the dense shard's time is the whole-model latency at ``batch`` less the
    gathers the regression predicts for it (never below a tenth of the whole)."""
    gathers = profiles.find(server=server, kind="gather_qps")
    if not gathers:
        raise ProfileError(f"no gather_qps profile for server {server!r}; run `recserve profile host`")
    g0, g1 = fit_gather_regression(gathers[0])
    whole_ms = profiles.get(model.name, server, "latency_vs_batch").interp(batch, "mean_ms")
    dense_ms = max(whole_ms - (g0 + g1 * batch * model.lookups_per_item), 0.1 * whole_ms)
    dense_bytes = sum(a * b for a, b in zip((model.dense_in, *model.bottom_mlp), model.bottom_mlp, strict=False)) * 4
    return ShardCostModel(g0, g1, 1000.0 / dense_ms, min_mem_bytes, float(dense_bytes),
                          source=f"{gathers[0].source} ({server})")


def cost_model_from_perfmodel(spec: ModelSpec, server: ServerType, batch: int, perfmodel: Any = None,
                              min_mem_bytes: float = MEASURED_REPLICA_BYTES) -> ShardCostModel:
    """The same cost model, from the calibrated perfmodel for server types we cannot run: the
    sparse and dense stage times of a one-core sparse-dense pipeline, with the gather regression
    fitted over single-table variants of ``spec`` gathering 1/8 … all of its rows per query.  On a server with an
    accelerator the dense stage runs on it (the perfmodel's device path) and the gathers on the host, as ElasticRec's
    CPU-GPU deployment places them (§IV-A)."""
    from recserve.perfmodel import Allocation, PerfModel

    pm = perfmodel or PerfModel()
    alloc = Allocation(workers=1, sparse_workers=1)
    st = pm._static(spec, server, alloc)
    m = np.array([float(batch)])
    dense_ms = float(pm.call_times(spec, server, alloc, st, m, 1.0)[1][0])
    table = spec.tables[0]
    total = batch * spec.lookups_per_item
    xs, ys = [], []
    for frac in (0.125, 0.25, 0.5, 1.0):
        pooling = max(1, int(round(total * frac / batch)))
        variant = replace(spec, tables=(replace(table, pooling=pooling, kind="pooled"),), interaction="concat")
        vst = pm._static(variant, server, alloc)
        xs.append(pooling * batch)
        ys.append(float(pm.call_times(variant, server, alloc, vst, m, 1.0)[0][0]))
    slope, intercept = np.polyfit(xs, ys, 1)
    dense_bytes = float(st.cost.weight_bytes) if hasattr(st.cost, "weight_bytes") else 0.0
    return ShardCostModel(max(float(intercept), 1e-6), max(float(slope), 1e-9), 1000.0 / dense_ms, min_mem_bytes,
                          dense_bytes, source=f"modelled ({server.name})",
                          dense_device=(server.accelerator or "") if st.on_accel else "")


# ------------------------------------------------------------------ access distribution


def access_cdf(sorted_counts: np.ndarray) -> np.ndarray:
    """CDF over hotness-sorted rows: ``cdf[x]`` = share of accesses to the ``x`` hottest rows (cdf[0] = 0)."""
    counts = np.asarray(sorted_counts, dtype=float)
    total = counts.sum()
    if total <= 0:
        raise SpecError("access counts must not all be zero")
    return np.concatenate([[0.0], np.cumsum(counts) / total])


class ModelledCDF:
    """A modelled table's access CDF (``cdf[x]``: the share of accesses to the ``x`` hottest rows) evaluated at the
    rows the planner reads: a few thousand candidate boundaries, so a table of 600 M rows never becomes an array of
    600 M floats (4.5 GiB)."""

    def __init__(self, rows: int, at: Callable[[np.ndarray], np.ndarray]) -> None:
        self.rows, self.size, self._at = rows, rows + 1, at

    def __getitem__(self, x: Any) -> np.ndarray:
        return self._at(np.asarray(x, dtype=np.int64))

    def rows_reaching(self, shares: np.ndarray) -> np.ndarray:
        """``np.searchsorted(cdf, shares)``: for each share the fewest hottest rows whose accesses reach it."""
        lo, hi = np.zeros(len(shares), np.int64), np.full(len(shares), self.rows, np.int64)
        while np.any(lo < hi):
            mid = (lo + hi) // 2
            below = self[mid] < shares
            lo, hi = np.where(below, mid + 1, lo), np.where(below, hi, mid)
        return lo


def two_level_at(rows: int, locality: float, hot_fraction: float = 0.1) -> Callable[[np.ndarray], np.ndarray]:
    """The locality-P model of ElasticRec §V-C as a function of the rows: the hottest ``hot_fraction`` of rows take
    share ``locality`` of accesses, uniform within each group."""
    hot = max(1, int(round(rows * hot_fraction)))

    def at(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(x <= hot, locality * x / hot, locality + (1 - locality) * (x - hot) / max(rows - hot, 1))

    return at


def locality_cdf(rows: int, locality: float, hot_fraction: float = 0.1) -> np.ndarray:
    """:func:`two_level_at` over every row, as an array."""
    return two_level_at(rows, locality, hot_fraction)(np.arange(rows + 1))


def zipf_locality_cdf(rows: int, locality: float, hot_fraction: float = 0.1) -> np.ndarray:
    """CDF of a Zipf table with locality ``locality`` (the hottest ``hot_fraction`` take that share): hotness
    keeps falling inside the hot set, so a hotter sub-range can earn more replicas than the rest of it."""
    from recserve.workload.indices import zipf_alpha_for_locality, zipf_rank_cdf

    return zipf_rank_cdf(rows, zipf_alpha_for_locality(locality, rows, hot_fraction))


def modelled_cdf(rows: int, locality: float, model: str = "two-level") -> ModelledCDF:
    """The CDF the planner reads for a table with no measured access counts."""
    if model not in LOCALITY_MODELS:
        raise SpecError(f"locality model must be one of {LOCALITY_MODELS}, got {model!r}")
    if model == "two-level":
        return ModelledCDF(rows, two_level_at(rows, locality))
    from recserve.workload.indices import zipf_alpha_for_locality, zipf_rank_cdf_at

    return ModelledCDF(rows, zipf_rank_cdf_at(rows, zipf_alpha_for_locality(locality, rows, 0.1)))


def rows_reaching(cdf: np.ndarray | ModelledCDF, shares: np.ndarray) -> np.ndarray:
    """``np.searchsorted(cdf, shares, side="left")`` for a measured CDF (an array) or a modelled one."""
    return cdf.rows_reaching(shares) if isinstance(cdf, ModelledCDF) else np.searchsorted(cdf, shares, side="left")


# ------------------------------------------------------------------ latency budget (§IV-D)


@dataclass(frozen=True)
class LatencyBudget:
    """Where each stage's tail must stay for a query to meet its SLA, as ElasticRec deploys (§IV-D): the dense
    shard scales out at 65% of the SLA; the gathers and one RPC hop share the rest.  A model-wise replica has
    the whole SLA.  Each replica is sized to its QPSmax under its budget (:func:`sla_bounded_qps`), so no
    replica runs at a utilisation whose queueing alone breaks the SLA."""

    sla_ms: float
    percentile: float = 95.0
    rpc_ms: float = 2.0

    @property
    def dense_ms(self) -> float:
        return DENSE_LATENCY_FRACTION * self.sla_ms

    @property
    def gather_ms(self) -> float:
        return self.sla_ms - self.dense_ms - self.rpc_ms

    def gather_rate(self, qps: np.ndarray | float) -> np.ndarray | float:
        return sla_bounded_qps(qps, self.gather_ms, self.percentile)

    def describe(self) -> str:
        return (f"replicas sized to QPSmax for p{self.percentile:g} within budget: dense {self.dense_ms:g} ms "
                f"(65% of the SLA), gathers {self.gather_ms:g} ms (the rest less {self.rpc_ms:g} ms RPC), "
                f"model-wise {self.sla_ms:g} ms; M/M/1 per replica")


# ------------------------------------------------------------------ Alg. 1 and Alg. 2


def shard_rates(cdf: np.ndarray, starts: np.ndarray, ends: np.ndarray, gathers_per_query: float,
                cost: ShardCostModel, budget: LatencyBudget | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rows gathered per query, QPS one replica takes) for shards [start, end): QPS(ns), or QPSmax in budget."""
    ns = (cdf[ends] - cdf[starts]) * gathers_per_query
    rate = cost.gather_qps(ns)
    return ns, (rate if budget is None else budget.gather_rate(rate))


def shard_cost(cdf: np.ndarray, starts: np.ndarray, ends: np.ndarray, gathers_per_query: float, row_bytes: int,
               target_qps: float, cost: ShardCostModel,
               budget: LatencyBudget | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1 COST for shards holding sorted rows [start, end): (memory bytes, replicas). Vectorised.

    Replicas are ``ceil(target / QPS(ns))`` (a replica count is whole; the paper writes ``//``); with a
    ``budget``, QPS(ns) is the shard's QPSmax, and a shard no replica count keeps in budget costs infinity."""
    _, rate = shard_rates(cdf, starts, ends, gathers_per_query, cost, budget)
    with np.errstate(divide="ignore"):
        replicas = np.where(rate > 0, replicas_for(target_qps, np.maximum(rate, 1e-300)), np.inf)
    memory = replicas * cost.shard_replica_bytes(ends - starts, row_bytes)
    return memory, replicas


def _dp(points: np.ndarray, cdf: np.ndarray, gathers: float, row_bytes: int, target: float,
        cost: ShardCostModel, max_shards: int, budget: LatencyBudget | None = None) -> tuple[float, list[int]]:
    """Alg. 2 over boundary candidates ``points`` (sorted, starting at 0, ending at N)."""
    g = points.size
    starts, ends = np.meshgrid(points, points, indexing="ij")          # [k, j]: shard [points[k], points[j])
    valid = starts < ends
    mem, _ = shard_cost(cdf, np.where(valid, starts, 0), np.where(valid, ends, 1), gathers, row_bytes, target, cost,
                        budget)
    mem = np.where(valid, mem, np.inf)
    best = mem[0].copy()                                               # one shard ending at each point
    choices = [np.zeros(g, dtype=np.int64)]
    overall, overall_level = best[-1], 0
    for _level in range(1, max_shards):
        total = best[:, None] + mem                                    # previous shards end at k, last is [k, j)
        arg = np.argmin(total, axis=0)
        best = total[arg, np.arange(g)]
        choices.append(arg)
        if best[-1] < overall - 1e-6:
            overall, overall_level = best[-1], _level
    cuts, j = [g - 1], g - 1
    for level in range(overall_level, 0, -1):
        j = int(choices[level][j])
        cuts.append(j)
    cuts.append(0)
    return float(overall), sorted({int(points[c]) for c in cuts})


def candidate_points(cdf: np.ndarray, grid: int = 512) -> np.ndarray:
    """Boundary candidates: access-share quantiles ∪ log- and linearly spaced row counts ∪ {0, N}."""
    n = cdf.size - 1
    if n + 1 <= grid * 2:
        return np.arange(n + 1)
    quantiles = rows_reaching(cdf, np.linspace(0, 1, grid))
    logs = np.geomspace(1, n, grid).astype(np.int64)
    linear = np.linspace(0, n, grid).astype(np.int64)
    return np.unique(np.concatenate([[0, n], np.clip(quantiles, 0, n), logs, linear]))


def partition_table(name: str, cdf: np.ndarray, gathers_per_query: float, row_bytes: int, target_qps: float,
                    cost: ShardCostModel, max_shards: int = 16, grid: int = 512,
                    budget: LatencyBudget | None = None) -> TableShards:
    """Cheapest shard count and boundaries for one table (DP over a candidate grid)."""
    points = candidate_points(cdf, grid)
    memory, bounds = _dp(points, cdf, gathers_per_query, row_bytes, target_qps, cost, max_shards, budget)
    if not math.isfinite(memory):
        whole_ms = tail_factor(budget.percentile) * 1000.0 / float(cost.gather_qps(gathers_per_query))
        raise InfeasibleError(f"table {name}: no split into at most {max_shards} shards keeps every shard's "
                              f"p{budget.percentile:g} within {budget.gather_ms:g} ms, the gathers' share of the "
                              f"{budget.sla_ms:g} ms p{budget.percentile:g} SLA ({budget.dense_ms:g} ms goes to the "
                              f"dense shard, {budget.rpc_ms:g} ms to the RPC); unsplit its gathers take "
                              f"{whole_ms:.1f} ms at p{budget.percentile:g}; raise the SLA or lower the batch")
    return _table_shards(name, bounds, cdf, gathers_per_query, row_bytes, target_qps, cost, budget)


def _table_shards(name: str, bounds: list[int], cdf: np.ndarray, gathers_per_query: float, row_bytes: int,
                  target_qps: float, cost: ShardCostModel, budget: LatencyBudget | None) -> TableShards:
    b = np.array(bounds)
    memory, replicas = shard_cost(cdf, b[:-1], b[1:], gathers_per_query, row_bytes, target_qps, cost, budget)
    rows_gathered, rate = shard_rates(cdf, b[:-1], b[1:], gathers_per_query, cost, budget)
    return TableShards(name, [int(x) for x in bounds], [int(r) for r in replicas], [float(x) for x in rows_gathered],
                       float(memory.sum()), [float(q) for q in np.atleast_1d(rate)])


def partition_exact(cdf: np.ndarray, gathers_per_query: float, row_bytes: int, target_qps: float,
                    cost: ShardCostModel, max_shards: int,
                    budget: LatencyBudget | None = None) -> tuple[float, list[int]]:
    """The paper's DP over every row position (for checking the grid on small tables)."""
    return _dp(np.arange(cdf.size), cdf, gathers_per_query, row_bytes, target_qps, cost, max_shards, budget)


# ------------------------------------------------------------------ whole-model plan


def unloaded_latency_ms(cost: ShardCostModel, tables: list[TableShards]) -> float:
    """One query with no queueing: every shard gathers in parallel, then the dense shard runs."""
    slowest = max((float(1000.0 / cost.gather_qps(ns)) for t in tables for ns in t.rows_gathered), default=0.0)
    return slowest + 1000.0 / cost.dense_qps


def _check_sla(spec: ModelSpec, batch: int, cost: ShardCostModel, tables: list[TableShards]) -> None:
    """Replicas add throughput, never speed: a query slower than the SLA unloaded fails it at any replica count."""
    latency = unloaded_latency_ms(cost, tables)
    if latency > spec.sla.target_ms:
        raise InfeasibleError(f"{spec.name}: a query of batch {batch} takes {latency:.1f} ms unloaded on its "
                              f"shards, over the {spec.sla.target_ms:g} ms p{spec.sla.percentile:g} SLA; lower "
                              "the batch")


def plan_shards(spec: ModelSpec, target_qps: float, cost: ShardCostModel, batch: int = 32,
                locality: float = 0.9, cdfs: dict[str, np.ndarray] | None = None, max_shards: int = 16,
                grid: int = 512, locality_model: str = "two-level", dp_target_qps: float | None = None,
                size_for_sla: bool = True, rpc_ms: float = 2.0, paper_dp_rule: bool = False) -> ShardPlan:
    """ElasticRec plan for ``spec`` at ``target_qps`` vs model-wise replication of the whole model.

    Each table's CDF comes from ``cdfs`` (measured access counts) or the locality-P model
    (``locality_model``: two-level, or Zipf with the same P).  ``dp_target_qps`` partitions at the paper's
    constant QPS goal (:data:`PAPER_DP_TARGET_QPS`) and then sizes each shard's replicas for ``target_qps``;
    ``paper_dp_rule`` does so at :func:`paper_dp_target` per table (the constant, kept above one replica's rate).
    ``size_for_sla`` gives every replica (shards and the model-wise baseline alike) its QPSmax under the
    SLA's :class:`LatencyBudget` instead of its saturation rate, as the paper's autoscaler targets do."""
    budget = _shard_budget(spec, target_qps, batch, max_shards, locality, size_for_sla, rpc_ms)
    tables, total_gathers = _partition_tables(spec, target_qps, cost, batch, locality, cdfs, max_shards, grid,
                                              locality_model, dp_target_qps, paper_dp_rule, budget)
    _check_sla(spec, batch, cost, tables)
    dense_rate, model_rate = _whole_rates(spec, cost, total_gathers, budget)
    dense_replicas = int(replicas_for(target_qps, dense_rate))
    dense_memory = dense_replicas * cost.dense_replica_bytes()
    model_replicas = int(replicas_for(target_qps, model_rate))
    model_memory = model_replicas * cost.modelwise_replica_bytes(spec)
    return ShardPlan(model=spec.name, target_qps=target_qps, batch=batch, dense_replicas=dense_replicas,
                     dense_memory_bytes=dense_memory, tables=tables, modelwise_replicas=model_replicas,
                     modelwise_memory_bytes=model_memory,
                     assumptions=_assumptions(spec, target_qps, cost, tables, locality, locality_model, bool(cdfs),
                                              dp_target_qps, paper_dp_rule, budget))


def _shard_budget(spec: ModelSpec, target_qps: float, batch: int, max_shards: int, locality: float,
                  size_for_sla: bool, rpc_ms: float) -> LatencyBudget | None:
    """The inputs checked, and the SLA's latency budget replicas are sized under (None: saturation rates)."""
    if not (math.isfinite(target_qps) and target_qps > 0):
        raise SpecError(f"target QPS must be a finite number > 0, got {target_qps}")
    if batch < 1 or max_shards < 1 or not 0 <= locality <= 1:
        raise SpecError(f"batch and max_shards must be >= 1 and locality in [0, 1], got {batch}, {max_shards}, "
                        f"{locality}")
    budget = LatencyBudget(spec.sla.target_ms, spec.sla.percentile, rpc_ms) if size_for_sla else None
    if budget is not None and budget.gather_ms <= 0:
        raise InfeasibleError(f"{spec.name}: the {rpc_ms:g} ms RPC hop leaves the gathers no time in the "
                              f"{spec.sla.target_ms:g} ms SLA after the dense shard's 65%")
    return budget


def _partition_tables(spec: ModelSpec, target_qps: float, cost: ShardCostModel, batch: int, locality: float,
                      cdfs: dict[str, np.ndarray] | None, max_shards: int, grid: int, locality_model: str,
                      dp_target_qps: float | None, paper_dp_rule: bool,
                      budget: LatencyBudget | None) -> tuple[list[TableShards], float]:
    """Each table's shards (the DP at its partitioning target, replicas resized for ``target_qps`` where that
    differs), and the gathers per query over all tables."""
    tables = []
    total_gathers = 0.0
    solved: dict[tuple[int, int, int], TableShards] = {}  # identical modelled tables share one DP
    for t in spec.tables:
        cdf = (cdfs or {}).get(t.name)
        gathers = batch * t.pooling
        total_gathers += gathers
        key = (t.rows, t.row_bytes(spec.bytes_per_elem), gathers)
        if cdf is None and key in solved:
            tables.append(replace(solved[key], table=t.name))
            continue
        table_cdf = modelled_cdf(t.rows, locality, locality_model) if cdf is None else cdf
        dp_target = paper_dp_target(table_cdf, gathers, cost, budget) if paper_dp_rule else dp_target_qps
        shards = partition_table(t.name, table_cdf, gathers, t.row_bytes(spec.bytes_per_elem),
                                 dp_target or target_qps, cost, max_shards, grid, budget)
        if dp_target:
            shards = resize_shards(shards, table_cdf, gathers, t.row_bytes(spec.bytes_per_elem), target_qps, cost,
                                   budget)
        if cdf is None:
            solved[key] = shards
        tables.append(shards)
    return tables, total_gathers


def _assumptions(spec: ModelSpec, target_qps: float, cost: ShardCostModel, tables: list[TableShards],
                 locality: float, locality_model: str, measured_cdfs: bool, dp_target_qps: float | None,
                 paper_dp_rule: bool, budget: LatencyBudget | None) -> list[str]:
    """What the plan took as given, in the order the plan prints them."""
    return [f"locality P={locality:g} ({locality_model}) where no access counts given"
            if not measured_cdfs else "CDFs from measured access counts",
            *([f"partitioned at the paper's constant {dp_target_qps:g} QPS, replicas sized for "
               f"{target_qps:g} QPS"] if dp_target_qps and not paper_dp_rule else []),
            *([f"partitioned at the paper's DP constant ({PAPER_DP_TARGET_QPS:g} QPS, raised per "
               "table to twice an unsplit replica's rate where one replica would take it), "
               f"replicas sized for {target_qps:g} QPS"] if paper_dp_rule else []),
            budget.describe() if budget else "replicas sized to saturation rates (no SLA budget)",
            f"min memory per replica {cost.min_mem_bytes / MiB:.0f} MiB",
            f"cost model source: {cost.source or 'given'}",
            f"unloaded query latency {unloaded_latency_ms(cost, tables):.2f} ms within the "
            f"{spec.sla.target_ms:g} ms SLA"]


def paper_dp_target(cdf: np.ndarray, gathers_per_query: float, cost: ShardCostModel,
                    budget: LatencyBudget | None = None) -> float:
    """§IV-B's constant QPS goal for the DP: 1000 in the paper, which says "any QPS values that make the number of
    replicas larger than 1 can be utilized".  Where one replica of the unsplit table takes 1000 QPS (faster hardware
    than the paper's), 1000 breaks that condition and the DP has nothing to trade (every shard one replica, so no
    split ever pays); the goal is then twice that replica's rate, the least whole multiple that needs two."""
    _, whole = shard_rates(cdf, np.array([0]), np.array([cdf.size - 1]), gathers_per_query, cost, budget)
    return max(PAPER_DP_TARGET_QPS, 2.0 * float(np.atleast_1d(whole)[0]))


def _whole_rates(spec: ModelSpec, cost: ShardCostModel, total_gathers: float,
                 budget: LatencyBudget | None) -> tuple[float, float]:
    """QPS one dense-shard replica and one model-wise replica take (QPSmax in ``budget`` when given)."""
    dense, model = cost.dense_qps, cost.model_qps(total_gathers)
    if budget is None:
        return dense, model
    return (_bounded(spec, "dense shard", dense, budget.dense_ms, budget.percentile),
            _bounded(spec, "model-wise replica", model, budget.sla_ms, budget.percentile))


def modelwise_qps_max(spec: ModelSpec, cost: ShardCostModel, batch: int) -> float:
    """One model-wise replica's QPSmax within the SLA (0 where even an idle one misses it): what ``plan_shards``
    sizes the model-wise baseline by."""
    total_gathers = sum(batch * t.pooling for t in spec.tables)
    return float(sla_bounded_qps(cost.model_qps(total_gathers), spec.sla.target_ms, spec.sla.percentile))


def _bounded(spec: ModelSpec, what: str, qps: float, budget_ms: float, percentile: float) -> float:
    """``what``'s QPSmax within ``budget_ms``; InfeasibleError when even an idle replica misses it."""
    rate = float(sla_bounded_qps(qps, budget_ms, percentile))
    if rate <= 0:
        raise InfeasibleError(f"{spec.name}: a {what} idle has a p{percentile:g} of "
                              f"{tail_factor(percentile) * 1000.0 / qps:.1f} ms (M/M/1), over its {budget_ms:g} ms "
                              "budget; lower the batch")
    return rate


def resize_shards(shards: TableShards, cdf: np.ndarray, gathers_per_query: float, row_bytes: int,
                  target_qps: float, cost: ShardCostModel, budget: LatencyBudget | None = None) -> TableShards:
    """The same boundaries with replicas and memory for another target (Alg. 1 COST at ``target_qps``)."""
    return _table_shards(shards.table, shards.boundaries, cdf, gathers_per_query, row_bytes, target_qps, cost, budget)


# ------------------------------------------------------------------ utility, servers, cost, SLA (§VI)


def shard_utility(cdf: np.ndarray | ModelledCDF, boundaries: list[int], lookups: float) -> list[float]:
    """Expected share of each shard's rows touched by ``lookups`` draws from ``cdf`` (ElasticRec Fig. 14's
    memory utility over the first 1,000 queries): a row of access probability p is touched with 1-(1-p)^n.

    Rows are read one by one up to ``EXACT_ROWS`` and beyond in geometric blocks of nearly equal p (each row of a
    block taken at the block's mean), so a table of any size costs the same."""
    n = cdf.size - 1
    edges = np.arange(min(n, EXACT_ROWS) + 1)
    if n > EXACT_ROWS:
        edges = np.unique(np.concatenate([edges, np.geomspace(EXACT_ROWS, n, UTILITY_BLOCKS).astype(np.int64), [n],
                                          np.asarray(boundaries, dtype=np.int64)]))
    widths = np.diff(edges)
    p = np.clip(np.diff(cdf[edges]) / widths, 0.0, 1.0)
    touched = widths * -np.expm1(lookups * np.log1p(-np.minimum(p, 1 - 1e-15)))
    sums = np.concatenate([[0.0], np.cumsum(touched)])
    at = np.searchsorted(edges, np.asarray(boundaries))
    b = np.asarray(boundaries)
    return [float((sums[j] - sums[i]) / max(e - s, 1))
            for i, j, s, e in zip(at[:-1], at[1:], b[:-1], b[1:], strict=True)]


@dataclass
class Replica:
    """One container: the cores its load needs on the cost model's one-core rates, its memory, and the whole
    accelerators it holds (a Kubernetes GPU request is exclusive: one container per device)."""

    name: str
    cores: float
    memory_bytes: float
    gpus: int = 0


def _cores(load_qps: float, capacity_qps: float, granularity: float = 0.1) -> float:
    return max(granularity, math.ceil(min(1.0, load_qps / capacity_qps) / granularity - 1e-9) * granularity)


def plan_replicas(plan: ShardPlan, spec: ModelSpec, cost: ShardCostModel) -> tuple[list[Replica], list[Replica]]:
    """(ElasticRec replicas, model-wise replicas), each sized to the load it serves."""
    q = plan.target_qps
    gpus = 1 if cost.dense_device else 0
    sharded = [Replica("dense", _cores(q / plan.dense_replicas, cost.dense_qps), cost.dense_replica_bytes(), gpus)
               for _ in range(plan.dense_replicas)]
    for t, tab in zip(plan.tables, spec.tables, strict=True):
        row_bytes = tab.row_bytes(spec.bytes_per_elem)
        for k, (r, ns) in enumerate(zip(t.replicas, t.rows_gathered, strict=True)):
            rows = t.boundaries[k + 1] - t.boundaries[k]
            sharded += [Replica(f"{t.table}-s{k}", _cores(q / r, float(cost.gather_qps(ns))),
                                cost.shard_replica_bytes(rows, row_bytes)) for _ in range(r)]
    total_gathers = sum(plan.batch * tab.pooling for tab in spec.tables)
    per_model = plan.modelwise_memory_bytes / plan.modelwise_replicas
    modelwise = [Replica("model", _cores(q / plan.modelwise_replicas, cost.model_qps(total_gathers)), per_model, gpus)
                 for _ in range(plan.modelwise_replicas)]
    return sharded, modelwise


def pack_servers(replicas: list[Replica], server: ServerType, sockets: int = 1, gpus_per_server: int | None = None
                 ) -> int:
    """First-fit decreasing by memory onto servers of ``sockets`` × ``server``'s cores and memory (a Kubernetes
    scheduler placing pods by their requests on nodes of that many sockets of the type: ElasticRec's nodes are two
    sockets, :data:`PAPER_NODE_SOCKETS`).  ``gpus_per_server`` also caps the replicas' whole accelerators per server
    (ElasticRec's GKE nodes: one T4 each); None ignores them.  Raises SpecError for a replica no server can hold."""
    if sockets < 1:
        raise SpecError(f"sockets per server must be >= 1, got {sockets}")
    cap_mem, cap_cores = sockets * server.mem_gb * 1e9, float(sockets * server.cores)
    cap_gpus = math.inf if gpus_per_server is None else gpus_per_server
    bins: list[list[float]] = []
    first = (lambda r: (-r.gpus, -r.memory_bytes)) if gpus_per_server is not None else (lambda r: -r.memory_bytes)
    for rep in sorted(replicas, key=first):
        if rep.memory_bytes > cap_mem or rep.cores > cap_cores or rep.gpus > cap_gpus:
            raise SpecError(f"replica {rep.name} ({rep.memory_bytes / 1e9:.1f} GB, {rep.gpus} GPU) fits no "
                            f"{f'{sockets}-socket ' if sockets > 1 else ''}{server.name}")
        for b in bins:
            if (b[0] + rep.cores <= cap_cores + 1e-9 and b[1] + rep.memory_bytes <= cap_mem
                    and b[2] + rep.gpus <= cap_gpus):
                b[0] += rep.cores
                b[1] += rep.memory_bytes
                b[2] += rep.gpus
                break
        else:
            bins.append([rep.cores, rep.memory_bytes, rep.gpus])
    return len(bins)


def p95_ms(service_ms: float, load_qps: float, capacity_qps: float) -> float:
    """p95 sojourn of an M/M/1 replica: exponential with mean S / (1 - rho); inf at rho >= 1."""
    rho = load_qps / capacity_qps
    return tail_factor(95.0) * service_ms / (1 - rho) if rho < 1 else math.inf


@dataclass
class ShardEvaluation:
    """ElasticRec §VI's metrics for one plan against model-wise replication."""

    utility_shards: list[float]          # first table, hot -> cold
    utility_modelwise: float
    servers: int
    servers_modelwise: int
    cost_per_hr: float | None
    cost_per_hr_modelwise: float | None
    p95_ms: float
    p95_ms_modelwise: float
    sla_ms: float
    rpc_ms: float
    sockets: int = 1                     # sockets of the server type per counted server (node)

    @property
    def utility_gain(self) -> float:
        return float(np.mean(self.utility_shards)) / self.utility_modelwise

    @property
    def server_saving(self) -> float:
        return self.servers_modelwise / self.servers

    @property
    def sla_ok(self) -> bool:
        return self.p95_ms <= self.sla_ms

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "utility_gain": self.utility_gain, "server_saving": self.server_saving,
                "sla_ok": self.sla_ok, "sla_ok_modelwise": self.p95_ms_modelwise <= self.sla_ms}


def evaluate_plan(plan: ShardPlan, spec: ModelSpec, cost: ShardCostModel, server: ServerType, *,
                  locality: float = 0.9, locality_model: str = "two-level", cdf: np.ndarray | None = None,
                  queries: int = 1000, rpc_ms: float = 2.0, sockets: int = 1,
                  gpus_per_server: int | None = None) -> ShardEvaluation:
    """Memory utility of the first table over ``queries`` queries, servers (nodes of ``sockets`` × ``server``) to
    host every replica, their $/hr (a node costs ``sockets`` × the type's price), and a p95 estimate per
    deployment against the SLA.  ElasticRec's p95 = the slowest shard call + ``rpc_ms`` per hop (2 ms assumed by
    default; the paper measured +31 ms on its cluster, :data:`PAPER_RPC_MS`) + the dense shard.
    ``gpus_per_server``: see :func:`pack_servers`."""
    first, tab = plan.tables[0], spec.tables[0]
    table_cdf = cdf if cdf is not None else modelled_cdf(tab.rows, locality, locality_model)
    lookups = queries * plan.batch * tab.pooling
    utility = shard_utility(table_cdf, first.boundaries, lookups)
    whole = shard_utility(table_cdf, [0, tab.rows], lookups)[0]
    sharded, modelwise = plan_replicas(plan, spec, cost)
    n_er = pack_servers(sharded, server, sockets, gpus_per_server)
    n_mw = pack_servers(modelwise, server, sockets, gpus_per_server)
    q = plan.target_qps
    gather_p95 = max(p95_ms(1000.0 / float(cost.gather_qps(ns)), q / r, float(cost.gather_qps(ns)))
                     for t in plan.tables for r, ns in zip(t.replicas, t.rows_gathered, strict=True))
    dense_p95 = p95_ms(1000.0 / cost.dense_qps, q / plan.dense_replicas, cost.dense_qps)
    total_gathers = sum(plan.batch * t.pooling for t in spec.tables)
    mw_qps = cost.model_qps(total_gathers)
    price = server.price_per_hr * sockets if server.price_per_hr else None
    return ShardEvaluation(utility, whole, n_er, n_mw, price * n_er if price else None,
                           price * n_mw if price else None, gather_p95 + rpc_ms + dense_p95,
                           p95_ms(1000.0 / mw_qps, q / plan.modelwise_replicas, mw_qps), spec.sla.target_ms, rpc_ms,
                           sockets)


def modelwise_replicas_implied(saving: float, spec: ModelSpec, cost: ShardCostModel) -> int:
    """The fewest model-wise replicas a reported memory ``saving`` (model-wise ÷ ElasticRec) can come from.

    ElasticRec holds every row of every table at least once, so its memory is at least the tables' bytes E, while
    N model-wise replicas hold N × (E + dense + min_mem_alloc); a saving s needs N ≥ s · E / (E + dense + min_mem).
    Read off the paper's Fig. 13 savings it bounds how many replicas its model-wise baseline ran."""
    whole = cost.modelwise_replica_bytes(spec)
    return max(1, math.ceil(saving * spec.embedding_bytes / whole - 1e-9))
