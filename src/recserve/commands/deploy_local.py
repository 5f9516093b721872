"""``recserve deploy local``: a fleet plan's servers as node servers on this host's cores.

Example::

    recserve plan fleet --spec examples/fleet.yaml --out fleet.json
    recserve deploy local --plan fleet.json --seconds 60            # up for a minute, then stopped
    recserve deploy local --plan fleet.json --dry-run --dir out/fl  # only write the node configs

One node server per planned server group (a Hercules-configured model, a Hera pair, an SDM-tiered model), its
workers scaled to this host's cores and pinned round robin, tables scaled by ``--scale``; the endpoints of every
model are printed and written to ``DIR/endpoints.json``.  A fleet router in front of them (``--router-port``)
takes every model's queries on one URL and dispatches each to a node serving it (Kairos' policy, a few slots
per worker); ``DIR/router-endpoints.json`` names it for ``recserve verify --target``.  Runs until Ctrl-C (or
``--seconds``), then stops the router and the node servers it started; SIGTERM (`kill PID`) and SIGHUP (its
terminal closed) stop them as Ctrl-C does, and a node server stops by itself when this command is killed outright.
A node server that exits meanwhile is started again on its ports (``--max-restarts`` times at most; one more exit
stops them all).
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
from pathlib import Path
from typing import Any

import yaml

from recserve.commands._plan_common import core_list, non_negative, non_negative_int, number, port, progress
from recserve.errors import RecserveError


def run(args: argparse.Namespace) -> int:
    from recserve.deploy.local_fleet import fleet_node_configs, keep_nodes, load_fleet_plan, start_nodes, stop_nodes

    plan = load_fleet_plan(args.plan)
    workdir = Path(args.dir)
    configs, notes = fleet_node_configs(plan, scale=args.scale, cores=args.cores, tier_dir=workdir / "tiers")
    lock = _hold(workdir)  # held until this process ends: its nodes restart from the configs it wrote there
    for n in notes:
        progress(f"note: {n}")
    if args.dry_run:
        _write_node_configs(configs, workdir)
        return 0
    _check_this_host(configs)
    if not args.no_router:
        _check_port_free(args.router_port)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # SIGINT too: a shell's background job ignores it
        signal.signal(sig, _stop)
    nodes = start_nodes(configs, workdir, progress=progress)
    router = None
    try:
        endpoints = _write_endpoints(nodes, workdir)
        if not args.no_router:
            router = _start_router(plan, nodes, configs, args.router_port)
            _write_router_endpoints(router, endpoints, workdir)
        progress(f"wrote {workdir / 'endpoints.json'}; " + (f"stopping in {args.seconds:g} s" if args.seconds
                                                             else "Ctrl-C stops every node"))
        keep_nodes(nodes, args.seconds or None, args.max_restarts, progress=progress)
    except KeyboardInterrupt:
        pass
    finally:
        if router is not None:
            router.stop()
        stop_nodes(nodes)
        lock.close()
        _note_tier_files(workdir / "tiers")
    return 0


def _stop(signum: int, frame: object) -> None:
    """`kill PID` or a closed terminal stops the nodes, as Ctrl-C does."""
    raise KeyboardInterrupt


def _write_node_configs(configs: list[dict[str, Any]], workdir: Path) -> None:
    """``--dry-run``: each node's config as ``node<i>.yaml``, and a line naming its group and models."""
    for i, cfg in enumerate(configs):
        path = workdir / f"node{i}.yaml"
        path.write_text(yaml.safe_dump({k: v for k, v in cfg.items() if not k.startswith("_")}, sort_keys=False))
        print(f"{path}: {cfg['_group']}: " + ", ".join(f"{m['name']} x{m['workers']}" for m in cfg["models"]))


def _write_endpoints(nodes: list[Any], workdir: Path) -> dict[str, list[str]]:
    """Each model's node URLs, written to ``endpoints.json`` and printed as inference URLs; returned."""
    endpoints: dict[str, list[str]] = {}
    served: dict[str, str] = {}
    for node in nodes:
        for m in node.models:
            endpoints.setdefault(m, []).append(node.url)
            served[m] = node.served.get(m, m)
    (workdir / "endpoints.json").write_text(json.dumps(endpoints, indent=1))
    for m, urls in endpoints.items():
        print(f"{m}: {' '.join(f'{u}/v2/models/{served[m]}/infer' for u in urls)}")
    return endpoints


def _write_router_endpoints(router: Any, endpoints: dict[str, list[str]], workdir: Path) -> None:
    """Every model at the router's URL, in ``router-endpoints.json``."""
    (workdir / "router-endpoints.json").write_text(json.dumps({m: [router.url] for m in endpoints}, indent=1))
    print(f"router: {router.url}/v2/models/<model>/infer for every model ({workdir / 'router-endpoints.json'})")


def _note_tier_files(tiers: Path) -> None:
    """Say where the SSD-tier files the nodes wrote stay (they are not removed: a large model's are gigabytes)."""
    files = [f for f in tiers.rglob("*") if f.is_file()] if tiers.is_dir() else []
    if files:
        size, count = sum(f.stat().st_size for f in files), f"{len(files)} file" + ("s" if len(files) > 1 else "")
        progress(f"SSD-tier files kept in {tiers} ({size / 2**20:,.0f} MiB in {count}): remove the folder when you "
                 "no longer deploy there")


def _hold(workdir: Path) -> Any:
    """Take ``workdir`` for this command (an exclusive lock on ``DIR/.deploy.lock``, released when the process ends
    however it ends): another ``deploy local`` there would overwrite the node configs this one's nodes restart from."""
    import fcntl
    import os

    workdir.mkdir(parents=True, exist_ok=True)
    lock = open(workdir / ".deploy.lock", "a+")  # noqa: SIM115 (held open for the command's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        lock.close()
        raise RecserveError(f"{workdir} is in use by another `recserve deploy local` (pid {holder}); give another "
                            "--dir, or stop that one first") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def _check_this_host(configs: list[dict[str, Any]]) -> None:
    """Every node config is one this host can run (its devices, its cores), checked before any node starts: a
    plan's GPU group on a host without one is one line naming the group, not a node that exits at start."""
    from recserve.errors import SpecError
    from recserve.serving.node.config import config_from_dict

    for i, cfg in enumerate(configs):
        try:
            config_from_dict({k: v for k, v in cfg.items() if not k.startswith("_")}, f"node {i}")
        except SpecError as exc:
            raise RecserveError(f"this host cannot run the plan's {cfg['_group']}: {exc}") from None
    _check_memory(configs)


def _check_memory(configs: list[dict[str, Any]]) -> None:
    """Refuse nodes whose tables together cannot fit this host's memory (each would be killed, or swap)."""
    from recserve.deploy.local_fleet import dram_bytes
    from recserve.hostinfo import memory_mb

    need, have = sum(dram_bytes(cfg) for cfg in configs), memory_mb()
    if have is not None and need > have * 2**20:
        raise RecserveError(f"the plan's nodes hold {need / 2**30:,.1f} GiB of embedding tables in DRAM (fp32), more "
                            f"than this host's {have / 1024:,.1f} GiB; give a smaller --scale")


def _check_port_free(port: int) -> None:
    """Refuse a taken ``--router-port`` before any node starts (0: a free one is picked later)."""
    if port == 0:
        return
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the router's listener does
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise RecserveError(f"--router-port {port}: {exc.strerror or exc}; give another port (0 picks a free "
                                "one) or --no-router") from exc


def _start_router(plan: Any, nodes: list[Any], configs: list[dict[str, Any]], port: int) -> Any:
    """A fleet router on ``port`` (0: a free one) over the started nodes, each model's SLA its policy's target."""
    from recserve.policies.fleet_router import FleetRouter, fleet_routes
    from recserve.policies.router import RouterThread

    thread = RouterThread(FleetRouter(fleet_routes(plan, nodes, configs)), port=port)
    thread.start()
    return thread


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("local", help="a fleet plan's server groups as node servers on this host",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, metavar="JSON", help="`recserve plan fleet --out` file")
    p.add_argument("--scale", type=number(0, 1, low_open=True), default=1e-3, help="table-row scale (default 1e-3)")
    p.add_argument("--cores", type=core_list,
                   help="the core ids to share out, e.g. 0-3 or 0,2,4 (default: every core this process may use)")
    p.add_argument("--dir", default="out/fleet-local", help="node configs, logs, tier files, endpoints.json")
    p.add_argument("--seconds", type=non_negative, default=0, help="stop after this long (0 = until Ctrl-C)")
    p.add_argument("--dry-run", action="store_true", help="write the node configs and exit")
    p.add_argument("--router-port", type=port, default=0, help="the fleet router's port (default: a free one)")
    p.add_argument("--no-router", action="store_true", help="start the node servers only")
    p.add_argument("--max-restarts", type=non_negative_int, default=3,
                   help="times within 10 minutes a node server that exits is started again before every node "
                        "is stopped (default 3; 0: stop at the first exit)")
    p.set_defaults(func=run)
