"""``recserve shards serve``: a model as ElasticRec shards on this host (embedding-shard gRPC replicas +
a dense-shard node server speaking the Open Inference Protocol); Ctrl-C stops everything."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from recserve.commands._plan_common import count, fraction, non_negative, non_negative_int, port, positive, seed
from recserve.errors import RecserveError

WATCH_S = 0.5  # how often the replicas are looked at: one that died is restarted
MAX_REPLICAS = 64  # replicas of one shard on this host (each a process)


def _replicas(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise RecserveError(f"--replicas must be comma-separated integers, got {text!r}") from exc
    if not values or any(v < 1 or v > MAX_REPLICAS for v in values):
        raise RecserveError(f"--replicas values must be between 1 and {MAX_REPLICAS}, got {text!r}")
    return values


def cmd_serve(args: argparse.Namespace) -> int:
    stop = threading.Event()  # handlers first: a Ctrl-C during start-up must not leave processes behind
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    from recserve.deploy.local_shards import make_layout, plan_from_json, plan_replicas, service_rates, start_sharded
    from recserve.specs import first_tables, get_model
    from recserve.zoo import build

    spec = get_model(args.model)
    if args.max_tables > len(spec.tables):
        raise RecserveError(f"--max-tables {args.max_tables}: {spec.name} has {len(spec.tables)} tables")
    if args.max_tables:
        spec = first_tables(spec, args.max_tables)
    plan = plan_from_json(args.plan) if args.plan else None
    if plan is not None and plan.model != spec.name:
        raise RecserveError(f"{args.plan}: a shard plan for {plan.model!r}, not {spec.name!r} (--model "
                            f"{args.model}{f' --max-tables {args.max_tables}' if args.max_tables else ''})")
    print(f"[shards] hotness from {args.warmup} warm-up queries (locality P={args.locality:g}) ...", file=sys.stderr)
    model = build(spec, scale=args.scale, seed=args.seed)
    layout = make_layout(spec, args.scale, seed=args.seed, plan=plan, shards_per_table=args.shards_per_table,
                         replicas=_replicas(args.replicas), dense_replicas=args.dense_replicas,
                         warmup_queries=args.warmup, locality=args.locality, model=model)
    if args.target_qps:
        rates = service_rates(model, layout, locality=args.locality)
        dense, modelwise = plan_replicas(layout, rates, args.target_qps)
        print("[shards] measured queries/s per worker: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()),
              file=sys.stderr)
        print(f"[shards] for {args.target_qps:g} QPS: dense x{dense} (model-wise replication would need "
              f"x{modelwise} whole-model replicas)", file=sys.stderr)
    for t in layout.tables:
        shards = ", ".join(f"[{a}:{b}) x{r}" for a, b, r in zip(t.boundaries[:-1], t.boundaries[1:], t.replicas,
                                                                strict=True))
        print(f"[shards] {t.name}: {shards}", file=sys.stderr)
    if stop.is_set():
        return 130
    deployment = start_sharded(layout, http_port=args.http_port, grpc_port=args.grpc_port, host=args.host,
                               timeout_s=args.timeout, model=model)
    del model
    print(f"recserve shards: {deployment.model_name} on http://{args.host}:{deployment.ports.http} "
          f"grpc {args.host}:{deployment.ports.grpc}; Ctrl-C to stop", file=sys.stderr, flush=True)
    try:
        while not stop.wait(WATCH_S):
            deployment.restart_dead()
    finally:
        print("recserve shards: stopping", file=sys.stderr, flush=True)
        deployment.stop()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("shards", help="serve a model as ElasticRec embedding + dense shards on this host")
    actions = parser.add_subparsers(dest="shards_action", metavar="ACTION", required=True)
    p = actions.add_parser("serve", help="start embedding-shard replicas and the dense shard on loopback")
    p.add_argument("--model", required=True, help="catalogue model (or <name>@tables=K)")
    p.add_argument("--scale", type=positive, default=1e-3, help="table-row scale for this host")
    p.add_argument("--max-tables", type=non_negative_int, default=0,
                   help="keep only the first N tables (small hosts; 0: all)")
    p.add_argument("--plan", default=None, help="`recserve plan shard --json` output (boundaries, replicas)")
    p.add_argument("--shards-per-table", type=count, default=2, help="without --plan: hot shard + even cold shards")
    p.add_argument("--replicas", default=None, help="replicas per shard position, e.g. 2,1 (overrides the plan)")
    p.add_argument("--target-qps", type=non_negative, default=0.0,
                   help="set every shard's replicas to ceil(target / its measured rate) (ElasticRec Alg. 1)")
    p.add_argument("--dense-replicas", type=count, default=None, help="dense-shard workers (default: plan or 1)")
    p.add_argument("--locality", type=fraction, default=0.9, help="warm-up sample: share of lookups on hottest 10%%")
    p.add_argument("--warmup", type=count, default=50, help="warm-up queries for the hotness order")
    p.add_argument("--seed", type=seed, default=0, help="seed of the tables' values and the warm-up sample")
    p.add_argument("--timeout", type=positive, default=10.0, help="deadline of each embedding-shard call (s)")
    p.add_argument("--host", default="127.0.0.1", help="bind address of the dense shard")
    p.add_argument("--http-port", type=port, default=8000, help="0 = any free port")
    p.add_argument("--grpc-port", type=port, default=8001, help="0 = any free port")
    p.set_defaults(func=cmd_serve)
