"""Table-batched embeddings: every table of a zoo model in one weight per embedding width.

Why (issue #16): a zoo model pools each table with its own ``EmbeddingBag`` call.  On a CPU core that costs
~10 us a table; on a GPU each call is several kernel launches plus, in ``QueryBatch.tables``, a device-to-host
sync, so hercules-rmc2's 100 tables spent most of a GPU pass launching kernels (issue #16's table: 67 ms at
batch 4096 on an H100, against 2.4 ms for hera-wnd's 27 tables).  FBGEMM's table-batched embedding fixes this
with one kernel over all tables; this is the same idea in plain PyTorch, so it needs no extra wheel and runs
wherever PyTorch does: the tables of one width are concatenated into one weight, each table's ids are shifted
by its first row, and a single ``embedding_bag`` over all ``T * B`` bags pools every table at once.  Sequence
tables (DIN/DIEN behaviour histories) are gathered from the same weight with one index computed on the
device.  Nothing in a pass waits for the device, so a pass is a short run of kernel launches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from recserve.zoo.base import DramTable, RecModel
from recserve.zoo.batch import QueryBatch


def table_of_values(lens: torch.Tensor, count: int) -> torch.Tensor:
    """The table of each of a query's ``count`` values (table-major, ``lens`` ``[T, B]``), on ``lens``' device."""
    return torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens.sum(dim=1),
                                   output_size=count)


class FusedTables(nn.Module):
    """The sparse part of ``model`` as one lookup per embedding width (scores equal the per-table path)."""

    def __init__(self, model: RecModel) -> None:
        super().__init__()
        tables = list(model.tables)
        if not all(isinstance(t, DramTable) for t in tables):
            raise ValueError("only tables held in memory (DramTable) can be fused; this model has an SSD or "
                             "sharded table")
        self.num_tables = len(tables)
        self.sequence_lengths = dict(model.sequence_lengths)
        self.widths = sorted({t.dim for t in tables})
        group_of = [self.widths.index(t.dim) for t in tables]
        first_row = [0] * len(tables)
        weights: list[list[torch.Tensor]] = [[] for _ in self.widths]
        sizes = [0] * len(self.widths)
        for t, table in enumerate(tables):
            g = group_of[t]
            first_row[t], sizes[g] = sizes[g], sizes[g] + table.num_rows
            weights[g].append(table.weight.detach())
        for g, parts in enumerate(weights):
            self.register_buffer(f"weight{g}", torch.cat(parts))
        self.group_of = group_of
        self.register_buffer("first_row", torch.tensor(first_row, dtype=torch.int64))
        for g in range(len(self.widths)):  # ids of other widths' tables become row 0, their bags discarded
            self.register_buffer(f"member{g}", torch.tensor([x == g for x in group_of]))

    def weight(self, g: int) -> torch.Tensor:
        return getattr(self, f"weight{g}")

    def forward(self, batch: QueryBatch) -> list[torch.Tensor]:
        """Per table: pooled ``[B, dim]``, or for sequence tables the rows ``[B, L, dim]`` (``RecModel.sparse``)."""
        lens = batch.lengths.to(torch.int64)
        return self.lookup(lens, self.group_ids(batch.values, lens), [self.weight(g) for g in range(len(self.widths))])

    def group_ids(self, values: torch.Tensor, lens: torch.Tensor, first_row: torch.Tensor | None = None,
                  members: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per width group, the row of every value in that group's weight, computed where ``values`` are (ids of
        other widths' tables become row 0, their bags discarded).  ``first_row``/``members``: copies of this
        module's buffers on ``values``' device (``zoo.device_cache`` keeps its weights apart from this module)."""
        first_row = self.first_row if first_row is None else first_row
        values = values.to(torch.int64)
        owner = table_of_values(lens, values.shape[0])
        return self.split_groups(values + first_row[owner], lens, members, owner)

    def split_groups(self, rows: torch.Tensor, lens: torch.Tensor, members: list[torch.Tensor] | None = None,
                     owner: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Per width group, ``rows`` (one per value, each in its own group's weight) where the value's table is of
        that group's width, else row 0 (those bags are discarded).  ``owner``: each value's table, if known."""
        if len(self.widths) == 1:
            return [rows]
        owner = table_of_values(lens, rows.shape[0]) if owner is None else owner
        members = [getattr(self, f"member{g}") for g in range(len(self.widths))] if members is None else members
        return [torch.where(member[owner], rows, 0) for member in members]

    def lookup(self, lens: torch.Tensor, group_ids: list[torch.Tensor],
               weights: list[torch.Tensor]) -> list[torch.Tensor]:
        """The pass itself, given per width group the row of every value in ``weights[g]`` (int64, on the weights'
        device) and the ``[T, B]`` int64 lengths: one ``embedding_bag`` per group, sequence tables gathered.
        ``zoo.device_cache`` calls it with rows remapped to a device cache's slots."""
        tables, size = lens.shape
        counts = lens.sum(dim=1)
        flat = lens.reshape(-1)
        offsets = torch.cumsum(flat, 0) - flat  # each bag's first value, all T * B bags
        starts = torch.cumsum(counts, 0) - counts
        out: list[torch.Tensor | None] = [None] * tables
        for g, width in enumerate(self.widths):
            ids, weight = group_ids[g], weights[g]
            pooled = F.embedding_bag(ids, weight, offsets, mode="sum").view(tables, size, width)
            for t in range(tables):
                if self.group_of[t] != g:
                    continue
                if t in self.sequence_lengths:
                    length = self.sequence_lengths[t]
                    where = starts[t] + torch.arange(size * length, device=ids.device)
                    out[t] = F.embedding(ids[where], weight).view(size, length, width)
                else:
                    out[t] = pooled[t]
        return out  # type: ignore[return-value]


class FusedModel(nn.Module):
    """A zoo model whose sparse part is :class:`FusedTables`; the dense layers are the model's own."""

    def __init__(self, model: RecModel) -> None:
        super().__init__()
        self.sparse = FusedTables(model)
        self.model = model

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        return self.model.dense(batch.dense, self.sparse(batch))

    def to_device(self, device: torch.device) -> FusedModel:
        """Move the dense layers and the fused weights to ``device``; the per-table copies stay on the host
        (a second copy of every table on the device would halve the tables that fit)."""
        self.sparse.to(device)
        dense_to(self.model, device)
        return self


def dense_to(model: RecModel, device: torch.device | str) -> None:
    """Move ``model``'s dense layers to ``device``, leaving its per-table weights on the host (the tables reach the
    device fused: whole, ``FusedModel``, or as a cache of hot rows, ``zoo.device_cache``)."""
    tables = model.tables
    model.tables = nn.ModuleList()
    try:
        model.to(device)
    finally:
        model.tables = tables


def fusable(model: object) -> bool:
    """Whether ``model`` is a zoo model whose every table is in memory (what :class:`FusedTables` needs)."""
    return isinstance(model, RecModel) and all(isinstance(t, DramTable) for t in model.tables)
