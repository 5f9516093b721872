"""The node server: several models co-located in one process tree, behind HTTP and gRPC.

``NodeServer(config).start()`` runs everything on an asyncio loop in a background thread and returns
the bound ports (tests, demos); ``NodeServer(config).run_forever()`` runs it in the calling thread
until SIGTERM/SIGINT (the CLI).  Shutdown drains: new queries get 503/UNAVAILABLE, admitted ones
finish, then workers stop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web

from recserve.serving import grpc_service, protocol
from recserve.serving.config import NodeConfig, available_cores
from recserve.serving.http import build_app, prometheus_text
from recserve.serving.llc import LlcAllocator
from recserve.serving.runtime import InferError, ModelRuntime, mp_context

log = logging.getLogger("recserve.serving")


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int


class NodeCore:
    """State shared by both front ends: the model runtimes and node-wide settings."""

    def __init__(self, config: NodeConfig, llc: LlcAllocator | None = None) -> None:
        self.config = config
        self.llc = llc or LlcAllocator()
        ctx = mp_context()
        self.models: dict[str, ModelRuntime] = {m.name: ModelRuntime(m, ctx, self.llc) for m in config.models}
        self.accepting = False

    @property
    def ready(self) -> bool:
        return self.accepting and all(rt.ready for rt in self.models.values())

    def model_config(self, rt: ModelRuntime) -> dict[str, Any]:
        workers = sum(len(p.active()) for p in rt.pools.values())
        return protocol.model_config(rt.name, rt.info, rt.cfg.max_batch_size, workers)

    def prometheus(self) -> str:
        return prometheus_text(self.models)

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


class NodeServer:
    def __init__(self, config: NodeConfig, llc: LlcAllocator | None = None) -> None:
        self.config = config
        self._llc = llc
        self.core: NodeCore | None = None
        self.ports: Ports | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._grpc: grpc.aio.Server | None = None
        self._stopped: asyncio.Event | None = None

    # ------------------------------------------------------------------ async core
    async def _astart(self) -> Ports:
        self._stopped = asyncio.Event()
        self.core = NodeCore(self.config, self._llc)
        try:
            await asyncio.gather(*(rt.start() for rt in self.core.models.values()))
            host = self.config.host
            self._runner = web.AppRunner(build_app(self.core), access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(self._runner, host, self.config.http_port, reuse_address=True)
            await site.start()
            http_port = self._runner.addresses[0][1]
            limit = self.config.max_body_bytes
            self._grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                                  ("grpc.max_send_message_length", limit),
                                                  ("grpc.so_reuseport", 0)])
            grpc_service.add_to_server(self._grpc, self.core)
            grpc_port = self._grpc.add_insecure_port(f"{host}:{self.config.grpc_port}")
            if grpc_port == 0:
                raise InferError("internal", f"cannot bind gRPC port {self.config.grpc_port} on {host}")
            await self._grpc.start()
        except BaseException:
            await self._ashutdown(drain=False)
            raise
        self.core.accepting = True
        self.ports = Ports(http_port, grpc_port)
        return self.ports

    async def _ashutdown(self, drain: bool = True) -> None:
        core = self.core
        if core is not None:
            core.accepting = False
            if drain:
                await asyncio.gather(*(rt.drain(self.config.drain_timeout_s) for rt in core.models.values()))
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
            self._grpc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if core is not None:
            await asyncio.gather(*(rt.stop() for rt in core.models.values()))
        if self._stopped is not None:
            self._stopped.set()

    # ------------------------------------------------------------------ background-thread API
    def start(self, timeout_s: float = 180.0) -> Ports:
        """Start in a background thread; returns once every worker is ready and both ports are bound."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        started: dict[str, Any] = {}
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                started["ports"] = loop.run_until_complete(self._astart())
            except BaseException as exc:  # surfaced to the caller of start()
                started["error"] = exc
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_until_complete(self._stopped.wait())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name="recserve-node", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError("node server did not start in time")
        if "error" in started:
            self._thread.join()
            self._thread = None
            raise started["error"]
        return started["ports"]

    def call(self, coro: Any, timeout_s: float = 120.0) -> Any:
        """Run a coroutine on the server's loop from another thread."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self, drain: bool = True) -> None:
        if self._thread is None or self._loop is None:
            return
        if self._loop.is_running():
            self.call(self._ashutdown(drain), timeout_s=self.config.drain_timeout_s + 60)
        self._thread.join(30)
        self._thread = None

    def __enter__(self) -> NodeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ foreground (CLI)
    def run_forever(self) -> None:
        asyncio.run(self._run_until_signal())

    async def _run_until_signal(self) -> None:
        ports = await self._astart()
        names = ", ".join(self.core.models) if self.core else ""
        print(f"recserve serve: {names} on http://{self.config.host}:{ports.http} "
              f"grpc {self.config.host}:{ports.grpc} (control under /control, metrics at /metrics)",
              file=sys.stderr, flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        print("recserve serve: draining in-flight queries, then stopping workers", file=sys.stderr, flush=True)
        await self._ashutdown(drain=True)
