"""``recserve serve``: run a node inference server (Open Inference Protocol over HTTP and gRPC)."""

from __future__ import annotations

import argparse
import logging

from recserve.errors import RecserveError


def cmd_serve(args: argparse.Namespace) -> int:
    from recserve.serving import NodeServer, load_config, quick_config

    if bool(args.config) == bool(args.model):
        raise RecserveError("serve: give either --config NODE.yaml or --model NAME")
    if args.config:
        from recserve.deploy.nodeconfig import resolve_tier_plans

        config = resolve_tier_plans(load_config(args.config))
        if args.http_port is not None:
            config.http_port = args.http_port
        if args.grpc_port is not None:
            config.grpc_port = args.grpc_port
    else:
        config = quick_config(args.model, scale=args.scale, workers=args.workers,
                              http_port=8000 if args.http_port is None else args.http_port,
                              grpc_port=8001 if args.grpc_port is None else args.grpc_port,
                              threads=args.threads, sub_batch=args.sub_batch, mode=args.mode,
                              share_tables=not args.copy_tables)
    if args.host:
        config.host = args.host
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    NodeServer(config).run_forever()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a node inference server (KServe v2 / Triton protocol, HTTP + gRPC)")
    p.add_argument("--config", help="node config YAML (see examples/node-*.yaml)")
    p.add_argument("--model", help="quick form: serve one catalogue model")
    p.add_argument("--scale", type=float, default=1e-3, help="table-row scale for --model")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--sub-batch", type=int, default=0, help="split queries into parts of this many items")
    p.add_argument("--mode", choices=("model", "pipeline"), default="model")
    p.add_argument("--copy-tables", action="store_true", help="each worker builds its own tables")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=None, help="0 = any free port (default 8000 / config)")
    p.add_argument("--grpc-port", type=int, default=None, help="0 = any free port (default 8001 / config)")
    p.set_defaults(func=cmd_serve)
