"""A small io_uring layer over the raw system calls: ctypes for ``io_uring_setup``/``io_uring_enter``, numpy
views of the mmapped submission and completion rings.

Why our own and not a binding: the PyPI ``liburing`` wheel (2026.3.30) is compiled for an AVX-512 target, so
``liburing.Ring()`` dies with SIGILL on x86-64 hosts without AVX-512
(docs/decisions/2026-11-28-io-uring-without-a-binding.md) and takes the interpreter with it.  This module compiles
nothing: there is no instruction set to assume, and a kernel that refuses io_uring (old kernel, seccomp,
``kernel.io_uring_disabled``) answers with an errno that we turn into "unavailable".  The submission queue is filled in
one vectorised numpy assignment per batch, so a batch of N reads costs one ``io_uring_enter`` plus O(1) Python, not N
binding calls.

Detection never runs io_uring in the calling process first: :func:`probe` sets up a ring and reads a file in a
child process, once per process tree (the verdict travels to worker processes in an environment variable), so
a probe that crashes (a signal, a seccomp kill) means "unavailable", with the reason, and the caller lives on.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np

from recserve.hostinfo import probe_in_child

log = logging.getLogger("recserve.embedding")

# The io_uring system calls have the same numbers on x86-64 and aarch64 (added after the syscall tables merged).
SYS_IO_URING_SETUP, SYS_IO_URING_ENTER = 425, 426
IORING_OFF_SQ_RING, IORING_OFF_CQ_RING, IORING_OFF_SQES = 0, 0x8000000, 0x10000000
IORING_ENTER_GETEVENTS = 1
IORING_OP_READV = 1  # Linux 5.1+ (IORING_OP_READ needs 5.6)

SQE_DTYPE = np.dtype({"names": ["opcode", "flags", "ioprio", "fd", "off", "addr", "len", "rw_flags", "user_data"],
                      "formats": [np.uint8, np.uint8, np.uint16, np.int32, np.uint64, np.uint64, np.uint32,
                                  np.uint32, np.uint64],
                      "offsets": [0, 1, 2, 4, 8, 16, 24, 28, 32], "itemsize": 64})
CQE_DTYPE = np.dtype({"names": ["user_data", "res", "flags"], "formats": [np.uint64, np.int32, np.uint32],
                      "offsets": [0, 8, 12], "itemsize": 16})
IOVEC_DTYPE = np.dtype([("base", np.uint64), ("len", np.uint64)])


class _SQOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped",
                                                "array", "resv1")] + [("user_addr", ctypes.c_uint64)]


class _CQOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes",
                                                "flags", "resv1")] + [("user_addr", ctypes.c_uint64)]


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in ("sq_entries", "cq_entries", "flags", "sq_thread_cpu",
                                                "sq_thread_idle", "features", "wq_fd")] + [
        ("resv", ctypes.c_uint32 * 3), ("sq_off", _SQOffsets), ("cq_off", _CQOffsets)]


assert ctypes.sizeof(_Params) == 120, "struct io_uring_params layout"

_libc = ctypes.CDLL(None, use_errno=True)  # CDLL calls release the GIL while the kernel works
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class UringError(OSError):
    """The kernel refused a ring operation (setup, mmap or enter)."""


class Ring:
    """One io_uring instance (not thread-safe: use one per thread).

    :meth:`submit` queues reads described by numpy arrays; :meth:`enter` submits and waits; :meth:`reap`
    returns the completions as ``(user_data, res)`` arrays."""

    def __init__(self, entries: int = 256) -> None:
        params = _Params()
        fd = _syscall(ctypes.c_long(SYS_IO_URING_SETUP), ctypes.c_long(entries), ctypes.byref(params))
        if fd < 0:
            err = ctypes.get_errno()
            raise UringError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd = int(fd)
        try:
            self._map(params)
        except Exception:
            os.close(self.fd)
            raise
        self.entries = params.sq_entries
        self.outstanding = 0  # published and not yet reaped (consumed by the kernel or not)

    def _map(self, p: _Params) -> None:
        sq, cq = p.sq_off, p.cq_off
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        self._sq_map = mmap.mmap(self.fd, sq.array + p.sq_entries * 4, flags, prot, offset=IORING_OFF_SQ_RING)
        self._cq_map = mmap.mmap(self.fd, cq.cqes + p.cq_entries * CQE_DTYPE.itemsize, flags, prot,
                                 offset=IORING_OFF_CQ_RING)
        self._sqe_map = mmap.mmap(self.fd, p.sq_entries * SQE_DTYPE.itemsize, flags, prot, offset=IORING_OFF_SQES)
        sq_u32 = np.frombuffer(self._sq_map, dtype=np.uint32)
        cq_u32 = np.frombuffer(self._cq_map, dtype=np.uint32)
        self._sq_head, self._sq_tail = sq_u32[sq.head // 4: sq.head // 4 + 1], sq_u32[sq.tail // 4: sq.tail // 4 + 1]
        self._sq_mask = int(sq_u32[sq.ring_mask // 4])
        sq_array = sq_u32[sq.array // 4: sq.array // 4 + p.sq_entries]
        sq_array[:] = np.arange(p.sq_entries, dtype=np.uint32)  # slot i of the SQE array is submission slot i
        self._cq_head, self._cq_tail = cq_u32[cq.head // 4: cq.head // 4 + 1], cq_u32[cq.tail // 4: cq.tail // 4 + 1]
        self._cq_mask = int(cq_u32[cq.ring_mask // 4])
        self._cqes = np.frombuffer(self._cq_map, dtype=CQE_DTYPE, count=p.cq_entries, offset=cq.cqes)
        self._sqes = np.frombuffer(self._sqe_map, dtype=SQE_DTYPE)
        self._queued = 0  # written to the SQE array, tail not yet moved

    def space(self) -> int:
        """Reads that can be queued now without overrunning the rings (the CQ holds twice the SQ)."""
        return self.entries - self.outstanding - self._queued

    def submit_readv(self, fd: int, iovec_addrs: np.ndarray, offsets: np.ndarray, user_data: np.ndarray) -> None:
        """Queue one single-iovec ``readv`` per element (``iovec_addrs`` point at ``struct iovec``s)."""
        n = int(offsets.size)
        if n > self.space():
            raise ValueError(f"{n} reads do not fit the ring ({self.space()} free)")
        slots = (int(self._sq_tail[0]) + self._queued + np.arange(n)) & self._sq_mask
        sqe = np.zeros(n, dtype=SQE_DTYPE)
        sqe["opcode"], sqe["fd"], sqe["off"] = IORING_OP_READV, fd, offsets
        sqe["addr"], sqe["len"], sqe["user_data"] = iovec_addrs, 1, user_data
        self._sqes[slots] = sqe
        self._queued += n

    def enter(self, wait_for: int) -> None:
        """Publish the queued reads and wait until at least ``wait_for`` completions are ready."""
        if self._queued:
            self._sq_tail[0] = np.uint32((int(self._sq_tail[0]) + self._queued) & 0xFFFFFFFF)
            self.outstanding += self._queued
            self._queued = 0
        wait_for = min(wait_for, self.outstanding)
        while True:
            unconsumed = (int(self._sq_tail[0]) - int(self._sq_head[0])) & 0xFFFFFFFF
            got = _syscall(ctypes.c_long(SYS_IO_URING_ENTER), ctypes.c_long(self.fd), ctypes.c_long(unconsumed),
                           ctypes.c_long(wait_for), ctypes.c_long(IORING_ENTER_GETEVENTS), None, ctypes.c_long(0))
            if got >= 0:
                return
            err = ctypes.get_errno()
            if err not in (4, 11):  # EINTR (a signal while waiting), EAGAIN (no memory for requests yet): again
                raise UringError(err, f"io_uring_enter: {os.strerror(err)}")

    def reap(self) -> tuple[np.ndarray, np.ndarray]:
        """Completions ready now: ``(user_data, res)``; ``res`` is bytes read or ``-errno``."""
        head, tail = int(self._cq_head[0]), int(self._cq_tail[0])
        n = (tail - head) & 0xFFFFFFFF
        if not n:
            return np.empty(0, np.uint64), np.empty(0, np.int32)
        idx = (head + np.arange(n)) & self._cq_mask
        entries = self._cqes[idx]  # fancy indexing copies before the head moves on
        self._cq_head[0] = np.uint32(tail)
        self.outstanding -= n
        return entries["user_data"].copy(), entries["res"].copy()

    def close(self) -> None:
        if self.fd >= 0:
            for name in ("_sqes", "_cqes", "_sq_head", "_sq_tail", "_cq_head", "_cq_tail"):
                self.__dict__.pop(name, None)  # drop the numpy views before unmapping
            for m in (self._sqe_map, self._cq_map, self._sq_map):
                m.close()
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown; the kernel frees the ring with the fd
            pass


def iovecs_for(buffer_address: int, size: int, count: int) -> np.ndarray:
    """``count`` ``struct iovec``s over consecutive ``size``-byte buffers starting at ``buffer_address``."""
    vec = np.empty(count, dtype=IOVEC_DTYPE)
    vec["base"] = buffer_address + size * np.arange(count, dtype=np.uint64)
    vec["len"] = size
    return vec


def read_windows(ring: Ring, fd: int, window: int, buffer_address: int, offsets: np.ndarray,
                 iovecs: np.ndarray) -> np.ndarray:
    """Read ``window`` bytes at each offset into consecutive buffers; returns each read's result (bytes or
    -errno).  Used by the probe; the table reader interleaves several files with :class:`Ring` directly."""
    n = int(offsets.size)
    results = np.zeros(n, dtype=np.int64)
    nxt = done = 0
    base = iovecs.ctypes.data
    while done < n:
        k = min(n - nxt, ring.space())
        if k:
            ring.submit_readv(fd, base + IOVEC_DTYPE.itemsize * np.arange(nxt, nxt + k, dtype=np.uint64),
                              offsets[nxt:nxt + k].astype(np.uint64), np.arange(nxt, nxt + k, dtype=np.uint64))
            nxt += k
        ring.enter(1)
        tags, res = ring.reap()
        results[tags.astype(np.int64)] = res
        done += tags.size
    return results


# ---- detection -----------------------------------------------------------------------------------------
PROBE_ENV = "RECSERVE_IO_URING_PROBE"  # "ok" or "unavailable: <reason>", inherited by worker processes
PROBE_TIMEOUT_S = 20.0
PROBE_CODE = "from recserve.embedding.uring import _probe_main; _probe_main()"
_verdict: tuple[bool, str] | None = None
_verdict_lock = threading.Lock()


def _probe_main() -> None:
    """Child side of :func:`probe`: set up a ring and read a file of known bytes through it."""
    import tempfile

    with tempfile.TemporaryFile() as f:
        f.write(bytes(range(256)) * 32)
        f.flush()
        ring = Ring(8)
        buf = mmap.mmap(-1, 8192)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        vec = iovecs_for(addr, 4096, 2)
        res = read_windows(ring, f.fileno(), 4096, addr, np.array([0, 4096], dtype=np.int64), vec)
        ok = list(res) == [4096, 4096] and bytes(buf[:8192]) == bytes(range(256)) * 32
        del addr
        ring.close()
    if not ok:
        sys.stderr.write(f"io_uring read returned {list(res)} or wrong bytes\n")
        sys.exit(3)
    sys.stdout.write("ok\n")


def _run_probe() -> tuple[bool, str]:
    src_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([src_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    ok, why = probe_in_child(PROBE_CODE, "the io_uring probe", PROBE_TIMEOUT_S, env)
    return (True, "io_uring set up and read a test file in a probe process") if ok else (False, why)


def probe() -> tuple[bool, str]:
    """``(available, reason)`` for io_uring in this process tree, decided once (in a child process) and logged."""
    global _verdict
    with _verdict_lock:
        if _verdict is None:
            inherited = os.environ.get(PROBE_ENV, "")
            if inherited == "ok":
                _verdict = (True, "io_uring verified by the parent process's probe")
            elif inherited.startswith("unavailable: "):
                _verdict = (False, inherited.removeprefix("unavailable: "))
            else:
                _verdict = _run_probe()
                os.environ[PROBE_ENV] = "ok" if _verdict[0] else f"unavailable: {_verdict[1]}"
                if _verdict[0]:
                    log.info("I/O engine: io_uring (%s)", _verdict[1])
                else:
                    log.warning("io_uring unavailable here (%s); tiered tables read with a thread pool of "
                                "os.preadv", _verdict[1])
        return _verdict


def reset_probe() -> None:
    """Forget the verdict (tests)."""
    global _verdict
    with _verdict_lock:
        _verdict = None
        os.environ.pop(PROBE_ENV, None)
