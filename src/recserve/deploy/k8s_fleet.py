"""Kubernetes manifests for a FleetPlan: ``recserve deploy k8s --plan fleet.json``.

Per planned server group (a Hercules-configured model, a Hera pair, an SDM-tiered model) one Deployment of node
servers, one pod per planned server:

- the node config is ``deploy local``'s (:func:`~recserve.deploy.local_fleet.fleet_node_configs` on that group,
  on a "host" of the pod's cores), less what the container decides: no core ids (the static CPU manager's exclusive
  cpuset), the pod's address and ports, the tier files on the pod's volume;
- Guaranteed QoS with an integer CPU count = the cores of the config's workers (and ``nvidia.com/gpu: 1`` where
  the config has accelerator workers: a plan on a GPU server type counts on its fused device passes); the kubelet
  keeps ``reserved_cpus`` of each node, so a plan that fills a server's cores is scaled onto the rest as ``deploy
  local`` scales onto a smaller host;
- the node pool by ``nodeSelector`` on the instance-type label, and one fleet pod per node (required pod
  anti-affinity on the hostname): a plan's unit is one whole server;
- an SSD-tiered model's table files on an ``emptyDir`` (on the node's disk, O_DIRECT works; it survives container
  restarts, and a new pod rewrites the files as a fresh node does), sized for the files the node writes;
- replicas = the plan's units at peak; a group whose models' traces let it shrink gets an HPA between the traces'
  lowest share and the peak (why not a CronJob: docs/fleet.md).

One Service per model selects every pod that serves it.  ElasticRec shard blocks are left out (``deploy k8s
--model M --qps Q`` writes ElasticRec's own manifests), as ``deploy local`` leaves them to ``shards serve``.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from recserve.deploy.k8s import GRPC_PORT, HTTP_PORT, hpa
from recserve.deploy.k8s_plans import (
    QPS_METRIC,
    config_map,
    dns_name,
    dns_part,
    guaranteed_resources,
    memory_share_mib,
    name_prefix,
    node_server_pod,
    workload,
)
from recserve.deploy.local_fleet import cores_run, dram_bytes, fleet_node_configs, served_name
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetGroup, FleetPlan
from recserve.specs import get_model, get_server

RESERVED_CPUS = 1                  # the static CPU manager needs a non-zero reservation on every node
TIERS_DIR = "/var/lib/recserve/tiers"
HPA_TARGET_FRACTION = 0.8          # scale out before a pod reaches the plan's max load: new pods take minutes
SCALE_DOWN_WINDOW_S = 600          # hourly traces: no reason to shed pods on a minute's dip
FLEET_LABEL = "recserve/fleet"
HOSTNAME_KEY = "kubernetes.io/hostname"
# A loaded node answers health late: generous timeouts, and a slow start (tables built, tier files written) is
# the startup probe's, so liveness never kills a node that is still building.
READINESS = {"timeoutSeconds": 5, "periodSeconds": 5, "failureThreshold": 3}
LIVENESS = {"timeoutSeconds": 10, "periodSeconds": 10, "failureThreshold": 6}
STARTUP = {"timeoutSeconds": 10, "periodSeconds": 10, "failureThreshold": 180}


def planned_cores(group: FleetGroup) -> int:
    """Cores one unit of ``group`` runs (each model's workers and sparse workers x threads), as ``deploy local``
    counts them."""
    return sum(cores_run(group.alloc.get(m, {})) for m in group.qps)


def local_config(group: FleetGroup, scale: float, cores: int) -> dict[str, Any]:
    """``deploy local``'s node config for one unit of ``group`` on a host of ``cores`` cores."""
    configs, _ = fleet_node_configs(FleetPlan(groups=[group]), scale=scale, cores=list(range(cores)),
                                    tier_dir=TIERS_DIR)
    return configs[0]


def fitted_config(group: FleetGroup, scale: float, allocatable: int) -> dict[str, Any]:
    """The node config on the most cores whose workers fit ``allocatable`` exclusive cores (rounding in the local
    scaling can add one), without the host's core ids, its tier files in the pod's volume."""
    if allocatable < len(group.qps):
        raise RecserveError(f"{group.server}: {allocatable} allocatable cores cannot run {len(group.qps)} models")
    for cores in range(min(planned_cores(group), allocatable), 0, -1):
        config = local_config(group, scale, cores)
        if sum(cores_run(m) for m in config["models"]) <= allocatable:
            break
    models = [{k: v for k, v in m.items() if k != "cores"} for m in config["models"]]
    for m in models:
        if "accelerator" in m:
            m["accelerator"] = {k: v for k, v in m["accelerator"].items() if k != "cores"}
        if "tier" in (m.get("options") or {}):
            m["options"]["tier"]["dir"] = f"{TIERS_DIR}/{m['name']}"
    return {"host": "0.0.0.0", "http_port": HTTP_PORT, "grpc_port": GRPC_PORT, "models": models}


def tier_gib(config: dict[str, Any]) -> int:
    """Disk for the tier files of ``config``'s SSD-tiered models: the files their nodes write (``tier_file_bytes``:
    rows as the tier stores them, fp32 unless it says otherwise, padded to their stride, each file's header and
    footer), +10% for the filesystem."""
    total = 0
    for m in config["models"]:
        if "tier" in (m.get("options") or {}):
            from recserve.embedding.tiered import tier_file_bytes  # torch: only where a model is tiered

            spec = get_model(m["model"])
            total += tier_file_bytes(spec.tables, spec.scaled_rows(m["scale"]), m["options"]["tier"],
                                     f"model {m.get('name') or m['model']!r} tier")
    return max(1, math.ceil(total * 1.1 / 2**30)) if total else 0


def floor_2_digits(x: float) -> float:
    """``x`` rounded down to two significant digits (a bound a user can type that still holds)."""
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.floor(x / step) * step


def labels_of(app: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "recserve", "app.kubernetes.io/instance": app, "recserve/plan": "fleet",
            **{f"recserve/{k}": dns_name(v) for k, v in extra.items()}}


def serves_label(model: str) -> str:
    return f"recserve/{dns_name('serves', dns_part(served_name(model)))}"


@dataclass
class FittedGroup:
    """A planned server group as its pods run it: the node config on the cores the kubelet leaves, the share of the
    plan's cores (and so of its QPS) a pod gets, and the pods (the plan's servers, and any that restore a peak)."""

    group: FleetGroup
    app: str
    config: dict[str, Any]
    cpus: int
    share: float
    count: int
    restores: list[str] = field(default_factory=list)  # the models whose peak made pods be added

    def pod_qps(self, model: str) -> float:
        return self.share * self.group.qps[model]


@dataclass
class FleetManifests:
    """The objects of one fleet plan, and what a reader should know about them (``notes``)."""

    plan: FleetPlan
    image: str = "recserve:latest"
    scale: float = 1.0
    name: str = "recserve-fleet"
    reserved_cpus: int = RESERVED_CPUS
    notes: list[str] = field(default_factory=list)

    def build(self) -> list[dict[str, Any]]:
        self.name = name_prefix(dns_name(self.name))
        groups = [g for g in self.plan.groups if g.kind in ("single", "pair")]
        self.notes = [f"{g.count} x shards on {g.server} ({', '.join(g.qps)}): not in these manifests; `recserve "
                      f"deploy k8s --model {next(iter(g.qps))} --qps Q --server {g.server}` writes ElasticRec's"
                      for g in self.plan.groups if g.kind == "shards"]
        self.notes += [n for n in self.plan.notes if n.startswith("short of peak")]
        if not groups:
            raise RecserveError("the fleet plan has no single-model or co-located server group to deploy on "
                                "Kubernetes")
        fitted = [self.fit(i, g) for i, g in enumerate(groups)]
        models = list(dict.fromkeys(m for g in groups for m in g.qps))
        self.check_distinct(models)
        for m in models:
            self.restore_peak(m, fitted)
        self.notes += [f"{f.app}: {f.count} pods for the plan's {f.group.count} {f.group.server} servers, so that "
                       f"{', '.join(f.restores)} keep{'s' if len(f.restores) == 1 else ''} the QPS the plan gives "
                       f"at peak on the cores the kubelet leaves ({f.count - f.group.count} more in that node pool)"
                       for f in fitted if f.restores]
        objects = [o for f in fitted for o in self.group_objects(f)]
        self.notes += [n for m in models if (n := self.spread_note(m, fitted))]
        return objects + [self.model_service(m) for m in models]

    def peak(self, model: str) -> float:
        """The model's peak QPS as the plan records it (0 where it does not)."""
        return float((self.plan.models.get(model) or {}).get("peak_qps")
                     or ((self.plan.inputs.get("models") or {}).get(model) or {}).get("peak_qps") or 0.0)

    def check_distinct(self, models: list[str]) -> None:
        """Each model its own Service and pod label: two that met would each send traffic to both models' pods."""
        for derive, what in ((self.service_name, "Service"), (serves_label, "pod label")):
            seen: dict[str, str] = {}
            for m in models:
                other = seen.setdefault(derive(m), m)
                if other != m:
                    raise RecserveError(f"models {other!r} and {m!r} both become {what} {derive(m)!r}: rename one")

    def restore_peak(self, model: str, fitted: list[FittedGroup]) -> None:
        """Pods added where the cores the kubelet keeps leave ``model`` short of what the plan gives it at peak
        (its peak, or the plan's whole capacity for it where that is less), to the group whose pod carries most."""
        serving = [f for f in fitted if model in f.group.qps]
        planned = sum(f.group.count * f.group.qps[model] for f in serving)
        target = min(planned, self.peak(model) or planned)
        short = target - sum(f.count * f.pod_qps(model) for f in serving)
        best = max(serving, key=lambda f: f.pod_qps(model))
        if short > 1e-9 * target and best.pod_qps(model) > 0:
            best.count += math.ceil(short / best.pod_qps(model) - 1e-9)
            best.restores.append(model)

    def spread_note(self, model: str, fitted: list[FittedGroup]) -> str:
        """Why a model's Service alone may not hold its peak: it spreads connections evenly over the pods, where
        the plan splits the load by each pod's capacity."""
        serving = [f for f in fitted if model in f.group.qps]
        pods = sum(f.count for f in serving)
        peak = self.peak(model)
        weakest = min(serving, key=lambda f: f.pod_qps(model))
        capacity = weakest.pod_qps(model)
        if pods < 2 or peak / pods <= capacity:
            return ""
        return (f"{model}: its Service spreads connections evenly over {pods} pods, {peak / pods:,.1f} QPS each at "
                f"the {peak:,.1f} QPS peak, above the {capacity:,.1f} QPS a {weakest.group.server} pod carries; the "
                "plan splits by capacity: put a router before them (`recserve route --pool`)")

    def fit(self, i: int, group: FleetGroup) -> FittedGroup:
        """The group's node config on the cores the kubelet leaves of its server type."""
        server = get_server(group.server)
        allocatable = server.cores - self.reserved_cpus
        if allocatable < len(group.qps):
            raise RecserveError(f"{group.server}: {max(0, allocatable)} allocatable cores ({server.cores} less "
                                f"--reserved-cpus {self.reserved_cpus}) cannot run {len(group.qps)} models "
                                f"({', '.join(group.qps)})")
        app = dns_name(self.name, f"g{i}", group.kind, group.server)
        config = fitted_config(group, self.scale, allocatable)
        self.check_memory(app, group, config, server)
        cpus = sum(cores_run(m) for m in config["models"])
        share = cpus / max(1, planned_cores(group))
        if share < 1:
            self.notes.append(f"{app}: {cpus} of the plan's {planned_cores(group)} cores per {group.server} (the "
                              f"kubelet keeps {self.reserved_cpus}): about {100 * share:.0f}% of the planned QPS")
        return FittedGroup(group, app, config, cpus, share, group.count)

    def check_memory(self, app: str, group: FleetGroup, config: dict[str, Any], server: Any) -> None:
        """Refuse a group whose node's tables cannot fit its pod's memory: the pod would be killed at every start."""
        need, limit = dram_bytes(config), memory_share_mib(server, server.cores) * 2**20
        if need > limit:
            fits = floor_2_digits(self.scale * limit / need)
            raise RecserveError(
                f"{app} ({group.kind} on {group.server}: {', '.join(group.qps)}): its node holds "
                f"{need / 2**30:,.1f} GiB of embedding tables in DRAM (the node builds fp32 tables; the plan counts "
                f"the catalogue's bytes a value), more than the {limit / 2**30:,.1f} GiB a {group.server} pod has; "
                f"deploy at --scale {fits:g} or less, or put more tables on SSD")

    def group_objects(self, fitted: FittedGroup) -> list[dict[str, Any]]:
        """The group's ConfigMap and Deployment, and an HPA where its models' traces let it shrink (which then
        owns the Deployment's replicas: none are set, so `kubectl apply` never resets its scale)."""
        group, app, config = fitted.group, fitted.app, fitted.config
        labels = {**labels_of(app, server=group.server), FLEET_LABEL: self.name,
                  **{serves_label(m): "true" for m in group.qps}}
        pod = self.pod(group, app, labels, config, fitted.cpus, get_server(group.server))
        deployment = workload("Deployment", app, labels, fitted.count, pod)
        deployment["spec"]["strategy"] = {"type": "RollingUpdate",  # one pod per node: no spare node to surge on
                                          "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
        objects = [config_map(app, labels, "node.yaml", config), deployment]
        floor = self.trace_floor(group, fitted.count)
        if floor < fitted.count:
            del deployment["spec"]["replicas"]
            objects.append(self.autoscaler(app, labels, floor, fitted.count,
                                           fitted.share * sum(group.qps.values())))
        return objects

    def pod(self, group: FleetGroup, app: str, labels: dict[str, str], config: dict[str, Any], cpus: int,
            server: Any) -> dict[str, Any]:
        ways = ",".join(f"{m}={a['ways']}" for m, a in group.alloc.items() if a.get("ways") is not None)
        # a changed node config changes the pod template, so `kubectl apply` rolls the pods onto it
        annotations = {"recserve/node-config-sha256": hashlib.sha256(yaml.safe_dump(config).encode()).hexdigest()}
        if ways:
            annotations["recserve/llc-ways"] = ways
        gpus = 1 if any("accelerator" in m for m in config["models"]) else 0  # the models share the server's one
        resources = guaranteed_resources(cpus, memory_share_mib(server, server.cores), gpus)
        pod = node_server_pod(labels, self.image, app, resources, group.server, annotations)
        spec = pod["spec"]
        container = spec["containers"][0]
        for probe, path, timing in (("readinessProbe", "/v2/health/ready", READINESS),
                                    ("livenessProbe", "/v2/health/live", LIVENESS),
                                    ("startupProbe", "/v2/health/live", STARTUP)):
            container[probe] = {"httpGet": {"path": path, "port": HTTP_PORT}, **timing}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {FLEET_LABEL: self.name}}, "topologyKey": HOSTNAME_KEY}]}}
        gib = tier_gib(config)
        if gib:
            spec["volumes"].append({"name": "tiers", "emptyDir": {"sizeLimit": f"{gib}Gi"}})
            container["volumeMounts"].append({"name": "tiers", "mountPath": TIERS_DIR})
            for amount in container["resources"].values():  # the tier files and the container's own logs
                amount["ephemeral-storage"] = f"{gib + 1}Gi"
        return pod

    def trace_floor(self, group: FleetGroup, count: int) -> int:
        """Of ``count`` pods, those the lowest step of the group's models' traces needs (each model's share of its
        peak; a model without a trace stays at its peak)."""
        inputs = self.plan.inputs.get("models") or {}
        share = 0.0
        for m in group.qps:
            trace = (inputs.get(m) or {}).get("trace") or []
            share = max(share, min(trace) / max(trace) if trace and max(trace) > 0 else 1.0)
        return max(1, math.ceil(count * share - 1e-9))

    def autoscaler(self, app: str, labels: dict[str, str], floor: int, peak: int, unit_qps: float) -> dict[str, Any]:
        scaler = hpa(app, labels, QPS_METRIC, HPA_TARGET_FRACTION * unit_qps, floor, peak)
        scaler["spec"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S}}
        return scaler

    def service_name(self, model: str) -> str:
        return dns_name(self.name, dns_part(served_name(model)))

    def model_service(self, model: str) -> dict[str, Any]:
        name = self.service_name(model)
        selector = {FLEET_LABEL: self.name, serves_label(model): "true"}
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "labels": labels_of(name, model=dns_part(served_name(model)))},
                "spec": {"selector": selector, "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT},
                                                         {"name": "grpc", "port": GRPC_PORT,
                                                          "targetPort": GRPC_PORT}]}}


def fleet_manifests(plan: FleetPlan, image: str, scale: float, name: str) -> list[dict[str, Any]]:
    """Every object of a fleet plan (the ``plan_manifests`` builder); notes: :class:`FleetManifests`."""
    return FleetManifests(plan, image, scale, name).build()

