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

from recserve.policies.router import Backend, PoolConfig, Router, router_app

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
            self.routers[route.served] = Router(pool, pool.make_policy(), timeout_s=timeout_s,
                                                model=route.served)

    def stats(self) -> dict[str, Any]:
        return {model: router.stats() for model, router in self.routers.items()}

    def app(self) -> web.Application:
        return router_app(self.routers.get, list(self.routers.values()), self.stats, "recserve-fleet-router",
                          served=sorted(self.routers))


def fleet_routes(plan: Any, nodes: list[Any], configs: list[dict[str, Any]]) -> list[ModelRoute]:
    """The routes of a local fleet deployment: for each model of the plan, the started nodes that serve it (each
    node's server type and its workers for that model, from the config it was started with)."""
    routes: dict[str, list[tuple[str, str, int]]] = {}
    served: dict[str, str] = {}
    for node, config in zip(nodes, configs, strict=True):
        kind = config.get("_server") or "node"  # the planned server type
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
