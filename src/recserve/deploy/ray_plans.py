"""Plans on Ray Serve: a Kairos pool routed by the Kairos policy inside Ray, Hera co-location and Hercules
provisioning plans.

**Kairos pool.**  One deployment per model whose replicas are the pool's instances (``max_ongoing_requests=1``:
an instance serves one query at a time, Kairos Sec. 6).  Each Ray node says which instance type it is and how
many instances it hosts with custom resources (``ray start --resources``: ``recserve_slot`` = instances, and a
marker ``recserve_type_<type>``); a replica takes one slot, so the planned counts land on the planned types.
The deployment's request router is :class:`KairosRouter` (``ray.serve.request_router.RequestRouter``): every
request Ray asks it to place becomes an arrival at the one :class:`~recserve.policies.dispatcher.Dispatcher`
(the live router's and the simulator's), ``choose_replicas`` waits until the dispatcher starts the query on an
instance and returns that replica, and ``on_request_completed`` completes it.  So Ray's own HTTP proxy routes
by Kairos' min-cost matching.  The query size comes from the ``Recserve-Batch-Size`` header (HTTP through the
proxy) or the ``size`` keyword (deployment handles).  Each decision is appended to a JSON-lines log.

**Hera co-location.**  One deployment per group of identical planned servers, one replica per server with the
planned CPUs (``num_cpus`` = planned workers × ``cpus_per_worker``); a replica hosts the server's models, each
with its planned workers as torch threads.

**Hercules provisioning.**  One deployment per (workload, server type) on nodes marked with that type, autoscaled
by the plan's schedule with the reactive rule on top (``policies.provision_autoscaler.RayScheduledPolicy``); each
starts at the planned count for the current hour.

All serve the node server's Open Inference Protocol path ``/v2/models/<model>/infer`` under the application's
route prefix.  Ray is imported lazily (and this module only on Ray hosts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.deploy.nodeconfig import planned_cpus, server_groups
from recserve.errors import RecserveError
from recserve.planners.plan import ColocationPlan, PoolChoice, ProvisionPlan
from recserve.policies.dispatch import make_instances, make_policy
from recserve.policies.dispatcher import Dispatcher
from recserve.policies.predictor import LatencyPredictor
from recserve.policies.provision_autoscaler import hour_of_day, scheduled_replicas
from recserve.serving.node.metrics import SlidingWindow
from recserve.wire import BATCH_SIZE_HEADER

SLOT_RESOURCE = "recserve_slot"
STATS_WINDOW_S = 10.0
log = logging.getLogger("recserve.ray")


def type_resource(type_name: str) -> str:
    """The custom resource that marks a Ray node as instance type ``type_name``."""
    return "recserve_type_" + re.sub(r"[^A-Za-z0-9]+", "_", type_name)


def node_start_flags(choice: PoolChoice) -> dict[str, str]:
    """Per instance type, the ``ray start --resources`` value of a node hosting all of that type's instances."""
    return {t: json.dumps({SLOT_RESOURCE: n, type_resource(t): 1}) for t, n in choice.config.items() if n}


def _http_scope(pending_request: Any) -> dict[str, Any]:
    """The ASGI scope of a request from Ray's HTTP proxy (which sends its own pickled ``StreamingHTTPRequest``:
    unpickled only when the metadata says the request came through the proxy)."""
    arg = pending_request.args[0] if pending_request.args else None
    if isinstance(arg, bytes | bytearray):
        is_http = getattr(pending_request.metadata, "is_http_request", False)  # a property in Ray 2.60
        if not (is_http() if callable(is_http) else is_http):
            return {}
        try:
            arg = pickle.loads(arg)
        except Exception:  # noqa: BLE001 - not the proxy's object: no scope
            return {}
    return getattr(arg, "_asgi_scope", None) or {}


def query_size(pending_request: Any, default: int) -> int:
    """A request's batch size: ``size=`` of a handle call, else the proxy request's size header."""
    size = (pending_request.kwargs or {}).get("size")
    if size is None and pending_request.args:
        scope = _http_scope(pending_request)
        wanted = BATCH_SIZE_HEADER.lower().encode()
        for key, value in scope.get("headers", []):
            if key.lower() == wanted:
                size = value
                break
    try:
        return max(1, int(size)) if size is not None else default
    except (TypeError, ValueError):
        return default


# ---------------------------------------------------------------- the Kairos request router


def _request_router_base() -> type:
    try:
        from ray.serve.request_router import RequestRouter
    except ImportError:  # without Ray the class is still importable (tests of the pure parts)
        return object
    return RequestRouter


class KairosRouter(_request_router_base()):  # type: ignore[misc]
    """Ray Serve request router driving the Dispatcher with a dispatch policy (Kairos by default)."""

    def initialize_state(self, types: dict[str, str] | None = None, qos_ms: float = 100.0, policy: str = "kairos",
                         base_types: list[str] | None = None, default_size: int = 100, log_path: str | None = None,
                         prior: dict[str, list[float]] | None = None, **_: Any) -> None:
        """``prior``: mean latency per predictor bucket and type (``policies.predictor.prior_from_profiles``), as
        the live router's pool-file ``prior``: without it, one cold-start outlier can make the online predictor
        avoid a type it then never observes again."""
        self.type_of_resource = dict(types or {})  # node marker resource -> instance type
        self.qos_ms, self.policy_name, self.base_types = float(qos_ms), policy, list(base_types or [])
        self.default_size, self.log_path = int(default_size), log_path
        self.prior = {t: np.asarray(row, dtype=float) for t, row in (prior or {}).items()}
        self.dispatcher: Dispatcher | None = None
        self.replica_ids: tuple = ()
        self.instance_of: dict[Any, Any] = {}
        self.replica_at: dict[int, Any] = {}
        self.started: dict[str, asyncio.Future] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.t0 = time.monotonic()

    # ------------------------------------------------------------ pool <-> replicas
    def _node_types(self) -> dict[str, str]:
        import ray

        out = {}
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            for resource, type_name in self.type_of_resource.items():
                if resource in (node.get("Resources") or {}):
                    out[node["NodeID"]] = type_name
        return out

    def _bind(self, replicas: list[Any]) -> None:
        """(Re)build the dispatcher over the current replicas, ordered by type then id (a new replica set
        restarts it: queued queries re-arrive when Ray asks again)."""
        node_types = self._node_types()
        typed = sorted(((node_types.get(r.node_id, "unknown"), str(r.replica_id), r) for r in replicas),
                       key=lambda x: (x[0], x[1]))
        pool = [t for t, _, _ in typed]
        instances, types = make_instances(pool, [r.replica_id for _, _, r in typed])
        kw: dict[str, Any] = {}
        if self.policy_name == "drs":
            kw = {"threshold": 300, "base_types": self.base_types or types[:1]}
        if self.prior:
            kw["predictor"] = LatencyPredictor(types, prior=self.prior)
        policy = make_policy(self.policy_name, self.qos_ms, **kw)
        for fut in self.started.values():
            if not fut.done():
                fut.cancel()
        self.started.clear()
        self.dispatcher = Dispatcher(policy, instances, types, self._start)
        self.instance_of = {inst.endpoint: inst for inst in instances}
        self.replica_at = {inst.index: r for inst, (_, _, r) in zip(instances, typed, strict=True)}
        self.replica_ids = tuple(sorted(str(r.replica_id) for r in replicas))
        self._log({"event": "pool", "instances": [[i.index, i.type_name, str(i.endpoint)] for i in instances]})

    def _now_ms(self) -> float:
        return (time.monotonic() - self.t0) * 1000.0

    def _start(self, q: Any, inst: Any, now: float) -> None:
        request_id = q.payload
        fut = self.started.get(request_id)
        if fut is not None and not fut.done():
            fut.set_result(inst.index)
        self._log({"event": "start", "t_ms": round(now, 3), "request": request_id, "size": q.size,
                   "instance": inst.index, "type": inst.type_name, "waited_ms": round(now - q.arrival, 3),
                   "predicted_ms": round(q.pred_ms, 3)})

    def _log(self, record: dict[str, Any]) -> None:
        if self.log_path:
            with open(self.log_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------ Ray's hooks
    async def choose_replicas(self, candidate_replicas: list[Any], pending_request: Any = None) -> list[list[Any]]:
        if pending_request is None:
            return [candidate_replicas]
        self.loop = asyncio.get_running_loop()
        if self.dispatcher is None or tuple(sorted(str(r.replica_id) for r in candidate_replicas)) != self.replica_ids:
            self._bind(candidate_replicas)
        request_id = pending_request.metadata.internal_request_id
        fut = self.started.get(request_id)
        if fut is None:  # first time Ray asks about this request: it arrives at the central queue
            fut = self.started[request_id] = self.loop.create_future()
            self.dispatcher.arrive(self._now_ms(), query_size(pending_request, self.default_size), payload=request_id)
        try:
            index = await asyncio.shield(fut)
        except asyncio.CancelledError:
            return []
        replica = self.replica_at.get(index)
        return [[replica]] if replica is not None else []

    def on_request_completed(self, replica_id: Any, internal_request_id: str) -> None:
        if self.loop is None:
            return
        self.loop.call_soon_threadsafe(self._complete, replica_id, internal_request_id)

    def _complete(self, replica_id: Any, internal_request_id: str) -> None:
        inst = self.instance_of.get(replica_id)
        self.started.pop(internal_request_id, None)
        if self.dispatcher is None or inst is None or inst.current is None or inst.current.payload != \
                internal_request_id:
            return
        self.dispatcher.complete(self._now_ms(), inst)


# ---------------------------------------------------------------- replicas


class ModelServer:
    """A replica serving some models over the node server's v2 HTTP path (and ``infer`` for handles)."""

    def __init__(self, models: dict[str, int], scale: float, seed: int = 0, instance_type: str = "") -> None:
        import torch

        from recserve.specs import get_model
        from recserve.zoo import build

        torch.set_num_threads(max(1, sum(models.values())))
        self.models = {name: build(get_model(name), scale=scale, seed=seed).eval() for name in models}
        self.threads = dict(models)
        self.instance_type = instance_type
        self.completions = SlidingWindow(STATS_WINDOW_S)

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Completed queries/s over the window: the reactive rule of a provisioning plan's autoscaling policy."""
        return {"qps": self.completions.rate()}

    def _run(self, name: str, arrays: dict[str, np.ndarray]) -> np.ndarray:
        import torch

        from recserve.zoo import QueryBatch

        model = self.models[name]
        batch = QueryBatch.from_arrays(arrays)
        batch.validate(model.spec.dense_in, tuple(model.rows), model.sequence_lengths)
        torch.set_num_threads(self.threads[name])
        with torch.inference_mode():
            scores = model(batch).numpy()
        self.completions.add()
        return scores

    async def infer(self, name: str, arrays: dict[str, np.ndarray], size: int | None = None) -> np.ndarray:
        return self._run(name, arrays)

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        from recserve.serving.wire import codec
        from recserve.serving.wire.errors import InferError

        match = re.search(r"/v2/models/([^/]+)(?:/versions/[^/]+)?/infer$", request.url.path)
        if request.method != "POST" or match is None or match.group(1) not in self.models:
            return Response(json.dumps({"error": f"no such model endpoint: {request.url.path}"}), status_code=404,
                            media_type="application/json")
        name = match.group(1)
        body = await request.body()
        try:
            parsed, arrays = codec.parse_http_infer(body, request.headers.get(codec.HEADER_LENGTH))
            scores = self._run(name, arrays)
        except InferError as exc:
            return Response(json.dumps({"error": str(exc)}), status_code=400, media_type="application/json")
        payload, headers = codec.http_infer_response(name, parsed, scores)
        return Response(payload, headers=headers)


# ---------------------------------------------------------------- applications


def pool_app(choice: PoolChoice, qos_ms: float, scale: float, seed: int = 0, policy: str = "kairos",
             default_size: int = 100, log_path: str | None = None, cpus_per_instance: float = 1.0,
             prior: dict[str, list[float]] | None = None) -> Any:
    """The Ray Serve application of one model's Kairos pool (not yet running)."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    instances = sum(n for n in choice.config.values() if n)
    if instances < 1:
        raise RecserveError(f"pool of {choice.model} has no instances")
    base = [choice.details["base_type"]] if choice.details.get("base_type") else []
    router = RequestRouterConfig(
        request_router_class="recserve.deploy.ray_plans:KairosRouter",
        request_router_kwargs={"types": {type_resource(t): t for t, n in choice.config.items() if n},
                               "qos_ms": qos_ms, "policy": policy, "base_types": base,
                               "default_size": default_size, "log_path": log_path, "prior": prior},
        initial_backoff_s=0.002, max_backoff_s=0.02)
    deployment = serve.deployment(ModelServer).options(
        name=f"pool-{choice.model}", num_replicas=instances, max_ongoing_requests=1, max_queued_requests=-1,
        ray_actor_options={"num_cpus": cpus_per_instance, "resources": {SLOT_RESOURCE: 1}},
        request_router_config=router)
    return deployment.bind({choice.model: 1}, scale, seed)


def colocation_apps(plan: ColocationPlan, scale: float, seed: int = 0,
                    cpus_per_worker: float = 1.0) -> dict[str, Any]:
    """One application per group of identical servers: ``{name: app}``; replicas = servers, CPUs = workers."""
    from ray import serve

    apps = {}
    for k, (server, count) in enumerate(server_groups(plan)):
        name = f"hera-node-{k}"
        deployment = serve.deployment(ModelServer).options(
            name=name, num_replicas=count,
            ray_actor_options={"num_cpus": planned_cpus(server) * cpus_per_worker})
        apps[name] = deployment.bind({p.model: p.workers for p in server.placements}, scale, seed, server.server)
    return apps


@dataclass(frozen=True)
class ProvisionTarget:
    """One (workload, server type) deployment of a provisioning plan: its schedule and its reactive rule."""

    name: str
    workload: str
    server: str
    steps: list[list[float]]  # [[hour, servers], ...] as the plan's steps
    qps_per_server: float  # the type's latency-bounded QPS for the workload (the planner's efficiency input)
    max_replicas: int

    def decision(self, t_hours: float, observed_qps: float = 0.0) -> int:
        """The autoscaling policy's replica count at ``t_hours`` under ``observed_qps`` (before Ray's delays)."""
        return scheduled_replicas(self.steps, t_hours, observed_qps, self.qps_per_server, 0, self.max_replicas)


def provision_targets(plan: ProvisionPlan) -> list[ProvisionTarget]:
    """The deployments a provisioning plan becomes, one per (workload, server type) it ever allocates."""
    efficiency = plan.inputs.get("efficiency", {})
    available = plan.inputs.get("available", {})
    pairs = sorted({(w, h) for s in plan.steps for w, alloc in s.allocation.items() for h, n in alloc.items() if n})
    out = []
    for w, h in pairs:
        steps = [[s.t, int(s.allocation.get(w, {}).get(h, 0))] for s in plan.steps]
        most = max(n for _, n in steps)
        out.append(ProvisionTarget(re.sub(r"[^A-Za-z0-9-]+", "-", f"prov-{w}-{h}"), w, h, steps,
                                   float(efficiency.get(w, {}).get(h, {}).get("qps", 0.0)),
                                   max(most, int(available.get(h, most)))))
    return out


def provision_apps(plan: ProvisionPlan, scale: float, seed: int = 0, cpus_per_core: float = 1.0,
                   t_hours: float | None = None) -> dict[str, Any]:
    """One application per (workload, server type) of a provisioning plan: replicas (servers) on nodes marked with
    the type, each with the type's cores, starting at the planned count for the hour ``t_hours`` (now by default)
    and autoscaled by :class:`~recserve.policies.provision_autoscaler.RayScheduledPolicy` (the planned count for the
    hour, raised when the load passes the type's QPS)."""
    from ray import serve

    from recserve.specs import get_server

    hour = hour_of_day() if t_hours is None else t_hours
    apps = {}
    for target in provision_targets(plan):
        cores = max(1, get_server(target.server).cores)
        deployment = serve.deployment(ModelServer).options(
            name=target.name, max_ongoing_requests=max(1, cores),
            ray_actor_options={"num_cpus": cores * cpus_per_core, "resources": {type_resource(target.server): 0.001}},
            autoscaling_config={
                "min_replicas": 0, "initial_replicas": target.decision(hour), "max_replicas": target.max_replicas,
                "metrics_interval_s": 2.0, "look_back_period_s": 30.0, "upscale_delay_s": 30.0,
                "downscale_delay_s": 300.0,
                "policy": {"policy_function": "recserve.policies.provision_autoscaler:RayScheduledPolicy",
                           "policy_kwargs": {"steps": target.steps, "qps_per_server": target.qps_per_server}}})
        apps[target.name] = deployment.bind({target.workload: cores}, scale, seed, target.server)
    return apps


# ---------------------------------------------------------------- running a plan, driving it, predicting it


def serve_plan(plan: Any, scale: float, models: list[str] | None = None, seed: int = 0, policy: str = "kairos",
               log_path: str | None = None, cpus: float = 1.0, default_size: int = 100,
               http_port: int = 8000, prior: dict[str, list[float]] | None = None) -> dict[str, str]:
    """Run a pool or co-location plan on the connected Ray cluster; returns ``{application: route prefix}``.
    One HTTP proxy, on the head node: the Kairos router inside it is the pool's one central controller."""
    from ray import serve

    serve.start(http_options={"host": "127.0.0.1", "port": http_port, "location": "HeadOnly"})
    routes = {}
    if plan.kind == "pool":
        qos = plan.inputs.get("qos_ms", {})
        for choice in plan.pools:
            if models and choice.model not in models:
                continue
            from recserve.specs import get_model

            qos_ms = float(qos.get(choice.model, get_model(choice.model).sla.target_ms))
            name = f"kairos-{choice.model}"
            serve.run(pool_app(choice, qos_ms, scale, seed, policy, default_size, log_path, cpus, prior), name=name,
                      route_prefix=f"/{name}")
            routes[name] = f"/{name}"
    elif plan.kind in ("colocate", "provision"):
        apps = colocation_apps(plan, scale, seed, cpus) if plan.kind == "colocate" else \
            provision_apps(plan, scale, seed, cpus)
        for name, app in apps.items():
            serve.run(app, name=name, route_prefix=f"/{name}")
            routes[name] = f"/{name}"
    else:
        raise RecserveError(f"no Ray Serve deployment for {plan.kind!r} plans (pool, colocate, provision, shard)")
    if not routes:
        raise RecserveError(f"plan has none of the models {models}")
    return routes


def pool_list(config: dict[str, int]) -> list[str]:
    """One type name per instance, in the plan's type order."""
    return [t for t, n in config.items() for _ in range(int(n))]


def latency_prior(latency: Any, pool: list[str]) -> dict[str, list[float]]:
    """Predictor prior for every type of ``pool`` from one latency_vs_batch table (this host's)."""
    import dataclasses

    from recserve.policies.predictor import prior_from_profiles
    from recserve.profiles import ProfileSet

    types = list(dict.fromkeys(pool))
    profiles = ProfileSet([dataclasses.replace(latency, server=t) for t in types])
    return {t: row.tolist() for t, row in prior_from_profiles(profiles, latency.model, types).items()}


def predict_pool(latency: Any, pool: list[str], qos_ms: float, times_s: np.ndarray, sizes: np.ndarray,
                 policy: str = "kairos", seed: int = 0, prior: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """The simulator's prediction for this pool on exactly the trace sent (same arrivals and sizes): service
    times drawn from ``latency`` (a latency_vs_batch table, used for every type of the pool); ``prior`` seeds
    the policy's predictor as the request router's."""
    import dataclasses

    from recserve.profiles import ProfileSet
    from recserve.sim.cluster import replay
    from recserve.sim.latency import ServiceModel

    types = list(dict.fromkeys(pool))
    profiles = ProfileSet([dataclasses.replace(latency, server=t) for t in types])
    service = ServiceModel.from_profiles(profiles, latency.model, types)
    noise = np.random.default_rng([seed, 7]).standard_normal(len(sizes))
    draws = service.sample(types, service.bucket(sizes), noise).tolist()
    kw: dict[str, Any] = {"predictor": LatencyPredictor(types, prior=prior)} if prior else {}
    result = replay(make_policy(policy, qos_ms, **kw), pool, [int(s) for s in sizes],
                    (np.asarray(times_s) * 1e3).tolist(), draws, qos_ms, percentile=99.0, record=True)
    served = {t: 0 for t in types}
    for _, _, inst in result.decisions:
        served[pool[inst]] += 1
    return {"p50_ms": float(np.percentile(result.latencies_ms, 50)), "p99_ms": result.tail(99.0),
            "mean_ms": float(result.latencies_ms.mean()), "served_by_type": served, "completed": result.completed}
