"""The node's shared state: its model runtimes by name and version (``node/model_loader.py`` loads and unloads
repository models), the watchdog over workers, and where each handed-over HTTP connection goes.  Both front ends (the
HTTP app and the gRPC service) and the workers' hand-overs act on one ``NodeCore``; ``NodeServer``
(``node/server.py``) owns its sockets and lifecycle."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from recserve.serving.node import handover
from recserve.serving.node.config import ModelConfig, NodeConfig, available_cores
from recserve.serving.node.forkserver import mp_context
from recserve.serving.node.llc import LlcAllocator
from recserve.serving.node.metrics import ModelMetrics
from recserve.serving.node.model_loader import ModelLoader
from recserve.serving.node.repository import Repository
from recserve.serving.node.runtime import ModelRuntime
from recserve.serving.wire import protocol
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import Registry

log = logging.getLogger("recserve.serving")

WATCHDOG_S = 0.2  # how often hung workers are looked for
STALE_TICK_S = 0.5  # a watchdog tick this late skips its judgement (this process was stalled: heartbeats unread)


def _infer_route(prefix: bytes) -> tuple[str, str] | None:
    """(model, version or "") an HTTP request's line names (``POST /v2/models/<m>[/versions/<v>]/infer``)."""
    line = prefix.split(b"\r\n", 1)[0].decode("latin-1", "replace").split(" ")
    if len(line) < 2 or line[0] != "POST":
        return None
    parts = line[1].partition("?")[0].split("/")
    if len(parts) == 5 and parts[:3] == ["", "v2", "models"] and parts[-1] == "infer":
        return parts[3], ""
    if len(parts) == 7 and parts[:3] == ["", "v2", "models"] and parts[4] == "versions" and parts[-1] == "infer":
        return parts[3], parts[5]
    return None


def _infer_target(prefix: bytes) -> str | None:
    """The model an HTTP request's line names for inference."""
    route = _infer_route(prefix)
    return route[0] if route else None


class NodeCore:
    """State shared by both front ends: the model runtimes and node-wide settings."""

    def __init__(self, config: NodeConfig, llc: LlcAllocator | None = None) -> None:
        self.config = config
        self.llc = llc or LlcAllocator()
        self.ctx = mp_context()
        # served name -> the runtime answering unversioned requests (the newest loaded version)
        self.models: dict[str, ModelRuntime] = {m.name: ModelRuntime(m, self.ctx, self.llc) for m in config.models}
        # served name -> version -> runtime (catalogue models have version "1" only)
        self.versions: dict[str, dict[str, ModelRuntime]] = {n: {rt.version: rt} for n, rt in self.models.items()}
        repository = Repository(config.repository) if config.repository else None
        self.loader = ModelLoader(repository, self.models, self.versions, self._new_runtime, self._cover_accepts,
                                  self.ctx, config.drain_timeout_s)
        self.grpc_listen: socket.socket | None = None  # gRPC in the workers (NodeServer sets it), for loaded models
        self.grpc_upstream = ""
        self.accepting = False
        self.stopping = False  # the node drains and stops (``NodeServer._ashutdown``)
        self.refusals: dict[str, int] = {}  # inference requests refused before a model was known, by reason
        self.own = handover.OwnAccepts(config, self.refused)  # the HTTP connections this process serves itself
        self._tasks: set[asyncio.Task] = set()
        self._watchdog: asyncio.TimerHandle | None = None
        self._skipped = False  # the last tick was late and judged nothing
        self.listen_sock: socket.socket | None = None
        self.cover_grpc: Callable[[bool], Awaitable[None]] | None = None  # the same for gRPC (NodeServer)
        # Triton's system shared memory: the node's one table of regions, which the workers follow (serving/wire/shm.py)
        self.shm = Registry()

    def start_watchdog(self) -> None:
        """Every ``WATCHDOG_S``: each model replaces workers that stopped beating (see ``serving/node/watchdog.py``),
        and this process accepts on the node's socket itself while no worker does.

        A tick that runs ``STALE_TICK_S`` late judges nothing: this process was not running (a host stall, or a thread
        of an embedding program holding the GIL), so heartbeats may wait unread in the workers' pipes and every worker
        would look silent (docs/decisions/2026-11-28-dead-and-hung-workers.md).  The loop reads them before the next
        tick, which judges.

        It keeps ticking while the node drains (a worker hung then is killed and its queries answered, not waited
        for until the drain's timeout), and watches versions retiring after an unload or a reload as well; only
        the covering is left to the shutdown, which accepts on the node's socket itself."""
        loop = asyncio.get_running_loop()
        late = loop.time() - self._watchdog.when() if self._watchdog is not None else 0.0  # this tick's timer
        stale = late >= STALE_TICK_S and not self._skipped
        if not stale:  # never two skipped in a row: a loop late on every tick still has its workers watched
            for rt in [*self.all_runtimes(), *self.loader.retiring]:
                rt.watch()
            if not self.stopping:
                self._cover_accepts()
        self._skipped = stale
        self._watchdog = loop.call_later(WATCHDOG_S, self.start_watchdog)

    def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._skipped = False

    def refused(self, reason: str) -> None:
        """Count a request (or connection) refused before any model counted it."""
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def _cover_accepts(self) -> None:
        """With every accepting worker down, hung or restarting, nothing would take new connections: health,
        readiness and metrics would hang with them.  Accept here meanwhile (queries then wait for the restarted
        workers in this process's queue) and stop as soon as a worker is back."""
        if self.listen_sock is None or self.own.server is None:
            return
        covered = any(rt.accepting_now() for rt in self.models.values())
        if not covered and not self.own.listening:
            log.warning("no worker is accepting connections: the server process accepts them until one is back")
            self.own.listen(self.listen_sock)
            self._cover_grpc(True)
        elif covered and self.own.listening:
            self.own.stop_listening()
            self._cover_grpc(False)

    def _cover_grpc(self, cover: bool) -> None:
        if self.cover_grpc is not None:
            task = asyncio.get_running_loop().create_task(self.cover_grpc(cover))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def use_worker_front_end(self, sock: socket.socket) -> bool:
        """Data plane v2: whole-query models' workers accept on ``sock``; False if no model can (a repository
        node counts on the models it will load: until one accepts, this process covers, see ``_cover_accepts``)."""
        takers = [rt for rt in self.models.values() if rt.cfg.mode == "model"]
        self.listen_sock = sock if takers or self.loader.repository is not None else None
        for rt in takers:
            self._attach(rt)
        return self.listen_sock is not None

    def _new_runtime(self, cfg: ModelConfig, metrics: ModelMetrics | None = None) -> ModelRuntime:
        """A repository version's runtime, its workers accepting on the node's sockets when it is a whole-query one
        (``metrics``: those of the runtime it replaces)."""
        rt = ModelRuntime(cfg, self.ctx, self.llc, metrics)
        self._attach(rt)
        return rt

    def _attach(self, rt: ModelRuntime) -> None:
        """A whole-query runtime's workers accept HTTP (and gRPC) queries themselves."""
        if self.listen_sock is not None and rt.cfg.mode == "model":
            front = rt.front
            front.listen_sock, front.node = self.listen_sock, self.config
            front.on_handoff = lambda fd, prefix, _hint, source=rt: self.route(fd, prefix, source)
            front.grpc_listen, front.grpc_upstream = self.grpc_listen, self.grpc_upstream
            front.shm_dir = self.shm.directory

    def find(self, name: str, version: str = "") -> ModelRuntime | None:
        """The runtime serving ``name`` at ``version`` ("" = the default version), or None."""
        return self.models.get(name) if not version else self.versions.get(name, {}).get(version)

    def runtime(self, name: str, version: str | None = None) -> ModelRuntime:
        """Like :meth:`find`, raising the protocol's not-found error."""
        if name not in self.models:
            raise self.loader.not_served(name)
        if version and not version.isdecimal():
            raise InferError("invalid", f"model version must be a whole number, got {version!r}", "model_version")
        rt = self.find(name, version or "")
        if rt is None:
            raise InferError("not_found", f"model {name!r} has no version {version!r} loaded; loaded: "
                                          f"{sorted(self.versions.get(name, {}), key=int)}", "model_version")
        return rt

    def route(self, fd: int, prefix: bytes, source: ModelRuntime | None = None) -> None:
        """A connection a worker handed over: to a worker of the model (and version) its request names, else to
        aiohttp here.  An idle connection (no bytes read) goes to its model's default version now.

        A worker that declines a request for its own runtime (chunked body, sub-batching, retiring with a partial
        request) means "serve it in the server": passing it back to that runtime's workers would loop."""
        if prefix:
            target = _infer_route(prefix)
            rt = self.find(*target) if target else None
            rt = None if rt is source else rt
        else:
            rt = self.models.get(source.name) if source is not None else None
        if rt is not None and rt.adopt(fd, prefix):
            os.close(fd)
            return
        task = asyncio.get_running_loop().create_task(self.own.serve(fd, prefix))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def accept_while_stopping(self) -> None:
        """Shutdown: the workers stop accepting as they drain, so this process accepts on the node's socket until
        it closes: new clients hear 503 (not ready; not accepting queries) instead of waiting in the listen queue."""
        if self.listen_sock is not None:
            self.own.listen(self.listen_sock)

    @property
    def ready(self) -> bool:
        """Accepting, every model's workers ready and, with ``strict_readiness``, no repository model failed."""
        return (self.accepting and all(rt.ready for rt in self.models.values())
                and not (self.config.strict_readiness and self.loader.failed()))

    def all_runtimes(self) -> list[ModelRuntime]:
        """Every loaded version of every model."""
        return [rt for versions in self.versions.values() for rt in versions.values()]

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics answer, one entry per version: of every model (no name), of every loaded version of
        one model (no version), or of the one named; an unknown model or version raises not found."""
        if not name:
            runtimes = sorted(self.all_runtimes(), key=lambda rt: (rt.name, int(rt.version)))
        elif version:
            runtimes = [self.runtime(name, version)]
        else:
            self.runtime(name)
            runtimes = [rt for _, rt in sorted(self.versions[name].items(), key=lambda item: int(item[0]))]
        return {"model_stats": [rt.metrics.triton_stats(rt.name, rt.version) for rt in runtimes]}

    def model_config(self, rt: ModelRuntime) -> dict[str, Any]:
        workers = sum(len(p.active()) for p in rt.pools.values())
        policy = self.loader.policy(rt.name)
        return protocol.model_config(rt.name, rt.info, rt.cfg.max_batch_size, workers,
                                     policy.as_triton() if policy is not None else None)

    def node_state(self) -> dict[str, Any]:
        supported = self.llc.supported
        return {"cores": available_cores(), "models": list(self.models),
                "llc": {"supported": supported, "total_ways": self.llc.total_ways() if supported else 0,
                        "message": "" if supported else self.llc.why_unsupported()}}

    def set_llc_ways(self, rt: ModelRuntime, ways: Any) -> dict[str, Any]:
        rt.check_served("nothing was changed")
        pids = [w.pid for p in rt.pools.values() for w in p.active()]
        try:
            return self.llc.set_ways(rt.name, ways, pids)
        except ValueError as exc:
            raise InferError("invalid", f"ways: {exc}", "ways") from exc
