"""SSD-tiered embedding tables (SDM): a table file read with O_DIRECT behind the shared DRAM caches.

``TieredTable`` implements the zoo's table interface (``num_rows``, ``dim``, ``pool``, ``gather``), so
``model.replace_table(t, TieredTable(...))`` makes a zoo model serve table ``t`` from SSD, and
``tier_model(model, placement, dir, cache_bytes)`` does it for every table a placement puts on SM.

A lookup: unique ids → row-cache lookup (vectorised) → the misses' aligned windows are deduplicated and read
concurrently (``blockio``) → rows decoded (FP32, or FBGEMM fused int8 dequantised) into a compact ``[U, dim]``
matrix → the same ``embedding_bag`` kernel as ``DramTable`` over remapped ids.  Same rows, same kernel, same
summation order: the result is bit-identical to the DRAM table (the dequantised one for int8).
Every row read from the file is checked against its row CRC before it is used or cached: a mismatch fails the
query with :class:`TableChecksumError` naming the table, row and block, and is counted
(``TierStats.checksum_errors``).  Every open (including a worker's reopen after unpickling) checks the header,
the footer, every block, and that the file is the one written from this table's DRAM weights.
The pooled-embedding cache, when enabled, returns a bag's cached sum for any order of the same ids, which is
equal up to FP32 summation order (see docs/sdm.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from recserve.embedding.blockio import BlockReader, TableIOError, read_many
from recserve.embedding.rowcache import ROW_BITS, PooledCache, RowCache, bag_keys
from recserve.embedding.tablefile import (
    VERSION,
    RowChecksums,
    TableFileError,
    TableHeader,
    check_free_space,
    decode_rows,
    footer_fingerprint,
    open_table_header,
    table_header,
    table_lock,
    weights_crc,
    write_table,
)
from recserve.embedding.tierconfig import TierSettings
from recserve.errors import SpecError
from recserve.zoo.threads import inherit_torch_threads

__all__ = ["TableChecksumError", "TableIOError", "TierResources", "TierStats", "TieredTable", "tier_from_config",
           "open_errors", "tier_model", "tier_stats"]


@dataclass
class TierStats:
    lookups: int = 0  # ids asked for (after the pooled cache)
    unique: int = 0  # distinct ids per batch, summed
    hits: int = 0
    misses: int = 0
    ios: int = 0
    bytes_read: int = 0
    bytes_used: int = 0
    pooled_hits: int = 0
    pooled_bags: int = 0
    checksum_errors: int = 0  # rows read whose CRC did not match (each failed its query)

    @property
    def read_amplification(self) -> float:
        return self.bytes_read / self.bytes_used if self.bytes_used else 0.0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def add(self, other: TierStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, float]:
        out: dict[str, float] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["read_amplification"] = self.read_amplification
        out["hit_rate"] = self.hit_rate
        return out


class TableChecksumError(TableIOError):
    """A row read while serving does not match its CRC: the file changed under the server (never serve it).
    ``code`` is its key in ``serving/errors.STATUS`` (500 / DATA_LOSS), so the query's failure is counted as such."""

    code = "data_loss"
    field = None


@dataclass
class PendingFetch:
    """A lookup between its cache phase and its reads (lets a batch issue all tables' reads together)."""

    table: TieredTable
    out: np.ndarray
    miss: np.ndarray
    missing: np.ndarray  # row ids of the misses (what their CRCs are looked up by)
    keys: np.ndarray | None
    windows: np.ndarray
    which: np.ndarray
    within: np.ndarray

    def complete(self, buf: np.ndarray) -> np.ndarray:
        self.table._finish(self, buf)
        return self.out


@dataclass
class TierResources:
    """What the tiered tables of one process share: the unified row cache and the pooled cache."""

    row_cache: RowCache | None
    pooled: PooledCache | None = None
    engine: str = "auto"
    max_outstanding: int = 32
    direct: bool = True
    tables_in_flight: int = 4  # tables whose misses are read at the same time (SDM §A.2 inter-op parallelism)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    prefetch_handle: Any = field(default=None, repr=False)  # remove() it to turn the cross-table prefetch off
    rebuilt: list[str] = field(default_factory=list)  # table files (re)written from DRAM by this tier_model call

    _tables: int = 0

    def new_table_id(self) -> int:
        self._tables += 1
        return self._tables - 1

    def executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, self.tables_in_flight), thread_name_prefix="sdm-tbl",
                                            initializer=inherit_torch_threads)
        return self._pool

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_pool": None, "prefetch_handle": None}


class TieredTable(nn.Module):
    """One embedding table served from a table file through the shared caches."""

    def __init__(self, path: str | Path, resources: TierResources, use_cache: bool = True,
                 verify: bool = True, reader: BlockReader | None = None, name: str = "",
                 expect: tuple[int, int, int] | None = None) -> None:
        """``expect`` = (rows, dim, source_crc) of the DRAM table this file must have been written from."""
        super().__init__()
        self.path = Path(path)
        self.name = name or self.path.stem
        self.verify = verify
        self.expect = expect
        self.header: TableHeader = self._open_file()
        self.num_rows, self.dim = self.header.rows, self.header.dim
        self.dtype = self.header.dtype
        self.resources = resources
        h = self.header
        # Read unit: the file's alignment (a row never straddles it); a row bigger than it spans whole units.
        self.unit = h.align
        self.window = h.align if h.stride <= h.align else h.stride
        self.reader = reader or BlockReader(self.path, self.window, resources.engine, resources.max_outstanding,
                                            resources.direct)
        cache = resources.row_cache
        self.use_cache = bool(use_cache and cache is not None and cache.slots > 0)
        if cache is not None:
            cache.register(h.row_bytes)  # checks the row fits a slot
        self.table_id = resources.new_table_id()  # distinct per table even without a row cache (pooled keys)
        self.stats = TierStats()
        self._col = np.arange(h.row_bytes, dtype=np.int64)
        self._staged: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def cache_index(self) -> str:
        """The row cache's key index this table's rows go through ("native", "dict"), "" if none."""
        cache = self.resources.row_cache
        return cache.index_kind if self.use_cache and cache is not None else ""

    def _open_file(self) -> TableHeader:
        """Header, footer and (with ``verify``) every block checked; the file must be the expected table's."""
        try:
            header = open_table_header(self.path, verify=self.verify)
        except TableFileError as exc:
            raise TableFileError(f"table {self.name}: {exc}; rebuild it (recserve tier rebuild)") from exc
        if self.expect is not None:
            rows, dim, source = self.expect
            if (header.rows, header.dim) != (rows, dim):
                raise TableFileError(f"table {self.name}: {self.path.name} holds {header.rows}x{header.dim} rows, "
                                     f"the model's table is {rows}x{dim}; rebuild it (recserve tier rebuild)")
            if header.source_crc != source:
                raise TableFileError(f"table {self.name}: {self.path.name} was written from other weights "
                                     f"(source CRC {header.source_crc:08x}, expected {source:08x}); rebuild it")
        self.fingerprint = footer_fingerprint(self.path, header)
        self.checksums = RowChecksums(self.path, header)
        return header

    def __getstate__(self) -> dict:
        """Picklable (the node server ships models to worker processes): the file is re-validated on load."""
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_reader"] = None
        state["_staged"] = None
        state["checksums"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        """A worker (re)starting reopens the file by path: it must still be the file the server validated.  A file
        that is not is kept as ``open_error`` (raised on any read, and said by the worker as the reason it cannot
        start: unpickling happens before the worker's own code runs, where an exception would only end it)."""
        super().__setstate__(state)  # the reader reopens on first use, once the worker has its settings
        pickled, fingerprint = self.header, self.fingerprint
        try:
            header = self._open_file()
        except TableFileError as exc:
            self.open_error = str(exc)
            return
        if header != pickled or self.fingerprint != fingerprint:
            self.open_error = (f"table {self.name}: {self.path.name} changed since the server opened it (header or "
                               "checksums differ); refusing to serve another file; rebuild it (recserve tier "
                               "rebuild)")

    @property
    def reader(self) -> BlockReader:
        if self.__dict__.get("open_error"):
            raise TableFileError(self.open_error)
        reader = self.__dict__.get("_reader")
        if reader is None:
            r = self.resources
            reader = self.__dict__["_reader"] = BlockReader(self.path, self.window, r.engine, r.max_outstanding,
                                                            r.direct)
        return reader

    @reader.setter
    def reader(self, reader: BlockReader | None) -> None:
        self.__dict__["_reader"] = reader

    # ---- the zoo table interface ---------------------------------------------------
    def pool(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        idx = indices.numpy() if indices.dtype == torch.int64 else indices.to(torch.int64).numpy()
        offs = offsets.to(torch.int64).numpy()
        pooled = self.resources.pooled
        if pooled is None or idx.size == 0:
            return self._pool_rows(idx, offs)
        return self._pool_with_cache(idx, offs, pooled)

    def gather(self, indices: torch.Tensor) -> torch.Tensor:
        idx = indices.to(torch.int64).numpy()
        uniq, inverse = np.unique(idx, return_inverse=True)
        compact = decode_rows(self._rows(uniq), self.dim, self.dtype)
        return F.embedding(torch.from_numpy(inverse.reshape(idx.shape)), compact)

    def stage(self, indices: torch.Tensor) -> None:
        """Fetch the rows of ``indices`` now (called for all tables at once by the prefetch hook) so that the
        following ``pool``/``gather`` with the same ids uses them without another lookup."""
        self._staged = None
        uniq = np.unique(indices.to(torch.int64).numpy())
        self._staged = (uniq, self.fetch(uniq))

    # ---- internals -------------------------------------------------------------------
    def _rows(self, uniq: np.ndarray) -> np.ndarray:
        staged, self._staged = self._staged, None
        if staged is not None and np.array_equal(staged[0], uniq):
            return staged[1]
        return self.fetch(uniq)

    def _pool_rows(self, idx: np.ndarray, offs: np.ndarray) -> torch.Tensor:
        uniq, inverse = np.unique(idx, return_inverse=True)
        compact = decode_rows(self._rows(uniq), self.dim, self.dtype)
        return F.embedding_bag(torch.from_numpy(inverse.astype(np.int64)), compact, torch.from_numpy(offs),
                               mode="sum")

    def _pool_with_cache(self, idx: np.ndarray, offs: np.ndarray, pooled: PooledCache) -> torch.Tensor:
        """Bags ≥ min_len are looked up by their order-invariant key; the rest (and misses) pool from rows."""
        n, batch = idx.size, offs.size
        lengths = np.diff(np.append(offs, n))
        hi, lo = bag_keys(idx, offs, self.table_id)
        eligible = lengths >= pooled.min_len
        out = torch.empty(batch, self.dim, dtype=torch.float32)
        todo = np.ones(batch, dtype=bool)
        with pooled.lock:
            for b in np.flatnonzero(eligible):
                vec = pooled.get((int(hi[b]), int(lo[b])))
                if vec is not None:
                    out[b] = vec
                    todo[b] = False
                    pooled.hit_ids += int(lengths[b])
        self.stats.pooled_bags += int(eligible.sum())
        self.stats.pooled_hits += int(batch - todo.sum())
        if todo.any():
            bags = np.flatnonzero(todo)
            keep = np.repeat(todo, lengths)
            sub_lengths = lengths[bags]
            sub_offs = np.concatenate([[0], np.cumsum(sub_lengths)[:-1]]).astype(np.int64)
            computed = self._pool_rows(idx[keep], sub_offs)
            out[torch.from_numpy(bags)] = computed
            with pooled.lock:
                for j, b in enumerate(bags):
                    if eligible[b]:
                        pooled.put((int(hi[b]), int(lo[b])), computed[j].clone())
        return out

    def fetch(self, rows: np.ndarray) -> np.ndarray:
        """Raw bytes ``[U, row_bytes]`` of distinct ``rows``: cache hits copied, misses read from the file."""
        pending = self.begin_fetch(rows)
        if pending.windows.size:
            pending.complete(self.reader.read(pending.windows))
        return pending.out

    def begin_fetch(self, rows: np.ndarray) -> PendingFetch:
        """Phase 1: cache lookup (hits copied out) and the aligned windows the misses need."""
        h = self.header
        out = np.empty((rows.size, h.row_bytes), dtype=np.uint8)
        stats = self.stats
        stats.lookups += rows.size
        stats.unique += rows.size
        keys = None
        if self.use_cache:
            cache = self.resources.row_cache
            keys = (np.int64(self.table_id) << np.int64(ROW_BITS)) | rows
            with cache.lock:
                slots = cache.lookup(keys)
                hit = slots >= 0
                out[hit] = cache.data[slots[hit], : h.row_bytes]
            miss = np.flatnonzero(~hit)
        else:
            miss = np.arange(rows.size)
        stats.hits += rows.size - miss.size
        stats.misses += miss.size
        missing = rows[miss]
        if missing.size and (int(missing.max()) >= h.rows or int(missing.min()) < 0):
            raise IndexError(f"{self.path}: row index out of range [0, {h.rows})")
        offsets = h.data_offset + missing * h.stride
        starts = offsets - offsets % self.unit
        windows, which = np.unique(starts, return_inverse=True)
        return PendingFetch(self, out, miss, missing, keys, windows, which, offsets - starts)

    def _finish(self, p: PendingFetch, buf: np.ndarray) -> None:
        """Phase 2: rows cut out of the read windows, then cached (only after every read succeeded)."""
        h = self.header
        rows = buf[p.which[:, None], p.within[:, None] + self._col]
        self._check_rows(p.missing, rows)
        p.out[p.miss] = rows
        self.stats.ios += p.windows.size
        self.stats.bytes_read += p.windows.size * self.window
        self.stats.bytes_used += p.miss.size * h.row_bytes
        if self.use_cache:
            cache = self.resources.row_cache
            with cache.lock:
                cache.insert(p.keys[p.miss], rows)

    def _check_rows(self, row_ids: np.ndarray, rows: np.ndarray) -> None:
        bad = self.checksums.mismatches(row_ids, rows)
        if bad.size:
            self.stats.checksum_errors += int(bad.size)
            row = int(row_ids[bad[0]])
            offset = self.header.data_offset + row * self.header.stride
            raise TableChecksumError(
                f"table {self.name}: checksum mismatch in row {row} (block {offset // self.unit}, byte {offset}) "
                f"of {self.path.name}, {bad.size} bad row(s) in this read: corrupt table file, query failed; "
                "rebuild it with `recserve tier rebuild`")

    def close(self) -> None:
        self.reader.close()

    def extra_repr(self) -> str:
        return (f"{self.path.name}: {self.num_rows}x{self.dim} {self.dtype}, stride {self.header.stride}, "
                f"{self.reader.mode}/{self.reader.engine}, cache={'on' if self.use_cache else 'off'}")


def io_report(model: nn.Module) -> list[dict[str, str]]:
    """Which read path each tiered table of ``model`` uses and why, and the row cache's key index ("native",
    "dict", "" with no cache): served in the node's model state."""
    return [{"table": name or "?", "file": t.path.name, "mode": t.reader.mode, "engine": t.reader.engine,
             "why": t.reader.engine_reason, "cache_index": t.cache_index}
            for name, t in model.named_modules() if isinstance(t, TieredTable)]


def tier_model(model: nn.Module, placement: list[int] | dict[int, dict], directory: str | Path,
               cache_bytes: int, dtype: str = "fp32", policy: str = "clock", pooled_cache_bytes: int = 0,
               pooled_min_len: int = 4, engine: str = "auto", max_outstanding: int = 32,
               no_cache_tables: tuple[int, ...] = (), verify: bool = True, prefetch: bool = True,
               tables_in_flight: int = 4, rebuild: bool = False) -> TierResources:
    """Write the tables ``placement`` puts on SM to ``directory`` and swap them into ``model`` in place.

    ``placement`` is a list of table ids (or a dict id → options, e.g. ``{"cache": False}``).  The DRAM weights
    of moved tables are released.  Files are named by a CRC of the weights, so workers building the same model
    reuse one file (checksummed again at open) and a changed model never reads a stale one.  With ``prefetch``
    a forward pre-hook reads the misses of all tiered tables concurrently before the model runs (SDM §A.2).
    With ``rebuild`` a file that fails validation (corrupt, truncated, swapped) is rewritten from the DRAM weights
    instead of refused (``recserve tier rebuild``).  Returns the shared resources (caches, stats) for inspection."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    items = placement.items() if isinstance(placement, dict) else ((t, {}) for t in placement)
    chosen = {int(t): dict(opts or {}) for t, opts in items}
    if not chosen:
        return TierResources(None)
    from recserve.embedding.tablefile import row_bytes_for

    slot = max(row_bytes_for(model.tables[t].dim, dtype) for t in chosen)
    cache = RowCache(cache_bytes, slot, policy) if cache_bytes > 0 else None
    pooled = PooledCache(pooled_cache_bytes, pooled_min_len) if pooled_cache_bytes > 0 else None
    resources = TierResources(cache, pooled, engine, max_outstanding, tables_in_flight=tables_in_flight)
    files = _table_files(model, chosen, directory, dtype)
    _check_space_for_missing(directory, files, dtype)
    for t, weight, path, expect in files:
        opts = chosen[t]
        if _ensure_file(path, weight, dtype, expect, rebuild):
            resources.rebuilt.append(path.name)
        use_cache = opts.get("cache", t not in no_cache_tables)
        model.replace_table(t, TieredTable(path, resources, use_cache=use_cache, verify=verify,
                                           name=_table_name(model, t), expect=expect))
    if prefetch and pooled is None and hasattr(model, "register_forward_pre_hook"):
        resources.prefetch_handle = model.register_forward_pre_hook(prefetch_hook)
    return resources


def _table_files(model: nn.Module, chosen: dict[int, dict], directory: Path,
                 dtype: str) -> list[tuple[int, torch.Tensor, Path, tuple[int, int, int]]]:
    """(table id, DRAM weight, file path, (rows, dim, weights' CRC)) of each chosen table not yet tiered."""
    out = []
    for t in sorted(chosen):
        table = model.tables[t]
        if isinstance(table, TieredTable):
            continue
        weight = table.weight.detach().contiguous()
        tag = weights_crc(weight)
        out.append((t, weight, table_path(directory, model, t, dtype, tag), (weight.shape[0], weight.shape[1], tag)))
    return out


def _check_space_for_missing(directory: Path, files: list, dtype: str) -> None:
    """Refuse up front when the missing files cannot all fit (one line with bytes needed and free), rather than
    fill the disk and fail at the Nth file; each write checks again for the file it writes."""
    missing = [expect for _, _, path, expect in files if not path.exists()]
    if missing:
        needed = sum(table_header(rows, dim, dtype).file_bytes for rows, dim, _ in missing)
        check_free_space(directory, needed, f"{len(missing)} table file(s)")


def _ensure_file(path: Path, weight: torch.Tensor, dtype: str, expect: tuple[int, int, int], rebuild: bool) -> bool:
    """Write ``path`` from ``weight`` if it is missing (or, with ``rebuild``, invalid); whether it was written.
    Writers of one file take turns under its lock and re-check there, so a node that waited for another (two
    replicas starting on one directory, a node starting during ``tier rebuild``) keeps the file that one wrote."""
    def kept() -> bool:  # there, and (with rebuild) valid
        return path.exists() and (not rebuild or _valid_file(path, expect))

    if kept():
        return False
    with table_lock(path):
        if kept():  # another writer finished it while this one waited
            return False
        write_table(path, weight, dtype)
    return True


def _valid_file(path: Path, expect: tuple[int, int, int]) -> bool:
    try:
        TieredTable(path, TierResources(None), use_cache=False, expect=expect).close()
    except (TableFileError, TableIOError):
        return False
    return True


def _table_name(model: nn.Module, t: int) -> str:
    spec = getattr(model, "spec", None)
    return spec.tables[t].name if spec is not None else f"t{t}"


def table_path(directory: str | Path, model: nn.Module, t: int, dtype: str, tag: int) -> Path:
    """Where table ``t`` of ``model`` lives: named by model, table, dtype, file version and weights' CRC, so workers
    building the same model share one file and a changed model (or format) never reads a stale one."""
    return Path(directory) / f"{getattr(model.spec, 'name', 'model')}.t{t}.{dtype}.v{VERSION}.{tag:08x}.tbl"


def prefetch_hook(model: nn.Module, args: tuple) -> None:
    """Forward pre-hook: look every tiered table of this batch up in the cache, then read all their misses in
    one concurrent submission (SDM §A.2), and stage the rows for the tables' ``pool``/``gather``."""
    if not args or not hasattr(args[0], "tables"):
        return
    batch = args[0]
    work = [(table, idx) for table, (idx, _) in zip(model.tables, batch.tables(), strict=True)
            if isinstance(table, TieredTable) and table.resources.pooled is None]
    if len(work) < 2:
        return
    pending = []
    for table, idx in work:
        table._staged = None
        uniq = np.unique(idx.to(torch.int64).numpy())
        pending.append((uniq, table.begin_fetch(uniq)))
    reads = [(p.table.reader, p.windows) for _, p in pending if p.windows.size]
    buffers = iter(read_many(reads, work[0][0].resources.executor()))  # raises on an I/O error: query fails
    for uniq, p in pending:
        if p.windows.size:
            p.complete(next(buffers))
        p.table._staged = (uniq, p.out)


def open_errors(model: nn.Module) -> list[str]:
    """Why tiered tables of ``model`` (as a worker unpickled it) cannot be served: files changed or broken since
    the server opened them."""
    return [t.open_error for t in getattr(model, "tables", ()) if isinstance(t, TieredTable)
            and t.__dict__.get("open_error")]


def tier_stats(model: nn.Module) -> TierStats:
    """Sum of the stats of every tiered table of ``model``."""
    total = TierStats()
    for table in model.tables:
        if isinstance(table, TieredTable):
            total.add(table.stats)
    return total


def _table_ids(spec_tables: Any, names: Any, where: str) -> list[int]:
    if names in ("user", "item"):
        return [i for i, t in enumerate(spec_tables) if t.side == names]
    if names == "all":
        return list(range(len(spec_tables)))
    by_name = {t.name: i for i, t in enumerate(spec_tables)}
    out = []
    for n in names if isinstance(names, list | tuple) else [names]:
        if isinstance(n, int) and 0 <= n < len(spec_tables):
            out.append(n)
        elif n in by_name:
            out.append(by_name[n])
        else:
            raise SpecError(f"{where}: unknown table {n!r}")
    return out


def tier_file_bytes(spec_tables: Any, rows: tuple[int, ...], tier: dict[str, Any], where: str = "tier") -> int:
    """Disk the table files of a ``tier:`` section take for a model of ``spec_tables`` with ``rows`` rows each:
    the tables :func:`tier_from_config` writes, each laid out as ``write_table`` lays it (header, padded rows,
    footer), so a deployment's volume is sized by what the node writes."""
    s = TierSettings.parse(tier, where)
    return sum(table_header(rows[t], spec_tables[t].dim, s.dtype).file_bytes
               for t in _table_ids(spec_tables, s.tables, where))


def tier_layout(spec_tables: Any, tier: dict[str, Any], where: str = "tier") -> tuple[list[int], int]:
    """What a ``tier:`` section puts where: (the tables it writes to SSD, the bytes of DRAM its row and pooled
    caches take, allocated up front)."""
    s = TierSettings.parse(tier, where)
    return _table_ids(spec_tables, s.tables, where), int((s.cache_mb + s.pooled_cache_mb) * 2**20)


def _check_cache_holds_a_row(model: nn.Module, placement: dict[int, dict], s: TierSettings, where: str) -> None:
    """A row cache too small for one row would be no cache at all, silently: refuse it (0 says "no cache")."""
    from recserve.embedding.tablefile import row_bytes_for

    if not placement or s.cache_mb <= 0:
        return
    slot = max(row_bytes_for(model.tables[t].dim, s.dtype) for t in placement)
    if int(s.cache_mb * 2**20) < slot:
        raise SpecError(f"{where}: cache_mb: {s.cache_mb:g} MiB holds no row of these tables ({slot} bytes each): "
                        f"give at least {slot / 2**20:.2g} MiB, or 0 for no row cache")


def tier_from_config(model: nn.Module, tier: dict[str, Any], where: str = "tier",
                     rebuild: bool = False) -> TierResources:
    """Apply a node-config ``tier:`` section to a freshly built model (the server's hook), e.g.::

        tier: {dir: /var/lib/recserve/tables, tables: user, cache_mb: 256, dtype: int8}

    ``tables`` is ``user`` | ``item`` | ``all`` | a list of table names or ids.  A ``plan:`` (a ``recserve plan
    tier --out`` JSON) is turned into ``tables`` + ``no_cache`` before the config reaches storage
    (``deploy.nodeconfig.resolve_tier_plans``, done by ``recserve serve``): storage never reads plans."""
    if not isinstance(tier, dict):
        raise SpecError(f"{where}: expected a mapping")
    if "plan" in tier:
        raise SpecError(f"{where}: 'plan' must be resolved into 'tables'/'no_cache' first "
                        "(recserve serve does it; in code: recserve.deploy.nodeconfig.resolve_tier_plans)")
    if "dir" not in tier:
        raise SpecError(f"{where}: 'dir' (a directory on the SSD for the table files) is required")
    s = TierSettings.parse(tier, where)
    placement = {i: {} for i in _table_ids(model.spec.tables, s.tables, where)}
    _check_cache_holds_a_row(model, placement, s, where)
    no_cache = tuple(_table_ids(model.spec.tables, s.no_cache, where)) if s.no_cache is not None else ()
    return tier_model(
        model, placement, s.dir, cache_bytes=int(s.cache_mb * 2**20), dtype=s.dtype, policy=s.policy,
        pooled_cache_bytes=int(s.pooled_cache_mb * 2**20), pooled_min_len=s.pooled_min_len, engine=s.engine,
        max_outstanding=s.max_outstanding, no_cache_tables=no_cache, verify=s.verify, prefetch=s.prefetch,
        tables_in_flight=s.tables_in_flight, rebuild=rebuild,
    )
