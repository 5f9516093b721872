"""Batched, concurrent, page-cache-bypassing reads of aligned windows of a table file.

Two decisions are made once per file and reported (``BlockReader.mode`` / ``.engine``):

- **mode**: ``O_DIRECT`` (reads go to the device, buffers aligned by allocating them with ``mmap``) or, when the
  file system refuses O_DIRECT (tmpfs, some overlays), ``buffered+fadvise``: plain ``pread`` followed by
  ``posix_fadvise(DONTNEED)`` so the page cache does not silently become a DRAM copy of the table.  The fallback
  is logged as a warning.
- **engine**: ``io_uring`` through the ``liburing`` Python binding when it imports and a ring can be set up
  (SDM §4.1 chose io_uring for its low per-IO overhead), otherwise a thread pool issuing ``os.preadv``
  (which releases the GIL).  Either way at most ``max_outstanding`` IOs per table are in flight (SDM §4.1:
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

log = logging.getLogger("recserve.embedding")

ENGINES = ("auto", "io_uring", "threads")


class TableIOError(OSError):
    """Reading rows from a table file failed during serving (device error, short read, file truncated)."""


def _liburing():
    try:
        import liburing  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - any import failure means "not available here"
        return None
    return liburing


def io_uring_available() -> bool:
    lu = _liburing()
    if lu is None:
        return False
    try:
        ring = lu.Ring()
        if lu.io_uring_queue_init(8, ring) != 0:
            return False
        lu.io_uring_queue_exit(ring)
        return True
    except Exception:  # noqa: BLE001 - kernel without io_uring, seccomp, disabled by sysctl
        return False


RING_ENTRIES = 256
_local = threading.local()


def _thread_ring():
    """This thread's io_uring (one per thread: rings are not thread-safe; one ring serves every file)."""
    ring = getattr(_local, "ring", None)
    if ring is None:
        lu = _liburing()
        ring = lu.Ring()
        if lu.io_uring_queue_init(RING_ENTRIES, ring) != 0:
            raise TableIOError("io_uring_queue_init failed")
        _local.ring, _local.cqe = ring, lu.Cqe()
    return _local.ring, _local.cqe


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
        self.iovecs: list | None = None

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
        if engine in ("auto", "io_uring"):
            if io_uring_available():
                self._lu = _liburing()
                return "io_uring"
            if engine == "io_uring":
                raise TableIOError("io_uring requested but the liburing binding or the kernel ring is unavailable")
            log.info("io_uring unavailable (pip install liburing); using a thread pool of os.preadv")
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

    def _iovecs(self) -> list:
        if self.slots.iovecs is None or len(self.slots.iovecs) < self.slots.count:
            self.slots.iovecs = [self._lu.Iovec([v]) for v in self.slots.views]
        return self.slots.iovecs

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
    ``RING_ENTRIES`` in all, completions reaped one at a time; raise the first failure after all completed."""
    lu = _liburing()
    ring, cqe = _thread_ring()
    iovecs = [r._iovecs() for r, _ in requests]
    nxt = [0] * len(requests)
    inflight = [0] * len(requests)
    remaining = sum(int(o.size) for _, o in requests)
    total_inflight = 0
    failure: TableIOError | None = None
    while remaining:
        issued = 0
        for k, (reader, offsets) in enumerate(requests):
            while (nxt[k] < offsets.size and inflight[k] < reader.max_outstanding
                   and total_inflight < RING_ENTRIES):
                i = nxt[k]
                sqe = lu.io_uring_get_sqe(ring)
                lu.io_uring_prep_readv(sqe, reader.fd, iovecs[k][i], int(offsets[i]))
                lu.io_uring_sqe_set_data64(sqe, (k << 32) | i)
                nxt[k] += 1
                inflight[k] += 1
                total_inflight += 1
                issued += 1
        if issued:
            lu.io_uring_submit(ring)
        lu.io_uring_wait_cqe(ring, cqe)
        ready = max(1, lu.io_uring_cq_ready(ring))
        for j in range(ready):  # reap every completion ready, each as the head (cqe[k>0] breaks when the CQ wraps)
            if j:
                lu.io_uring_peek_cqe(ring, cqe)
            entry = cqe[0]
            tag = lu.io_uring_cqe_get_data64(entry)
            try:
                res = entry.res
            except OSError as exc:  # the binding raises for negative results
                res = -(exc.errno or 5)
            lu.io_uring_cqe_seen(ring, entry)
            k, i = tag >> 32, tag & 0xFFFFFFFF
            inflight[k] -= 1
            total_inflight -= 1
            remaining -= 1
            if failure is None:
                try:
                    requests[k][0]._check(res, int(requests[k][1][i]))
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
