"""The node's shared state: its model runtimes by name and version, the repository's load and unload, the
watchdog over workers, and where each handed-over HTTP connection goes.  Both front ends (the HTTP app and the gRPC
service) and the workers' hand-overs act on one ``NodeCore``; ``NodeServer`` (``node/server.py``) owns its sockets
and lifecycle."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError
from recserve.serving.node import handover
from recserve.serving.node.config import NodeConfig, available_cores
from recserve.serving.node.forkserver import mp_context
from recserve.serving.node.llc import LlcAllocator
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
        self.repository = Repository(config.repository) if config.repository else None
        self.repo_state: dict[tuple[str, str], tuple[str, str]] = {}  # (model, version) -> (state, reason)
        self.policies: dict[str, Any] = {}  # repository model -> the VersionPolicy its versions were loaded by
        self._model_locks: dict[str, asyncio.Lock] = {}
        self.retiring: set[ModelRuntime] = set()  # versions unloaded or replaced, finishing their queries
        self.grpc_listen: socket.socket | None = None  # gRPC in the workers (NodeServer sets it), for loaded models
        self.grpc_upstream = ""
        self.accepting = False
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
        tick, which judges."""
        loop = asyncio.get_running_loop()
        late = loop.time() - self._watchdog.when() if self._watchdog is not None else 0.0  # this tick's timer
        stale = late >= STALE_TICK_S and not self._skipped
        if not stale:  # never two skipped in a row: a loop late on every tick still has its workers watched
            for rt in self.all_runtimes():
                rt.watch()
            self._cover_accepts()
        self._skipped = stale
        self._watchdog = loop.call_later(WATCHDOG_S, self.start_watchdog)

    def stop_watchdog(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self._skipped = False
        self.own.stop_listening()

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
        self.listen_sock = sock if takers or self.repository is not None else None
        for rt in takers:
            self._attach(rt)
        return self.listen_sock is not None

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
            raise not_served(name, sorted(self.models), self.failed_models().get(name), self.repo_state)
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
                and not (self.config.strict_readiness and self.failed_models()))

    def failed_models(self) -> dict[str, str]:
        """Models the repository holds that failed to load and serve no version, each with why (Triton's strict
        readiness, except that a failed new version does not count while an older one serves, nor a name the
        repository does not hold: a mistyped load, or a model since taken out of it)."""
        failed: dict[str, str] = {}
        for (name, version), (state, reason) in self.repo_state.items():
            if (state == "UNAVAILABLE" and not reason.startswith("unloaded") and not self.versions.get(name)
                    and self.repository is not None and self.repository.holds(name)):
                failed.setdefault(name, f"version {version}: {reason}" if version else reason)
        return failed

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
        policy = self.policies.get(rt.name)
        return protocol.model_config(rt.name, rt.info, rt.cfg.max_batch_size, workers,
                                     policy.as_triton() if policy is not None else None)

    def node_state(self) -> dict[str, Any]:
        supported = self.llc.supported
        return {"cores": available_cores(), "models": list(self.models),
                "llc": {"supported": supported, "total_ways": self.llc.total_ways() if supported else 0,
                        "message": "" if supported else self.llc.why_unsupported()}}

    def set_llc_ways(self, rt: ModelRuntime, ways: Any) -> dict[str, Any]:
        pids = [w.pid for p in rt.pools.values() for w in p.active()]
        try:
            return self.llc.set_ways(rt.name, ways, pids)
        except ValueError as exc:
            raise InferError("invalid", f"ways: {exc}", "ways") from exc

    # ------------------------------------------------------------------ model repository
    def _repo(self) -> Repository:
        if self.repository is None:
            raise InferError("unsupported", "this node has no model repository (serve --repository REPO)")
        return self.repository

    async def load_repository(self) -> None:
        """Start: load every repository model (Triton's default); a model that fails is logged and left out.  Each
        is LOADING until its turn has come and gone: its queries meanwhile hear 503 "loading", not 404."""
        names = self._repo().names()
        for name in names:
            self.repo_state[(name, "")] = ("LOADING", "")
        for name in names:
            try:
                await self.load_model(name)
            except InferError:
                pass  # logged by ``load_model``, and in the repository index

    async def load_model(self, name: str) -> list[str]:
        """Load (or reload) repository model ``name``: the versions its policy selects.

        New versions, and loaded ones whose files changed since (``Repository.stamp``), are checked (one batch) and
        their workers started before anything changes; then the newest
        becomes the default and versions the policy no longer selects are retired after the answer (admitted
        queries finish, idle connections move to the new default).  If any new version fails, the ones started here
        are stopped, the versions already serving keep serving, and the error names the file and the reason."""
        repo = self._repo()
        async with self._model_locks.setdefault(name, asyncio.Lock()):
            if self.repo_state.get((name, "")) == ("LOADING", ""):  # its turn at start: its versions say the rest
                del self.repo_state[(name, "")]
            self._refuse_catalogue_model(name)
            try:
                wanted = [str(v) for v in repo.selected_versions(name)]
            except RecserveError as exc:
                if repo.holds(name):  # a name it does not hold gets no entry: the index lists what it holds
                    self.repo_state[(name, "")] = ("UNAVAILABLE", str(exc))
                log.warning("model %s not loaded: %s", name, exc)
                raise InferError("invalid", str(exc), "model_name") from exc
            loaded = self.versions.setdefault(name, {})
            newest = max(wanted, key=int)
            started: list[ModelRuntime] = []
            changed = [v for v in wanted if v in loaded and loaded[v].files != repo.stamp(name, int(v))]
            for version in (v for v in wanted if v not in loaded or v in changed):
                try:
                    started.append(await self._start_version(name, int(version), version == newest))
                except (RecserveError, InferError) as exc:
                    reason = self.repository.relative(str(exc)) if self.repository is not None else str(exc)
                    if version in loaded:  # its files changed and the new ones failed: the old ones serve on
                        log.warning("model %s version %s: reloading its changed files failed; the files loaded "
                                    "before serve on: %s", name, version, reason)
                        self.repo_state[(name, version)] = ("READY", f"serving the files loaded before; reloading "
                                                                     f"failed: {reason}")
                    else:
                        log.warning("model %s version %s not loaded: %s", name, version, reason)
                        self.repo_state[(name, version)] = ("UNAVAILABLE", reason)
                    await asyncio.gather(*(rt.stop() for rt in started))
                    if not loaded:
                        self.versions.pop(name, None)
                    raise InferError("invalid", f"model {name!r} version {version} not loaded: {reason}",
                                     "model_name") from exc
            replaced = [loaded[rt.version] for rt in started if rt.version in loaded]  # their files changed
            for rt in started:
                loaded[rt.version] = rt
            for rt in replaced:
                await rt.set_default(False)
            for version, rt in loaded.items():
                self.repo_state[(name, version)] = ("READY", "")
                if version != newest and rt.is_default:
                    await rt.set_default(False)
            await loaded[newest].set_default(True)
            self.models[name], self.policies[name] = loaded[newest], repo.settings(name).policy
            retire = [loaded.pop(v) for v in list(loaded) if v not in wanted]
            for rt in retire:
                self.repo_state[(name, rt.version)] = ("UNAVAILABLE", "unloaded: not selected by the version policy")
            self._models_changed()
            self._retire_in_background(retire + replaced)
            return wanted

    def _refuse_catalogue_model(self, name: str) -> None:
        """A model of the node config (not loaded from the repository) is neither loaded nor unloaded here:
        unloaded, no load could bring it back."""
        if name in self.models and name not in self.policies:
            raise InferError("invalid", f"model {name!r} is a model of the node config, not a repository model: it "
                                        "serves until the node stops", "model_name")

    async def _start_version(self, name: str, version: int, default: bool) -> ModelRuntime:
        """A version's runtime started, its artifact checked first; it keeps the stamp of the files it loaded."""
        from recserve.serving.node.artifact_check import check_in_child

        cfg = self._repo().model_config(name, version)
        stamp = self._repo().stamp(name, version)  # before the check: files changed during it are seen next load
        self.repo_state[(name, str(version))] = ("LOADING", "")
        loop = asyncio.get_running_loop()
        bound = await loop.run_in_executor(None, check_in_child, self.ctx, Path(cfg.artifact), cfg.spec)
        if bound is not None and bound < cfg.max_batch_size:  # a program exported for batches up to ``bound``
            log.info("model %s version %s: max_batch_size %d, the largest batch %s takes", name, version, bound,
                     Path(cfg.artifact).name)
            cfg = cfg.model_copy(update={"max_batch_size": bound})
        rt = ModelRuntime(cfg, self.ctx, self.llc)
        rt.is_default, rt.files = default, stamp
        self._attach(rt)
        try:
            await rt.start()
        except BaseException:
            await rt.stop()
            raise
        log.info("model %s version %s loaded from %s", name, version, cfg.artifact)
        return rt

    async def unload_model(self, name: str) -> None:
        """Unload every version of ``name``; admitted queries finish, later ones get 404.  A model that failed to
        load is marked unloaded (it no longer holds the node unready)."""
        async with self._model_locks.setdefault(name, asyncio.Lock()):
            if name not in self.models and name in self.failed_models():  # no longer wanted: ready again
                for key in [key for key in self.repo_state if key[0] == name]:
                    self.repo_state[key] = ("UNAVAILABLE", "unloaded")
                return
            if name not in self.models:
                raise InferError("not_found", f"model {name!r} is not loaded; loaded: {sorted(self.models)}",
                                 "model_name")
            self._refuse_catalogue_model(name)
            del self.models[name]
            versions = self.versions.pop(name, {})
            for version in versions:
                self.repo_state[(name, version)] = ("UNAVAILABLE", "unloaded")
            self._models_changed()
            self._retire_in_background(list(versions.values()))

    def _retire_in_background(self, runtimes: list[ModelRuntime]) -> None:
        """Retire versions after answering: the load/unload call itself may have come through one of their workers
        (gRPC calls are forwarded by the worker that took them), which waits for its calls before it exits."""
        self.retiring.update(runtimes)
        task = asyncio.get_running_loop().create_task(self._retire_all(runtimes))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retire_all(self, runtimes: list[ModelRuntime]) -> None:
        """Every retiring version's workers stop accepting before any of them closes a connection
        (``ModelRuntime.stop_accepting``); then each version retires."""
        await asyncio.gather(*(rt.stop_accepting() for rt in runtimes))
        await asyncio.gather(*(self._retire(rt) for rt in runtimes))

    async def _retire(self, rt: ModelRuntime) -> None:
        """Let queries admitted through the server finish, then stop the workers (they finish their own)."""
        try:
            deadline = time.monotonic() + self.config.drain_timeout_s
            while rt.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await rt.stop()
        finally:
            self.retiring.discard(rt)

    def _models_changed(self) -> None:
        """Keep the node's socket covered: this process accepts while no worker does (all models unloaded)."""
        self._cover_accepts()

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every repository model, with each version's state and reason."""
        names = set(self.repository.names()) if self.repository is not None else set()
        names |= set(self.versions) | {n for n, _ in self.repo_state}
        entries = []
        for name in sorted(names):
            seen = {v for n, v in self.repo_state if n == name and v} | set(self.versions.get(name, {}))
            if not seen:
                state, reason = self.repo_state.get((name, ""), ("", ""))
                entries.append({"name": name, "version": "", "state": state, "reason": reason})
            for version in sorted(seen, key=int):
                rt = self.versions.get(name, {}).get(version)
                state, reason = self.repo_state.get((name, version), ("UNAVAILABLE", ""))
                if rt is not None:  # serving; the reason says when a reload of its files failed
                    state = "READY" if rt.ready else "LOADING"
                entries.append({"name": name, "version": version, "state": state, "reason": reason})
        return [e for e in entries if e["state"] == "READY"] if ready_only else entries


def not_served(name: str, served: list[str], failure: str | None, repo_state: dict) -> InferError:
    """Why a query's model is not served: it is still loading (503: retry), it failed to load (and why), it was
    unloaded, or no such model (404)."""
    if any(model == name and state == "LOADING" for (model, _version), (state, _why) in repo_state.items()):
        return InferError("unavailable", f"model {name!r} is loading; retry shortly", "model_name")
    if failure is not None:
        why = f"model {name!r} failed to load: {failure}; load it again once fixed (`recserve models load`)"
    elif any(model == name for model, _version in repo_state):
        why = f"model {name!r} is not loaded (unloaded); `recserve models load` loads it again"
    else:
        why = f"unknown model {name!r}; served: {served}"
    return InferError("not_found", why, "model_name")
