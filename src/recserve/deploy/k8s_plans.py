"""Kubernetes manifests for every plan kind: a Plan JSON in, validated objects out.

- **colocate** (Hera): per group of identical servers a ConfigMap (the node config: each model with its
  planned workers) and a Deployment of node-server pods with Guaranteed QoS and an integer CPU request equal
  to the planned workers, so the kubelet's static CPU manager policy gives them exclusive cores.  LLC ways have
  no Kubernetes resource: they ride along as a pod annotation for the node's resource manager (resctrl).
- **pool** (Kairos): per model and instance type a StatefulSet of node servers pinned to that node pool
  (``nodeSelector`` on ``node.kubernetes.io/instance-type``) behind a headless Service, so every instance has
  its own DNS name; the router is its own Deployment whose ConfigMap is the pool file (one backend per
  instance, the base type marked), and the Kairos policy dispatches over the instances.
- **provision** (Hercules): per (workload, server type) a node-server Deployment on that node pool, an HPA
  (the reactive rule: add servers when per-server QPS passes the type's latency-bounded QPS from the plan's
  efficiency tuple) and, per provisioning step, a CronJob that sets the planned server count as the HPA's
  floor (and scales a pair to zero when the plan switches it off).
- **shard** (ElasticRec): the shard Deployments/Services/HPAs of :mod:`recserve.deploy.k8s`.
- **tier** (SDM): a node server whose node config places the plan's SM tables on a persistent volume.
- **fleet**: per planned server group a Deployment with ``deploy local``'s node config, a Service per
  model (:mod:`recserve.deploy.k8s_fleet`).

Pods run the image's ``recserve`` entry point (``serve --config``, ``route --pool``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import yaml

from recserve.deploy.k8s import GRPC_PORT, HTTP_PORT, dns_name, hpa, manifests, name_hash
from recserve.deploy.nodeconfig import node_config, planned_cpus, server_groups, tier_section
from recserve.deploy.sharding import layout_for_export
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetPlan  # noqa: F401 - registers the kind, so Plan.load rebuilds fleet plans
from recserve.planners.plan import ColocationPlan, Plan, PoolPlan, ProvisionPlan, ShardPlan
from recserve.specs import ServerType, get_model, get_server

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
CONFIG_DIR = "/etc/recserve"
ROUTER_PORT = 8080
KUBECTL_IMAGE = "bitnami/kubectl:1.30"
QPS_METRIC = "recserve_requests_per_second"  # rate(recserve_requests_total) per pod, via a custom-metrics adapter


def dns_part(text: str) -> str:
    """``text`` (a model's name) as one part of a DNS label; where sanitising changed it (``Ctr_Model``,
    ``ctr.model``, a non-ASCII name) a hash of ``text`` follows, so distinct names never meet."""
    part = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return part if part == text else "-".join(p for p in (part, name_hash(text)) if p)


def name_prefix(name: str) -> str:
    """``name`` (``--name``, sanitised) checked as the start of every object name: a Service's must start with
    a letter (DNS-1035)."""
    if not re.match(r"[a-z]", name):
        raise RecserveError(f"--name: the object name prefix {name!r} must start with a letter a-z (Service "
                            "names are DNS-1035 labels)")
    return name


def _labels(app: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "recserve", "app.kubernetes.io/instance": app,
            **{f"recserve/{k}": dns_name(v) for k, v in extra.items()}}


def guaranteed_resources(cpus: int, memory_mib: int, gpus: int = 0) -> dict[str, Any]:
    """Requests == limits with an integer CPU count: Guaranteed QoS, exclusive cores under the static CPU manager."""
    amount: dict[str, str] = {"cpu": str(int(cpus)), "memory": f"{int(memory_mib)}Mi"}
    if gpus:
        amount["nvidia.com/gpu"] = str(int(gpus))
    return {"requests": dict(amount), "limits": dict(amount)}


def memory_share_mib(server: ServerType, cpus: int) -> int:
    """The pod's memory: the server's memory in proportion to the cores it takes (90%, for the system)."""
    return int(server.mem_gb * 1024 * 0.9 * min(1.0, cpus / max(server.cores, 1)))


def config_map(name: str, labels: dict[str, str], filename: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels},
            "data": {filename: yaml.safe_dump(data, sort_keys=False)}}


def node_server_pod(labels: dict[str, str], image: str, config: str, resources: dict[str, Any],
                    instance_type: str | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """Pod template of a node server reading its node config from ConfigMap ``config``."""
    spec: dict[str, Any] = {
        "containers": [{
            "name": "node-server",
            "image": image,
            "args": ["serve", "--config", f"{CONFIG_DIR}/node.yaml", "--host", "0.0.0.0"],
            "ports": [{"name": "http", "containerPort": HTTP_PORT}, {"name": "grpc", "containerPort": GRPC_PORT}],
            "resources": resources,
            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
            "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT}},
            "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": HTTP_PORT}},
        }],
        "volumes": [{"name": "config", "configMap": {"name": config}}],
    }
    if instance_type:
        spec["nodeSelector"] = {INSTANCE_TYPE_LABEL: instance_type}
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}


def workload(kind: str, name: str, labels: dict[str, str], replicas: int, pod: dict[str, Any],
             service_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": int(replicas), "selector": {"matchLabels": labels}, "template": pod}
    if kind == "StatefulSet":
        spec["serviceName"] = service_name
        spec["podManagementPolicy"] = "Parallel"
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "labels": labels}, "spec": spec}


def service(name: str, labels: dict[str, str], port: int = HTTP_PORT, headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": labels, "ports": [{"name": "http", "port": port, "targetPort": port}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels}, "spec": spec}


# ---------------------------------------------------------------- Hera co-location


def colocation_manifests(plan: ColocationPlan, image: str, scale: float, name: str) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for k, (server_plan, count) in enumerate(server_groups(plan)):
        server = get_server(server_plan.server)
        app = dns_name(name, "node", str(k))
        labels = _labels(app, plan="colocate", server=server.name)
        cpus = planned_cpus(server_plan)
        config = node_config(server_plan, scale=scale)
        ways = ",".join(f"{p.model}={p.ways}" for p in server_plan.placements)
        pod = node_server_pod(labels, image, app, guaranteed_resources(cpus, memory_share_mib(server, cpus)),
                              server.name, {"recserve/llc-ways": ways})
        objects += [config_map(app, labels, "node.yaml", config), workload("Deployment", app, labels, count, pod),
                    service(app, labels)]
    return objects


# ---------------------------------------------------------------- Kairos pool


def pool_manifests(plan: PoolPlan, image: str, scale: float, name: str, policy: str = "kairos",
                   namespace: str = "default") -> list[dict[str, Any]]:
    """Per model: one StatefulSet per instance type, and a router Deployment whose pool file lists every instance."""
    objects: list[dict[str, Any]] = []
    qos = plan.inputs.get("qos_ms", {})
    for choice in plan.pools:
        model = choice.model
        base = choice.details.get("base_type") or max(choice.config, key=lambda t: get_server(t).cores)
        backends = []
        for type_name, count in choice.config.items():
            if not count:
                continue
            server = get_server(type_name)
            app = dns_name(name, model, type_name)
            labels = _labels(app, plan="pool", model=model, server=type_name)
            cpus = max(1, server.cores)
            gpus = 1 if server.accelerator else 0
            config = {"host": "0.0.0.0", "http_port": HTTP_PORT, "grpc_port": GRPC_PORT,
                      "models": [{"model": model, "name": model, "scale": scale, "workers": 1, "threads": cpus}]}
            pod = node_server_pod(labels, image, app, guaranteed_resources(cpus, memory_share_mib(server, cpus), gpus),
                                  type_name)
            objects += [config_map(app, labels, "node.yaml", config), service(app, labels, headless=True),
                        workload("StatefulSet", app, labels, count, pod, service_name=app)]
            backends += [{"url": f"http://{app}-{i}.{app}.{namespace}.svc.cluster.local:{HTTP_PORT}",
                          "type": type_name, "slots": 1, "base": type_name == base} for i in range(count)]
        router = dns_name(name, model, "router")
        labels = _labels(router, plan="pool", model=model, role="router")
        qos_ms = qos.get(model) if isinstance(qos, dict) else qos
        if qos_ms is None:
            qos_ms = get_model(model).sla.target_ms
        pool_file = {"qos_ms": float(qos_ms), "policy": policy, "backends": backends}
        pod = {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "router", "image": image,
                            "args": ["route", "--pool", f"{CONFIG_DIR}/pool.yaml", "--host", "0.0.0.0",
                                     "--port", str(ROUTER_PORT)],
                            "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
                            "resources": guaranteed_resources(1, 1024),
                            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}],
                            "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": ROUTER_PORT}}}],
            "volumes": [{"name": "config", "configMap": {"name": router}}]}}
        objects += [config_map(router, labels, "pool.yaml", pool_file), workload("Deployment", router, labels, 1, pod),
                    service(router, labels, ROUTER_PORT)]
    return objects


# ---------------------------------------------------------------- Hercules provisioning


def cron_schedule(t_hours: float) -> str:
    """Daily cron expression at hour-of-day ``t_hours`` (fractions become minutes)."""
    minutes = int(round((t_hours % 24) * 60)) % (24 * 60)
    return f"{minutes % 60} {minutes // 60} * * *"


def scaling_script(counts: dict[str, int]) -> str:
    """Set each pair's planned floor: HPA minReplicas = n (scale up from zero first); n = 0 scales the pair off."""
    lines = ["set -e"]
    for name, n in counts.items():
        if n > 0:
            lines.append(f"kubectl scale deployment/{name} --current-replicas=0 --replicas={n} || true")
            lines.append(f"kubectl patch hpa/{name} --type=merge -p '{{\"spec\":{{\"minReplicas\":{n}}}}}'")
        else:
            lines.append(f"kubectl scale deployment/{name} --replicas=0")
    return "\n".join(lines)


def provision_manifests(plan: ProvisionPlan, image: str, scale: float, name: str) -> list[dict[str, Any]]:
    steps = plan.steps
    if not steps:
        raise RecserveError("provision plan has no steps")
    if max(s.t for s in steps) >= 24:
        raise RecserveError("provision plan steps must lie within one day (t < 24 h) to become a daily schedule")
    pairs = sorted({(w, h) for s in steps for w, alloc in s.allocation.items() for h, n in alloc.items() if n})
    available = plan.inputs.get("available", {})
    efficiency = plan.inputs.get("efficiency", {})
    objects: list[dict[str, Any]] = []
    names: dict[tuple[str, str], str] = {}
    for w, h in pairs:
        server = get_server(h)
        app = names[(w, h)] = dns_name(name, w, h)
        labels = _labels(app, plan="provision", model=w, server=h)
        cpus = max(1, server.cores)
        config = {"host": "0.0.0.0", "http_port": HTTP_PORT, "grpc_port": GRPC_PORT,
                  "models": [{"model": w, "name": w, "scale": scale, "workers": cpus, "threads": 1}]}
        gpus = 1 if server.accelerator else 0
        pod = node_server_pod(labels, image, app, guaranteed_resources(cpus, memory_share_mib(server, cpus), gpus), h)
        first = int(steps[0].allocation.get(w, {}).get(h, 0))
        most = max(int(s.allocation.get(w, {}).get(h, 0)) for s in steps)
        cap = max(most, int(available.get(h, most)))
        qps = float(efficiency.get(w, {}).get(h, {}).get("qps", 0.0)) or 1.0
        objects += [config_map(app, labels, "node.yaml", config), workload("Deployment", app, labels, first, pod),
                    service(app, labels), hpa(app, labels, QPS_METRIC, qps, max(1, first), cap)]
    objects += _scaler_rbac(name)
    for k, step in enumerate(steps):
        counts = {names[p]: int(step.allocation.get(p[0], {}).get(p[1], 0)) for p in pairs}
        objects.append(_cronjob(dns_name(name, "step", str(k)), name, cron_schedule(step.t), scaling_script(counts)))
    return objects


def _scaler_rbac(name: str) -> list[dict[str, Any]]:
    account = dns_name(name, "scaler")
    labels = _labels(account, plan="provision", role="scaler")
    rules = [{"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"],
              "verbs": ["get", "patch", "update"]},
             {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": ["get", "patch"]}]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account, "labels": labels}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": account, "labels": labels},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": account, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
         "subjects": [{"kind": "ServiceAccount", "name": account}]},
    ]


def _cronjob(job: str, name: str, schedule: str, script: str) -> dict[str, Any]:
    labels = _labels(job, plan="provision", role="schedule")
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": job, "labels": labels},
            "spec": {"schedule": schedule, "concurrencyPolicy": "Replace", "jobTemplate": {"spec": {
                "backoffLimit": 2, "template": {"metadata": {"labels": labels}, "spec": {
                    "serviceAccountName": dns_name(name, "scaler"), "restartPolicy": "OnFailure",
                    "containers": [{"name": "scale", "image": KUBECTL_IMAGE,
                                    "command": ["/bin/sh", "-c", script]}]}}}}}}


# ---------------------------------------------------------------- ElasticRec shards


def shard_manifests(plan: ShardPlan, image: str, scale: float, name: str,
                    max_replicas: int = 16) -> list[dict[str, Any]]:
    spec = get_model(plan.model)
    if len(plan.tables) != len(spec.tables):
        raise RecserveError(f"shard plan has {len(plan.tables)} tables, model {spec.name} has {len(spec.tables)}")
    layout = layout_for_export(plan, spec)
    qps_max = {f"{t.name}-s{s}": shards.qps_max[s] for t, shards in zip(layout.tables, plan.tables, strict=True)
               for s in range(len(shards.qps_max))}
    return manifests(layout, image=image, qps_max=qps_max, max_replicas=max_replicas)


# ---------------------------------------------------------------- SDM tiers

TABLES_DIR = "/var/lib/recserve/tables"


def tier_manifests(plan: Plan, image: str, scale: float, name: str, workers: int = 1) -> list[dict[str, Any]]:
    """One node server (a StatefulSet of one) whose node config tiers the plan's SM tables onto a persistent volume
    sized for them, with the planned DRAM budget as its Guaranteed memory (row cache included)."""
    model = plan.inputs.get("model")
    if not model:
        raise RecserveError("tier plan has no inputs.model")
    summary = plan.summary
    app = dns_name(name, model)
    labels = _labels(app, plan="tier", model=model)
    tier = tier_section(plan, {"dir": TABLES_DIR, "cache_mb": int(float(summary.get("cache_gb", 0.0)) * 1024)})
    config = {"host": "0.0.0.0", "http_port": HTTP_PORT, "grpc_port": GRPC_PORT,
              "models": [{"model": model, "name": model, "scale": scale, "workers": workers, "threads": 1,
                          "options": {"tier": tier}}]}
    memory_mib = int(float(plan.inputs.get("dram_gb", summary.get("dram_budget_gb", 1.0))) * 1024)
    pod = node_server_pod(labels, image, app, guaranteed_resources(workers, memory_mib), None)
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "tables", "mountPath": TABLES_DIR})
    sts = workload("StatefulSet", app, labels, 1, pod, service_name=app)
    sm_gib = max(1, int(float(summary.get("sm_gb", 1.0)) * 1.1 + 0.999))  # the SM tables' files, with 10% room
    sts["spec"]["volumeClaimTemplates"] = [{"metadata": {"name": "tables"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": f"{sm_gib}Gi"}}}}]
    return [config_map(app, labels, "node.yaml", config), service(app, labels, headless=True), sts]


def fleet_manifests(plan: Plan, image: str, scale: float, name: str) -> list[dict[str, Any]]:
    from recserve.deploy.k8s_fleet import fleet_manifests as build  # it builds on this module's pieces

    return build(plan, image, scale, name)


BUILDERS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "colocate": colocation_manifests,
    "fleet": fleet_manifests,
    "pool": pool_manifests,
    "provision": provision_manifests,
    "shard": shard_manifests,
    "tier": tier_manifests,
}


def plan_manifests(plan: Plan, image: str = "recserve:latest", scale: float = 1.0,
                   name: str | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object of ``plan`` (any registered kind with a builder)."""
    build = BUILDERS.get(plan.kind)
    if build is None:
        raise RecserveError(f"no Kubernetes deployment for {plan.kind!r} plans; deployable kinds: {sorted(BUILDERS)}")
    return build(plan, image, scale, name_prefix(dns_name(name or f"recserve-{plan.kind}")))
