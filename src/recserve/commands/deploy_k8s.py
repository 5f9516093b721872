"""``recserve deploy k8s``: Kubernetes manifests for any plan (``--plan PLAN.json``: Hera co-location, Kairos
pool, Hercules provisioning, ElasticRec shards, SDM tiers, a fleet plan), or an ElasticRec plan made on the spot
(``--model --qps``); validated against the Kubernetes API schema (strict) before they are written, to one
multi-document YAML (``--out FILE.yaml``) or one file per kind (``--out DIR``)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from recserve.commands._plan_common import count, fraction, non_negative_int, number, progress, qps
from recserve.errors import RecserveError
from recserve.specs import get_model, get_server


def _shard_plan_now(args: argparse.Namespace):  # noqa: ANN202 - a ShardPlan
    from recserve.planners.elasticrec import cost_model_from_perfmodel, plan_shards

    spec = get_model(args.model)
    cost = cost_model_from_perfmodel(spec, get_server(args.server), args.batch)
    plan = plan_shards(spec, args.qps, cost, batch=args.batch, locality=args.locality)
    plan.server = args.server
    return plan


def _fleet_objects(plan, args: argparse.Namespace) -> list[dict]:  # noqa: ANN001 - a FleetPlan
    from recserve.deploy.k8s_fleet import FleetManifests
    from recserve.deploy.k8s_plans import dns_name

    fleet = FleetManifests(plan, args.image, args.scale, dns_name(args.name or "recserve-fleet"), args.reserved_cpus)
    objects = fleet.build()
    for note in fleet.notes:
        progress(f"note: {note}")
    return objects


def _is_dir(out: str) -> bool:
    return out.endswith("/") or Path(out).is_dir() or Path(out).suffix not in (".yaml", ".yml", ".json")


def cmd_k8s(args: argparse.Namespace) -> int:
    from recserve.deploy.k8s import validate, write_manifest_dir, write_manifests
    from recserve.deploy.k8s_plans import plan_manifests, shard_manifests
    from recserve.planners.plan import Plan

    if bool(args.plan) == bool(args.model):
        raise RecserveError("deploy k8s: give either --plan PLAN.json or --model NAME --qps Q (an ElasticRec plan)")
    if args.plan:
        plan = Plan.load(args.plan)
        if plan.kind == "fleet":
            objects = _fleet_objects(plan, args)
        else:
            objects = plan_manifests(plan, image=args.image, scale=args.scale, name=args.name)
    else:
        if args.qps is None:
            raise RecserveError("deploy k8s --model needs --qps (the target the shard replicas are sized for)")
        plan = _shard_plan_now(args)
        objects = shard_manifests(plan, args.image, 1.0, args.name or "", max_replicas=args.max_replicas)
    errors = validate(objects, args.k8s_version)
    if errors:
        raise RecserveError("generated manifests do not validate: " + "; ".join(errors[:3]))
    if _is_dir(args.out):
        for path, names in write_manifest_dir(objects, args.out):
            print(f"{path}: {', '.join(names)}")
        path = Path(args.out)
    else:
        path = write_manifests(objects, args.out)
    kinds = ", ".join(f"{n} {k}" for k, n in Counter(o["kind"] for o in objects).items())
    print(f"wrote {len(objects)} objects for the {plan.kind} plan ({kinds}) to {path}; "
          f"valid for Kubernetes {args.k8s_version}", file=sys.stderr)
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("k8s", help="write Kubernetes manifests for a plan (colocate, pool, provision, shard, tier, "
                                       "fleet)")
    p.add_argument("--plan", help="a plan JSON from `recserve plan colocate|pool|provision|shard|tier|fleet`")
    p.add_argument("--name", default=None, help="prefix of the object names (default recserve-<plan kind>)")
    p.add_argument("--scale", type=number(0, 1, low_open=True), default=1.0,
                   help="table-row scale of the served models (1 = full size)")
    p.add_argument("--model", help="instead of --plan: plan ElasticRec shards for this model now")
    p.add_argument("--qps", type=qps, help="with --model: target QPS the initial replicas are sized for")
    p.add_argument("--server", default="hera-xeon", help="with --model: server type the pods run on (cost model)")
    p.add_argument("--batch", type=count, default=32,
                   help="with --model: items per query the shard replicas are sized for (default %(default)s)")
    p.add_argument("--locality", type=fraction, default=0.9,
                   help="with --model: share of lookups on the hottest 10%% of rows (default %(default)s)")
    p.add_argument("--image", default="recserve:latest", help="container image of every pod (default %(default)s)")
    p.add_argument("--max-replicas", type=count, default=16,
                   help="with --model: each shard autoscaler's maxReplicas, at least its initial replicas "
                        "(default %(default)s)")
    p.add_argument("--k8s-version", default="1.30.0",
                   help="Kubernetes version whose API schema the manifests are validated against "
                        "(default %(default)s)")
    p.add_argument("--reserved-cpus", type=non_negative_int, default=1,
                   help="fleet plans: cores each node keeps for the kubelet (the static CPU manager needs >= 1); a "
                        "group that fills a server's cores runs on the rest")
    p.add_argument("--out", default="out/k8s/manifests.yaml",
                   help="FILE.yaml (one multi-document YAML) or DIR (one file per kind, for `kubectl apply -f DIR`)")
    p.set_defaults(func=cmd_k8s)
