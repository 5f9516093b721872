"""What every zoo model shares: embedding tables behind one lookup interface, and the
sparse/dense split (``sparse`` = lookups → pooled embeddings, ``dense`` = MLPs + interaction).

Running ``dense(batch.dense, sparse(batch))`` is by construction exactly ``forward(batch)``: the
pipelined server, the sharded (ElasticRec) path and the SSD-tiered (SDM) path replace only the
``tables`` and reuse ``dense`` unchanged.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from recserve.specs import ModelSpec
from recserve.zoo.batch import QueryBatch


class TableLookup(Protocol):
    """One embedding table, wherever its rows live (DRAM, SSD tier, remote shards)."""

    num_rows: int
    dim: int

    def pool(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """Sum of the rows of each bag: ``[B, dim]``."""
        ...

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows themselves: ``[N, dim]``."""
        ...


class DramTable(nn.Module):
    """A table held in DRAM as one ``nn.EmbeddingBag`` (sum mode, fbgemm's CPU kernel).

    Rows are drawn from a generator of their own, seeded by one draw from the global RNG, so the
    dense layers built after the tables get the same weights whatever the table sizes: a dense
    shard built with tiny tables equals the dense part of the full model.
    """

    def __init__(self, num_rows: int, dim: int) -> None:
        super().__init__()
        self.num_rows, self.dim = num_rows, dim
        self.bag = nn.EmbeddingBag(num_rows, dim, mode="sum", _weight=torch.empty(num_rows, dim))
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), device="cpu")))
        with torch.no_grad():
            self.bag.weight.uniform_(-0.05, 0.05, generator=generator)

    @property
    def weight(self) -> torch.Tensor:
        return self.bag.weight

    def pool(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bag(indices, offsets)

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        return F.embedding(indices, self.bag.weight)


_HOOKS = torch.nn.modules.module  # where torch keeps its global module hooks


class MLP(nn.Sequential):
    """A Linear+ReLU stack (an ``nn.Sequential``: same parameter names, same state dict).

    Direct (``RecModel.direct_layers``, what workers run): an inference pass calls ``F.linear`` and ``torch.relu``
    itself instead of one ``nn.Module`` call per layer, the very ops ``Linear`` and ``ReLU`` run, so scores are
    bit-identical.  Why: each module call costs Python dispatch, a third of a small MLP's time at batch 1
    (docs/decisions/2026-11-24-worker-per-query-costs.md).  Layers anything hooks (``zoo.flops`` counts through
    hooks) run as modules."""

    _steps: tuple[tuple[torch.Tensor, torch.Tensor | None] | None, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self._steps or self.training or self._hooked():
            return super().forward(x)
        for step in self._steps:
            x = torch.relu(x) if step is None else F.linear(x, step[0], step[1])
        return x

    def _hooked(self) -> bool:
        return bool(_HOOKS._global_forward_hooks or _HOOKS._global_forward_pre_hooks
                    or any(layer._forward_hooks or layer._forward_pre_hooks for layer in self._modules.values()))

    def run_direct(self) -> bool:
        """Take the direct pass from now on, if every layer is a plain ``Linear`` or ``ReLU``; whether it does.
        The parameters are read now (and again after a conversion): call it again after replacing a layer."""
        layers = list(self)
        if not all(type(layer) in (nn.Linear, nn.ReLU) for layer in layers):
            return False
        self._steps = tuple((layer.weight, layer.bias) if type(layer) is nn.Linear else None for layer in layers)
        return True

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - torch's signature
        """``.to(device)``, ``.half()``, ``share_memory()``: the direct pass reads the converted parameters."""
        out = super()._apply(fn, recurse)
        if self._steps:
            self.run_direct()
        return out


def mlp(widths: list[int] | tuple[int, ...], in_features: int, last_activation: bool = True) -> MLP:
    """Linear+ReLU stack; the last layer's activation is optional (score heads add a sigmoid)."""
    layers: list[nn.Module] = []
    for i, width in enumerate(widths):
        layers.append(nn.Linear(in_features, width))
        if last_activation or i < len(widths) - 1:
            layers.append(nn.ReLU())
        in_features = width
    return MLP(*layers)


class RecModel(nn.Module):
    """Base of every zoo model.  Subclasses build their dense layers and implement :meth:`dense`."""

    def __init__(self, spec: ModelSpec, rows: tuple[int, ...]) -> None:
        super().__init__()
        self.spec = spec
        self.rows = rows
        self.tables = nn.ModuleList(DramTable(n, t.dim) for n, t in zip(rows, spec.tables, strict=True))
        self.sequence_lengths = {i: t.pooling for i, t in enumerate(spec.tables) if t.kind == "sequence"}
        self.fused: nn.Module | None = None  # FusedTables over these tables' memory, once fuse_tables() ran

    # ---- the split ------------------------------------------------------------------
    def sparse(self, batch: QueryBatch) -> list[torch.Tensor]:
        """Per table: pooled ``[B, dim]``, or for sequence tables the rows ``[B, L, dim]``."""
        if self.fused is not None and self.fused.takes(batch):
            return self.fused(batch)
        out = []
        for t, (indices, offsets) in enumerate(batch.tables()):
            table = self.tables[t]
            if t in self.sequence_lengths:
                out.append(table.gather(indices).view(batch.size, self.sequence_lengths[t], table.dim))
            else:
                out.append(table.pool(indices, offsets))
        return out

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        """Scores ``[B, towers]`` from the dense input and the sparse part's output."""
        raise NotImplementedError

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        return self.dense(batch.dense, self.sparse(batch))

    # ---- helpers --------------------------------------------------------------------
    def validate(self, batch: QueryBatch, max_batch: int | None = None) -> None:
        batch.validate(self.spec.dense_in, self.rows, self.sequence_lengths, max_batch)

    def fuse_tables(self) -> None:
        """Pool every table in one lookup per embedding width (``zoo.fused``): the rows move into one weight per
        width and each table keeps a view of it, so memory is not doubled and the per-table path reads the same
        rows.  What a CPU worker runs (docs/decisions/2026-11-24-fuse-tables-in-node.md); needs every table in
        DRAM."""
        from recserve.zoo.fused import FusedTables

        self.fused = FusedTables(self, in_place=True)

    def direct_layers(self) -> None:
        """Run every MLP's inference pass without per-layer module calls (``MLP.run_direct``; scores unchanged)."""
        for module in self.modules():
            if isinstance(module, MLP):
                module.run_direct()

    def replace_table(self, t: int, table: TableLookup) -> None:
        """Back table ``t`` by another store (SSD tier, shards) with the same rows."""
        if table.num_rows != self.rows[t] or table.dim != self.tables[t].dim:
            raise ValueError(f"table {t}: replacement has shape ({table.num_rows}, {table.dim}), "
                             f"expected ({self.rows[t]}, {self.tables[t].dim})")
        self.fused = None  # the fused weights no longer hold every table
        self.tables[t] = table  # type: ignore[assignment]

    def pooled_tables(self) -> list[int]:
        return [t for t in range(len(self.rows)) if t not in self.sequence_lengths]
