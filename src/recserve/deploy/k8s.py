"""Kubernetes manifests for an ElasticRec deployment: a Deployment, Service and
HorizontalPodAutoscaler per shard (ElasticRec §IV-D).

Sparse shards autoscale on a per-pod ``recserve_shard_qps`` metric with their QPSmax as the
target; the dense shard on ``recserve_p95_latency_ms`` at 65% of the SLA (both served by the
node server's Prometheus /metrics and exposed to the HPA through a custom-metrics adapter).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from recserve.deploy.sharding import ShardLayout
from recserve.errors import RecserveError
from recserve.policies.shard_autoscaler import DENSE_LATENCY_FRACTION

GRPC_PORT = 8001
HTTP_PORT = 8000


MAX_LABEL = 63  # a DNS label's (and a label value's) characters
NAME_HASH_CHARS = 6


def name_hash(text: str) -> str:
    """A short stable hash of ``text``: what keeps names apart that sanitising or truncating made alike."""
    return hashlib.sha256(text.encode()).hexdigest()[:NAME_HASH_CHARS]


def dns_name(*parts: str) -> str:
    """A DNS label from parts (``g4dn.xlarge`` -> ``g4dn-xlarge``), at most 63 characters; one cut short ends
    with a hash of the whole, so names that differ past the cut stay distinct."""
    whole = "-".join(parts)
    name = re.sub(r"[^a-z0-9-]+", "-", whole.lower()).strip("-")
    if len(name) <= MAX_LABEL:
        return name
    return f"{name[:MAX_LABEL - NAME_HASH_CHARS - 1].rstrip('-')}-{name_hash(whole)}"


def _labels(layout: ShardLayout, shard: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "recserve", "recserve/model": dns_name(layout.spec.name),
            "recserve/shard": dns_name(shard)}


def _deployment(name: str, labels: dict[str, str], image: str, args: list[str], replicas: int, cpu: str,
                memory_bytes: int) -> dict[str, Any]:
    mem = f"{max(64, memory_bytes // 2**20 + 256)}Mi"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "shard",
                    "image": image,
                    "args": args,
                    "ports": [{"name": "http", "containerPort": HTTP_PORT},
                              {"name": "grpc", "containerPort": GRPC_PORT}],
                    "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
                    "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": HTTP_PORT}},
                    "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": HTTP_PORT}},
                }]},
            },
        },
    }


def _service(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": HTTP_PORT},
                                               {"name": "grpc", "port": GRPC_PORT, "targetPort": GRPC_PORT}]},
    }


def hpa(name: str, labels: dict[str, str], metric: str, target: float, min_replicas: int,
         max_replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": metric},
                "target": {"type": "AverageValue", "averageValue": f"{max(1, round(target * 1000))}m"},
            }}],
        },
    }


def manifests(layout: ShardLayout, image: str = "recserve:latest", qps_max: dict[str, float] | None = None,
              max_replicas: int = 16, cpu: str = "1") -> list[dict[str, Any]]:
    """Every object for ``layout``: dense shard first, then one triple per embedding shard."""
    base = dns_name(layout.spec.name)
    objects: list[dict[str, Any]] = []
    dense = f"{base}-dense"
    labels = _labels(layout, "dense")
    args = ["serve-shard", "--model", layout.spec.name, "--role", "dense", "--scale", str(layout.scale)]
    objects += [_deployment(dense, labels, image, args, layout.dense_replicas, cpu, 0), _service(dense, labels),
                hpa(dense, labels, "recserve_p95_latency_ms", DENSE_LATENCY_FRACTION * layout.sla_ms, 1,
                     max(max_replicas, layout.dense_replicas))]
    for table in layout.tables:
        for s, replicas in enumerate(table.replicas):
            shard = f"{table.name}-s{s}"
            name = dns_name(base, shard)
            labels = _labels(layout, shard)
            rows = table.boundaries[s + 1] - table.boundaries[s]
            nbytes = rows * layout.spec.tables[table.table].row_bytes(layout.spec.bytes_per_elem)
            args = ["serve-shard", "--model", layout.spec.name, "--role", "embedding", "--table", table.name,
                    "--rows", f"{table.boundaries[s]}:{table.boundaries[s + 1]}", "--scale", str(layout.scale)]
            target = (qps_max or {}).get(shard, 100.0)
            objects += [_deployment(name, labels, image, args, replicas, cpu, nbytes), _service(name, labels),
                        hpa(name, labels, "recserve_shard_qps", target, 1, max(max_replicas, replicas))]
    return objects


def write_manifests(objects: list[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plain = json.loads(json.dumps(objects))  # no shared sub-objects, so no YAML anchors in the output
    path.write_text(yaml.safe_dump_all(plain, sort_keys=False))
    return path


def write_manifest_dir(objects: list[dict[str, Any]], directory: str | Path) -> list[tuple[Path, list[str]]]:
    """One multi-document YAML per kind (``deployment.yaml``, ``service.yaml``, ...) in ``directory``, for
    ``kubectl apply -f DIR``; a per-kind file left from an earlier run whose kind is not written now is removed, so
    the directory holds exactly these objects.  Returns (file, object names) per file written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    written = []
    for kind, objs in by_kind.items():
        path = write_manifests(objs, directory / f"{kind.lower()}.yaml")
        written.append((path, [o["metadata"]["name"] for o in objs]))
    for stale in set(KIND_FILES) - {k.lower() for k in by_kind}:
        (directory / f"{stale}.yaml").unlink(missing_ok=True)
    return written


KIND_FILES = ("configmap", "cronjob", "deployment", "horizontalpodautoscaler", "role", "rolebinding", "service",
              "serviceaccount", "statefulset")


DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
NAME_LIMITS = {"Service": 63, "CronJob": 52}  # a CronJob's Jobs add 11 characters; the rest: DNS-1123 subdomains


def name_errors(obj: dict[str, Any]) -> list[str]:
    """What the API schema leaves to the server: the object's name (a Service's a DNS-1035 label, every other a
    DNS-1123 subdomain) and its labels and selectors."""
    kind, name = obj["kind"], obj["metadata"].get("name", "")
    form = DNS_1035 if kind == "Service" else DNS_1123
    errors = []
    if not form.fullmatch(name) or len(name) > NAME_LIMITS.get(kind, 253):
        errors.append(f"{kind}/{name!r}: not a valid name ({'DNS-1035 label' if kind == 'Service' else 'DNS-1123'}"
                      f", at most {NAME_LIMITS.get(kind, 253)} characters)")
    spec = obj.get("spec") or {}
    selector = spec.get("selector") or {}
    for labels in (obj["metadata"].get("labels") or {}, (spec.get("template") or {}).get("metadata", {}).get(
            "labels") or {}, selector.get("matchLabels", selector) if kind != "Service" else selector):
        errors += [f"{kind}/{name}: label {k}={v!r}: {why}" for k, v in labels.items() if (why := label_error(k, v))]
    return errors


def label_error(key: str, value: Any) -> str:
    """Why a label is invalid ('' when valid): a key of an optional DNS-1123 prefix and a name, a value of at
    most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if prefix and (not DNS_1123.fullmatch(prefix) or len(prefix) > 253):
        return "its key's prefix is not a DNS-1123 subdomain"
    if not LABEL_NAME.fullmatch(name) or len(name) > 63:
        return "its key's name is not 1-63 letters, digits, '-', '_' or '.' between letters or digits"
    if not isinstance(value, str) or (value and not LABEL_NAME.fullmatch(value)) or len(value) > 63:
        return "its value is not at most 63 letters, digits, '-', '_' or '.' between letters or digits"
    return ""


def duplicate_errors(objects: list[dict[str, Any]]) -> list[str]:
    """One object per kind and name: `kubectl apply` keeps only the last of several."""
    counts = Counter((o["kind"], o["metadata"].get("name")) for o in objects)
    return [f"{kind}/{name}: {n} objects have this name" for (kind, name), n in counts.items() if n > 1]


def validate(objects: list[dict[str, Any]], version: str = "1.30.0") -> list[str]:
    """Validate each object against the Kubernetes API schema (kubernetes-validate, strict), its name and labels,
    and that no two objects of a kind share a name; returns the errors, empty when all objects are valid."""
    import kubernetes_validate
    from kubernetes_validate.utils import VersionNotSupportedError

    errors = []
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
        except VersionNotSupportedError:
            known = sorted(set(kubernetes_validate.utils.all_versions()), key=lambda v: tuple(map(int, v.split("."))))
            raise RecserveError(f"Kubernetes version {version!r} has no API schema here; known: {known[0]} to "
                                f"{known[-1]} (--k8s-version)") from None
        errors += name_errors(obj)
    return errors + duplicate_errors(objects)
