"""Table-batched embeddings: every table of a zoo model in one weight per embedding width.

Why (docs/decisions/2026-11-24-fuse-tables-in-node.md): a zoo model pools each table with its own
``EmbeddingBag`` call.  On a CPU core each call costs its dispatch; on a GPU it is several kernel launches plus, in
``QueryBatch.tables``, a device-to-host sync, so a model of 100 tables spends most of a GPU pass launching
kernels.  FBGEMM's table-batched embedding fixes this
with one kernel over all tables; this is the same idea in plain PyTorch, so it needs no extra wheel and runs
wherever PyTorch does: the tables of one width are concatenated into one weight, each table's ids are shifted
by its first row, and a single ``embedding_bag`` over all ``T * B`` bags pools every table at once.  Sequence
tables (DIN/DIEN behaviour histories) are gathered from the same weight with one index computed on the
device.  Nothing in a pass waits for the device, so a pass is a short run of kernel launches.

On CPU workers too, through :meth:`RecModel.fuse_tables`: the tables' rows move into the fused weights and each table's
weight becomes a view of them, so the node still holds one copy (shared by every worker).  There the ids are shifted
with numpy (one ``repeat`` and one add; torch's ``repeat_interleave`` and gather cost half a large pass), and a CPU
pass costs one lookup call instead of one per table.  A query of over ``HOST_FUSED_IDS_PER_TABLE`` ids a table takes
the per-table path (the ids' copy would cost more than the calls it saves).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from recserve.zoo.base import DramTable, RecModel
from recserve.zoo.batch import QueryBatch


def table_of_values(lens: torch.Tensor, count: int) -> torch.Tensor:
    """The table of each of a query's ``count`` values (table-major, ``lens`` ``[T, B]``), on ``lens``' device."""
    return torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens.sum(dim=1),
                                   output_size=count)


# On the host a fused pass trades each table's lookup call for a shifted copy of the query's ids: past ~30 k ids a
# table the copy costs more than the calls it saves, so larger queries take the per-table path over the same rows
# (``RecModel.sparse``; docs/decisions/2026-11-24-fuse-tables-in-node.md).
HOST_FUSED_IDS_PER_TABLE = 30_000
# From this many ids a table on (on average), ``shifted`` adds each table's first row to its own slice, one call a
# table, instead of adding a repeat of the shifts: a temporary as long as the ids, written and read again.
SHIFT_BY_TABLE_IDS = 12_000  # docs/decisions/2026-11-29-shift-ids-by-table.md


def shifted(values: np.ndarray, counts: np.ndarray, first_row: np.ndarray) -> np.ndarray:
    """Table-major ids (``counts[t]`` of table ``t`` in turn) as rows of the fused weight: each plus its table's
    first row, as int64 (a new array; a ``repeat`` of the shifts costs ~1 ns an id, torch's index gather ~7).  Long
    slices are shifted one add each, straight into the result, computed in int64 so no shift wraps."""
    if len(values) < SHIFT_BY_TABLE_IDS * len(counts):
        return values.astype(np.int64, copy=False) + np.repeat(first_row, counts)
    ids = np.empty(len(values), np.int64)
    start = 0
    for first, count in zip(first_row.tolist(), counts.tolist(), strict=True):
        np.add(values[start : start + count], first, out=ids[start : start + count], dtype=np.int64)
        start += count
    return ids


class FusedTables(nn.Module):
    """The sparse part of ``model`` as one lookup per embedding width (scores equal the per-table path).

    ``in_place``: move the rows instead of copying them; each of ``model``'s tables is left a view of its group's
    weight, so the per-table path reads the same memory (one table at a time is copied: no second full copy)."""

    def __init__(self, model: RecModel, in_place: bool = False) -> None:
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
        sizes = [0] * len(self.widths)
        for t, table in enumerate(tables):
            g = group_of[t]
            first_row[t], sizes[g] = sizes[g], sizes[g] + table.num_rows
        for g, width in enumerate(self.widths):  # not in state_dict: the tables' own weights are the saved copy
            fused = torch.empty(sizes[g], width) if in_place else \
                torch.cat([table.weight.detach() for table, x in zip(tables, group_of, strict=True) if x == g])
            self.register_buffer(f"weight{g}", fused, persistent=False)
        if in_place:  # each table's rows copied in, then its own tensor dropped: at most one table held twice
            for t, table in enumerate(tables):
                rows = self.weight(group_of[t])[first_row[t]: first_row[t] + table.num_rows]
                rows.copy_(table.weight.detach())
                table.bag.weight = nn.Parameter(rows, requires_grad=False)
        self.group_of = group_of
        self.register_buffer("first_row", torch.tensor(first_row, dtype=torch.int64), persistent=False)
        self._first_rows = np.array(first_row, np.int64)  # the same as numpy, made once for the host passes
        for g in range(len(self.widths)):  # ids of other widths' tables become row 0, their bags discarded
            self.register_buffer(f"member{g}", torch.tensor([x == g for x in group_of]), persistent=False)
        # per width group, its pooled tables and its sequence tables (``_host_lookup``)
        self._pooled_in = [[t for t, x in enumerate(group_of) if x == g and t not in self.sequence_lengths]
                           for g in range(len(self.widths))]
        self._sequences_in = [[t for t, x in enumerate(group_of) if x == g and t in self.sequence_lengths]
                              for g in range(len(self.widths))]
        self._one_pooled_group = len(self.widths) == 1 and not self.sequence_lengths

    def weight(self, g: int) -> torch.Tensor:
        return getattr(self, f"weight{g}")

    def takes(self, batch: QueryBatch) -> bool:
        """Whether the fused pass is the cheaper one for ``batch``: always on a device (no per-table syncs), on the
        host up to ``HOST_FUSED_IDS_PER_TABLE`` ids a table."""
        if self.weight(0).device.type != "cpu":
            return True
        return batch.values.shape[0] <= HOST_FUSED_IDS_PER_TABLE * self.num_tables

    def forward(self, batch: QueryBatch) -> list[torch.Tensor]:
        """Per table: pooled ``[B, dim]``, or for sequence tables the rows ``[B, L, dim]`` (``RecModel.sparse``)."""
        if batch.values.device.type == "cpu" and self.weight(0).device.type == "cpu":
            return self._host_lookup(batch.values.numpy(), batch.lengths.numpy())
        lens = batch.lengths.to(torch.int64)
        return self.lookup(lens, self.group_ids(batch.values, lens), [self.weight(g) for g in range(len(self.widths))])

    def _host_lookup(self, values: np.ndarray, lengths: np.ndarray) -> list[torch.Tensor]:
        """The pass on the host, where each table's slice of ``values`` is known without a device sync: one
        ``embedding_bag`` per width over only that width's pooled tables (the device path pools every bag of every
        group, which doubled a two-width model's lookups and pooled DIN's 250-id histories for nothing), and each
        sequence table gathered from its own slice."""
        if self._one_pooled_group:
            return self._one_group_lookup(values, lengths)
        tables, size = lengths.shape
        counts = lengths.sum(axis=1, dtype=np.int64)
        ends = np.cumsum(counts)
        starts = ends - counts
        first = self._first_rows
        out: list[torch.Tensor | None] = [None] * tables
        for g, width in enumerate(self.widths):
            weight = self.weight(g)
            pooled, sequences = self._pooled_in[g], self._sequences_in[g]
            if pooled:  # a subset of the ids (the tables of every width pooled at once take ``_one_group_lookup``)
                ids = shifted(np.concatenate([values[starts[t]:ends[t]] for t in pooled]), counts[pooled],
                              first[pooled])
                flat = lengths[pooled].reshape(-1).astype(np.int64)
                offsets = np.cumsum(flat) - flat
                bags = F.embedding_bag(torch.from_numpy(ids), weight, torch.from_numpy(offsets), mode="sum")
                for t, bag in zip(pooled, bags.view(len(pooled), size, width).unbind(0), strict=True):
                    out[t] = bag
            for t in sequences:
                ids = torch.from_numpy(values[starts[t]:ends[t]].astype(np.int64) + first[t])
                out[t] = F.embedding(ids, weight).view(size, self.sequence_lengths[t], width)
        return out  # type: ignore[return-value]

    def _one_group_lookup(self, values: np.ndarray, lengths: np.ndarray) -> list[torch.Tensor]:
        """``_host_lookup`` when every table is pooled and of one width (DLRM's usual case) in fewer numpy and torch
        calls: each value shifted by its table's first row (:func:`shifted`), one bag per ``(table, sample)``, the
        tables' ``[B, dim]`` results as views of one ``unbind``."""
        tables, size = lengths.shape
        flat = lengths.reshape(-1).astype(np.int64)
        ids = shifted(values, lengths.sum(axis=1, dtype=np.int64), self._first_rows)
        offsets = np.cumsum(flat)
        offsets -= flat
        bags = F.embedding_bag(torch.from_numpy(ids), self.weight0, torch.from_numpy(offsets), mode="sum")
        return list(bags.view(tables, size, -1).unbind(0))

    def group_ids(self, values: torch.Tensor, lens: torch.Tensor, first_row: torch.Tensor | None = None,
                  members: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per width group, the row of every value in that group's weight, computed where ``values`` are (ids of
        other widths' tables become row 0, their bags discarded).  ``first_row``/``members``: copies of this
        module's buffers on ``values``' device (``zoo.device_cache`` keeps its weights apart from this module)."""
        first_row = self.first_row if first_row is None else first_row
        if values.device.type == "cpu":
            return self._group_ids_host(values, lens, first_row, members)
        values = values.to(torch.int64)
        owner = table_of_values(lens, values.shape[0])
        return self.split_groups(values + first_row[owner], lens, members, owner)

    def _group_ids_host(self, values: torch.Tensor, lens: torch.Tensor, first_row: torch.Tensor,
                        members: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """:meth:`group_ids` on the host, with numpy (:func:`shifted`)."""
        counts = lens.sum(dim=1).numpy()
        rows = shifted(values.numpy(), counts, first_row.numpy())
        owner = torch.from_numpy(np.repeat(np.arange(len(counts)), counts)) if len(self.widths) > 1 else None
        return self.split_groups(torch.from_numpy(rows), lens, members, owner)

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
        self.sparse = fused_tables(model)
        model.fused = None  # taken over: the model's own sparse path stays per table, on the host
        self.model = model

    def forward(self, batch: QueryBatch) -> torch.Tensor:
        return self.model.dense(batch.dense, self.sparse(batch))

    def to_device(self, device: torch.device) -> FusedModel:
        """Move the dense layers and the fused weights to ``device``; the per-table copies stay on the host
        (a second copy of every table on the device would halve the tables that fit)."""
        self.sparse.to(device)
        dense_to(self.model, device)
        return self


def fused_tables(model: RecModel) -> FusedTables:
    """``model``'s fused tables: those it holds (``RecModel.fuse_tables``, over its own rows: no second copy), else
    a new copy."""
    return model.fused if isinstance(model.fused, FusedTables) else FusedTables(model)


def dense_to(model: RecModel, device: torch.device | str) -> None:
    """Move ``model``'s dense layers to ``device``, leaving its per-table weights on the host (the tables reach the
    device fused: whole, ``FusedModel``, or as a cache of hot rows, ``zoo.device_cache``)."""
    tables, fused = model.tables, model.fused
    model.tables, model.fused = nn.ModuleList(), None
    try:
        model.to(device)
    finally:
        model.tables, model.fused = tables, fused


def fusable(model: object) -> bool:
    """Whether ``model`` is a zoo model whose every table is in memory (what :class:`FusedTables` needs)."""
    return isinstance(model, RecModel) and all(isinstance(t, DramTable) for t in model.tables)
