"""Plans on a local multi-node Ray cluster: a Kairos pool routed by the Kairos request router, a Hera plan with
several models on one server, a Hercules provisioning plan and an ElasticRec shard plan.

Steps (everything on 127.0.0.1; both Ray nodes are processes this script starts with ``ray start --block``
and stops by terminating them):

1. plans from the planners: ``recserve plan pool`` (Kairos reference data, two instance types under a small
   budget), ``recserve plan colocate`` (Hera, targets that put two models on one server), ``recserve plan
   provision`` (Hercules, a day alternating hour by hour between two loads on two server types) and ``recserve plan
   shard`` (ElasticRec);
2. a Ray head node posing as the pool's first instance type and the first provisioned server type, and a second
   ``ray start --address`` node as the other two (each advertises ``recserve_slot`` = its planned pool instances
   and its type markers);
3. ``recserve deploy ray --plan pool.json --rate R --seconds S``: scores against the in-process model, a
   Poisson load through Ray's HTTP proxy routed by the Kairos request router (decisions logged), and the
   simulator's prediction for the same pool and trace;
4. ``recserve deploy ray --plan colocate.json``: the Hera plan's servers come up and every model of every server
   answers as the in-process model;
5. ``recserve deploy ray --plan provision.json``: one deployment per (workload, server type) at the count planned
   for the current hour; scores, a short Poisson load through the proxy, and the replicas Ray runs beside the
   autoscaling policy's decision;
6. ``recserve deploy ray --plan shards.json``: the plan's shards (first two tables) at the planned replica counts,
   scores through the dense shard against the monolithic model.

Both node "types" run on this host's cores: the types differ in name and placement, not in hardware, so the
simulator is given this host's measured latency table for every type.

    python -m benchmarks.bench_ray_fleet --rate 6 --seconds 30 --out results/ray_fleet.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks import harness

PY = sys.executable
RAY = str(Path(PY).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recserve(*argv: str, timeout_s: float = 900.0) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    print("$ recserve " + " ".join(argv), file=sys.stderr, flush=True)
    # the commands' tables go to stderr with their progress: this script's stdout is its JSON summary only
    subprocess.run([PY, "-m", "recserve.cli", *argv], check=True, env=env, timeout=timeout_s, stdout=sys.stderr)


class LocalRayCluster:
    """A head node and one more node on this host, each a ``ray start --block`` process owned by this script."""

    def __init__(self, head_resources: dict[str, float], node_resources: dict[str, float], cpus: int = 2) -> None:
        self.port = free_port()
        self.temp = Path(tempfile.gettempdir()) / f"rsray-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen] = []
        common = ["--block", "--num-cpus", str(cpus), "--object-store-memory", str(200 * 2**20),
                  "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
        self.head = [RAY, "start", "--head", "--port", str(self.port), "--include-dashboard=false",
                     "--temp-dir", str(self.temp), "--resources", json.dumps(head_resources), *common]
        self.node = [RAY, "start", "--address", f"127.0.0.1:{self.port}", "--temp-dir", str(self.temp),
                     "--resources", json.dumps(node_resources), *common]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalRayCluster:
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        self.procs.append(subprocess.Popen(self.head, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_nodes(1)
        self.procs.append(subprocess.Popen(self.node, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self._wait_nodes(2)
        return self

    def _wait_nodes(self, n: int, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(1 for x in ray.nodes() if x['Alive']))")
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError("a ray start process exited early")
            out = subprocess.run([PY, "-c", probe, self.address], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled"})
            if out.returncode == 0 and out.stdout.strip().isdigit() and int(out.stdout.strip()) >= n:
                print(f"ray cluster at {self.address}: {n} node(s) up", file=sys.stderr, flush=True)
                return
            time.sleep(2)
        raise TimeoutError(f"Ray cluster did not reach {n} nodes")

    def __exit__(self, *exc: object) -> None:
        for p in reversed(self.procs):  # the worker node first, then the head
            p.terminate()
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)
        shutil.rmtree(self.temp, ignore_errors=True)


HERA_TARGETS = "hera-ncf: 8000\nhera-dlrm-b: 100\n"  # one server with both models, one with hera-dlrm-b alone
PROVISION_DAY = {"available": {"hercules-t1": 2, "hercules-t2": 1},  # every hour: t1 at 1 or 2 servers, t2 at 1
                 "trace": {"hours": list(range(24)), "loads": {"hercules-rmc1": [3000, 4000] * 12}}}


def make_plans(out: Path) -> dict[str, Path]:
    plans = {kind: out / f"{kind}.json" for kind in ("pool", "colocate", "provision", "shards")}
    recserve("plan", "pool", "--reference", "kairos", "--models", "kairos-wnd", "--servers", "g4dn.xlarge,r5n.large",
             "--budget", "0.85", "--json", str(plans["pool"]))
    targets = out / "hera-targets.yaml"
    targets.write_text(HERA_TARGETS)
    recserve("plan", "colocate", "--server", "hera-xeon", "--traffic", str(targets), "--json", str(plans["colocate"]))
    day = out / "hercules-day.json"
    day.write_text(json.dumps(PROVISION_DAY))
    recserve("plan", "provision", "--traffic", str(day), "--json", str(plans["provision"]))
    recserve("plan", "shard", "--model", "hera-dlrm-a", "--qps", "8000", "--json", str(plans["shards"]))
    return plans


def node_resources(pool_plan: Path, provision_plan: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``ray start --resources`` of the head and the second node: the pool's two instance types one per node, and
    the provisioned server types spread over the two nodes."""
    from recserve.deploy.ray_plans import node_start_flags, provision_targets, type_resource
    from recserve.planners.plan import Plan

    choice = Plan.load(pool_plan).pools[0]
    flags = {t: json.loads(f) for t, f in node_start_flags(choice).items()}
    if len(flags) != 2:
        raise RuntimeError(f"expected a pool of two instance types, got {choice.config}")
    (head_type, head), (node_type, node) = flags.items()
    servers = sorted({t.server for t in provision_targets(Plan.load(provision_plan))})
    for i, server in enumerate(servers):
        (head if i % 2 == 0 else node)[type_resource(server)] = 1
    types = {"head": {"pool_type": head_type, "servers": servers[0::2], "resources": head},
             "node": {"pool_type": node_type, "servers": servers[1::2], "resources": node}}
    return head, node, types


def run(out: Path, rate: float, seconds: float, scale: float = 1e-3) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    plans = make_plans(out)
    head, node, types = node_resources(plans["pool"], plans["provision"])
    port = free_port()
    with LocalRayCluster(head, node) as cluster:
        common = ["--address", cluster.address, "--scale", str(scale)]
        recserve("deploy", "ray", "--plan", str(plans["pool"]), *common, "--cpus", "0.25", "--http-port", str(port),
                 "--rate", str(rate), "--seconds", str(seconds), "--prior", "--decisions", str(out / "decisions.jsonl"),
                 "--json", str(out / "pool_run.json"))
        recserve("deploy", "ray", "--plan", str(plans["colocate"]), *common, "--cpus", "0.05", "--http-port",
                 str(port), "--json", str(out / "colocate_run.json"))
        recserve("deploy", "ray", "--plan", str(plans["provision"]), *common, "--cpus", "0.01", "--http-port",
                 str(port), "--rate", "4", "--seconds", "4", "--json", str(out / "provision_run.json"))
        recserve("deploy", "ray", "--plan", str(plans["shards"]), *common, "--max-tables", "2",
                 "--json", str(out / "shards_run.json"))
    result = {"cluster": types, **{kind: json.loads((out / f"{kind}_run.json").read_text())
                                   for kind in ("pool", "colocate", "provision", "shards")}}
    result["colocate"]["servers"] = [[p["model"] for p in s["placements"]]
                                     for s in json.loads(plans["colocate"].read_text())["servers"]]
    result["pool"].pop("latency_table", None)
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    pool, provision, shards = result["pool"], result["provision"]["provision"], result["shards"]
    keys = ("pool", "qos_ms", "rate_qps", "seconds", "router_prior", "router_decisions", "router_sizes_match_sent",
            "scores_max_abs_diff", "measured", "simulated", "simulated_with_ray_overhead", "router_pool")
    deployment_keys = ("planned_now", "reactive_servers", "policy_decision", "replicas_running", "as_decided",
                       "scores_max_abs_diff", "load")
    return {**{k: pool.get(k) for k in keys}, "cluster": result["cluster"],
            "colocate_servers": result["colocate"].get("servers"),
            "colocate_replicas": result["colocate"].get("replicas"),
            "colocate_scores_max_abs_diff": result["colocate"].get("scores_max_abs_diff"),
            "provision_hour_utc": provision["hour_utc"],
            "provision": {name: {k: d.get(k) for k in deployment_keys} for name, d in provision["deployments"].items()},
            "shards": {k: shards.get(k) for k in ("planned_replicas", "replicas_after_deploy", "replicas_as_planned",
                                                  "scores_max_abs_diff")}}


def headline(result: dict[str, Any]) -> list[dict]:
    """The Kairos pool through Ray's proxy: measured p99 against the simulator's, and queries answered."""
    dig = harness.dig
    return [harness.row("Ray pool p99, measured (target: simulated)", dig(result, "pool", "measured", "p99_ms"), "ms",
                        dig(result, "pool", "simulated", "p99_ms")),
            harness.row("Ray pool queries answered (target: sent)", dig(result, "pool", "measured", "ok"), "queries",
                        dig(result, "pool", "measured", "sent"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--scale", type=float, default=1e-3)
    p.add_argument("--workdir", default="out/ray_fleet")
    p.add_argument("--out", default="results/ray_fleet.json")
    args = p.parse_args()
    result = run(Path(args.workdir), args.rate, args.seconds, args.scale)
    harness.write_result(args.out, args, headline(result), result)
    print(json.dumps(summarize(result), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
