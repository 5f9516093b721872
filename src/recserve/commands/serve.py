"""``recserve serve``: run a node inference server (Open Inference Protocol over HTTP and gRPC)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from recserve.commands._plan_common import count, number
from recserve.errors import RecserveError

if TYPE_CHECKING:
    from recserve.serving.node.config import NodeConfig

PORT = number(0, 65535, integer=True)
LOG_LEVELS = ("debug", "info", "warning", "error")


def _distinct_ports(args: argparse.Namespace, config: NodeConfig) -> None:
    """HTTP and gRPC given one port: refused before anything starts, not as gRPC's bind failure once HTTP holds it.
    Port 0 (any free port) is allowed for both: each gets its own."""
    if not config.http_port or config.http_port != config.grpc_port:
        return

    def source(flag: str, field: str, given: int | None) -> str:
        if given is not None:
            return flag
        return f"{field} of {args.config}" if args.config else f"{flag} (default)"

    raise RecserveError(f"{source('--http-port', 'http_port', args.http_port)} and "
                        f"{source('--grpc-port', 'grpc_port', args.grpc_port)} are the same port ({config.http_port}); "
                        "give each its own (0 = any free port)")


def _set_log_level(name: str) -> None:
    """The node's log level: the server process's lines at ``name`` and above; its workers (forkserver children,
    which inherit the environment) log warnings and above, errors only at ``error``."""
    from recserve.logs import log_to_stderr
    from recserve.serving.worker.main import LOG_LEVEL_ENV

    level = getattr(logging, name.upper())
    log_to_stderr(level, "%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("recserve").setLevel(level)
    os.environ[LOG_LEVEL_ENV] = name.upper()


def cmd_serve(args: argparse.Namespace) -> int:
    from recserve.serving import NodeServer, load_config, quick_config
    from recserve.serving.node.config import NodeConfig
    from recserve.serving.node.control_api import TOKEN_ENV, check_exposure

    if sum(map(bool, (args.config, args.model, args.repository))) != 1 and not (args.config and args.repository):
        raise RecserveError("serve: give --config NODE.yaml, --model NAME or --repository REPO")
    if args.config:
        from recserve.deploy.nodeconfig import resolve_tier_plans
        from recserve.jsonio import refuse_plan

        refuse_plan(args.config, "a node config")
        config = resolve_tier_plans(load_config(args.config))
        config.repository = args.repository or config.repository
        if args.http_port is not None:
            config.http_port = args.http_port
        if args.grpc_port is not None:
            config.grpc_port = args.grpc_port
    elif args.repository:
        config = NodeConfig(models=[], repository=args.repository,
                            http_port=8000 if args.http_port is None else args.http_port,
                            grpc_port=8001 if args.grpc_port is None else args.grpc_port)
    else:
        config = quick_config(args.model, scale=args.scale, workers=args.workers,
                              http_port=8000 if args.http_port is None else args.http_port,
                              grpc_port=8001 if args.grpc_port is None else args.grpc_port,
                              threads=args.threads, sub_batch=args.sub_batch, mode=args.mode,
                              share_tables=not args.copy_tables, fuse_tables=not args.per_table)
    _distinct_ports(args, config)
    if args.host:
        config.host = args.host
    if args.no_strict_readiness:
        config.strict_readiness = False
    if args.exit_on_error:
        config.exit_on_error = True
    config.control_token = os.environ.get(TOKEN_ENV) or config.control_token
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise RecserveError("--tls-cert and --tls-key go together")
        config.tls_cert, config.tls_key, config.front_end = args.tls_cert, args.tls_key, "server"
    if config.tls_cert:
        print("recserve serve: TLS on HTTP and gRPC (one front-end process: front_end server)", file=sys.stderr)
    print(f"recserve serve: {check_exposure(config.host, config.control_token)}", file=sys.stderr, flush=True)
    _set_log_level(args.log_level)
    NodeServer(config).run_forever()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a node inference server (KServe v2 / Triton protocol, HTTP + gRPC)",
                       description="Run a node inference server: the models of a node config, one catalogue model "
                                   "(--model) or a model repository, served over HTTP and gRPC (KServe v2 / Triton "
                                   "protocol) until Ctrl-C, SIGTERM or SIGHUP, which drain in-flight queries and stop.")
    p.add_argument("--config", help="node config YAML (see examples/node-*.yaml)")
    p.add_argument("--model", help="quick form: serve one catalogue model")
    p.add_argument("--repository", help="a model repository (REPO/<model>/config.yaml, REPO/<model>/<version>/...): "
                                        "load its models (with --config: beside the config's models)")
    p.add_argument("--no-strict-readiness", action="store_true",
                   help="ready even while a repository model failed to load (default: not ready until it loads or "
                        "is unloaded, as Triton's --strict-readiness)")
    p.add_argument("--exit-on-error", action="store_true",
                   help="stop and exit with the reasons when a model fails to load at start (Triton's "
                        "--exit-on-error; default: serve the rest, not ready while strict readiness holds)")
    p.add_argument("--scale", type=number(0, 1, low_open=True), default=1e-3, help="table-row scale for --model")
    p.add_argument("--workers", type=count, default=1,
                   help="worker processes for --model (pipeline mode: its dense workers; default %(default)s)")
    p.add_argument("--threads", type=count, default=1, help="torch threads per worker")
    p.add_argument("--sub-batch", type=number(0, integer=True), default=0,
                   help="split queries into parts of this many items")
    p.add_argument("--mode", choices=("model", "pipeline"), default="model",
                   help="how --model runs: model = each worker runs the whole model; pipeline = a sparse worker "
                        "(embedding lookups) feeds the dense workers (default %(default)s)")
    p.add_argument("--copy-tables", action="store_true", help="each worker builds its own tables")
    p.add_argument("--per-table", action="store_true",
                   help="pool each table with its own lookup (default: all tables of one width in one lookup)")
    p.add_argument("--host", default=None,
                   help="bind address (default 127.0.0.1; any other needs RECSERVE_CONTROL_TOKEN)")
    p.add_argument("--http-port", type=PORT, default=None, help="0 = any free port (default 8000 / config)")
    p.add_argument("--grpc-port", type=PORT, default=None, help="0 = any free port (default 8001 / config)")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info",
                   help="the server process's log lines at this level and above (default %(default)s); its "
                        "workers log warnings and errors (only errors at error)")
    p.add_argument("--tls-cert", metavar="PEM", help="certificate chain: serve HTTPS and gRPC over TLS")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    p.set_defaults(func=cmd_serve)
