"""``recserve plan shard``: ElasticRec partitioning of a model's tables into hot/cold shards and
the replicas each needs for a target QPS, vs model-wise replication."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from recserve.commands._plan_common import count, non_negative, number, qps
from recserve.errors import ProfileError
from recserve.measure.plot import pyplot
from recserve.planners.elasticrec import (
    LOCALITY_MODELS,
    MEASURED_REPLICA_BYTES,
    PAPER_DP_TARGET_QPS,
    cost_model_from_perfmodel,
    cost_model_from_profiles,
    evaluate_plan,
    plan_shards,
)
from recserve.planners.plan import ShardPlan
from recserve.profiles import ProfileSet
from recserve.sim.shards import simulate_plan_latency
from recserve.specs import get_model, get_server

MAX_GRID = 2048
MAX_SHARDS = 64


def plot_plan(plan: ShardPlan, path: str | Path) -> Path:
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    first = plan.tables[0]
    labels = [f"S{i + 1}\n{b - a:,} rows" for i, (a, b) in enumerate(zip(first.boundaries[:-1], first.boundaries[1:],
                                                                         strict=True))]
    left.bar(labels, first.replicas, color="tab:red")
    left.set_ylabel("replicas")
    left.set_title(f"{plan.model} table {first.table}: shards (hot → cold)")
    right.bar(["model-wise", "ElasticRec"], [plan.modelwise_memory_bytes / 2**30, plan.memory_bytes / 2**30],
              color=["tab:gray", "tab:blue"])
    right.set_ylabel("memory allocated (GiB)")
    right.set_title(f"{plan.target_qps:g} QPS: {plan.saving:.2f}x less memory")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def evaluation_text(ev) -> str:
    util = ", ".join(f"S{i + 1} {100 * u:.1f}%" for i, u in enumerate(ev.utility_shards))
    cost = (f", ${ev.cost_per_hr:.2f}/hr vs ${ev.cost_per_hr_modelwise:.2f}/hr" if ev.cost_per_hr is not None else "")
    return (f"  memory utility (first table, 1000 queries): {util}; model-wise {100 * ev.utility_modelwise:.1f}% "
            f"({ev.utility_gain:.2f}x)\n"
            f"  servers: {ev.servers} vs model-wise {ev.servers_modelwise} ({ev.server_saving:.2f}x){cost}\n"
            f"  p95 estimate: {ev.p95_ms:.1f} ms (incl. {ev.rpc_ms:g} ms RPC) vs model-wise {ev.p95_ms_modelwise:.1f} "
            f"ms; SLA {ev.sla_ms:g} ms: {'met' if ev.sla_ok else 'VIOLATED'}")


def cmd_shard(args: argparse.Namespace) -> int:
    spec = get_model(args.model)
    server = get_server(args.server)
    if args.profiles:
        cost = cost_model_from_profiles(ProfileSet.load(args.profiles), spec, server.name, args.batch,
                                        args.min_mem_mb * 2**20)
    else:
        try:
            cost = cost_model_from_perfmodel(spec, server, args.batch, min_mem_bytes=args.min_mem_mb * 2**20)
        except ImportError as exc:
            raise ProfileError("no --profiles given and the perfmodel is unavailable") from exc
    start = time.perf_counter()
    plan = plan_shards(spec, args.qps, cost, batch=args.batch, locality=args.locality, max_shards=args.max_shards,
                       grid=args.grid, locality_model=args.locality_model,
                       paper_dp_rule=args.paper_dp_constant,
                       size_for_sla=not args.saturation_sizing, rpc_ms=args.rpc_ms)
    print(plan.table_text())
    evaluation = evaluate_plan(plan, spec, cost, server, locality=args.locality, locality_model=args.locality_model,
                               rpc_ms=args.rpc_ms, sockets=args.node_sockets)
    print(evaluation_text(evaluation))
    simulated = simulate_plan_latency(plan, spec, cost, rpc_ms=args.rpc_ms)
    print(f"  p{simulated.percentile:g} simulated (a minute of Poisson queries through every replica queue): "
          f"{simulated.sharded_ms:.1f} ms vs model-wise {simulated.modelwise_ms:.1f} ms; "
          f"SLA {spec.sla.target_ms:g} ms: "
          f"{'met' if simulated.within(spec.sla.target_ms) else 'VIOLATED'}")
    print(f"(partitioned {len(spec.tables)} tables in {time.perf_counter() - start:.2f} s; cost model: "
          f"{cost.source}, gather {cost.gather_ms0:.3f} ms + {cost.gather_ms_per_row * 1e3:.3f} us/row, "
          f"dense {cost.dense_qps:.0f} QPS/replica)", file=sys.stderr)
    if args.json:
        plan.server = server.name
        plan.inputs = {"model": spec.name, "qps": args.qps, "server": server.name, "cost_model": cost.__dict__}
        plan.summary["evaluation"] = evaluation.to_dict()
        plan.summary["simulated_latency"] = asdict(simulated)
        plan.save(args.json)
    if args.plot:
        plot_plan(plan, args.plot)
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("shard", help="ElasticRec: split tables into hot/cold shards with per-shard replicas")
    p.add_argument("--model", required=True, help="catalogue model, or a repository model's path REPO/<model>")
    p.add_argument("--qps", type=qps, required=True, help="target queries per second")
    p.add_argument("--server", default="hera-xeon", help="server type the shards run on")
    p.add_argument("--profiles", default=None, help="Profile file with gather_qps and dense latency tables "
                                                    "(default: the calibrated perfmodel)")
    p.add_argument("--batch", type=count, default=32, help="items per query (ElasticRec uses 32)")
    p.add_argument("--locality", type=number(0.1, 1), default=0.9,
                   help="share of accesses on the hottest 10%% of rows, in [0.1, 1] (0.1: uniform access)")
    p.add_argument("--max-shards", type=number(1, MAX_SHARDS, integer=True), default=16,
                   help="most shards per table the DP considers (one DP level each)")
    p.add_argument("--grid", type=number(2, MAX_GRID, integer=True), default=512,
                   help="boundary candidates per table for the DP (its arrays hold (3 x grid)^2 cells: ~3 GB at "
                        f"the largest, {MAX_GRID})")
    p.add_argument("--locality-model", choices=LOCALITY_MODELS, default="two-level",
                   help="access CDF with the given locality: hot/cold uniform groups, or Zipf")
    p.add_argument("--paper-dp-constant", action="store_true",
                   help=f"partition at the paper's constant {PAPER_DP_TARGET_QPS:g} QPS (raised per table to twice an "
                        "unsplit replica's rate where one replica would take it, as the paper's condition asks), "
                        "size replicas for --qps")
    p.add_argument("--rpc-ms", type=non_negative, default=2.0,
                   help="latency per shard call: taken from the gathers' SLA budget and added in the SLA check "
                        "(2 ms: a gRPC hop on one host; the paper measured 31 ms on its Kubernetes cluster)")
    p.add_argument("--node-sockets", type=count, default=1,
                   help="servers are packed as nodes of this many sockets of --server (ElasticRec's: 2)")
    p.add_argument("--saturation-sizing", action="store_true",
                   help="size replicas to each one's saturation rate (the DP's QPS(x)) instead of its QPSmax within "
                        "the SLA budget (dense shard 65%% of the SLA)")
    p.add_argument("--min-mem-mb", type=non_negative, default=MEASURED_REPLICA_BYTES / 2**20,
                   help="fixed memory per replica (code, buffers; default: ~30 MB measured per replica process)")
    p.add_argument("--json", default=None, help="write the plan as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of shard replicas and memory")
    p.set_defaults(func=cmd_shard)
