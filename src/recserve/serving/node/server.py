"""The node server: several models co-located in one process tree, behind HTTP and gRPC.

``NodeServer(config).start()`` runs everything on an asyncio loop in a background thread and returns
the bound ports (tests, demos); ``NodeServer(config).run_forever()`` runs it in the calling thread
until SIGTERM/SIGINT (the CLI).  Shutdown drains: new queries get 503/UNAVAILABLE, admitted ones
finish, then workers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import shutil
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import web

from recserve.errors import RecserveError
from recserve.hostinfo import remove_orphaned
from recserve.serving.node import grpc_service, tls
from recserve.serving.node.config import NodeConfig
from recserve.serving.node.core import NodeCore
from recserve.serving.node.handover import close_listener
from recserve.serving.node.http import build_app
from recserve.serving.node.launch import socket_folder
from recserve.serving.node.llc import LlcAllocator
from recserve.serving.node.pool import WORKER_STOP_TIMEOUT_S
from recserve.serving.transport.h2grpc import BACKLOG, GrpcServer
from recserve.serving.wire.errors import InferError
from recserve.serving.worker.grpc_methods import Forwarder, channel_to, relay_options

log = logging.getLogger("recserve.serving")

HURRIED_STOP_S = 1.0  # after a second stop signal: how long workers get to exit before they are killed
SHUTDOWN_GRACE_S = 5.0  # HTTP handlers still running after the drain (and its 503s) get this long, not aiohttp's 60 s


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (workers inherit it): each client connection
    costs descriptors, and the usual soft limit (1024, systemd's default) let 1,500 idle clients starve a node.
    Returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft


def listening_socket(host: str, port: int, what: str = "HTTP") -> socket.socket:
    """A node's listening socket (HTTP, and gRPC with data plane v2), created once here and inherited by every
    accepting worker.  Made with protocol ``IPPROTO_TCP``: a socket accepted from it carries that protocol, and
    only then does asyncio turn Nagle's algorithm off on its transports (``TCP_NODELAY``); with protocol 0 a
    small answer written while an earlier small frame was unacknowledged waited for the client's delayed ACK
    (docs/decisions/2026-11-28-tcp-nodelay.md).  A port it cannot take is a one-line error naming it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        flag = "--http-port" if what == "HTTP" else "--grpc-port"
        hint = (f"; another process listens there: give another port ({flag}, or http_port / grpc_port in the node "
                "config; 0 takes any free one)" if exc.errno == errno.EADDRINUSE else "")
        raise RecserveError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}{hint}") from exc
    sock.setblocking(False)
    return sock


def supervisor_loop() -> asyncio.AbstractEventLoop:
    """The supervisor's loop: asyncio's own, whatever loop policy the embedding process set.  Under uvloop's policy
    (Ray Serve replicas, uvicorn apps) a two-model node reset some connections one model's worker handed to the
    other's and its workers exited; the workers pick their own loop (``event_loop`` in the node config)."""
    return asyncio.SelectorEventLoop()


@dataclass(frozen=True)
class Ports:
    http: int
    grpc: int


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
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Server | None = None  # this process's accept loop on it when no worker accepts (v1)
        self._grpc_listen: socket.socket | None = None  # the public gRPC socket, while the workers accept on it
        self._grpc_dir = ""
        self._grpc_fallback: GrpcServer | None = None  # this process's accept loop on it while no worker accepts
        self._grpc_front: GrpcServer | None = None  # the public gRPC port when this process serves it (TLS, v1)
        self._grpc_cover_methods: Forwarder | None = None
        self._hurry: asyncio.Event | None = None  # set: the drain ends now and workers are killed at once

    # ------------------------------------------------------------------ async core
    async def _astart(self) -> Ports:
        self._stopped = asyncio.Event()
        raise_open_file_limit()
        left = remove_orphaned()  # what a node killed before it could remove its own left in the temporary folder
        if left:
            log.info("removed %d temporary folder(s) of node processes that are gone: %s", len(left), ", ".join(left))
        self.core = NodeCore(self.config, self._llc)
        try:
            host = self.config.host
            sock = self._sock = listening_socket(host, self.config.http_port)
            in_workers = (self.config.front_end == "workers" and not self.config.tls_cert  # TLS: serving/node/tls.py
                          and self.core.use_worker_front_end(sock))
            if in_workers:
                self._listen_grpc(host)
            await self._serve_app(sock, in_workers)
            http_port = sock.getsockname()[1]
            grpc_port = await self._start_grpc()
            if in_workers:  # until a worker accepts (the watchdog's first tick): health answers, not a full backlog
                self.core.own.listen(sock)
                await self._cover_grpc(True)
            await asyncio.gather(*(rt.start() for rt in self.core.models.values()))
            if self.core.loader.repository is not None:
                await self.core.loader.load_all()
        except BaseException:
            await self._ashutdown(drain=False)
            raise
        self.core.accepting = True
        self.core.start_watchdog()
        self.ports = Ports(http_port, grpc_port)
        return self.ports

    async def _serve_app(self, sock: socket.socket, in_workers: bool) -> None:
        """This process's aiohttp app, before any model starts: health, readiness (503 until every model is ready)
        and metrics are answered while the models start."""
        self._runner = web.AppRunner(build_app(self.core), handle_signals=False, shutdown_timeout=SHUTDOWN_GRACE_S,
                                     **self.core.own.options)
        await self._runner.setup()
        self.core.own.server = self._runner.server
        if not in_workers:  # v1 layout, or no whole-query model: this process accepts itself
            loop = asyncio.get_running_loop()  # its protocols from the core: capped, and refused while stopping
            self._accepting = await loop.create_server(self.core.own.protocol, sock=sock, backlog=BACKLOG,
                                                       ssl=tls.http_context(self.config))

    def _grpc_server(self) -> grpc.aio.Server:
        server = grpc.aio.server(options=relay_options(self.config.max_body_bytes))
        grpc_service.add_to_server(server, self.core)
        return server

    def _listen_grpc(self, host: str) -> None:
        """Data plane v2 for gRPC: one public listening socket that every whole-query worker inherits and accepts
        on (as HTTP's), and a private Unix socket for this process's gRPC service, where the workers forward every
        call they do not answer."""
        sock = self._grpc_listen = listening_socket(host, self.config.grpc_port, "gRPC")
        upstream = self._private_grpc_address()
        self.core.grpc_listen, self.core.grpc_upstream = sock, upstream
        for rt in self.core.models.values():
            if rt.accepts_in_workers:
                rt.front.grpc_listen, rt.front.grpc_upstream = sock, upstream
        self.core.cover_grpc = self._cover_grpc

    def _private_grpc_address(self) -> str:
        self._grpc_dir = socket_folder("grpc", "server.sock")
        return f"unix:{self._grpc_dir}/server.sock"

    async def _start_grpc(self) -> int:
        """This process's gRPC service, on a private socket; the public port is the workers' (data plane v2) or,
        when this process serves it (TLS, ``front_end: server``), the workers' HTTP/2 stack in this process
        forwarding to it: every mode meets clients with the same hardened stack, never grpc.aio's own parser."""
        self._grpc = self._grpc_server()
        upstream = self.core.grpc_upstream if self._grpc_listen is not None else self._private_grpc_address()
        if not self._grpc.add_insecure_port(upstream):
            raise InferError("internal", f"cannot bind the server's gRPC socket in {self._grpc_dir}")
        await self._grpc.start()
        if self._grpc_listen is not None:
            return self._grpc_listen.getsockname()[1]
        public = listening_socket(self.config.host, self.config.grpc_port, "gRPC")
        limit = self.config.max_body_bytes
        self._grpc_cover_methods = Forwarder(channel_to(upstream, limit))
        self._grpc_front = GrpcServer(self._grpc_cover_methods, limit, self.config.grpc_limits,
                                      max_connections=self.config.max_connections,
                                      idle_timeout_s=self.config.keep_alive_timeout_s)
        await self._grpc_front.start(public, ssl=tls.grpc_context(self.config))
        return public.getsockname()[1]

    async def _cover_grpc(self, cover: bool) -> None:
        """While no worker accepts, this process accepts on the public gRPC socket too and forwards every call to
        its own service (see ``_cover_accepts``); connections it took end with a graceful GOAWAY once a worker
        is back."""
        if cover and self._grpc_fallback is None and self._grpc_listen is not None:
            limit = self.config.max_body_bytes
            if self._grpc_cover_methods is None:  # one channel to this process's service, for every cover
                self._grpc_cover_methods = Forwarder(channel_to(self.core.grpc_upstream, limit))
            self._grpc_fallback = GrpcServer(self._grpc_cover_methods, limit, self.config.grpc_limits)
            await self._grpc_fallback.start(self._grpc_listen.dup())
        elif not cover and self._grpc_fallback is not None:
            fallback, self._grpc_fallback = self._grpc_fallback, None
            await fallback.stop(grace=5.0)

    async def _ashutdown(self, drain: bool = True) -> None:
        core = self.core
        if core is not None:
            core.accepting, core.stopping = False, True
            core.accept_while_stopping()
            if drain:  # watched throughout: a worker that hangs now is killed and its queries answered
                await self._drain(core)
            core.stop_watchdog()
            held = [*core.all_runtimes(), *core.loader.retiring]
            abandoned = sum(rt.abandon("the node server is shutting down") for rt in held)
            if abandoned:
                log.warning("shutting down: %d queries still held were answered with 503", abandoned)
        for server in (self._grpc_front, self._grpc, self._grpc_fallback):
            if server is not None:
                await server.stop(grace=1.0)
        self._grpc = self._grpc_fallback = self._grpc_front = None
        if self._grpc_cover_methods is not None:
            await self._grpc_cover_methods.channel.close()
            self._grpc_cover_methods = None
        if self._grpc_listen is not None:
            self._grpc_listen.close()
            self._grpc_listen = None
        if self._grpc_dir:
            shutil.rmtree(self._grpc_dir, ignore_errors=True)
            self._grpc_dir = ""
        if self._runner is not None:
            if core is not None:
                core.own.server = None  # connections taken from now on are answered 503 at once
            await self._runner.cleanup()
            self._runner = None
        if core is not None:  # meanwhile this process answers new connections 503 (the workers hold the socket too)
            stop_s = HURRIED_STOP_S if self._hurried() else WORKER_STOP_TIMEOUT_S
            await asyncio.gather(*(rt.stop(stop_s) for rt in [*core.all_runtimes(), *core.loader.retiring]))
        await self._stop_accepting()
        if core is not None:
            core.shm.close()
        if self._stopped is not None:
            self._stopped.set()

    async def _stop_accepting(self) -> None:
        """Last: stop accepting (every copy of the listening socket closed: a connection still in its queue is
        reset, not left waiting), then answer and close every connection taken before, and only then let the loop
        end (uvicorn's and aiohttp's order: close the listener, then the connections, then stop)."""
        core = self.core
        if core is not None:
            await core.own.close_listening()  # the accepting that covered the shutdown
        if self._accepting is not None:
            accepting, self._accepting = self._accepting, None
            await close_listener(accepting)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if core is not None:
            await core.own.refused_all()

    async def _drain(self, core: NodeCore) -> None:
        """Every model drains (``drain_timeout_s`` at most), or less once ``_hurry`` is set."""
        drains = asyncio.gather(*(rt.drain(self.config.drain_timeout_s) for rt in core.all_runtimes()))
        if self._hurry is None:
            await drains
            return
        hurry = asyncio.ensure_future(self._hurry.wait())
        await asyncio.wait({drains, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if not drains.done():
            drains.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drains

    def _hurried(self) -> bool:
        return self._hurry is not None and self._hurry.is_set()

    # ------------------------------------------------------------------ background-thread API
    def start(self, timeout_s: float = 180.0) -> Ports:
        """Start in a background thread; returns once every worker is ready and both ports are bound."""
        if self._thread is not None:
            raise RuntimeError("server already started")
        started: dict[str, Any] = {}
        ready = threading.Event()

        def main() -> None:
            loop = supervisor_loop()
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
        with asyncio.Runner(loop_factory=supervisor_loop) as runner:
            runner.run(self._run_until_signal())

    async def _run_until_signal(self) -> None:
        """Serve until SIGTERM, SIGINT or SIGHUP, which drain; from the first line on, so that a signal while the
        models load stops the node as cleanly (its workers and temporary folders gone) instead of killing it."""
        signals = StopSignals(asyncio.get_running_loop())
        self._hurry = signals.again  # a second signal also hurries a stop begun while the models load
        starting = asyncio.ensure_future(self._astart())
        stop = asyncio.ensure_future(signals.first.wait())
        await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            print(f"recserve serve: {signals.name} while starting: stopping", file=sys.stderr, flush=True)
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting  # ``_astart`` stops what it started
            return
        ports = starting.result()
        failed = self.core.loader.failed() if self.core else {}
        if failed and self.config.exit_on_error:
            stop.cancel()
            await self._ashutdown(drain=False)
            raise RecserveError("; ".join(f"{name} failed to load ({why})" for name, why in failed.items())
                                + ": stopped (exit_on_error; without it the node serves the rest, not ready)")
        self._announce(ports, failed)
        await stop
        print(f"recserve serve: {signals.name}: draining in-flight queries, then stopping workers (again to stop "
              "now)", file=sys.stderr, flush=True)
        await self._ashutdown(drain=True)

    def _announce(self, ports: Ports, failed: dict[str, str]) -> None:
        names = ", ".join(self.core.models) if self.core and self.core.models else "no model loaded"
        print(f"recserve serve: {names} on http://{self.config.host}:{ports.http} "
              f"grpc {self.config.host}:{ports.grpc} (control under /control, metrics at /metrics)",
              file=sys.stderr, flush=True)
        for name, why in failed.items():
            print(f"recserve serve: {name} failed to load ({why}); "
                  + ("not ready until it loads (recserve models load) or is unloaded" if self.config.strict_readiness
                     else "ready without it (strict_readiness: false)"), file=sys.stderr, flush=True)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """The signals that stop a node (SIGHUP too: a closed terminal or session), counted on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.first = asyncio.Event()
        self.again = asyncio.Event()  # a second one: stop now, without waiting out the drain
        self.name = ""
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: signal.Signals) -> None:
        if not self.first.is_set():
            self.name = sig.name
            self.first.set()
        elif not self.again.is_set():
            print(f"recserve serve: {sig.name} again: stopping now (queries still held get 503, workers are killed)",
                  file=sys.stderr, flush=True)
            self.again.set()
