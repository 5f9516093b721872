"""The on-SSD embedding table file: fixed-stride rows behind a checksummed header and footer.

Layout (all little-endian)::

    [0, 4096)                       header: magic, version, dtype, rows, dim, row_bytes, stride, align,
                                    data_offset, data_bytes, block_bytes, footer_offset, source_crc (CRC32 of
                                    the DRAM weights the file was written from), CRC32 of the header
    [4096, 4096 + rows*stride)      rows, each at ``4096 + row*stride``; padded to a 4096 multiple
    [footer_offset, +4096k)         footer: CRC32 of every row's ``row_bytes``, then CRC32 of every
                                    ``block_bytes`` block of the data region, then the CRC32 of both lists
                                    (the file's fingerprint), padded to a 4096 multiple

Checks: the whole file (header, footer, every block) at open; every row read while serving against its row
CRC (:class:`RowChecksums`: 4 bytes per row kept in DRAM).  A row CRC costs far less than the SSD read that
brought the row (``benchmarks/bench_row_checksum.py``).

Row format: ``fp32`` = ``dim`` float32; ``int8`` = FBGEMM's *fused 8-bit rowwise* format,
``dim`` uint8 codes followed by a float32 scale and a float32 bias (value = code*scale + bias).

Stride: a row is padded so that it never straddles an ``align`` boundary (power of two ≥ row bytes when the
row is smaller than ``align``, else a multiple of ``align``).  Then one row is one aligned O_DIRECT read of
``align`` bytes (or its own stride for big rows), never two.  ``align`` is 512 by default: the logical block
size of NVMe/virtio devices and the access granularity of Optane (SDM Table 1); 4096 when the device's
logical block is 4 KiB.  The cost is space on SSD (cheap, SDM §A.5), not IOs.

Only the header and footer are memory-mapped (metadata); rows are read with O_DIRECT by ``embedding.io``.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import tempfile
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from recserve.errors import RecserveError

MAGIC = b"RSEMBTBL"
VERSION = 2
HEADER_BYTES = 4096
PAGE = 4096
DTYPES = {"fp32": 0, "int8": 1}
_HEADER = struct.Struct("<8sIIQIIIIQQQQI")  # magic version dtype rows dim row_bytes stride align data_off
#                                              data_bytes block_bytes footer_offset source_crc
DEFAULT_BLOCK_BYTES = 1 << 20
DEFAULT_ALIGN = 512


class TableFileError(RecserveError):
    """A table file is missing, truncated, corrupt (checksum mismatch) or of an unknown format."""


def row_bytes_for(dim: int, dtype: str) -> int:
    if dtype not in DTYPES:
        raise TableFileError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return dim * 4 if dtype == "fp32" else dim + 8


def stride_for(row_bytes: int, align: int) -> int:
    """Smallest stride ≥ row_bytes that keeps every row inside one ``align`` block (see module doc)."""
    if row_bytes <= align:
        return 1 << (row_bytes - 1).bit_length()
    return -(-row_bytes // align) * align


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


# ---------------------------------------------------------------- row-wise int8 (FBGEMM fused 8-bit rowwise)


def quantize_rowwise(weight: np.ndarray) -> np.ndarray:
    """FP32 ``[R, D]`` → fused rows ``[R, D + 8]`` uint8 (codes, fp32 scale, fp32 bias), as FBGEMM computes them."""
    w = np.ascontiguousarray(weight, dtype=np.float32)
    lo = w.min(axis=1, keepdims=True)
    hi = w.max(axis=1, keepdims=True)
    scale = ((hi - lo) / np.float32(255.0)).astype(np.float32)
    inv = np.float32(255.0) / (hi - lo + np.float32(1e-8))
    codes = np.clip(np.rint((w - lo) * inv), 0, 255).astype(np.uint8)
    out = np.empty((w.shape[0], w.shape[1] + 8), dtype=np.uint8)
    out[:, : w.shape[1]] = codes
    out[:, w.shape[1] : w.shape[1] + 4] = scale.view(np.uint8)
    out[:, w.shape[1] + 4 :] = lo.astype(np.float32).view(np.uint8)
    return out


def decode_rows(raw: np.ndarray, dim: int, dtype: str) -> torch.Tensor:
    """Raw row bytes ``[N, row_bytes]`` → FP32 ``[N, dim]``.  The only dequantisation in recserve, so the tiered
    path and the DRAM reference (``dequantized_weight``) produce identical bits."""
    raw = np.ascontiguousarray(raw)
    if dtype == "fp32":
        return torch.from_numpy(raw.view(np.float32).reshape(raw.shape[0], dim))
    codes = torch.from_numpy(raw[:, :dim]).to(torch.float32)
    params = torch.from_numpy(np.ascontiguousarray(raw[:, dim : dim + 8]).view(np.float32))  # [N, 2]
    return codes * params[:, 0:1] + params[:, 1:2]


def dequantized_weight(weight: torch.Tensor | np.ndarray) -> torch.Tensor:
    """What an int8 tiered table serves: the DRAM weight quantised then decoded (the reference for tests)."""
    w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    return decode_rows(quantize_rowwise(w), w.shape[1], "int8")


# ---------------------------------------------------------------- header


@dataclass(frozen=True)
class TableHeader:
    dtype: str
    rows: int
    dim: int
    row_bytes: int
    stride: int
    align: int
    data_offset: int
    data_bytes: int
    block_bytes: int
    footer_offset: int
    source_crc: int = 0

    @property
    def num_blocks(self) -> int:
        return -(-self.data_bytes // self.block_bytes) if self.data_bytes else 0

    @property
    def listing_bytes(self) -> int:
        """Row CRCs then block CRCs (the footer before its own CRC)."""
        return 4 * (self.rows + self.num_blocks)

    @property
    def footer_bytes(self) -> int:
        return _round_up(self.listing_bytes + 4, PAGE)

    @property
    def file_bytes(self) -> int:
        return self.footer_offset + self.footer_bytes

    def pack(self) -> bytes:
        body = _HEADER.pack(MAGIC, VERSION, DTYPES[self.dtype], self.rows, self.dim, self.row_bytes, self.stride,
                            self.align, self.data_offset, self.data_bytes, self.block_bytes, self.footer_offset,
                            self.source_crc)
        return body + struct.pack("<I", zlib.crc32(body))

    @classmethod
    def unpack(cls, buf: bytes, path: str | Path) -> TableHeader:
        body, (crc,) = buf[: _HEADER.size], struct.unpack_from("<I", buf, _HEADER.size)
        fields = _HEADER.unpack(body)
        if fields[0] != MAGIC:
            raise TableFileError(f"{path}: not a recserve table file (bad magic {fields[0]!r})")
        if zlib.crc32(body) != crc:
            raise TableFileError(f"{path}: header checksum mismatch (corrupt header)")
        if fields[1] != VERSION:
            raise TableFileError(f"{path}: table file version {fields[1]}, this recserve reads {VERSION}")
        names = {v: k for k, v in DTYPES.items()}
        if fields[2] not in names:
            raise TableFileError(f"{path}: unknown dtype code {fields[2]}")
        return cls(names[fields[2]], *fields[3:])


# ---------------------------------------------------------------- write / open


def row_crcs(raw_rows: np.ndarray) -> np.ndarray:
    """CRC32 of each row of a ``[N, row_bytes]`` uint8 array (zlib: measured cheaper here than a CRC32C in Python,
    see ``benchmarks/bench_row_checksum.py``)."""
    rows = np.ascontiguousarray(raw_rows)
    return np.fromiter((zlib.crc32(r) for r in rows), dtype=np.uint32, count=rows.shape[0])


def weights_crc(weight: torch.Tensor | np.ndarray) -> int:
    """CRC32 of the DRAM weights a table file is written from (its ``source_crc`` and file-name tag)."""
    w = weight.detach().cpu().contiguous().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    return zlib.crc32(np.ascontiguousarray(w).view(np.uint8)) & 0xFFFFFFFF


def table_header(rows: int, dim: int, dtype: str = "fp32", align: int = DEFAULT_ALIGN,
                 block_bytes: int = DEFAULT_BLOCK_BYTES, source_crc: int = 0) -> TableHeader:
    """The layout of a ``rows`` x ``dim`` table file (its ``file_bytes`` included) before a byte is written: what
    :func:`write_table` writes, and what a deployment sizes a table volume by."""
    if align not in (512, 4096):
        raise TableFileError(f"align must be 512 or 4096, got {align}")
    rb = row_bytes_for(dim, dtype)
    stride = stride_for(rb, align)
    data_bytes = _round_up(rows * stride, PAGE)
    return TableHeader(dtype, rows, dim, rb, stride, align, HEADER_BYTES, data_bytes, block_bytes,
                       HEADER_BYTES + data_bytes, source_crc)


def write_table(path: str | Path, weight: torch.Tensor | np.ndarray, dtype: str = "fp32",
                align: int = DEFAULT_ALIGN, block_bytes: int = DEFAULT_BLOCK_BYTES) -> TableHeader:
    """Write ``weight`` ``[rows, dim]`` as a table file, atomically: a temp file of its own (``mkstemp``) in the
    same directory, fsync'd, renamed over ``path``, then the directory fsync'd.  No reader ever sees a partial
    file, and writers of one path take turns (:func:`table_lock`), so two never race on one temp file."""
    w = weight.detach().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    if w.ndim != 2 or w.shape[0] < 1:
        raise TableFileError(f"weight must be [rows, dim] with rows ≥ 1, got shape {list(w.shape)}")
    header = table_header(w.shape[0], w.shape[1], dtype, align, block_bytes, weights_crc(w))
    raw = quantize_rowwise(w) if dtype == "int8" else np.ascontiguousarray(w, dtype=np.float32).view(np.uint8)
    raw = raw.reshape(header.rows, header.row_bytes)
    path = Path(path)
    with table_lock(path):
        _refuse_non_file(path)
        check_free_space(path.parent, header.file_bytes, path.name)
        tmp = _write_temp(path, header, raw)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            _remove_quietly(tmp)
            raise _write_error(path, exc, header.file_bytes) from None
        _fsync_dir(path.parent)
    return header


def check_free_space(directory: str | Path, needed: int, what: str) -> None:
    """Refuse up front (one line) to write ``needed`` bytes of ``what`` where the file system has less free:
    running out half-way would leave a partial file filling the disk.  Skipped if ``statvfs`` is unavailable."""
    free = _free_bytes(directory)
    if free is not None and free < needed:
        raise TableFileError(f"{directory}: not enough free space for {what}: {_size(needed)} needed, "
                             f"{_size(free)} free")


def _free_bytes(directory: str | Path) -> int | None:
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:,.1f} MiB)"


def _write_error(path: Path, exc: OSError, needed: int) -> TableFileError:
    """A failed write of table file ``path`` as one line: out of space names the directory, needed and free."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = _free_bytes(path.parent)
        return TableFileError(f"{path.parent}: no space left writing {path.name}: {_size(needed)} needed, "
                              + (f"{_size(free)} free" if free is not None else "free space unknown"))
    return TableFileError(f"{path}: cannot write the table file: {exc.strerror or exc}")


def _remove_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_temp(path: Path, header: TableHeader, raw: np.ndarray) -> Path:
    """Header, data blocks and footer into a new temp file beside ``path``, fsync'd; its path.  On any failure
    (no space, I/O error, interrupted) the temp file is removed, and an ``OSError`` becomes one line."""
    try:
        fd, name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _write_error(path, exc, header.file_bytes) from None
    try:
        with open(fd, "wb") as f:
            _write_contents(f, header, raw)
    except BaseException as exc:
        _remove_quietly(name)
        if isinstance(exc, OSError):
            raise _write_error(path, exc, header.file_bytes) from None
        raise
    return Path(name)


def _write_contents(f: BinaryIO, header: TableHeader, raw: np.ndarray) -> None:
    f.write(header.pack().ljust(HEADER_BYTES, b"\0"))
    crcs = []
    for block in _data_blocks(raw, header):
        crcs.append(zlib.crc32(block))
        f.write(block)
    listing = row_crcs(raw).astype("<u4").tobytes() + np.asarray(crcs, dtype="<u4").tobytes()
    f.write((listing + struct.pack("<I", zlib.crc32(listing))).ljust(header.footer_bytes, b"\0"))
    f.flush()
    os.fsync(f.fileno())


def _data_blocks(raw: np.ndarray, header: TableHeader) -> Iterator[bytes]:
    """The data region in ``block_bytes`` blocks: rows padded to their stride, the end zero-padded to a page."""
    padded = np.zeros((header.rows, header.stride), dtype=np.uint8)
    padded[:, : header.row_bytes] = raw
    data = padded.reshape(-1)
    for start in range(0, header.data_bytes, header.block_bytes):
        length = min(header.block_bytes, header.data_bytes - start)
        yield data[start : start + length].tobytes().ljust(length, b"\0")


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: some file systems refuse fsync on a directory)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_held = threading.local()


@contextmanager
def table_lock(path: str | Path) -> Iterator[None]:
    """Hold the writer lock of table file ``path``: an ``fcntl.flock`` on ``<name>.lock`` beside it, so writers of
    one table in any process or thread take turns, and one that waited can find the other's finished file.
    Re-entrant within a thread.  While held, temp files of writers that died (killed mid-write) are removed."""
    path = Path(path)
    held = _held.__dict__.setdefault("paths", set())
    key = os.path.abspath(path)
    if key in held:
        yield
        return
    lock = path.with_name(path.name + ".lock")
    fd = _acquire(lock)
    held.add(key)
    try:
        _remove_dead_temps(path)
        yield
    finally:
        held.discard(key)
        _release(fd, lock)


def _acquire(lock: Path) -> int:
    """An fd holding an exclusive flock on ``lock``; retried when the holder removed the file meanwhile."""
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise TableFileError(f"{lock.parent}: cannot write table files there: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, lock):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _release(fd: int, lock: Path) -> None:
    """Remove the lock file while still holding it (a waiter then finds it gone and retries), then unlock."""
    try:
        os.unlink(lock)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


def _remove_dead_temps(path: Path) -> None:
    """Temp files of ``path`` (``<name>.*.tmp``, ``<name>.tmp``): only a writer that died leaves one, since the
    caller holds the lock every writer takes."""
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return
    for entry in entries:
        name = entry.name
        if name == path.name + ".tmp" or (name.startswith(path.name + ".") and name.endswith(".tmp")):
            _remove_quietly(entry.path)


def _map_region(fd: int, offset: int, length: int) -> bytes:
    """Bytes of [offset, offset+length) through a read-only mmap (metadata only; never row data)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with mmap.mmap(fd, length + offset - start, prot=mmap.PROT_READ, offset=start) as m:
        return bytes(m[offset - start : offset - start + length])


def read_header(path: str | Path) -> TableHeader:
    """Parse and validate the header and the file size (truncation) without touching the data."""
    path = Path(path)
    if not path.exists():
        raise TableFileError(f"{path}: no such table file")
    if not path.is_file():
        raise TableFileError(f"{path}: {_kind(path)}, not a table file")
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise TableFileError(f"{path}: truncated ({size} bytes, smaller than the {HEADER_BYTES}-byte header)")
    fd = _open_readable(path)
    try:
        header = TableHeader.unpack(_map_region(fd, 0, _HEADER.size + 4), path)
    except OSError as exc:
        raise TableFileError(f"{path}: cannot read the header: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size != header.file_bytes:
        raise TableFileError(f"{path}: truncated or padded: {size} bytes, header says {header.file_bytes}")
    return header


def _kind(path: Path) -> str:
    """What is at ``path`` where a table file should be, for an error."""
    return "a directory" if path.is_dir() else "not a regular file (a device, socket or pipe)"


def _refuse_non_file(path: Path) -> None:
    """A directory (or other non-file) where the table file goes is the user's: never removed, named instead."""
    if path.exists() and not path.is_file():
        raise TableFileError(f"{path}: {_kind(path)} is where this table file goes; remove it, then run "
                             "`recserve tier rebuild` again")


def _open_readable(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise TableFileError(f"{path}: cannot open the table file: {exc.strerror}") from exc


def footer_fingerprint(path: str | Path, header: TableHeader) -> int:
    """The footer's own CRC32 after checking it: it covers every row and block CRC, so it names the contents."""
    fd = _open_readable(Path(path))
    try:
        return _checked_footer(fd, header, path)[1]
    finally:
        os.close(fd)


def _checked_footer(fd: int, header: TableHeader, path: str | Path) -> tuple[bytes, int]:
    footer = _map_region(fd, header.footer_offset, header.listing_bytes + 4)
    listing, (crc,) = footer[:-4], struct.unpack("<I", footer[-4:])
    if zlib.crc32(listing) != crc:
        raise TableFileError(f"{path}: footer checksum mismatch (corrupt footer)")
    return listing, crc


def verify_table(path: str | Path, header: TableHeader | None = None) -> None:
    """Check every data block's CRC32 against the footer (one sequential buffered pass whose pages are dropped
    from the page cache afterwards, so verification does not warm the cache the benchmarks measure)."""
    path = Path(path)
    header = header or read_header(path)
    fd = _open_readable(path)
    try:
        listing, _ = _checked_footer(fd, header, path)
        expected = np.frombuffer(listing, dtype="<u4", offset=4 * header.rows)
        os.posix_fadvise(fd, header.data_offset, header.data_bytes, os.POSIX_FADV_SEQUENTIAL)
        for b in range(header.num_blocks):
            start = header.data_offset + b * header.block_bytes
            length = min(header.block_bytes, header.data_bytes - b * header.block_bytes)
            block = os.pread(fd, length, start)
            if len(block) != length or zlib.crc32(block) != int(expected[b]):
                raise TableFileError(f"{path}: data checksum mismatch in block {b} "
                                     f"(bytes {start}..{start + length}): corrupt table file")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def open_table_header(path: str | Path, verify: bool = True) -> TableHeader:
    header = read_header(path)
    if verify:
        verify_table(path, header)
    return header


class RowChecksums:
    """The row CRCs of one table file, read from its footer into DRAM at open: 4 bytes per row (1.6% of a 256-byte
    fp32 row, 5.6% of a 72-byte int8 one) so that checking a read costs an index, not another I/O (CRC pages
    read on demand are a second I/O in all but name; docs/decisions/2026-11-28-hardening-off-the-query-path.md)."""

    def __init__(self, path: str | Path, header: TableHeader) -> None:
        fd = _open_readable(Path(path))
        try:
            raw = os.pread(fd, 4 * header.rows, header.footer_offset)
        finally:
            os.close(fd)
        if len(raw) != 4 * header.rows:
            raise TableFileError(f"{path}: truncated footer (row checksums)")
        self.crcs = np.frombuffer(raw, dtype="<u4")

    def mismatches(self, row_ids: np.ndarray, raw_rows: np.ndarray) -> np.ndarray:
        """Positions in ``row_ids`` whose bytes (``raw_rows[i]``) do not match their recorded CRC."""
        return np.flatnonzero(row_crcs(raw_rows) != self.crcs[row_ids])
