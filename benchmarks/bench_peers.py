"""Serving benchmark: max load at the SLA for the same model, the same 2 cores and the same query
mix, served by recserve, by a Ray Serve deployment and by a plain FastAPI + PyTorch server.

Every server gets two single-threaded model workers and is driven by recserve's open-loop
Poisson load generator over HTTP with the v2 binary protocol; latency counts from the scheduled
send time.  Ratios are taken within one run (the machine is shared and noisy).

    .venv/bin/python benchmarks/bench_peers.py --model hercules-rmc1 --scale 0.001 --sla-ms 100
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recserve.measure.loadgen import run_load  # noqa: E402
from recserve.measure.maxload import find_max_load  # noqa: E402
from recserve.measure.requests import RequestPool  # noqa: E402
from recserve.measure.targets import HttpTarget  # noqa: E402
from recserve.specs import get_model  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 180.0) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


@contextmanager
def recserve_server(model: str, scale: float, workers: int) -> Iterator[str]:
    from recserve.serving import NodeServer, quick_config

    server = NodeServer(quick_config(model, scale=scale, workers=workers))
    ports = server.start()
    try:
        yield f"http://127.0.0.1:{ports.http}"
    finally:
        server.stop()


def _peer_env(model: str, scale: float) -> dict[str, str]:
    return {**os.environ, "RECSERVE_PEER_MODEL": model, "RECSERVE_PEER_SCALE": str(scale),
            "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}


@contextmanager
def fastapi_server(model: str, scale: float, workers: int) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "benchmarks.peers.fastapi_app:app", "--host",
                             "127.0.0.1", "--port", str(port), "--workers", str(workers), "--log-level", "warning"],
                            cwd=ROOT, env=_peer_env(model, scale))
    try:
        wait_ready(f"http://127.0.0.1:{port}/v2/health/ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def ray_server(model: str, scale: float, workers: int) -> Iterator[str]:
    os.environ.update(_peer_env(model, scale))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from benchmarks.peers.ray_app import RecModelDeployment

    port = free_port()
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=workers)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = RecModelDeployment.options(num_replicas=workers, ray_actor_options={"num_cpus": 1}).bind()
        serve.run(app, name="peer", route_prefix=f"/v2/models/{model}")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


PEERS: dict[str, Callable] = {"recserve": recserve_server, "ray-serve": ray_server, "fastapi": fastapi_server}


def max_load(url: str, model: str, pool: RequestPool, sla_ms: float, percentile: float, probe_s: float,
             start_qps: float) -> dict:
    target = HttpTarget(url, model, timeout_s=max(5.0, 10 * sla_ms / 1000))

    def run_at(rate: float):
        return run_load(target, rate, probe_s, pool, warmup_s=1.0, seed=int(rate * 1000) % 2**31)

    run_at(start_qps)  # warm every worker before the search
    result = find_max_load(run_at, sla_ms, percentile, start_qps=start_qps, rtol=0.08, max_probes=14,
                           log=lambda line: print(line, file=sys.stderr))
    return result.to_dict()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sla-ms", type=float, default=None, help="default: the model's catalogue SLA")
    parser.add_argument("--percentile", type=float, default=95.0)
    parser.add_argument("--mix", default="production", help="query-size mix")
    parser.add_argument("--probe-s", type=float, default=6.0, help="seconds per load probe")
    parser.add_argument("--start-qps", type=float, default=5.0)
    parser.add_argument("--peers", default="recserve,ray-serve,fastapi")
    parser.add_argument("--out", default="results/bench_peers.json")
    args = parser.parse_args()
    spec = get_model(args.model)
    sla = args.sla_ms or spec.sla.target_ms
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=64)
    results = {"model": args.model, "scale": args.scale, "workers": args.workers, "sla_ms": sla,
               "percentile": args.percentile, "mix": args.mix, "peers": {}}
    for name in args.peers.split(","):
        print(f"== {name}", file=sys.stderr)
        with PEERS[name](args.model, args.scale, args.workers) as url:
            results["peers"][name] = max_load(url, args.model, pool, sla, args.percentile, args.probe_s,
                                              args.start_qps)
    base = results["peers"].get("recserve", {}).get("max_qps")
    print(f"max load at p{args.percentile:g} <= {sla:g} ms, {args.model} scale {args.scale}, "
          f"{args.workers} workers, {args.mix} mix")
    for name, r in results["peers"].items():
        ratio = f"{base / r['max_qps']:.2f}x" if base and r["max_qps"] else "n/a"
        print(f"  {name:10s} {r['max_qps']:8.1f} QPS   recserve / {name} = {ratio}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
