"""Plans on a local multi-node Ray cluster: a Kairos pool routed by the Kairos request router, and a Hera plan.

Steps (everything on 127.0.0.1; both Ray nodes are processes this script starts with ``ray start --block``
and stops by terminating them):

1. plans from the planners: ``recserve plan pool`` (Kairos reference data, two instance types under a small
   budget) and ``recserve plan colocate`` (Hera, from a targets file);
2. a Ray head node posing as the pool's first instance type and a second ``ray start --address`` node as the
   other (each advertises ``recserve_slot`` = its planned instances and its type marker);
3. ``recserve deploy ray --plan pool.json --rate R --seconds S``: scores against the in-process model, a
   Poisson load through Ray's HTTP proxy routed by the Kairos request router (decisions logged), and the
   simulator's prediction for the same pool and trace;
4. ``recserve deploy ray --plan colocate.json``: the Hera plan's servers come up and answer.

Both node "types" run on this host's cores: the types differ in name and placement, not in hardware, so the
simulator is given this host's measured latency table for every type.

    python benchmarks/bench_ray_fleet.py --rate 6 --seconds 30 --out results/ray_fleet.json
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

PY = sys.executable
RAY = str(Path(PY).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def recserve(*argv: str, timeout_s: float = 900.0) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    print("$ recserve " + " ".join(argv), file=sys.stderr, flush=True)
    subprocess.run([PY, "-m", "recserve.cli", *argv], check=True, env=env, timeout=timeout_s)


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


def make_plans(out: Path) -> tuple[Path, Path]:
    pool, colocate = out / "pool.json", out / "colocate.json"
    recserve("plan", "pool", "--reference", "kairos", "--models", "kairos-wnd", "--servers", "g4dn.xlarge,r5n.large",
             "--budget", "0.85", "--json", str(pool))
    targets = out / "hera-targets.yaml"
    targets.write_text("hera-ncf: 8000\nhera-dlrm-a: 500\n")
    recserve("plan", "colocate", "--server", "hera-xeon", "--traffic", str(targets), "--json", str(colocate))
    return pool, colocate


def run(out: Path, rate: float, seconds: float, scale: float = 1e-3) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    pool_plan, colocate_plan = make_plans(out)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from recserve.deploy.ray_plans import node_start_flags
    from recserve.planners.plan import Plan

    choice = Plan.load(pool_plan).pools[0]
    flags = {t: json.loads(f) for t, f in node_start_flags(choice).items()}
    if len(flags) != 2:
        raise RuntimeError(f"expected a pool of two instance types, got {choice.config}")
    (head_type, head), (node_type, node) = flags.items()
    port = free_port()
    with LocalRayCluster(head, node) as cluster:
        recserve("deploy", "ray", "--plan", str(pool_plan), "--address", cluster.address, "--scale", str(scale),
                 "--cpus", "0.25", "--http-port", str(port), "--rate", str(rate), "--seconds", str(seconds), "--prior",
                 "--decisions", str(out / "decisions.jsonl"), "--json", str(out / "pool_run.json"))
        recserve("deploy", "ray", "--plan", str(colocate_plan), "--address", cluster.address, "--scale", str(scale),
                 "--cpus", "0.05", "--http-port", str(port), "--json", str(out / "colocate_run.json"))
    result = {"cluster": {"head": {"type": head_type, "resources": head}, "node": {"type": node_type,
                                                                                   "resources": node}},
              "pool": json.loads((out / "pool_run.json").read_text()),
              "colocate": json.loads((out / "colocate_run.json").read_text())}
    result["pool"].pop("latency_table", None)
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    pool = result["pool"]
    keys = ("pool", "qos_ms", "rate_qps", "seconds", "router_prior", "router_decisions", "router_sizes_match_sent",
            "scores_max_abs_diff", "measured", "simulated", "simulated_with_ray_overhead", "router_pool")
    return {**{k: pool.get(k) for k in keys}, "cluster": result["cluster"],
            "colocate_scores_max_abs_diff": result["colocate"].get("scores_max_abs_diff")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--scale", type=float, default=1e-3)
    p.add_argument("--workdir", default="out/ray_fleet")
    p.add_argument("--out", default="results/ray_fleet.json")
    args = p.parse_args()
    result = run(Path(args.workdir), args.rate, args.seconds, args.scale)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summarize(result), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
