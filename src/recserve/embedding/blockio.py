"""Batched, concurrent, page-cache-bypassing reads of aligned windows of a table file.

Two decisions are made once per file and reported (``BlockReader.mode`` / ``.engine``):

- **mode**: ``O_DIRECT`` (reads go to the device, buffers aligned by allocating them with ``mmap``) or, when the
  file system refuses O_DIRECT (tmpfs, some overlays), ``buffered+fadvise``: plain ``pread`` followed by
  ``posix_fadvise(DONTNEED)`` so the page cache does not silently become a DRAM copy of the table.  The fallback
  is logged as a warning.
- **engine**: ``io_uring`` through recserve's own syscall layer (:mod:`recserve.embedding.uring`; SDM §4.1
  chose io_uring for its low per-IO overhead) when a probe in a child process has shown it works on this
  host, otherwise a thread pool issuing ``os.preadv`` (which releases the GIL).  ``BlockReader.engine_reason``
  says why.  Either way at most ``max_outstanding`` IOs per table are in flight (SDM §4.1:
  capping outstanding IOs smooths NAND bursts; a "Tuning API" knob).

A read that fails or comes back short raises :class:`TableIOError`: the caller fails that query, it never
serves rows it did not read.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from recserve.embedding import uring

log = logging.getLogger("recserve.embedding")

ENGINES = ("auto", "io_uring", "threads")


class TableIOError(OSError):
    """Reading rows from a table file failed during serving (device error, short read, file truncated)."""


def io_uring_available() -> bool:
    """Whether io_uring works here, decided once by a probe in a child process (never crashes the caller)."""
    return uring.probe()[0]


RING_ENTRIES = 256
_local = threading.local()


def _thread_ring() -> uring.Ring:
    """This thread's io_uring (one per thread: rings are not thread-safe; one ring serves every file)."""
    ring = getattr(_local, "ring", None)
    if ring is None:
        try:
            ring = uring.Ring(RING_ENTRIES)
        except OSError as exc:
            raise TableIOError(f"io_uring ring set-up failed: {exc}") from exc
        _local.ring = ring
    return ring


class AlignedSlots:
    """``count`` buffers of ``size`` bytes each, page-aligned (an anonymous mmap), growable."""

    def __init__(self, size: int, count: int = 64) -> None:
        self.size = size
        self.count = 0
        self._grow(count)

    def _grow(self, count: int) -> None:
        self.count = max(count, 2 * self.count)
        self.buf = mmap.mmap(-1, self.size * self.count)
        self.array = np.frombuffer(self.buf, dtype=np.uint8).reshape(self.count, self.size)
        self.views = [memoryview(self.buf)[i * self.size : (i + 1) * self.size] for i in range(self.count)]
        self.iovecs = uring.iovecs_for(self.array.ctypes.data, self.size, self.count)  # for io_uring readv

    def ensure(self, count: int) -> None:
        if count > self.count:
            self._grow(count)


class BlockReader:
    """Reads fixed-size windows at aligned offsets of one file; see the module doc for mode and engine."""

    def __init__(self, path: str | Path, window: int, engine: str = "auto", max_outstanding: int = 32,
                 direct: bool = True, pool: ThreadPoolExecutor | None = None) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.path = Path(path)
        self.window = window
        self.max_outstanding = max(1, int(max_outstanding))
        self.slots = AlignedSlots(window, 64)
        self._lock = threading.Lock()
        self.fd, self.mode = self._open(direct)
        self.engine = self._pick_engine(engine)
        self._pool = pool
        self._own_pool = False
        self.ios = 0
        self.bytes_read = 0

    # ---- set-up ------------------------------------------------------------------
    def _open(self, direct: bool) -> tuple[int, str]:
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            except OSError as exc:
                log.warning("%s: O_DIRECT refused (%s); falling back to buffered pread + fadvise(DONTNEED)",
                            self.path, exc)
            else:
                try:  # some file systems accept the flag at open but reject unaligned/direct reads
                    os.preadv(fd, [self.slots.views[0]], 0)
                    return fd, "O_DIRECT"
                except OSError as exc:
                    os.close(fd)
                    log.warning("%s: O_DIRECT read of %d bytes failed (%s); falling back to buffered pread + "
                                "fadvise(DONTNEED)", self.path, self.window, exc)
        return os.open(self.path, os.O_RDONLY), "buffered+fadvise"

    def _pick_engine(self, engine: str) -> str:
        if engine == "threads":
            self.engine_reason = "thread pool requested (engine: threads)"
            return "threads"
        available, why = uring.probe()
        if available:
            self.engine_reason = why
            return "io_uring"
        if engine == "io_uring":
            raise TableIOError(f"io_uring requested but unavailable here: {why}")
        self.engine_reason = f"io_uring unavailable ({why}); thread pool of os.preadv"
        return "threads"

    # ---- reads -------------------------------------------------------------------
    def read(self, offsets: np.ndarray) -> np.ndarray:
        """Read ``window`` bytes at each (aligned, distinct) offset; returns a ``[n, window]`` uint8 array that
        stays valid until the next ``read`` on this reader (copy what you keep)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        n = offsets.size
        with self._lock:
            self.slots.ensure(n)
            if n:
                if self.engine == "io_uring":
                    self._read_uring(offsets)
                else:
                    self._read_threads(offsets)
                if self.mode != "O_DIRECT":
                    os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_DONTNEED)
            self.ios += n
            self.bytes_read += n * self.window
            return self.slots.array[:n]

    def _check(self, got: int, offset: int) -> None:
        if got < 0:
            raise TableIOError(-got, f"{self.path}: read at offset {offset} failed: {os.strerror(-got)}")
        if got != self.window:
            raise TableIOError(f"{self.path}: short read at offset {offset}: {got} of {self.window} bytes "
                               "(file truncated or device error)")

    def _read_range(self, offsets: np.ndarray, first: int, last: int) -> None:
        views = self.slots.views
        for i in range(first, last):
            off = int(offsets[i])
            try:
                got = os.preadv(self.fd, [views[i]], off)
            except OSError as exc:
                raise TableIOError(exc.errno, f"{self.path}: read at offset {off} failed: {exc.strerror}") from exc
            self._check(got, off)

    def _read_threads(self, offsets: np.ndarray) -> None:
        n = offsets.size
        lanes = min(self.max_outstanding, n)
        if lanes == 1:
            self._read_range(offsets, 0, n)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.max_outstanding, thread_name_prefix="sdm-io")
            self._own_pool = True
        bounds = np.linspace(0, n, lanes + 1).astype(int)
        futures = [self._pool.submit(self._read_range, offsets, int(a), int(b))
                   for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
        errors = [f.exception() for f in futures]
        for err in errors:
            if err is not None:
                raise err

    def _read_uring(self, offsets: np.ndarray) -> None:
        _uring_read_many([(self, offsets)])

    def close(self) -> None:
        with self._lock:
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            if self._own_pool and self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None


def _uring_read_many(requests: list[tuple[BlockReader, np.ndarray]]) -> None:
    """Issue every request's windows on this thread's ring, at most ``max_outstanding`` per file and
    ``RING_ENTRIES`` in all; raise the first failure once every read issued has completed (the buffers must
    not be reused while the kernel still writes them)."""
    ring = _thread_ring()
    nxt = [0] * len(requests)
    inflight = [0] * len(requests)
    remaining = sum(int(o.size) for _, o in requests)
    windows = np.array([r.window for r, _ in requests], dtype=np.int64)
    failure: TableIOError | None = None
    while remaining:
        for k, (reader, offsets) in enumerate(requests):
            take = min(offsets.size - nxt[k], reader.max_outstanding - inflight[k], ring.space())
            if take > 0:
                i = np.arange(nxt[k], nxt[k] + take, dtype=np.uint64)
                iov = reader.slots.iovecs.ctypes.data + uring.IOVEC_DTYPE.itemsize * i
                ring.submit_readv(reader.fd, iov, offsets[nxt[k]:nxt[k] + take].astype(np.uint64), (k << 32) | i)
                nxt[k] += take
                inflight[k] += take
        # All issued: one wait for every read; else wake at a quarter done so the queue refills while deep.
        all_issued = all(n == o.size for n, (_, o) in zip(nxt, requests, strict=True))
        try:
            ring.enter(ring.outstanding if all_issued else max(1, ring.outstanding // 4))
        except OSError as exc:
            raise TableIOError(f"io_uring_enter failed: {exc}") from exc
        tags, results = ring.reap()
        which, slot = (tags >> np.uint64(32)).astype(np.int64), (tags & np.uint64(0xFFFFFFFF)).astype(np.int64)
        for k, done in enumerate(np.bincount(which, minlength=len(requests))):
            inflight[k] -= int(done)
        remaining -= tags.size
        bad = np.flatnonzero(results != windows[which])
        if failure is None and bad.size:
            j = int(bad[0])
            reader, offsets = requests[int(which[j])]
            try:
                reader._check(int(results[j]), int(offsets[int(slot[j])]))
            except TableIOError as exc:
                failure = exc
    if failure is not None:
        raise failure


def read_many(requests: list[tuple[BlockReader, np.ndarray]], executor=None) -> list[np.ndarray]:
    """Read several files' windows at once (SDM §A.2 inter-op parallelism: all tables' IOs in flight together).
    io_uring readers share one submission on this thread's ring; thread-pool readers run side by side on
    ``executor``.  Each result is valid until that reader's next read."""
    requests = [(r, np.asarray(o, dtype=np.int64)) for r, o in requests if len(o)]
    if not requests:
        return []
    readers = sorted({id(r): r for r, _ in requests}.values(), key=id)
    if len(readers) != len(requests):
        raise ValueError("read_many: one request per reader")
    if all(r.engine == "io_uring" for r in readers):
        for r in readers:
            r._lock.acquire()
        try:
            for r, o in requests:
                r.slots.ensure(o.size)
            _uring_read_many(requests)
            out = []
            for r, o in requests:
                if r.mode != "O_DIRECT":
                    os.posix_fadvise(r.fd, 0, 0, os.POSIX_FADV_DONTNEED)
                r.ios += o.size
                r.bytes_read += o.size * r.window
                out.append(r.slots.array[: o.size])
            return out
        finally:
            for r in readers:
                r._lock.release()
    if executor is None or len(requests) == 1:
        return [r.read(o) for r, o in requests]
    futures = [executor.submit(r.read, o) for r, o in requests]
    return [f.result() for f in futures]
