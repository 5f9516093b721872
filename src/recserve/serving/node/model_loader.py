"""A node's repository models: loaded (and reloaded when their files change) and unloaded on request, the versions
replaced or unloaded retired after their queries, and each version's state as Triton's repository index reports it.

The loader changes the node's tables of served runtimes (``models``: name -> default version, ``versions``: name ->
version -> runtime), which ``NodeCore`` owns and both front ends read; catalogue models of the node config are in
the same tables and are never loaded or unloaded here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError
from recserve.serving.node.config import ModelConfig
from recserve.serving.node.metrics import ModelMetrics
from recserve.serving.node.repository import Repository, VersionPolicy
from recserve.serving.node.runtime import ModelRuntime
from recserve.serving.wire.errors import InferError

log = logging.getLogger("recserve.serving")

State = tuple[str, str]  # (Triton's version state, reason)


class ModelLoader:
    """Load, reload and unload repository models on a node, one model at a time."""

    def __init__(self, repository: Repository | None, models: dict[str, ModelRuntime],
                 versions: dict[str, dict[str, ModelRuntime]],
                 new_runtime: Callable[[ModelConfig, ModelMetrics | None], ModelRuntime],
                 on_change: Callable[[], None], ctx: Any, drain_timeout_s: float) -> None:
        self.repository = repository
        self.models, self.versions = models, versions
        self._new_runtime, self._on_change, self._ctx = new_runtime, on_change, ctx
        self.drain_timeout_s = drain_timeout_s
        self.state: dict[tuple[str, str], State] = {}  # (model, version or "") -> state
        self.policies: dict[str, VersionPolicy] = {}  # repository model -> the policy its versions were loaded by
        self.retiring: set[ModelRuntime] = set()  # versions unloaded or replaced, finishing their queries
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task] = set()

    def _repo(self) -> Repository:
        if self.repository is None:
            raise InferError("unsupported", "this node has no model repository (serve --repository REPO)")
        return self.repository

    def policy(self, name: str) -> VersionPolicy | None:
        """The version policy ``name`` was loaded by (None: a catalogue model)."""
        return self.policies.get(name)

    async def load_all(self) -> None:
        """Start: load every repository model (Triton's default); a model that fails is logged and left out.  Each
        is LOADING until its turn has come and gone: its queries meanwhile hear 503 "loading", not 404."""
        names = self._repo().names()
        for name in names:
            self.state[(name, "")] = ("LOADING", "")
        for name in names:
            try:
                await self.load(name)
            except InferError:
                pass  # logged by ``load``, and in the repository index

    async def load(self, name: str) -> list[str]:
        """Load (or reload) repository model ``name``: the versions its policy selects.

        New versions, and loaded ones whose files changed since (``Repository.stamp``), are checked (one batch) and
        their workers started before anything changes; then the newest becomes the default and versions the policy
        no longer selects are retired after the answer (admitted queries finish, idle connections move to the new
        default).  If any new version fails, the ones started here are stopped, the versions already serving keep
        serving, and the error names the file and the reason."""
        repo = self._repo()
        async with self._locks.setdefault(name, asyncio.Lock()):
            if self.state.get((name, "")) == ("LOADING", ""):  # its turn at start: its versions say the rest
                del self.state[(name, "")]
            self._refuse_catalogue_model(name)
            wanted = self._selected(name)
            loaded = self.versions.setdefault(name, {})
            newest = max(wanted, key=int)
            changed = [v for v in wanted if v in loaded and loaded[v].files != repo.stamp(name, int(v))]
            started = await self._start_versions(name, [v for v in wanted if v not in loaded or v in changed], newest)
            replaced = [loaded[rt.version] for rt in started if rt.version in loaded]  # their files changed
            for rt in started:
                loaded[rt.version] = rt
            for rt in replaced:
                rt.withdrawn = "replaced by a reload of its changed files"
                await rt.set_default(False)
            for version, rt in loaded.items():
                self.state[(name, version)] = ("READY", "")
                if version != newest and rt.is_default:
                    await rt.set_default(False)
            await loaded[newest].set_default(True)
            self.models[name], self.policies[name] = loaded[newest], repo.settings(name).policy
            retire = [loaded.pop(v) for v in list(loaded) if v not in wanted]
            for rt in retire:
                rt.withdrawn = "unloaded (not selected by the version policy)"
                self.state[(name, rt.version)] = ("UNAVAILABLE", "unloaded: not selected by the version policy")
            self._on_change()
            self._retire_in_background(retire + replaced)
            return wanted

    def _selected(self, name: str) -> list[str]:
        """The versions ``name``'s policy selects on disk; a model the repository holds but cannot read is marked
        unavailable (a name it does not hold gets no entry: the index lists what it holds)."""
        repo = self._repo()
        try:
            return [str(v) for v in repo.selected_versions(name)]
        except RecserveError as exc:
            if repo.holds(name):  # the operator's to see; a name it does not hold is the client's error (400)
                self.state[(name, "")] = ("UNAVAILABLE", str(exc))
                log.warning("model %s not loaded: %s", name, exc)
            raise InferError("invalid", str(exc), "model_name") from exc

    async def _start_versions(self, name: str, versions: list[str], newest: str) -> list[ModelRuntime]:
        """Each version started; if one fails, those started here are stopped and the error says why (a loaded
        version whose new files failed serves on with its old ones)."""
        loaded = self.versions[name]
        started: list[ModelRuntime] = []
        for version in versions:
            try:
                started.append(await self._start_version(name, int(version), version == newest))
            except (RecserveError, InferError) as exc:
                reason = self._repo().relative(str(exc))
                if version in loaded:
                    log.warning("model %s version %s: reloading its changed files failed; the files loaded before "
                                "serve on: %s", name, version, reason)
                    self.state[(name, version)] = ("READY", f"serving the files loaded before; reloading failed: "
                                                            f"{reason}")
                else:
                    log.warning("model %s version %s not loaded: %s", name, version, reason)
                    self.state[(name, version)] = ("UNAVAILABLE", reason)
                await asyncio.gather(*(rt.stop() for rt in started))
                if not loaded:
                    self.versions.pop(name, None)
                raise InferError("invalid", f"model {name!r} version {version} not loaded: {reason}",
                                 "model_name") from exc
            except BaseException:  # cancelled (the node stops while loading): what started here stops too
                await asyncio.gather(*(rt.stop() for rt in started))
                raise
        return started

    async def _start_version(self, name: str, version: int, default: bool) -> ModelRuntime:
        """A version's runtime started, its artifact checked first; it keeps the stamp of the files it loaded."""
        from recserve.serving.node.artifact_check import check_in_child

        cfg = self._repo().model_config(name, version)
        stamp = self._repo().stamp(name, version)  # before the check: files changed during it are seen next load
        self.state[(name, str(version))] = ("LOADING", "")
        loop = asyncio.get_running_loop()
        bound = await loop.run_in_executor(None, check_in_child, self._ctx, Path(cfg.artifact), cfg.spec)
        if bound is not None and bound < cfg.max_batch_size:  # a program exported for batches up to ``bound``
            log.info("model %s version %s: max_batch_size %d, the largest batch %s takes", name, version, bound,
                     Path(cfg.artifact).name)
            cfg = cfg.model_copy(update={"max_batch_size": bound})
        replaced = self.versions.get(name, {}).get(str(version))  # its files changed: its counters go on
        rt = self._new_runtime(cfg, replaced.metrics if replaced else None)
        rt.is_default, rt.files = default, stamp
        try:
            await rt.start()
        except BaseException:
            await rt.stop()
            raise
        log.info("model %s version %s loaded from %s", name, version, cfg.artifact)
        return rt

    def _refuse_catalogue_model(self, name: str) -> None:
        """A model of the node config (not loaded from the repository) is neither loaded nor unloaded here:
        unloaded, no load could bring it back."""
        if name in self.models and name not in self.policies:
            raise InferError("invalid", f"model {name!r} is a model of the node config, not a repository model: it "
                                        "serves until the node stops", "model_name")

    async def unload(self, name: str) -> None:
        """Unload every version of ``name``; admitted queries finish, later ones get 404.  A model that failed to
        load is marked unloaded (it no longer holds the node unready)."""
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name not in self.models and name in self.failed():  # no longer wanted: ready again
                for key in [key for key in self.state if key[0] == name]:
                    self.state[key] = ("UNAVAILABLE", "unloaded")
                return
            if name not in self.models:
                raise InferError("not_found", f"model {name!r} is not loaded; loaded: {sorted(self.models)}",
                                 "model_name")
            self._refuse_catalogue_model(name)
            del self.models[name]
            versions = self.versions.pop(name, {})
            for version, rt in versions.items():
                rt.withdrawn = "unloaded"
                self.state[(name, version)] = ("UNAVAILABLE", "unloaded")
            self._on_change()
            log.info("model %s unloaded: version(s) %s retire once their queries are answered", name,
                     ", ".join(sorted(versions, key=int)))
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
            deadline = time.monotonic() + self.drain_timeout_s
            while rt.in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            await rt.stop()
        finally:
            self.retiring.discard(rt)

    def failed(self) -> dict[str, str]:
        """Models the repository holds that failed to load and serve no version, each with why (Triton's strict
        readiness, except that a failed new version does not count while an older one serves, nor a name the
        repository does not hold: a mistyped load, or a model since taken out of it)."""
        failed: dict[str, str] = {}
        for (name, version), (state, reason) in self.state.items():
            if (state == "UNAVAILABLE" and not reason.startswith("unloaded") and not self.versions.get(name)
                    and self.repository is not None and self.repository.holds(name)):
                failed.setdefault(name, f"version {version}: {reason}" if version else reason)
        return failed

    def not_served(self, name: str) -> InferError:
        """Why a query's model is not served: still loading (503: retry), failed to load (and why), unloaded, or
        no such model (404)."""
        return not_served(name, sorted(self.models), self.failed().get(name), self.state)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every repository model, with each version's state and reason."""
        names = set(self.repository.names()) if self.repository is not None else set()
        names |= set(self.versions) | {n for n, _ in self.state}
        entries = []
        for name in sorted(names):
            seen = {v for n, v in self.state if n == name and v} | set(self.versions.get(name, {}))
            if not seen:
                state, reason = self.state.get((name, ""), ("", ""))
                entries.append({"name": name, "version": "", "state": state, "reason": reason})
            for version in sorted(seen, key=int):
                rt = self.versions.get(name, {}).get(version)
                state, reason = self.state.get((name, version), ("UNAVAILABLE", ""))
                if rt is not None:  # serving; the reason says when a reload of its files failed
                    state = "READY" if rt.ready else "LOADING"
                entries.append({"name": name, "version": version, "state": state, "reason": reason})
        return [e for e in entries if e["state"] == "READY"] if ready_only else entries


def not_served(name: str, served: list[str], failure: str | None, state: dict[tuple[str, str], State]) -> InferError:
    """Why a query's model is not served: it is still loading (503: retry), it failed to load (and why), it was
    unloaded, or no such model (404)."""
    if any(model == name and s == "LOADING" for (model, _version), (s, _why) in state.items()):
        return InferError("unavailable", f"model {name!r} is loading; retry shortly", "model_name")
    if failure is not None:
        why = f"model {name!r} failed to load: {failure}; load it again once fixed (`recserve models load`)"
    elif any(model == name for model, _version in state):
        why = f"model {name!r} is not loaded (unloaded); `recserve models load` loads it again"
    else:
        why = f"unknown model {name!r}; served: {served}"
    return InferError("not_found", why, "model_name")
