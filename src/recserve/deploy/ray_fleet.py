"""A FleetPlan on Ray Serve: each planned server group a Ray Serve application on the Ray node(s) of its server
type, each replica running the node server itself.

**Mapping.**  The groups become exactly the node configs ``recserve deploy local`` writes
(:func:`~recserve.deploy.local_fleet.fleet_node_configs`: workers scaled to the cluster's CPUs, each model at least
one), without core pinning (a Ray node's cores are its own).  Each becomes one deployment whose replica asks for one
unit of its server type's custom resource (``ray_plans.type_resource``, ``recserve_type_<type>``), so the plan's
servers land on the nodes that say they are that type: ``ray start --resources '{"recserve_type_<type>": N}'``
where N is how many of the plan's servers of that type the node hosts (:func:`node_resources`).

**Replica.**  :class:`FleetNode` starts the node server (``serving.node.server.NodeServer``, the code ``recserve serve``
runs: its workers, batching, tiers, repository models) with that config on its Ray node, and relays the requests
Ray's HTTP proxy hands it to the node's own HTTP port unchanged.  So every model answers under Ray's proxy at
``http://HEAD:PORT/<application>/v2/models/<model>/infer`` and, directly, at the node server's own URL (bound to
loopback on its Ray node's host: the relay is local, and the node's control API stays unexposed).
Ray is imported lazily (and this module's Ray parts only run on Ray hosts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.deploy.local_fleet import fleet_node_configs
from recserve.deploy.ray_plans import type_resource
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetPlan

APP_PREFIX = "fleet"
MAX_ONGOING = 1024  # the node server's admission control decides, not Ray's per-replica cap
HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "date",
               "server"}


@dataclass(frozen=True)
class FleetDeployment:
    """One planned server group as a Ray Serve application: its node config (the plan's model names) and type."""

    name: str                  # application, deployment and route prefix (``/<name>``)
    server: str                # the planned server type
    group: str                 # e.g. "1 x pair on sdm-hw-ss"
    config: dict[str, Any]     # node config, as ``deploy local`` writes it (no core pinning)

    @property
    def resource(self) -> str:
        return type_resource(self.server)

    @property
    def gpus(self) -> int:
        """GPUs its replica asks Ray for: one where the plan runs a model's dense part on the type's accelerator."""
        return int(any((m.get("accelerator") or {}).get("device", "cpu") != "cpu" for m in self.config["models"]))

    @property
    def workers(self) -> int:
        return sum(int(m.get("workers", 1)) * int(m.get("threads", 1)) for m in self.config["models"])

    @property
    def models(self) -> list[str]:
        return [m["model"] for m in self.config["models"]]

    def served(self, model: str) -> str:
        return next(m["name"] for m in self.config["models"] if m["model"] == model)


def fleet_deployments(plan: FleetPlan, cpus: int, scale: float = 1e-3,
                      tier_dir: str | Path = "tiers") -> tuple[list[FleetDeployment], list[str]]:
    """(deployments, notes): one per single-model or co-located server group, workers scaled onto ``cpus``."""
    configs, notes = fleet_node_configs(plan, scale=scale, cores=list(range(max(1, int(cpus)))), tier_dir=tier_dir)
    out = []
    for k, cfg in enumerate(configs):
        body = {key: v for key, v in cfg.items() if not key.startswith("_")}
        body["models"] = [{key: v for key, v in m.items() if key != "cores"} for m in cfg["models"]]
        out.append(FleetDeployment(f"{APP_PREFIX}-{k}", cfg["_server"], cfg["_group"], body))
    return out, notes


def node_resources(deployments: list[FleetDeployment]) -> dict[str, dict[str, int]]:
    """Per server type, the ``ray start --resources`` of one node hosting all of that type's planned servers."""
    out: dict[str, dict[str, int]] = {}
    for d in deployments:
        out.setdefault(d.server, {d.resource: 0})[d.resource] += 1
    return out


def node_gpus(deployments: list[FleetDeployment]) -> dict[str, int]:
    """Per server type with an accelerator the plan uses, the GPUs (``ray start --num-gpus``) of one node hosting all
    of that type's planned servers."""
    out: dict[str, int] = {}
    for d in deployments:
        if d.gpus:
            out[d.server] = out.get(d.server, 0) + d.gpus
    return out


def start_flags(deployments: list[FleetDeployment]) -> dict[str, str]:
    """Per server type, the ``ray start`` flags of one node hosting all of that type's planned servers."""
    gpus = node_gpus(deployments)
    return {t: f"--resources '{json.dumps(r)}'" + (f" --num-gpus {gpus[t]}" if t in gpus else "")
            for t, r in node_resources(deployments).items()}


def missing_gpus(deployments: list[FleetDeployment], nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Server types whose replicas need a GPU that no node carrying the type's resource has: {type: GPUs wanted}."""
    out = {}
    for server, wanted in node_gpus(deployments).items():
        have = sum(float((n.get("Resources") or {}).get("GPU", 0)) for n in nodes
                   if n.get("Alive", True) and type_resource(server) in (n.get("Resources") or {}))
        if have < wanted:
            out[server] = wanted
    return out


def missing_types(deployments: list[FleetDeployment], nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Server types whose replicas no node can take (too little of the type's resource over all ``nodes``, as
    ``ray.nodes()`` lists them): {type: replicas wanted}."""
    have: dict[str, float] = {}
    for node in nodes:
        if node.get("Alive", True):
            for resource, amount in (node.get("Resources") or {}).items():
                have[resource] = have.get(resource, 0.0) + float(amount)
    wanted = {t: r[type_resource(t)] for t, r in node_resources(deployments).items()}
    return {t: n for t, n in wanted.items() if have.get(type_resource(t), 0.0) < n}


def cluster_cpus(deployments: list[FleetDeployment], nodes: list[dict[str, Any]]) -> int:
    """CPUs of the alive nodes that carry a server type's resource (the CPUs the plan's servers are scaled onto)."""
    markers = {d.resource for d in deployments}
    return int(sum(float((n.get("Resources") or {}).get("CPU", 0)) for n in nodes
                   if n.get("Alive", True) and markers & set(n.get("Resources") or {})))


def cpus_per_worker(deployments: list[FleetDeployment], nodes: list[dict[str, Any]]) -> float:
    """Ray CPUs to ask per deployed worker so that every replica fits even if all replicas of the types a node
    carries land on it (at most 1)."""
    workers_of: dict[str, int] = {}
    for d in deployments:
        workers_of[d.resource] = workers_of.get(d.resource, 0) + d.workers
    share = 1.0
    for n in nodes:
        resources = n.get("Resources") or {}
        demand = sum(w for r, w in workers_of.items() if r in resources)
        if n.get("Alive", True) and demand:
            share = min(share, float(resources.get("CPU", 0)) / demand)
    return share


def replica_config(d: FleetDeployment) -> dict[str, Any]:
    """The node config a replica starts: repository paths made absolute (a Ray worker's directory is not ours)."""
    models = []
    for m in d.config["models"]:
        path = Path(m["model"])
        absolute = "/" in m["model"] and path.is_dir()
        models.append({**m, "model": str(path.resolve()) if absolute else m["model"]})
        tier = (m.get("options") or {}).get("tier")
        if isinstance(tier, dict) and "dir" in tier:
            models[-1]["options"] = {**m["options"], "tier": {**tier, "dir": str(Path(tier["dir"]).resolve())}}
    return {**d.config, "models": models}


def endpoints(deployments: list[FleetDeployment], urls: dict[str, str]) -> dict[str, list[str]]:
    """{model: [base URL, ...]} as ``recserve verify --target`` reads it; ``urls``: {deployment name: base URL}."""
    out: dict[str, list[str]] = {}
    for d in deployments:
        for m in d.models:
            out.setdefault(m, []).append(urls[d.name])
    return out


def write_deployment(deployments: list[FleetDeployment], workdir: str | Path, proxy_urls: dict[str, str],
                     node_urls: dict[str, str] | None = None) -> Path:
    """``endpoints.json`` (through Ray's proxy), ``endpoints-direct.json`` (the node servers' own ports) and one
    ``node<k>.yaml`` per deployment, as ``deploy local`` writes them: what ``recserve verify`` reads."""
    import yaml

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for k, d in enumerate(deployments):
        (workdir / f"node{k}.yaml").write_text(yaml.safe_dump(d.config, sort_keys=False))
    path = workdir / "endpoints.json"
    path.write_text(json.dumps(endpoints(deployments, proxy_urls), indent=1))
    if node_urls:
        (workdir / "endpoints-direct.json").write_text(json.dumps(endpoints(deployments, node_urls), indent=1))
    return path


# ---------------------------------------------------------------- the replica and the applications


class FleetNode:
    """A Ray Serve replica that is one planned server: the node server with the group's config on this Ray node,
    behind Ray's HTTP proxy (requests relayed to its port as they came)."""

    def __init__(self, config: dict[str, Any]) -> None:
        import ray

        from recserve.serving import NodeServer, config_from_dict

        self.node_id = ray.get_runtime_context().get_node_id()
        # on loopback: the relay is on the same host, and the control API stays unexposed (no token to hand out)
        self.node = NodeServer(config_from_dict({**config, "host": "127.0.0.1", "http_port": 0, "grpc_port": 0},
                                                "fleet node config"))
        ports = self.node.start()  # on asyncio's own loop, whatever Ray's replica installed (supervisor_loop)
        self.url = f"http://127.0.0.1:{ports.http}"
        self.session: Any = None

    def where(self) -> dict[str, str]:
        """The Ray node this replica runs on and its node server's URL (loopback: reachable on that node's host)."""
        return {"node_id": self.node_id, "url": self.url}

    def check_health(self) -> None:
        if self.node.core is None or not self.node.core.ready:
            raise RuntimeError(f"node server at {self.url} is not ready")

    async def __call__(self, request: Any) -> Any:
        import aiohttp
        from starlette.responses import Response

        path = request.url.path
        at = path.find("/v2/")
        if at < 0:
            return Response(json.dumps({"error": f"no such endpoint: {path}"}), status_code=404,
                            media_type="application/json")
        if self.session is None:  # on the replica's own loop
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                 timeout=aiohttp.ClientTimeout(total=None))
        url = self.url + path[at:] + (f"?{request.url.query}" if request.url.query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self.session.request(request.method, url, data=await request.body(), headers=headers) as reply:
            body = await reply.read()
            kept = {k: v for k, v in reply.headers.items() if k.lower() not in HOP_HEADERS}
            return Response(body, status_code=reply.status, headers=kept)

    def __del__(self) -> None:  # Ray Serve calls it when the replica shuts down
        node = getattr(self, "node", None)
        if node is not None:
            node.stop(drain=False)


def actor_options(d: FleetDeployment, cpus_per_worker: float = 1.0) -> dict[str, Any]:
    """The Ray resources one replica of ``d`` asks for: its workers' CPUs, its type's marker, its GPU if any."""
    options: dict[str, Any] = {"num_cpus": d.workers * cpus_per_worker, "resources": {d.resource: 1}}
    if d.gpus:
        options["num_gpus"] = d.gpus
    return options


def fleet_app(d: FleetDeployment, cpus_per_worker: float = 1.0) -> Any:
    """The Ray Serve application of one planned server group (not yet running): one replica on a node of its type."""
    from ray import serve

    deployment = serve.deployment(FleetNode).options(
        name=d.name, num_replicas=1, max_ongoing_requests=MAX_ONGOING, max_queued_requests=-1,
        ray_actor_options=actor_options(d, cpus_per_worker),
        health_check_period_s=10.0, health_check_timeout_s=30.0, graceful_shutdown_timeout_s=20.0)
    return deployment.bind(replica_config(d))


def serve_fleet(deployments: list[FleetDeployment], cpus_per_worker: float, http_port: int = 8000,
                host: str = "127.0.0.1") -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Run every deployment on the connected Ray cluster: ({name: proxy base URL}, {name: replica's where()}).
    One HTTP proxy, on the head node."""
    from ray import serve

    serve.start(http_options={"host": host, "port": http_port, "location": "HeadOnly"})
    proxy, where = {}, {}
    for d in deployments:
        handle = serve.run(fleet_app(d, cpus_per_worker), name=d.name, route_prefix=f"/{d.name}")
        proxy[d.name] = f"http://{host}:{http_port}/{d.name}"
        where[d.name] = handle.where.remote().result(timeout_s=120.0)
    return proxy, where


def placement(deployments: list[FleetDeployment], where: dict[str, dict[str, str]],
              nodes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per deployment: the node its replica runs on and whether that node carries the planned type's resource."""
    resources = {n["NodeID"]: n.get("Resources") or {} for n in nodes}
    out = {}
    for d in deployments:
        w = where.get(d.name, {})
        out[d.name] = {"group": d.group, "server": d.server, "models": d.models, "node_id": w.get("node_id"),
                       "node_url": w.get("url"), "as_planned": d.resource in resources.get(w.get("node_id"), {})}
    return out


def check_cluster(deployments: list[FleetDeployment], nodes: list[dict[str, Any]]) -> None:
    """Refuse (one line naming the flags) when no node says it is a planned server type, or none of a type whose
    plan runs on its accelerator has the GPUs."""
    missing, flags = missing_types(deployments, nodes), start_flags(deployments)
    if missing:
        raise RecserveError("no Ray node offers " + ", ".join(f"{n} x {type_resource(t)}" for t, n in missing.items())
                            + "; start nodes with " + "; ".join(f"{t}: ray start {flags[t]}" for t in missing))
    short = missing_gpus(deployments, nodes)
    if short:
        raise RecserveError("the plan runs " + ", ".join(f"{n} {t} server(s)" for t, n in short.items())
                            + " on their GPU, but the Ray nodes of that type have fewer GPUs; start them with "
                            + "; ".join(f"{t}: ray start {flags[t]}" for t in short))
