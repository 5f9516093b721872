"""Triton's system shared-memory extension: query tensors read from, and scores written to, regions of
POSIX shared-memory objects (``/dev/shm/<key>``) that a client on this host registered, so a large query (a
hercules-rmc2 production-mix query is ~19 MB of int64 ids) never crosses HTTP or gRPC.

Protocol (Triton's ``extension_shared_memory.md``; tritonclient's ``register_system_shared_memory`` and
``tritonclient.utils.shared_memory`` speak it unchanged):

- ``POST v2/systemsharedmemory/region/<name>/register`` ``{"key", "offset", "byte_size"}`` (gRPC
  ``SystemSharedMemoryRegister``): the object ``/dev/shm/<key>`` (leading slashes dropped, as ``shm_open`` does) is
  opened read-write and ``offset + byte_size`` must lie within it; a name already registered, a key that cannot
  be opened or a region past the object's end is a 400 / ``INVALID_ARGUMENT``.
- ``POST v2/systemsharedmemory[/region/<name>]/unregister``: one region or all; an unknown name is no error (as
  Triton).  ``GET v2/systemsharedmemory[/region/<name>]/status``: ``[{"name", "key", "offset", "byte_size"}]``
  (gRPC: ``regions`` map); an unknown name is 404 / ``NOT_FOUND``.
- An infer input whose ``parameters`` carry ``shared_memory_region`` and ``shared_memory_byte_size`` (optional
  ``shared_memory_offset``, bytes into the region) is read from the region: ``byte_size`` must equal the shape's
  size in bytes and ``offset + byte_size`` lie within the region.  A requested output with the same parameters is
  written there and its data left out of the response (HTTP JSON without ``data``, gRPC without
  ``raw_output_contents``); the region must hold the scores.

Where regions live.  Every call but a worker's own model's infer already reaches the supervisor (HTTP requests are
handed over with their connection, gRPC calls forwarded through ``grpc_worker.Forwarder``), so the supervisor holds
the one :class:`Registry`.  It opens each registered object once, keeps that descriptor, writes the table to
``regions.json`` in a private directory (write, then rename) and *then* increments a generation counter in an
8-byte file of the same directory, before the register call is answered.  Every process that decodes queries (each
data-plane worker; the supervisor for the v1 paths) holds a :class:`Regions`: when a query names a region it reads
the counter (one load from a shared mapping) and rereads the table if it changed, then maps the region on first use
through the supervisor's descriptor (``/proc/<pid>/fd/<n>``, identity checked by device and inode: the object the
client registered is the one mapped even if its name was unlinked since; ``/dev/shm/<key>`` where ``/proc`` is
closed) and keeps the mapping for later queries.  Any request sent after the register answer therefore finds the
region in whichever worker takes it.  Broadcasting on the workers' pipes, as ``("config", ...)`` messages do, was
not enough: those are not acknowledged (an infer sent right after the answer could reach a worker first) and a
worker started later would need a snapshot; the counter needs neither, and a new worker needs only the directory.

Lifetime.  Inputs are numpy views of the mapping (no copy); a view holds a reference to its ``mmap`` object, which is
unmapped only when the last view is gone (Python's ``mmap`` refuses ``close()`` while views exist, and this module never
calls it).  Unregister drops the mapping from the table; a query already decoded keeps its memory until it is answered,
so no view ever reads unmapped memory.  Keeping mappings alive under the views costs nothing per query, where copying a
large query's ids out of the region would cost more than reading them, so inputs are views
(docs/decisions/2026-11-28-shared-memory-regions.md; ``tests/test_shm.py::test_zero_copy_view_outlives_unregister``
checks the lifetime).

Access: registering makes the server open an object under ``/dev/shm`` for a client, so it follows the control
API's rule (``control_api``): open on a node without a control token (which must then be bound to loopback), else
the token is needed: HTTP's ``Authorization: Bearer`` header, gRPC's ``authorization`` metadata.  Calls the workers
forward to the supervisor carry no metadata, so on such a node register over HTTP (or run ``front_end: server``).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import shutil
import stat
import struct
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from recserve.hostinfo import private_folder
from recserve.serving.wire.errors import InferError

SHM_ROOT = "/dev/shm"
TABLE = "regions.json"
GENERATION = "generation"
MAX_REGIONS = 1024  # each holds a descriptor in the supervisor and a mapping per worker that used it
MAX_NAME = 255
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
SHM_PARAMETERS = (REGION, BYTE_SIZE, OFFSET)
CUDA_UNSUPPORTED = ("CUDA shared memory is not supported by this server; use system shared memory "
                    "(v2/systemsharedmemory, SystemSharedMemoryRegister)")


def invalid(field: str, message: str) -> InferError:
    return InferError("invalid", f"{field}: {message}", field)


@dataclass(frozen=True)
class Registration:
    """One registered region: the client's ``key``/``offset``/``byte_size`` and the object the supervisor opened."""

    name: str
    key: str
    offset: int
    byte_size: int
    pid: int  # the supervisor, which holds descriptor ``fd`` of the object
    fd: int
    dev: int  # the object's identity: a descriptor number or a name reused for another object is noticed
    ino: int
    serial: int  # unique per registration: a process's mapping cache key

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class _Mapping:
    """One process's mapping of a registration (from the page boundary at or below its offset)."""

    __slots__ = ("mm", "base", "end")

    def __init__(self, mm: mmap.mmap, base: int, end: int) -> None:
        self.mm, self.base, self.end = mm, base, end  # region byte 0 is mm[base]; the object must hold ``end`` bytes


def _shrank(reg: Registration, end: int) -> InferError:
    return invalid(REGION, f"region {reg.name!r}: its shared memory object {reg.key!r} shrank below the {end} bytes "
                           "registered")


def shm_path(key: str) -> str:
    """``/dev/shm/<key>`` for a POSIX shared-memory key (``shm_open``'s rules: leading slashes dropped, no other)."""
    name = key.lstrip("/")
    if not name or "/" in name or name in (".", "..") or "\0" in name or len(name) > MAX_NAME:
        raise invalid("key", f"{key!r} is not a shared memory key (one name, optionally after '/': "
                             f"'/{name or 'name'}')")
    return os.path.join(SHM_ROOT, name)


def _count(field: str, value: Any, what: str, low: int = 0) -> int:
    if type(value) is not int or value < low:
        raise invalid(field, f"{what} must be an integer >= {low}, got {value!r}")
    return value


def tensor_params(field: str, params: dict[str, Any]) -> tuple[str, int, int] | None:
    """``(region, byte_size, offset)`` from a tensor's parameters (HTTP JSON, or gRPC's as plain values); None when
    it names no region.  Region and byte size come together or not at all (Triton's rule)."""
    region, size = params.get(REGION), params.get(BYTE_SIZE)
    if region is None and size is None:
        if OFFSET in params:
            raise invalid(field, f"parameters.{OFFSET} without {REGION} and {BYTE_SIZE}")
        return None
    if region is None or size is None:
        raise invalid(field, f"parameters.{REGION} and parameters.{BYTE_SIZE} must be given together")
    if not isinstance(region, str) or not region:
        raise invalid(field, f"parameters.{REGION} must be a region name, got {region!r}")
    return (region, _count(field, size, f"parameters.{BYTE_SIZE}"),
            _count(field, params.get(OFFSET, 0), f"parameters.{OFFSET}"))


def grpc_params(parameters: Any) -> dict[str, Any]:
    """A gRPC ``map<string, InferParameter>`` as plain values (what :func:`tensor_params` reads)."""
    return {k: getattr(v, v.WhichOneof("parameter_choice") or "string_param") for k, v in parameters.items()}


def register_request(body: dict[str, Any]) -> tuple[str, int, int]:
    """``(key, offset, byte_size)`` of an HTTP register body ``{"key", "offset"?, "byte_size"}``."""
    for k in body:
        if k not in ("key", "offset", "byte_size"):
            raise invalid(str(k), "unknown field; a register request takes ['key', 'offset', 'byte_size']")
    key = body.get("key")
    if not isinstance(key, str):
        raise invalid("key", f"must be the shared memory object's key (a string), got {key!r}")
    if "byte_size" not in body:
        raise invalid("byte_size", "required")
    return key, _count("offset", body.get("offset", 0), "offset"), _count("byte_size", body["byte_size"], "byte_size")


class Regions:
    """A process's view of the node's registered regions: follows the supervisor's table (``directory``), maps a
    region on its first use and keeps the mapping while the region stays registered."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._counter: mmap.mmap | None = None
        self._generation = -1
        self.table: dict[str, Registration] = {}
        self._maps: dict[int, _Mapping] = {}

    # ---- the table ----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Reread the table if the supervisor changed it since (cheap when it did not: one 8-byte read)."""
        if self._counter is None:
            try:
                with open(os.path.join(self.directory, GENERATION), "rb") as f:
                    self._counter = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)
            except OSError:
                return  # no registry (the node is stopping): what is known stays
        generation = struct.unpack_from("<q", self._counter)[0]
        if generation == self._generation:
            return
        with open(os.path.join(self.directory, TABLE), "rb") as f:  # renamed into place whole: never torn
            table = {name: Registration(**entry) for name, entry in json.load(f).items()}
        self._set_table(table)
        self._generation = generation

    def _set_table(self, table: dict[str, Registration]) -> None:
        self.table = table
        live = {r.serial for r in table.values()}
        for serial in [s for s in self._maps if s not in live]:
            del self._maps[serial]  # unmapped when the last view of it is gone

    def lookup(self, field: str, name: str) -> Registration:
        self.refresh()
        reg = self.table.get(name)
        if reg is None:
            known = sorted(self.table)
            shown = f"{known[:8]}{' ...' if len(known) > 8 else ''}" if known else "none"
            raise invalid(field, f"{REGION} {name!r} is not a registered system shared memory region "
                                 f"(registered: {shown})")
        return reg

    # ---- mappings -----------------------------------------------------------------------------------
    def _open(self, reg: Registration) -> int:
        """A descriptor of the object ``reg`` names: the supervisor's own (through /proc) or the key's."""
        for path in (f"/proc/{reg.pid}/fd/{reg.fd}", shm_path(reg.key)):
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError:
                continue
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (reg.dev, reg.ino):
                return fd
            os.close(fd)
        raise invalid(REGION, f"region {reg.name!r}: its shared memory object {reg.key!r} is gone (unregistered "
                              "while this request was read, or removed and replaced under the same key)")

    def _mapping(self, reg: Registration) -> _Mapping:
        m = self._maps.get(reg.serial)
        if m is None:
            fd = self._open(reg)
            try:
                end = reg.offset + reg.byte_size
                if os.fstat(fd).st_size < end:
                    raise _shrank(reg, end)
                start = reg.offset - reg.offset % mmap.ALLOCATIONGRANULARITY
                mm = mmap.mmap(fd, end - start, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
            finally:
                os.close(fd)
            m = self._maps[reg.serial] = _Mapping(mm, reg.offset - start, end)
        elif m.mm.size() < m.end:  # one fstat: a client that truncated its object must not cost us a SIGBUS
            raise _shrank(reg, m.end)
        return m

    def _span(self, field: str, region: str, byte_size: int, offset: int) -> tuple[Registration, int]:
        reg = self.lookup(field, region)
        if offset + byte_size > reg.byte_size:
            raise invalid(field, f"{OFFSET} {offset} + {BYTE_SIZE} {byte_size} runs past region {region!r} of "
                                 f"{reg.byte_size} bytes")
        return reg, offset

    # ---- tensors ------------------------------------------------------------------------------------
    def view(self, field: str, region: str, byte_size: int, offset: int, dtype: np.dtype,
             shape: tuple[int, ...]) -> np.ndarray:
        """Input ``field`` as a numpy view of ``byte_size`` bytes at ``offset`` into ``region`` (no copy; an
        unaligned start is copied).  ``byte_size`` must be the shape's size in bytes."""
        count = math.prod(shape)
        if byte_size != count * dtype.itemsize:
            raise invalid(field, f"{BYTE_SIZE} is {byte_size} bytes, shape {list(shape)} of {dtype.name} needs "
                                 f"{count * dtype.itemsize}")
        reg, offset = self._span(field, region, byte_size, offset)
        m = self._mapping(reg)
        arr = np.frombuffer(m.mm, dtype=dtype, count=count, offset=m.base + offset).reshape(shape)
        return arr if arr.flags.aligned else arr.copy()

    def check_output(self, field: str, region: str, byte_size: int, offset: int) -> None:
        """A requested output's region exists and the span lies within it (checked before the query runs)."""
        self._span(field, region, byte_size, offset)

    def write(self, field: str, region: str, byte_size: int, offset: int, array: np.ndarray) -> None:
        """Output ``field``'s bytes (little-endian, C order) into ``region`` at ``offset``."""
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        if raw.size > byte_size:
            raise invalid(field, f"{BYTE_SIZE} {byte_size} of the output's region is too small: the result "
                                 f"{list(array.shape)} of {array.dtype.name} takes {raw.size} bytes")
        reg, offset = self._span(field, region, byte_size, offset)
        m = self._mapping(reg)
        np.frombuffer(m.mm, dtype=np.uint8, count=raw.size, offset=m.base + offset)[:] = raw


class Registry(Regions):
    """The supervisor's registry: register, unregister and status; the table its :class:`Regions` readers follow.
    Every call runs on the supervisor's one event loop (HTTP and gRPC alike), so no lock is needed."""

    def __init__(self, directory: str | None = None) -> None:
        super().__init__(directory or private_folder("shm"))
        self._fds: dict[str, int] = {}
        self._serial = 0
        self._cleanup = weakref.finalize(self, _remove, self.directory, self._fds)
        self._publish()

    def refresh(self) -> None:
        pass  # this process writes the table: it is always current here

    def _publish(self) -> None:
        """Write the table, then move the generation on: a reader that sees the new count reads the new table."""
        tmp = os.path.join(self.directory, TABLE + ".tmp")
        with open(tmp, "w") as f:
            json.dump({name: asdict(reg) for name, reg in self.table.items()}, f)
        os.replace(tmp, os.path.join(self.directory, TABLE))
        path = os.path.join(self.directory, GENERATION)
        if self._counter is None:
            with open(path, "wb") as f:
                f.write(struct.pack("<q", 0))
            with open(path, "r+b") as f:
                self._counter = mmap.mmap(f.fileno(), 8)
        self._generation += 1
        struct.pack_into("<q", self._counter, 0, self._generation)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Triton's register: the object opened read-write, the span checked against its size."""
        where = f"failed to register shared memory region {name!r}"
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise invalid("name", f"{where}: a region name must be 1-{MAX_NAME} characters")
        if name in self.table:
            raise invalid("name", f"{where}: a region of that name is already registered (unregister it first)")
        if len(self.table) >= MAX_REGIONS:
            raise invalid("name", f"{where}: {MAX_REGIONS} regions are registered, the most this server holds")
        _count("offset", offset, "offset")
        _count("byte_size", byte_size, "byte_size", low=1)
        path = shm_path(key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError as exc:
            raise invalid("key", f"{where}: unable to open shared memory object {key!r}: {exc.strerror}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise invalid("key", f"{where}: {key!r} is not a shared memory object")
            if offset + byte_size > st.st_size:
                raise invalid("byte_size", f"{where}: offset {offset} + byte_size {byte_size} runs past the end of "
                                           f"shared memory object {key!r} ({st.st_size} bytes)")
        except BaseException:
            os.close(fd)
            raise
        self._serial += 1
        self._fds[name] = fd
        self.table = {**self.table, name: Registration(name, key, offset, byte_size, os.getpid(), fd,
                                                       st.st_dev, st.st_ino, self._serial)}
        self._publish()

    def unregister(self, name: str = "") -> None:
        """One region (an unknown name is no error, as Triton) or, with ``name`` empty, all of them."""
        names = list(self.table) if not name else [name] if name in self.table else []
        if not names:
            return
        self._set_table({n: r for n, r in self.table.items() if n not in names})
        self._publish()  # a reader that still maps it keeps its mapping; a reused descriptor number fails its check
        for n in names:
            os.close(self._fds.pop(n))

    def status(self, name: str = "") -> list[dict[str, Any]]:
        if not name:
            return [reg.status() for reg in self.table.values()]
        reg = self.table.get(name)
        if reg is None:
            raise InferError("not_found", f"Unable to find system shared memory region: {name!r}", "name")
        return [reg.status()]

    def close(self) -> None:
        """Unregister everything and remove the directory (node shutdown)."""
        self.table, self._maps = {}, {}
        self._cleanup()


def _remove(directory: str, fds: dict[str, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
    shutil.rmtree(directory, ignore_errors=True)
