"""Starting one worker process of a model: what it is told (its arguments), and what it is lent (an I/O buffer,
a load slot, a connection-state array, an accelerator socket) until it exits."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from recserve.errors import RecserveError
from recserve.hostinfo import private_folder
from recserve.serving.node.config import ModelConfig
from recserve.serving.node.handle import Outbox, WorkerHandle, next_id
from recserve.serving.node.watchdog import CONN_SLOTS
from recserve.serving.wire.model_info import ModelInfo
from recserve.serving.worker.main import WorkerArgs, build_worker_model, share_model, worker_main

log = logging.getLogger("recserve.serving")

LOAD_SLOTS = 64  # model workers that share connections by load; more are served but never take moved connections


UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (``sun_path`` holds 108 with its NUL)


def socket_folder(kind: str, longest: str) -> str:
    """A private temporary folder for Unix sockets the node cannot run without, named up to ``longest``; under a
    TMPDIR too deep for their paths, a one-line error saying so (binding failed later with a traceback)."""
    folder = private_folder(kind)
    length = len(os.fsencode(os.path.join(folder, longest)))
    if length > UNIX_PATH_MAX:
        shutil.rmtree(folder, ignore_errors=True)
        raise RecserveError(f"the temporary folder {os.path.dirname(folder)} is too deep for the node's Unix sockets "
                            f"({length} bytes, at most {UNIX_PATH_MAX}): set TMPDIR to a shorter folder (e.g. /tmp)")
    return folder


@dataclass
class FrontEnd:
    """How a whole-query model's workers meet clients themselves (data plane v2); the node sets it before start."""

    whole_query: bool  # the model's mode is ``model`` (no pipeline)
    listen_sock: Any = None  # the node's HTTP listening socket
    node: Any = None  # the NodeConfig whose body, JSON and read-time bounds the workers apply
    grpc_listen: Any = None  # the node's gRPC listening socket, when the workers answer gRPC too
    grpc_upstream: str = ""  # the supervisor's private gRPC address, for every call a worker does not answer
    shm_dir: str = ""  # the node's shared-memory registry (serving/wire/shm.py) the workers follow
    on_handoff: Callable[[int, bytes, str], None] | None = None  # a connection a worker does not serve

    @property
    def in_workers(self) -> bool:
        return self.listen_sock is not None and self.whole_query


@dataclass
class WorkerSettings:
    """What every model worker is told at start and, when it changes, over its pipe (``("config", {...})``)."""

    version: str
    default: bool = True  # answers the unversioned path
    sub_batch: int = 0


class AccelRoute(Protocol):
    """Where CPU workers send large queries (``accelerators.AcceleratorPool``)."""

    min_items: int

    def sockets(self) -> list[str]: ...

    def claim_socket(self) -> str: ...

    def release_socket(self, path: str) -> None: ...


def probe_verdicts(cfg: ModelConfig) -> dict[str, str]:
    """For a tiered model, probe its native pieces once here (each in a child process: io_uring, the row cache's
    index) and hand the verdicts to every worker as environment variables: the forkserver's environment predates
    them, and one probe per node beats one per worker."""
    if not (cfg.options or {}).get("tier"):
        return {}
    from recserve.embedding import row_index, uring

    ring, why = uring.probe()
    index, index_why = row_index.available()
    return {uring.PROBE_ENV: "ok" if ring else f"unavailable: {why}",
            row_index.PROBE_ENV: "ok" if index else f"unavailable: {index_why}"}


class WorkerLauncher:
    """Starts a model's worker processes with their arguments and shared buffers; takes back what they held."""

    def __init__(self, cfg: ModelConfig, ctx: Any, info: ModelInfo, front: FrontEnd, settings: WorkerSettings,
                 accel: AccelRoute | None) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.info = info
        self.front = front
        self.settings = settings
        self.accel = accel
        self.probe_verdicts = probe_verdicts(cfg)
        # Artifacts are loaded by each worker: safetensors tables are memory-mapped (the page cache is the one
        # shared copy; share_memory_() would copy them), and programs are opaque.
        share = cfg.share_tables and not cfg.artifact
        self.shared_model = share_model(build_worker_model(cfg)) if share else None
        # v2, one shared segment: the queries each model worker holds, one slot per live worker (-1 = free): idle
        # siblings take connections from a worker with a backlog (``ConnectionManager.maybe_move``); and the
        # keep-alive connections each has lately served requests on: a worker serving more than a sibling moves its
        # connections there as they go idle (``ConnectionManager.fewer_active``)
        slots = torch.full((2, LOAD_SLOTS), -1, dtype=torch.int32).share_memory_()
        self.loads, self.active = slots[0], slots[1]
        self.active.zero_()
        # and each serves a socket there for the queries busy siblings forward (``serving/worker/siblings.py``)
        # (a socket that cannot be made there only costs its worker its siblings' queries: ``_serve_siblings``)
        self.sibling_dir = private_folder("siblings") \
            if cfg.forward_to_idle and cfg.mode == "model" else ""
        self.event_loop: dict[str, str] | None = None  # the loop the v2 workers run, and why not the one asked
        self.json_numbers: tuple[str, ...] | None = None  # the native readers of JSON tensors the v2 workers use
        self._slots: set[int] = set()

    async def launch(self, stage: str, cores: list[int], threads: int) -> WorkerHandle:
        """Start a worker process (not waiting for it to be ready): its handle, with the supervisor's pipe end."""
        loop = asyncio.get_running_loop()
        parent, child = self.ctx.Pipe(duplex=True)
        wid = next_id()
        split = self.info.io_in_bytes
        io = torch.empty(split + self.info.io_out_bytes, dtype=torch.uint8).share_memory_()
        args = WorkerArgs(wid, stage, list(cores), threads, self.cfg, split, self.probe_verdicts)
        states = None
        if self.front.in_workers and stage == "model":
            states = torch.zeros((CONN_SLOTS, 2), dtype=torch.int64).share_memory_()  # ``Connection.mark``
            await self._front_end_args(args)
        if stage == "accel" and self.accel is not None:
            args.accel_socket, args.info = self.accel.claim_socket(), self.info
        proc = self.ctx.Process(target=worker_main,
                                args=(child, args, self.shared_model, io, states, self.loads, self.active),
                                daemon=True, name=f"recserve-{self.cfg.name}-{stage}-{wid}")
        try:
            await loop.run_in_executor(None, proc.start)
        except BaseException:
            self._slots.discard(args.slot)
            raise
        child.close()
        handle = WorkerHandle(wid, stage, list(cores), threads, proc, parent,
                              loop.create_future(), loop.create_future(), io.numpy(), split,
                              states=states.numpy() if states is not None else None, slot=args.slot,
                              accel_socket=args.accel_socket)
        handle.outbox = Outbox(parent, proc.name)
        return handle

    async def _front_end_args(self, args: WorkerArgs) -> None:
        """A model worker that accepts the node's queries itself: sockets, limits, live settings, load slot."""
        front, settings = self.front, self.settings
        args.listen, args.info, args.limits, args.sub_batch = front.listen_sock, self.info, self._limits(), \
            settings.sub_batch
        args.grpc_listen, args.grpc_upstream = front.grpc_listen, front.grpc_upstream
        args.shm_dir = front.shm_dir
        args.version, args.default = settings.version, settings.default
        args.slot = self._free_slot()
        args.sibling_dir = self.sibling_dir if args.slot >= 0 else ""
        if self.accel is not None:
            args.accel_sockets, args.accel_min_items = tuple(self.accel.sockets()), self.accel.min_items
        args.event_loop = await self._event_loop()
        args.json_numbers = await self._json_numbers()

    def release(self, handle: WorkerHandle) -> None:
        """An exited worker's load slot and accelerator socket are free for its replacement."""
        if 0 <= handle.slot < LOAD_SLOTS:
            self.loads[handle.slot] = -1
            self.active[handle.slot] = 0
            self._slots.discard(handle.slot)
        if self.accel is not None and handle.accel_socket:
            self.accel.release_socket(handle.accel_socket)

    def cleanup(self) -> None:
        if self.sibling_dir:
            shutil.rmtree(self.sibling_dir, ignore_errors=True)

    async def _event_loop(self) -> str:
        """The loop this model's v2 workers run (``serving/worker/eventloop.py``), chosen once: the probe runs a child
        process, off this loop."""
        if self.event_loop is None:
            from recserve.serving.worker import eventloop

            setting = getattr(self.front.node, "event_loop", "auto")
            chosen, why = await asyncio.get_running_loop().run_in_executor(None, eventloop.choose, setting)
            if why and setting == "uvloop":
                log.warning("model %s: event_loop uvloop asked, workers run asyncio: %s", self.cfg.name, why)
            self.event_loop = {"loop": chosen, "asked": setting, "why": why}
        return self.event_loop["loop"]

    async def _json_numbers(self) -> tuple[str, ...]:
        """Which native readers parse JSON tensors (``serving/wire/json_numbers.py``), chosen once: their probes run
        child processes once per node, off this loop; the supervisor's own decode (handed-off requests) follows."""
        if self.json_numbers is None:
            from recserve.serving.wire import json_numbers

            passed, why = await asyncio.get_running_loop().run_in_executor(None, json_numbers.probe)
            if why:
                log.warning("model %s: plain-JSON tensors read by %s (slower): %s", self.cfg.name,
                            " then ".join(passed) or "lists", why)
            json_numbers.enable(passed)
            self.json_numbers = passed
        return self.json_numbers

    def _limits(self) -> Any:
        """One worker's admission limits (data plane v2): the model's queue limit, counted over its workers' published
        loads, and an even share of it where a worker has no load slot."""
        from recserve.serving.worker.limits import PlaneLimits

        node, cfg = self.front.node, self.cfg
        share = max(1, -(-cfg.queue_limit // cfg.workers))
        return PlaneLimits(max_body=node.max_body_bytes, max_json=node.max_json_bytes, queue_limit=share,
                           model_queue_limit=cfg.queue_limit,
                           deadline_s=cfg.deadline_ms / 1e3, fuse_items=cfg.fuse_items,
                           read_timeout_s=node.read_timeout_s, keep_alive_s=node.keep_alive_timeout_s,
                           max_connections=node.max_connections, flood=node.grpc_limits)

    def _free_slot(self) -> int:
        """Take the lowest load slot no worker of this model holds (-1 if every slot is taken)."""
        slot = next((i for i in range(LOAD_SLOTS) if i not in self._slots), -1)
        if slot >= 0:
            self._slots.add(slot)
        return slot
