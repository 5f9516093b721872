"""ElasticRec (Choi et al.): split a model into a dense shard and hotness-sorted embedding shards,
each replicated only as much as its own traffic needs (Alg. 1 cost, Alg. 2 DP partitioning).

Inputs are a :class:`ShardCostModel` (gather-QPS regression and dense-shard QPS, read from
Profile tables) and the per-table access CDF; the output is a :class:`ShardPlan`.  The exact DP
of the paper is O(S·N²) over row positions; :func:`partition_table` runs the same recurrence
over a candidate grid of boundaries (CDF quantiles ∪ log-spaced row counts), vectorised with
numpy, and :func:`partition_exact` keeps the full recurrence for checking the gap on small tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from recserve.errors import ProfileError, SpecError
from recserve.planners.plan import ShardPlan, TableShards
from recserve.planners.replicas import replicas_for
from recserve.profiles import ProfileSet, ProfileTable
from recserve.specs import ModelSpec, ServerType

MiB = 1024**2


@dataclass(frozen=True)
class ShardCostModel:
    """What a shard replica costs and sustains on one server type.

    Gather time per query is ``gather_ms0 + gather_ms_per_row × rows gathered`` (ElasticRec Fig. 9's
    QPS(x) regression in time form); the dense shard sustains ``dense_qps`` per replica.
    """

    gather_ms0: float
    gather_ms_per_row: float
    dense_qps: float
    min_mem_bytes: float = 256 * MiB
    dense_bytes: float = 0.0
    source: str = ""

    def gather_qps(self, rows_gathered: np.ndarray | float) -> np.ndarray | float:
        return 1000.0 / (self.gather_ms0 + self.gather_ms_per_row * np.asarray(rows_gathered, dtype=float))

    def model_qps(self, total_rows_gathered: float) -> float:
        """A monolithic replica runs the gathers and the dense part back to back."""
        return 1000.0 / (1000.0 / self.dense_qps + self.gather_ms0 + self.gather_ms_per_row * total_rows_gathered)


def fit_gather_regression(table: ProfileTable) -> tuple[float, float]:
    """Least-squares fit of per-query gather time (ms) against gathers per query."""
    x = table.column("gathers")
    ms = 1000.0 / table.column("qps")
    if len(x) < 2:
        raise ProfileError(f"profile {table.key}: need at least two points to fit QPS(x)")
    slope, intercept = np.polyfit(x, ms, 1)
    return max(float(intercept), 1e-6), max(float(slope), 1e-9)


def cost_model_from_profiles(profiles: ProfileSet, model: ModelSpec, server: str, batch: int,
                             min_mem_bytes: float = 256 * MiB) -> ShardCostModel:
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
                              min_mem_bytes: float = 256 * MiB) -> ShardCostModel:
    """The same cost model, from the calibrated perfmodel for server types we cannot run: the
    sparse and dense stage times of a one-core sparse-dense pipeline, with the gather regression
    fitted over single-table variants of ``spec`` gathering 1/8 … all of its rows per query."""
    from recserve.perfmodel import Allocation, PerfModel

    pm = perfmodel or PerfModel()
    alloc = Allocation(workers=1, sparse_workers=1)
    st = pm._static(spec, server, alloc)
    m = np.array([float(batch)])
    dense_ms = float(pm._call_times(spec, server, alloc, st, m, 1.0)[1][0])
    table = spec.tables[0]
    total = batch * spec.lookups_per_item
    xs, ys = [], []
    for frac in (0.125, 0.25, 0.5, 1.0):
        pooling = max(1, int(round(total * frac / batch)))
        variant = replace(spec, tables=(replace(table, pooling=pooling, kind="pooled"),), interaction="concat")
        vst = pm._static(variant, server, alloc)
        xs.append(pooling * batch)
        ys.append(float(pm._call_times(variant, server, alloc, vst, m, 1.0)[0][0]))
    slope, intercept = np.polyfit(xs, ys, 1)
    dense_bytes = float(st.cost.weight_bytes) if hasattr(st.cost, "weight_bytes") else 0.0
    return ShardCostModel(max(float(intercept), 1e-6), max(float(slope), 1e-9), 1000.0 / dense_ms, min_mem_bytes,
                          dense_bytes, source=f"modelled ({server.name})")


# ------------------------------------------------------------------ access distribution


def access_cdf(sorted_counts: np.ndarray) -> np.ndarray:
    """CDF over hotness-sorted rows: ``cdf[x]`` = share of accesses to the ``x`` hottest rows (cdf[0] = 0)."""
    counts = np.asarray(sorted_counts, dtype=float)
    total = counts.sum()
    if total <= 0:
        raise SpecError("access counts must not all be zero")
    return np.concatenate([[0.0], np.cumsum(counts) / total])


def locality_cdf(rows: int, locality: float, hot_fraction: float = 0.1) -> np.ndarray:
    """CDF of a table whose hottest ``hot_fraction`` of rows take share ``locality`` of accesses,
    uniform within each group — the locality-P model of ElasticRec §V-C."""
    hot = max(1, int(round(rows * hot_fraction)))
    x = np.arange(rows + 1, dtype=float)
    return np.where(x <= hot, locality * x / hot, locality + (1 - locality) * (x - hot) / max(rows - hot, 1))


# ------------------------------------------------------------------ Alg. 1 and Alg. 2


def shard_cost(cdf: np.ndarray, starts: np.ndarray, ends: np.ndarray, gathers_per_query: float, row_bytes: int,
               target_qps: float, cost: ShardCostModel) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1 COST for shards holding sorted rows [start, end): (memory bytes, replicas). Vectorised.

    Replicas are ``ceil(target / QPS(ns))`` (a replica count is whole; the paper writes ``//``)."""
    ns = (cdf[ends] - cdf[starts]) * gathers_per_query
    replicas = replicas_for(target_qps, cost.gather_qps(ns))
    memory = replicas * ((ends - starts) * float(row_bytes) + cost.min_mem_bytes)
    return memory, replicas


def _dp(points: np.ndarray, cdf: np.ndarray, gathers: float, row_bytes: int, target: float,
        cost: ShardCostModel, max_shards: int) -> tuple[float, list[int]]:
    """Alg. 2 over boundary candidates ``points`` (sorted, starting at 0, ending at N)."""
    g = points.size
    starts, ends = np.meshgrid(points, points, indexing="ij")          # [k, j]: shard [points[k], points[j])
    valid = starts < ends
    mem, _ = shard_cost(cdf, np.where(valid, starts, 0), np.where(valid, ends, 1), gathers, row_bytes, target, cost)
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
    quantiles = np.searchsorted(cdf, np.linspace(0, 1, grid), side="left")
    logs = np.geomspace(1, n, grid).astype(np.int64)
    linear = np.linspace(0, n, grid).astype(np.int64)
    return np.unique(np.concatenate([[0, n], np.clip(quantiles, 0, n), logs, linear]))


def partition_table(name: str, cdf: np.ndarray, gathers_per_query: float, row_bytes: int, target_qps: float,
                    cost: ShardCostModel, max_shards: int = 16, grid: int = 512) -> TableShards:
    """Cheapest shard count and boundaries for one table (DP over a candidate grid)."""
    points = candidate_points(cdf, grid)
    memory, bounds = _dp(points, cdf, gathers_per_query, row_bytes, target_qps, cost, max_shards)
    b = np.array(bounds)
    _, replicas = shard_cost(cdf, b[:-1], b[1:], gathers_per_query, row_bytes, target_qps, cost)
    rows_gathered = (cdf[b[1:]] - cdf[b[:-1]]) * gathers_per_query
    return TableShards(name, bounds, [int(r) for r in replicas], [float(x) for x in rows_gathered], memory,
                       [float(q) for q in np.atleast_1d(cost.gather_qps(rows_gathered))])


def partition_exact(cdf: np.ndarray, gathers_per_query: float, row_bytes: int, target_qps: float,
                    cost: ShardCostModel, max_shards: int) -> tuple[float, list[int]]:
    """The paper's DP over every row position (for checking the grid on small tables)."""
    return _dp(np.arange(cdf.size), cdf, gathers_per_query, row_bytes, target_qps, cost, max_shards)


# ------------------------------------------------------------------ whole-model plan


def plan_shards(spec: ModelSpec, target_qps: float, cost: ShardCostModel, batch: int = 32,
                locality: float = 0.9, cdfs: dict[str, np.ndarray] | None = None, max_shards: int = 16,
                grid: int = 512) -> ShardPlan:
    """ElasticRec plan for ``spec`` at ``target_qps`` vs model-wise replication of the whole model.

    Each table's CDF comes from ``cdfs`` (measured access counts) or the locality-P model."""
    if target_qps <= 0:
        raise SpecError("target QPS must be positive")
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
        shards = partition_table(t.name, locality_cdf(t.rows, locality) if cdf is None else cdf, gathers,
                                 t.row_bytes(spec.bytes_per_elem), target_qps, cost, max_shards, grid)
        if cdf is None:
            solved[key] = shards
        tables.append(shards)
    dense_replicas = int(replicas_for(target_qps, cost.dense_qps))
    dense_memory = dense_replicas * (cost.dense_bytes + cost.min_mem_bytes)
    model_replicas = int(replicas_for(target_qps, cost.model_qps(total_gathers)))
    model_memory = model_replicas * (spec.embedding_bytes + cost.dense_bytes + cost.min_mem_bytes)
    return ShardPlan(model=spec.name, target_qps=target_qps, batch=batch, dense_replicas=dense_replicas,
                     dense_memory_bytes=dense_memory, tables=tables, modelwise_replicas=model_replicas,
                     modelwise_memory_bytes=model_memory,
                     assumptions=[f"locality P={locality:g} where no access counts given" if not cdfs else
                                  "CDFs from measured access counts",
                                  f"min memory per replica {cost.min_mem_bytes / MiB:.0f} MiB",
                                  f"cost model source: {cost.source or 'given'}"])
