"""``recserve route --pool pool.yaml``: a live Open Inference Protocol router over several node servers.

It speaks the node server's HTTP protocol (clients, ``recserve bench`` and tritonclient point at it
unchanged) and sends each query to one backend slot chosen by a dispatch policy (Kairos by default;
ribbon, drs, clockwork) that learns each backend type's latency online.  ``GET /router/stats`` shows
per-backend counts and the router's own latency percentiles.  See ``recserve.policies.router`` for
the pool file format.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from recserve.commands._plan_common import port, positive
from recserve.errors import RecserveError


def cmd_route(args: argparse.Namespace) -> int:
    from recserve.jsonio import refuse_plan
    from recserve.policies.router import Router, load_pool

    refuse_plan(args.pool, "a pool file")
    pool = load_pool(args.pool)
    if args.qos_ms:
        pool.qos_ms = args.qos_ms
    router = Router(pool, pool.make_policy(args.policy))
    types, urls = pool.instance_pool()
    banner = (f"recserve route: {router.policy.name} over {len(types)} slots "
              + ", ".join(f"{t}@{u}" for t, u in zip(types, urls, strict=True)) + f" on http://{args.host}:{args.port}")
    asyncio.run(_serve(router, args.host, args.port, banner))
    return 0


async def _serve(router: object, host: str, port: int, banner: str) -> None:
    """Serve until SIGINT or SIGTERM, then stop (queries in flight answered within the front door's grace)."""
    from recserve.policies.front_door import FrontDoor

    door = FrontDoor(router.app(), host, port)  # type: ignore[attr-defined]
    try:  # the banner once the port is held: a taken port is one error line, not a banner and then the error
        await door.start()
    except OSError as exc:  # the port: taken, or an address this host does not have
        raise RecserveError(f"route: cannot listen on {host}:{port}: {exc.strerror or exc}; give another "
                            "--port") from exc
    print(banner, file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await door.stop()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("route", help="live query router (KServe v2 HTTP) dispatching to node servers with a policy",
                       description="Route KServe v2 HTTP queries to the node servers of a pool file, each to the "
                                   "backend slot a dispatch policy picks (GET /router/stats shows counts and "
                                   "latencies).  Runs until Ctrl-C or SIGTERM.")
    p.add_argument("--pool", required=True, help="pool YAML: qos_ms, policy, backends [{url, type, slots, base}]")
    p.add_argument("--policy", help="override the pool file's policy: kairos | ribbon | drs | clockwork")
    p.add_argument("--qos-ms", type=positive, help="override the pool file's QoS target")
    p.add_argument("--host", default="127.0.0.1", help="address the router listens on (default %(default)s)")
    p.add_argument("--port", type=port, default=8000, help="HTTP port the router listens on (default %(default)s)")
    p.set_defaults(func=cmd_route)
