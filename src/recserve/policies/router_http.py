"""A live router's HTTP side: the Open Inference Protocol app in front of one or more routers
(:func:`router_app`), and :class:`RouterThread`, which serves it behind the front door in a background thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from recserve.errors import RecserveError
from recserve.policies.front_door import LIMITS, STOP_GRACE_S, FrontDoor
from recserve.policies.router_answers import backend_error, forwarded, model_target
from recserve.serving.node.http import error_response, json_errors, plain_server_header, refuse_bad_framing
from recserve.serving.node.http_bodies import request_body
from recserve.serving.wire import protocol
from recserve.serving.wire.codec import HEADER_LENGTH, batch_size_of
from recserve.serving.wire.errors import InferError

if TYPE_CHECKING:
    from recserve.policies.router import Router

ROUTER_EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration"]  # no repository, no shared memory
log = logging.getLogger("recserve.router")


def router_app(pick: Callable[[str], Router | None], routers: list[Router], stats: Callable[[], Any],
               name: str, served: list[str] | None = None) -> web.Application:
    """The Open Inference Protocol over HTTP in front of routers: ``pick(model)`` is the router a model's queries
    and metadata requests go to (None: 404 naming the served models); health is the app's own."""
    app = web.Application(client_max_size=LIMITS.max_body_bytes, middlewares=[json_errors, refuse_bad_framing])
    app.on_response_prepare.append(plain_server_header)
    _add_routes(app, _Handlers(pick, routers, stats, name, served))
    return app


def _add_routes(app: web.Application, h: _Handlers) -> None:
    """Each path of the protocol to its handler, and the routers' clients opened and closed with the app."""
    app.router.add_post("/v2/models/{model}/infer", h.infer)
    app.router.add_post("/v2/models/{model}/versions/{version}/infer", h.infer)
    app.router.add_get("/v2", h.server_metadata)
    app.router.add_get("/v2/health/live", h.live)
    app.router.add_get("/v2/health/ready", h.ready)
    app.router.add_get("/v2/models/stats", h.all_stats)
    for tail in ("", "/ready", "/config"):
        app.router.add_get("/v2/models/{model}" + tail, h.proxy_get(tail))
        app.router.add_get("/v2/models/{model}/versions/{version}" + tail, h.proxy_get(tail))
    app.router.add_get("/v2/models/{model}/stats", h.model_stats)
    app.router.add_get("/v2/models/{model}/versions/{version}/stats", h.model_stats)
    app.router.add_get("/router/stats", h.router_stats)
    app.on_startup.append(h.on_startup)
    app.on_cleanup.append(h.on_cleanup)


class _Handlers:
    """The app's request handlers over its routers (``router_app``'s arguments)."""

    def __init__(self, pick: Callable[[str], Router | None], routers: list[Router], stats: Callable[[], Any],
                 name: str, served: list[str] | None) -> None:
        self.pick, self.routers, self.stats, self.name, self.served = pick, routers, stats, name, served

    def unknown(self, model: str) -> web.Response:
        names = f"; served: {', '.join(self.served)}" if self.served else ""
        return error_response(InferError("not_found", f"model {model!r} is not served here{names}"))

    def routed(self, request: web.Request) -> tuple[Router | None, str]:
        """The router of the model a request names (None: not served here) and the model's backend path segments."""
        model = request.match_info["model"]
        return self.pick(model), model_target(model, request.match_info.get("version", ""))

    async def infer(self, request: web.Request) -> web.Response:
        router, target = self.routed(request)
        if router is None:
            return self.unknown(request.match_info["model"])
        body = await request_body(request, LIMITS.read_timeout_s, LIMITS.max_body_bytes)
        size = batch_size_of(body, request.headers.get(HEADER_LENGTH))
        status, payload, out = await router.submit(target, body, forwarded(request.headers), size)
        return web.Response(status=status, body=payload, headers=out)

    def proxy_get(self, tail: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def get(request: web.Request) -> web.Response:
            router, target = self.routed(request)
            if router is None:
                return self.unknown(request.match_info["model"])
            return await router.backend_get(f"/v2/models/{target}{tail}")
        return get

    async def model_stats(self, request: web.Request) -> web.Response:
        router, target = self.routed(request)
        if router is None:
            return self.unknown(request.match_info["model"])
        return stats_answer(*await router.backend_stats(f"/v2/models/{target}/stats"))

    async def all_stats(self, _: web.Request) -> web.Response:
        """Every model's statistics: each router's models' (a fleet's: its one model's) summed over its nodes."""
        paths = [f"/v2/models/{model_target(r.model)}/stats" if r.model else "/v2/models/stats" for r in self.routers]
        answers = await asyncio.gather(*(r.backend_stats(path) for r, path in zip(self.routers, paths, strict=True)))
        return stats_answer([e for entries, _ in answers for e in entries], [f for _, fs in answers for f in fs],
                            every=True)

    async def live(self, _: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, _: web.Request) -> web.Response:
        """Ready while some model has a ready backend, naming those that have none: one model's outage must not take
        the front door (a Kubernetes Service's endpoints) away from the others; each model's own readiness is
        ``/v2/models/{m}/ready``."""
        reasons = await asyncio.gather(*(router.unready_reason() for router in self.routers))
        unready = [(f"model {router.model}: " if router.model else "") + reason
                   for router, reason in zip(self.routers, reasons, strict=True) if reason is not None]
        if len(unready) == len(self.routers):
            return web.json_response({"ready": False, "error": "no backend is ready: " + "; ".join(unready)},
                                     status=503)
        return web.json_response({"ready": True, **({"unready": "; ".join(unready)} if unready else {})})

    async def server_metadata(self, _: web.Request) -> web.Response:
        return web.json_response(protocol.server_metadata(self.name, ROUTER_EXTENSIONS))

    async def router_stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.stats())

    async def on_startup(self, _: web.Application) -> None:
        for router in self.routers:
            await router.open()

    async def on_cleanup(self, _: web.Application) -> None:
        for router in self.routers:
            await router.close()


def stats_answer(entries: list[dict], failed: list, every: bool = False) -> web.Response:
    """The summed statistics; a 502 naming each node where none answered (with ``every``: where some failed)."""
    if failed and (every or not entries):
        return web.Response(status=502, body=backend_error(failed), content_type="application/json")
    return web.json_response({"model_stats": entries})


class RouterThread:
    """Run a router (a :class:`Router` or a ``FleetRouter``: anything with ``app()``) on 127.0.0.1 in a background
    thread; ``port`` and ``url`` after ``start``."""

    def __init__(self, router: Any, port: int = 0, host: str = "127.0.0.1") -> None:
        self.router, self.host, self.port = router, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._door: FrontDoor | None = None
        self._thread = None

    def start(self) -> int:
        import threading

        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True, name="recserve-router")
        self._thread.start()
        ready.wait(30)
        if failure:
            raise RecserveError(f"router failed to start: {failure[0]}")
        return self.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def _serve(self) -> None:
        self._door = FrontDoor(self.router.app(), self.host, self.port)
        self.port = await self._door.start()

    def stop(self) -> None:
        if self._loop is None:
            return
        fut = asyncio.run_coroutine_threadsafe(self._door.stop(), self._loop)
        try:
            fut.result(timeout=STOP_GRACE_S + 10)
        except TimeoutError:
            log.warning("router: not stopped within %.0f s; closing its loop", STOP_GRACE_S + 10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            self._loop = None  # stopped: a second stop is a no-op
