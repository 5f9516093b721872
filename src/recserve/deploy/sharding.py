"""From an ElasticRec ShardPlan (full-size) to the shards of a live, scaled model.

Both live backends (local worker pools and Ray Serve) and the Kubernetes export take a
:class:`ShardLayout`: per table the hotness remap, the shard boundaries in the scaled table, and
the replica counts the plan chose.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from recserve.embedding.sharded import hotness_order
from recserve.planners.plan import ShardPlan
from recserve.specs import ModelSpec
from recserve.zoo import QueryBatch, RecModel


@dataclass
class TableLayout:
    table: int
    name: str
    boundaries: list[int]
    replicas: list[int]
    remap: np.ndarray
    qps_max: list[float] = field(default_factory=list)


@dataclass
class ShardLayout:
    spec: ModelSpec
    scale: float
    seed: int
    sla_ms: float
    dense_replicas: int
    tables: list[TableLayout]

    def shard_names(self) -> list[str]:
        return [f"{t.name}-s{s}" for t in self.tables for s in range(len(t.replicas))]


def access_counts(model: RecModel, batches: list[QueryBatch]) -> list[np.ndarray]:
    """Per table, how often each row was read by ``batches`` (the hotness history)."""
    counts = [np.zeros(n, dtype=np.int64) for n in model.rows]
    for batch in batches:
        for t, (indices, _offsets) in enumerate(batch.tables()):
            counts[t] += np.bincount(indices.numpy(), minlength=model.rows[t])
    return counts


def scaled_boundaries(full: list[int], full_rows: int, rows: int) -> list[int]:
    """Shard cut points moved from a full-size table onto the scaled one (kept strictly rising)."""
    cuts = sorted({min(rows - 1, max(1, round(b * rows / full_rows))) for b in full[1:-1]})
    return [0, *cuts, rows]


def layout_from_plan(plan: ShardPlan, model: RecModel, counts: list[np.ndarray], seed: int = 0,
                     scale: float = 1e-3) -> ShardLayout:
    tables = []
    for t, shards in enumerate(plan.tables):
        bounds = scaled_boundaries(shards.boundaries, model.spec.tables[t].rows, model.rows[t])
        replicas = shards.replicas if len(bounds) - 1 == len(shards.replicas) else [max(shards.replicas)] * (
            len(bounds) - 1)
        _, remap = hotness_order(counts[t])
        tables.append(TableLayout(t, model.spec.tables[t].name, bounds, list(replicas), remap))
    return ShardLayout(model.spec, scale, seed, model.spec.sla.target_ms, plan.dense_replicas, tables)


def even_layout(model: RecModel, counts: list[np.ndarray], shards_per_table: int, seed: int = 0,
                scale: float = 1e-3, hot_fraction: float = 0.1) -> ShardLayout:
    """A hot shard of the ``hot_fraction`` hottest rows and the rest split evenly (for tests and demos)."""
    tables = []
    for t, rows in enumerate(model.rows):
        hot = max(1, int(rows * hot_fraction))
        cold = np.linspace(hot, rows, shards_per_table).astype(int).tolist() if shards_per_table > 1 else []
        bounds = sorted({0, *cold, rows}) if shards_per_table > 1 else [0, rows]
        _, remap = hotness_order(counts[t])
        tables.append(TableLayout(t, model.spec.tables[t].name, bounds, [1] * (len(bounds) - 1), remap))
    return ShardLayout(model.spec, scale, seed, model.spec.sla.target_ms, 1, tables)


def shard_weights(model: RecModel, layout: ShardLayout) -> dict[str, np.ndarray]:
    """The rows each shard holds (hotness-sorted slices), keyed by shard name."""
    out = {}
    for t in layout.tables:
        weight = model.tables[t.table].weight.detach()
        sorted_weight = torch.empty_like(weight)
        sorted_weight[torch.from_numpy(t.remap)] = weight
        for s, (a, b) in enumerate(zip(t.boundaries[:-1], t.boundaries[1:], strict=True)):
            out[f"{t.name}-s{s}"] = sorted_weight[a:b].numpy().copy()
    return out


def layout_for_export(plan: ShardPlan, spec: ModelSpec) -> ShardLayout:
    """The full-size layout of a plan, for manifests: boundaries and replicas as planned; the hotness
    remap is computed by each shard server from its access history, so none is carried here."""
    tables = [TableLayout(t, spec.tables[t].name, s.boundaries, s.replicas, np.empty(0, dtype=np.int64))
              for t, s in enumerate(plan.tables)]
    return ShardLayout(spec, 1.0, 0, spec.sla.target_ms, plan.dense_replicas, tables)
