"""The one input format for every model, server and client.

A query of ``B`` candidate items for a model with ``T`` tables is three tensors (TorchRec's
KeyedJaggedTensor convention, table-major):

- ``dense``          FP32  ``[B, dense_in]``
- ``sparse_values``  INT64 ``[N]``      all indices, table 0's bags first, then table 1's, …
- ``sparse_lengths`` INT32 ``[T, B]``   ids in each (table, sample) bag; ``N = lengths.sum()``

Per table this is the EmbeddingBag convention (indices + offsets), which :meth:`QueryBatch.table`
gives.  Sequence tables (DIN/DIEN behaviour histories) must have every bag exactly ``pooling`` long.
The wire names above are the Open Inference Protocol tensor names; the output is ``scores``
FP32 ``[B, towers]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from recserve.errors import RecserveError
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, SMALL_QUERY_LENGTHS
from recserve.wire import OUTPUT_SCORES as OUTPUT_SCORES  # re-exported: the wire names are imported from here

# (rows, n, rng) -> n int64 ids in [0, rows)
IndexSampler = Callable[[int, int, np.random.Generator], np.ndarray]


class BatchError(RecserveError):
    """A query does not fit the model (wrong shape, dtype, index range, lengths)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class QueryBatch:
    dense: torch.Tensor
    values: torch.Tensor
    lengths: torch.Tensor  # [T, B] int32/int64

    @property
    def size(self) -> int:
        return int(self.dense.shape[0])

    @property
    def num_tables(self) -> int:
        return int(self.lengths.shape[0])

    def table_offsets(self) -> torch.Tensor:
        """Start of each table's slice in ``values`` (length T + 1)."""
        per_table = self.lengths.to(torch.int64).sum(dim=1)
        return torch.cat([torch.zeros(1, dtype=torch.int64, device=per_table.device), torch.cumsum(per_table, 0)])

    def table(self, t: int, starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices, offsets) of table ``t`` in the EmbeddingBag convention."""
        starts = self.table_offsets() if starts is None else starts
        idx = self.values[int(starts[t]) : int(starts[t + 1])]
        lens = self.lengths[t].to(torch.int64)
        offsets = torch.zeros(lens.shape[0], dtype=torch.int64, device=lens.device)
        if lens.shape[0] > 1:
            offsets[1:] = torch.cumsum(lens[:-1], 0)
        return idx, offsets

    def tables(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every table's (indices, offsets), computed with a handful of ops for all tables at once
        (per-table work dominated the sparse part of one-hot models with dozens of tables)."""
        lens = self.lengths.to(torch.int64)
        starts = self.table_offsets().tolist()
        offsets = torch.zeros_like(lens)
        if lens.shape[1] > 1:
            offsets[:, 1:] = torch.cumsum(lens[:, :-1], 1)
        return [(self.values[starts[t] : starts[t + 1]], offsets[t]) for t in range(self.num_tables)]

    def slice(self, start: int, stop: int) -> QueryBatch:
        """Samples ``[start, stop)`` as their own batch (for sub-batching across workers)."""
        starts = self.table_offsets()
        lens = self.lengths.to(torch.int64)
        pieces = []
        for t in range(self.num_tables):
            before = int(lens[t, :start].sum())
            count = int(lens[t, start:stop].sum())
            base = int(starts[t]) + before
            pieces.append(self.values[base : base + count])
        return QueryBatch(self.dense[start:stop], torch.cat(pieces), self.lengths[:, start:stop])

    def as_arrays(self) -> dict[str, np.ndarray]:
        """Wire tensors by their protocol names."""
        return {
            INPUT_DENSE: self.dense.numpy(),
            INPUT_VALUES: self.values.numpy(),
            INPUT_LENGTHS: self.lengths.to(torch.int32).numpy(),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> QueryBatch:
        for name in (INPUT_DENSE, INPUT_VALUES, INPUT_LENGTHS):
            if name not in arrays:
                raise BatchError(name, "input tensor missing")
        return cls(
            dense=_tensor(arrays[INPUT_DENSE]),
            values=_tensor(arrays[INPUT_VALUES]),
            lengths=_tensor(arrays[INPUT_LENGTHS]),
        )

    def validate(self, dense_in: int, rows: tuple[int, ...], seq_lens: dict[int, int] | None = None,
                 max_batch: int | None = None) -> None:
        """Raise :class:`BatchError` naming the offending field; cheap enough for every request."""
        check_query(self.dense.numpy(), self.values.numpy(), self.lengths.numpy(), dense_in, rows, seq_lens,
                    max_batch)


WIRE_DTYPES = {INPUT_DENSE: (np.dtype(np.float32),), INPUT_VALUES: (np.dtype(np.int64),),
               INPUT_LENGTHS: (np.dtype(np.int32), np.dtype(np.int64))}
WIRE_DTYPE_NAMES = {INPUT_DENSE: "FP32", INPUT_VALUES: "INT64", INPUT_LENGTHS: "INT32"}


def check_query(dense: np.ndarray, values: np.ndarray, lengths: np.ndarray, dense_in: int, rows: tuple[int, ...],
                seq_lens: dict[int, int] | None = None, max_batch: int | None = None,
                lengths_checked: bool = False) -> None:
    """Raise :class:`BatchError` unless the three wire arrays are a query this model can run.

    numpy only: the worker validates every query with it before any tensor exists (each torch call on these
    small tensors costs microseconds of dispatch; this check is ~10 µs at batch 1).  ``lengths_checked``: the
    caller has checked already that every length is >= 0 and that they sum to the number of ids (every request the
    serving codec decodes is, by ``serving.codec.check_inputs``), so those two passes over the lengths are skipped;
    their shape, sequence tables and every id's bounds are checked here all the same."""
    check_shapes(dense, values, lengths, dense_in, len(rows), max_batch)
    check_values(values, lengths, rows, seq_lens, lengths_checked)


def check_shapes(dense: np.ndarray, values: np.ndarray, lengths: np.ndarray, dense_in: int, tables: int,
                 max_batch: int | None = None) -> None:
    """``check_query``'s checks of dtypes and shapes: the same for every request a client sends with the same
    header, so a server that has seen one pass them can check only the values of the next (``check_values``)."""
    for name, array in ((INPUT_DENSE, dense), (INPUT_VALUES, values), (INPUT_LENGTHS, lengths)):
        if array.dtype not in WIRE_DTYPES[name]:
            raise BatchError(name, f"dtype must be {WIRE_DTYPE_NAMES[name]}, got {array.dtype}")
    if dense.ndim != 2 or dense.shape[1] != dense_in:
        raise BatchError(INPUT_DENSE, f"shape must be [B, {dense_in}], got {list(dense.shape)}")
    b = dense.shape[0]
    if b < 1:
        raise BatchError(INPUT_DENSE, "batch must hold at least one item")
    if max_batch is not None and b > max_batch:
        raise BatchError(INPUT_DENSE, f"batch {b} exceeds max_batch_size {max_batch}")
    if lengths.shape != (tables, b):
        raise BatchError(INPUT_LENGTHS, f"shape must be [{tables}, {b}], got {list(lengths.shape)}")


def check_values(values: np.ndarray, lengths: np.ndarray, rows: tuple[int, ...],
                 seq_lens: dict[int, int] | None = None, lengths_checked: bool = False) -> None:
    """``check_query``'s checks of the values (of arrays whose dtypes and shapes passed ``check_shapes``): lengths,
    sequence tables, every id within its table."""
    if lengths.size <= SMALL_QUERY_LENGTHS:
        _check_small(values, lengths, rows, seq_lens, lengths_checked)
        return
    if not lengths_checked and lengths.size and lengths.min() < 0:
        raise BatchError(INPUT_LENGTHS, "lengths must be >= 0")
    counts = lengths.sum(axis=1, dtype=np.int64)
    if not lengths_checked and (total := int(counts.sum())) != values.size:
        raise BatchError(INPUT_VALUES, f"has {values.size} ids but lengths sum to {total}")
    for t, length in (seq_lens or {}).items():
        if (lengths[t] != length).any():
            raise _not_sequence(t, length)
    if values.size:
        _check_ids(values, counts, rows)


def _not_sequence(t: int, length: int) -> BatchError:
    return BatchError(INPUT_LENGTHS, f"table {t} is a sequence table: every bag must hold {length} ids")


def _check_small(values: np.ndarray, lengths: np.ndarray, rows: tuple[int, ...],
                 seq_lens: dict[int, int] | None, lengths_checked: bool) -> None:
    """``check_query``'s value checks for a small query: its lengths as lists (one row per table) for the sign, sum
    and sequence checks, then every id against its own table's bound (``_row_bounds`` repeated per id: three numpy
    calls, cheaper than a Python loop over the tables building ``reduceat`` offsets)."""
    if not lengths_checked or seq_lens:
        listed = lengths.tolist()
        if not lengths_checked and any(n < 0 for row in listed for n in row):
            raise BatchError(INPUT_LENGTHS, "lengths must be >= 0")
        if not lengths_checked and (total := sum(map(sum, listed))) != values.size:
            raise BatchError(INPUT_VALUES, f"has {values.size} ids but lengths sum to {total}")
        for t, length in (seq_lens or {}).items():
            if any(n != length for n in listed[t]):
                raise _not_sequence(t, length)
    if not values.size:
        return
    counts = lengths.reshape(-1) if lengths.shape[1] == 1 else lengths.sum(axis=1)
    ids = values.view(np.uint64)  # as unsigned, a negative id is above every row count
    over = ids >= _row_bounds(rows).repeat(counts)
    if np.count_nonzero(over):  # count_nonzero: ``.any()``'s Python wrapper costs more
        first = int(np.flatnonzero(over)[0])
        t = int(np.searchsorted(np.cumsum(counts), first, side="right"))
        raise _out_of_range(values, first, t, rows[t])


def _check_ids(values: np.ndarray, counts: np.ndarray, rows: tuple[int, ...]) -> None:
    """Every id within its table: one max per table with ``reduceat`` (tables are contiguous in ``values``); as
    unsigned, a negative id is above every row count, so one comparison checks both bounds."""
    starts = np.cumsum(counts) - counts
    bounds = _row_bounds(rows)
    if not counts.all():  # reduceat reads an empty table's slot as the next id: compare non-empty tables only
        nonempty = np.flatnonzero(counts)
        starts, bounds = starts[nonempty], bounds[nonempty]
    else:
        nonempty = None
    bad = np.flatnonzero(np.maximum.reduceat(values.view(np.uint64), starts) >= bounds)
    if bad.size:
        t = int(bad[0] if nonempty is None else nonempty[bad[0]])
        start = int(counts[:t].sum())
        table_ids = values[start : start + int(counts[t])].view(np.uint64)
        raise _out_of_range(values, start + int(np.flatnonzero(table_ids >= rows[t])[0]), t, rows[t])


def _out_of_range(values: np.ndarray, at: int, t: int, rows: int) -> BatchError:
    """The 400 of an id outside its table: the first such id, where it is and the table's size, so a client can
    find it (a silent wrap or clamp would answer with another item's row)."""
    return BatchError(INPUT_VALUES, f"table {t} index out of range [0, {rows}): sparse_values[{at}] is "
                                    f"{int(values[at])}")


_ROW_BOUNDS: dict[tuple[int, ...], np.ndarray] = {}


def _row_bounds(rows: tuple[int, ...]) -> np.ndarray:
    """``rows`` as uint64, made once per model (not a fresh array per query: a tenth of the check)."""
    key = rows if isinstance(rows, tuple) else tuple(rows)
    bounds = _ROW_BOUNDS.get(key)
    if bounds is None:
        if len(_ROW_BOUNDS) >= 1024:  # a process that builds many models (tests, a planner's sweep) stays bounded
            _ROW_BOUNDS.clear()
        bounds = _ROW_BOUNDS[key] = np.asarray(key, dtype=np.uint64)
    return bounds


def concat_arrays(queries: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Several queries' ``(dense, values, lengths)`` as one batch, in order (a fused forward pass).

    ``values`` is table-major, so each table's slice of every query is gathered in turn.
    """
    per_table = [np.concatenate([[0], np.cumsum(lengths.sum(axis=1, dtype=np.int64))]) for _, _, lengths in queries]
    tables = queries[0][2].shape[0]
    values = [q[1][starts[t] : starts[t + 1]] for t in range(tables) for q, starts in zip(queries, per_table,
                                                                                         strict=True)]
    lengths = np.concatenate([q[2] for q in queries], axis=1) if len({q[2].dtype for q in queries}) == 1 else \
        np.concatenate([q[2].astype(np.int64) for q in queries], axis=1)
    return np.concatenate([q[0] for q in queries]), np.concatenate(values), lengths


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array``; read-only buffers (decoded straight from a request body) are copied,
    since torch may not alias memory it cannot write."""
    array = np.ascontiguousarray(array)
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def uniform_sampler(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, rows, size=n, dtype=np.int64)


def random_batch(
    dense_in: int,
    rows: tuple[int, ...],
    pooling: tuple[int, ...],
    batch_size: int,
    rng: np.random.Generator | int = 0,
    sampler: IndexSampler = uniform_sampler,
    fixed: tuple[bool, ...] | None = None,
) -> QueryBatch:
    """A synthetic query: pooled bags have 1..2×pooling ids (mean ≈ pooling), sequences exactly pooling."""
    rng = np.random.default_rng(rng) if isinstance(rng, int) else rng
    fixed = fixed or tuple(False for _ in rows)
    lengths = np.empty((len(rows), batch_size), dtype=np.int32)
    values = []
    for t, (n, p, is_fixed) in enumerate(zip(rows, pooling, fixed, strict=True)):
        if is_fixed or p == 1:
            lengths[t] = p
        else:
            lengths[t] = rng.integers(max(1, p // 2), p + p // 2 + 1, size=batch_size)
        values.append(sampler(n, int(lengths[t].sum()), rng))
    dense = rng.standard_normal((batch_size, dense_in), dtype=np.float32)
    return QueryBatch(torch.from_numpy(dense), torch.from_numpy(np.concatenate(values)), torch.from_numpy(lengths))
