"""One front door for a fleet: the Open Inference Protocol over HTTP, each model's queries dispatched to the nodes
that serve it.

A fleet deployment (``recserve deploy local --plan``) runs several node servers, each serving some of the plan's
models.  Clients, ``recserve verify`` and tritonclient point at one URL; ``POST /v2/models/{model}/infer`` goes
to that model's :class:`~recserve.policies.router.Router`, whose dispatch policy (Kairos by default) picks a slot
among the nodes serving it, a few slots per worker (``SLOTS_PER_WORKER``).  A model no node serves is answered
404 in the protocol's error format.  Everything else (the queue, the policy, the learning of each backend's
latency) is the single-model router's, run once per model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from recserve.policies.router import Backend, PoolConfig, Router
from recserve.serving.node.http import error_response
from recserve.serving.wire import protocol
from recserve.serving.wire.codec import HEADER_LENGTH, batch_size_of
from recserve.serving.wire.errors import InferError

FORWARD_HEADERS = ("Content-Type", HEADER_LENGTH)
# queries in flight per worker: a node worker fuses what queues behind its pass, so a few per worker keep it busy
# across the router's round trip (one per worker, Kairos' instance model, left workers idle while answers travelled
# and the router's queue grew without bound at the plan's load)
SLOTS_PER_WORKER = 4


@dataclass(frozen=True)
class ModelRoute:
    """Where one served model runs: each backend node's URL, its server type and how many workers serve it."""

    served: str  # the name clients use in /v2/models/{name}
    qos_ms: float  # the model's SLA target: what its dispatch policy plans for
    backends: tuple[tuple[str, str, int], ...]  # (url, server type, workers)


class FleetRouter:
    """A :class:`Router` per served model behind one HTTP app."""

    def __init__(self, routes: list[ModelRoute], policy: str = "kairos", timeout_s: float = 30.0) -> None:
        if not routes:
            raise ValueError("a fleet router needs at least one model")
        self.routers: dict[str, Router] = {}
        for route in routes:
            backends = [Backend(url, kind, SLOTS_PER_WORKER * max(1, workers), base=(i == 0))
                        for i, (url, kind, workers) in enumerate(route.backends)]
            pool = PoolConfig(backends, route.qos_ms, policy)
            self.routers[route.served] = Router(pool, pool.make_policy(), timeout_s=timeout_s)

    def stats(self) -> dict[str, Any]:
        return {model: router.stats() for model, router in self.routers.items()}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)

        def unknown(model: str) -> web.Response:
            return error_response(InferError("not_found", f"model {model!r} is not served here; served: "
                                                          f"{', '.join(sorted(self.routers))}"))

        async def infer(request: web.Request) -> web.Response:
            model = request.match_info["model"]
            router = self.routers.get(model)
            if router is None:
                return unknown(model)
            body = await request.read()
            try:
                size = batch_size_of(body, request.headers.get(HEADER_LENGTH))
            except InferError as exc:
                return error_response(exc)
            headers = {k: request.headers[k] for k in FORWARD_HEADERS if k in request.headers}
            status, payload, out = await router.submit(model, body, headers, size)
            return web.Response(status=status, body=payload, headers=out)

        async def model_get(request: web.Request) -> web.Response:
            router = self.routers.get(request.match_info["model"])
            if router is None:
                return unknown(request.match_info["model"])
            async with router.session.get(router.instances[0].endpoint + request.path) as resp:
                return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"live": True})

        async def server_metadata(_: web.Request) -> web.Response:
            return web.json_response(protocol.server_metadata("recserve-fleet-router"))

        async def stats(_: web.Request) -> web.Response:
            return web.json_response(self.stats())

        async def on_startup(_: web.Application) -> None:
            for router in self.routers.values():
                await router.open()

        async def on_cleanup(_: web.Application) -> None:
            for router in self.routers.values():
                await router.close()

        app.router.add_post("/v2/models/{model}/infer", infer)
        app.router.add_post("/v2/models/{model}/versions/{version}/infer", infer)
        app.router.add_get("/v2", server_metadata)
        app.router.add_get("/v2/health/live", health)
        app.router.add_get("/v2/health/ready", health)
        for path in ("/v2/models/{model}", "/v2/models/{model}/ready", "/v2/models/{model}/config"):
            app.router.add_get(path, model_get)
        app.router.add_get("/router/stats", stats)
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        return app


def fleet_routes(plan: Any, nodes: list[Any], configs: list[dict[str, Any]]) -> list[ModelRoute]:
    """The routes of a local fleet deployment: for each model of the plan, the started nodes that serve it (each
    node's server type and its workers for that model, from the config it was started with)."""
    routes: dict[str, list[tuple[str, str, int]]] = {}
    served: dict[str, str] = {}
    for node, config in zip(nodes, configs, strict=True):
        kind = config.get("_group", "").rsplit(" on ", 1)[-1] or "node"
        for entry in config["models"]:
            routes.setdefault(entry["model"], []).append((node.url, kind, int(entry.get("workers", 1))))
            served[entry["model"]] = entry["name"]
    return [ModelRoute(served[m], _sla_ms(plan, m), tuple(backends)) for m, backends in routes.items()]


def _sla_ms(plan: Any, model: str) -> float:
    """The model's SLA target as the plan states it, else as its catalogue spec does."""
    if "sla_ms" in plan.models.get(model, {}):
        return float(plan.models[model]["sla_ms"])
    from recserve.specs import get_model

    return float(get_model(model).sla.target_ms)
