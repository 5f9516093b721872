"""``recserve deploy k8s``: Kubernetes manifests (Deployment, Service, HPA per shard) for an
ElasticRec plan, validated against the Kubernetes API schema before they are written."""

from __future__ import annotations

import argparse
import sys

from recserve.commands._plan_common import count, fraction, qps
from recserve.errors import RecserveError
from recserve.specs import get_model, get_server


def cmd_k8s(args: argparse.Namespace) -> int:
    from recserve.deploy.k8s import manifests, validate, write_manifests
    from recserve.deploy.sharding import layout_for_export
    from recserve.planners.elasticrec import cost_model_from_perfmodel, plan_shards

    spec = get_model(args.model)
    cost = cost_model_from_perfmodel(spec, get_server(args.server), args.batch)
    plan = plan_shards(spec, args.qps, cost, batch=args.batch, locality=args.locality)
    layout = layout_for_export(plan, spec)
    qps_max = {}
    for table, shards in zip(layout.tables, plan.tables, strict=True):
        for s, gathered in enumerate(shards.rows_gathered):
            qps_max[f"{table.name}-s{s}"] = float(cost.gather_qps(gathered))
    objects = manifests(layout, image=args.image, qps_max=qps_max, max_replicas=args.max_replicas)
    errors = validate(objects, args.k8s_version)
    if errors:
        raise RecserveError("generated manifests do not validate: " + "; ".join(errors[:3]))
    path = write_manifests(objects, args.out)
    print(f"wrote {len(objects)} objects ({len(layout.shard_names())} embedding shards + dense) to {path}; "
          f"valid for Kubernetes {args.k8s_version}", file=sys.stderr)
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("k8s", help="write Kubernetes manifests (Deployment/Service/HPA per ElasticRec shard)")
    p.add_argument("--model", required=True)
    p.add_argument("--qps", type=qps, required=True, help="target QPS the initial replicas are sized for")
    p.add_argument("--server", default="hera-xeon", help="server type the pods run on (for the cost model)")
    p.add_argument("--batch", type=count, default=32)
    p.add_argument("--locality", type=fraction, default=0.9)
    p.add_argument("--image", default="recserve:latest")
    p.add_argument("--max-replicas", type=count, default=16)
    p.add_argument("--k8s-version", default="1.30.0")
    p.add_argument("--out", default="out/k8s/manifests.yaml")
    p.set_defaults(func=cmd_k8s)
