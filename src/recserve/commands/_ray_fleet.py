"""``recserve deploy ray --plan fleet.json``: a fleet plan's server groups on a Ray cluster.

Example (a two-node cluster on one host, the plan's server types this-host and sdm-hw-ss)::

    recserve deploy ray --plan fleet.json --dry-run                # each type's `ray start` flags
    ray start --head --port 6379 --num-cpus 1 --resources '{"recserve_type_this_host": 2}'
    ray start --address 127.0.0.1:6379 --num-cpus 1 --resources '{"recserve_type_sdm_hw_ss": 1}'
    recserve deploy ray --plan fleet.json --address 127.0.0.1:6379 --dir out/fleet-ray &
    recserve verify --plan fleet.json --target out/fleet-ray/endpoints.json --seconds 10

Each group becomes one Ray Serve application whose replica runs the node server with the node config ``deploy
local`` writes (workers scaled to the CPUs of the cluster's typed nodes), on a node that carries the group's server
type resource (``deploy/ray_fleet.py``).  Writes ``DIR/endpoints.json`` (each model's URLs through Ray's HTTP
proxy), ``DIR/endpoints-direct.json`` (the node servers' own ports) and ``DIR/node*.yaml``; runs until Ctrl-C,
SIGTERM or ``--seconds``; with ``--json`` it comes up, writes the placement there and stops.  Without
``--address`` it starts a one-node Ray carrying every type.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def dry_run(args: argparse.Namespace, plan: Any) -> int:
    import yaml

    from recserve.deploy import ray_fleet

    workdir = Path(args.dir)
    deployments, notes = ray_fleet.fleet_deployments(plan, args.cluster_cpus or os.cpu_count() or 1, args.scale,
                                                     workdir.resolve() / "tiers")
    for n in notes:
        _say(f"note: {n}")
    for server, flags in ray_fleet.start_flags(deployments).items():
        print(f"{server}: ray start {flags}")
    workdir.mkdir(parents=True, exist_ok=True)
    for k, d in enumerate(deployments):
        path = workdir / f"node{k}.yaml"
        path.write_text(yaml.safe_dump(d.config, sort_keys=False))
        print(f"{path}: {d.name}: {d.group} (needs {d.resource}): "
              + ", ".join(f"{m['name']} x{m['workers']}" for m in d.config["models"]))
    return 0


def run(args: argparse.Namespace) -> int:
    from recserve.deploy.local_fleet import load_fleet_plan

    plan = load_fleet_plan(args.plan)
    if args.dry_run:
        return dry_run(args, plan)
    from recserve.commands.deploy_ray import write_report_and_shut_down
    from recserve.deploy import ray_fleet, ray_serve

    ray, _ = ray_serve._require_ray()  # Ray Serve installed, or the one-line error
    tiers = Path(args.dir).resolve() / "tiers"
    wanted, _ = ray_fleet.fleet_deployments(plan, 1, args.scale, tiers)  # only which types, and how many of each
    local = {r: float(n) for flags in ray_fleet.node_resources(wanted).values() for r, n in flags.items()}
    ray_serve.start_ray(args.address, resources=None if args.address else local)
    signal.signal(signal.SIGTERM, _stop)  # after ray.init, which installs its own SIGTERM handler
    report: dict[str, Any] = {"plan": args.plan, "kind": "fleet", "scale": args.scale, "address": args.address}
    try:
        deployments, proxy = _serve(args, plan, ray, wanted, tiers, report)
        _print_routes(deployments, proxy)
        _say(f"wrote {report['endpoints']} (and endpoints-direct.json, node*.yaml beside it); "
             + ("stopping now (--json)" if args.json else f"stopping in {args.seconds:g} s" if args.seconds
                else "Ctrl-C stops it"))
        if not args.json:
            _wait(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        write_report_and_shut_down(args.json, report)
    return 0


def _stop(signum: int, frame: object) -> None:
    """`kill PID` stops the deployment too, as Ctrl-C does."""
    raise KeyboardInterrupt


def _serve(args: argparse.Namespace, plan: Any, ray: Any, wanted: list[Any], tiers: Path,
           report: dict[str, Any]) -> tuple[list[Any], dict[str, str]]:
    """The plan's groups sized to the cluster's typed nodes and served on them; where each runs and the endpoints
    written go into ``report``.  Returns the deployments and each one's proxy URL."""
    from recserve.deploy import ray_fleet

    nodes = ray.nodes()
    ray_fleet.check_cluster(wanted, nodes)
    cpus = ray_fleet.cluster_cpus(wanted, nodes)
    deployments, notes = ray_fleet.fleet_deployments(plan, cpus, args.scale, tiers)
    for n in notes:
        _say(f"note: {n}")
    share = args.cpus or ray_fleet.cpus_per_worker(deployments, nodes)
    _say(f"{len(deployments)} server group(s) onto {cpus} CPU(s) of {len(nodes)} Ray node(s), "
         f"{share:.3g} Ray CPU per worker")
    proxy, where = ray_fleet.serve_fleet(deployments, share, args.http_port)
    report["placement"] = ray_fleet.placement(deployments, where, ray.nodes())
    report["endpoints"] = str(ray_fleet.write_deployment(deployments, Path(args.dir), proxy,
                                                         {n: w["url"] for n, w in where.items()}))
    for name, p in report["placement"].items():
        _say(f"{name} ({p['group']}: {', '.join(p['models'])}): node {p['node_id'][:12]} "
             f"{'carries' if p['as_planned'] else 'does NOT carry'} its type's resource; node server "
             f"{p['node_url']}")
    return deployments, proxy


def _print_routes(deployments: list[Any], proxy: dict[str, str]) -> None:
    """Each model's inference URL through Ray's proxy, one line per deployment serving it."""
    for d in deployments:
        for m in d.models:
            print(f"{m}: {proxy[d.name]}/v2/models/{d.served(m)}/infer")


def _wait(seconds: float | None) -> None:
    """Serve for ``seconds``, or until Ctrl-C (or SIGTERM) where none is given."""
    from recserve.commands.deploy_ray import wait_forever

    time.sleep(seconds) if seconds else wait_forever()
