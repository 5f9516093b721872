"""What Ray's HTTP proxy adds to a fleet plan deployed with ``recserve deploy ray --plan fleet.json``: queries one at
a time (no queueing), alternating per query between a model's route through Ray's proxy (``endpoints.json``) and its
node server (``endpoints-direct.json``); with ``--address``, also an empty Ray Serve app on the same proxy (Ray's own
proxy-to-replica path, no relay, no model).  Not part of ``run_all.py``: it needs a running deployment.

    python -m benchmarks.ray_fleet_proxy --dir out/fleet-ray/dep --models hercules-rmc1,elasticrec-rm1 \
        --address 127.0.0.1:6379 --http-port 8000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

WARM = 20


def _summary(latencies: list[float]) -> str:
    rest = latencies[WARM:]
    return f"p50 {np.percentile(rest, 50):.1f} ms p95 {np.percentile(rest, 95):.1f} ms"


def proxy_vs_direct(workdir: Path, model: str, queries: int, scale: float) -> dict[str, str]:
    import recserve.cli  # noqa: F401 - repository paths become model names (as for every command)
    from recserve.deploy.local_fleet import served_name
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.specs import get_model

    urls = {k: json.loads((workdir / f).read_text())[model][0]
            for k, f in (("proxy", "endpoints.json"), ("direct", "endpoints-direct.json"))}
    pool = RequestPool.from_mix(get_model(model), scale, pool=16, seed=0)
    latencies: dict[str, list[float]] = {k: [] for k in urls}
    with LoadSession(HttpTarget(urls["proxy"], served_name(model)), pool) as proxy, \
            LoadSession(HttpTarget(urls["direct"], served_name(model)), pool) as direct:
        for i in range(WARM + queries):
            for name, session in (("proxy", proxy), ("direct", direct)):
                start = time.perf_counter()
                session.outputs(i % len(pool.sizes))
                latencies[name].append((time.perf_counter() - start) * 1e3)
    return {k: _summary(v) for k, v in latencies.items()}


def empty_app(address: str, http_port: int, queries: int) -> str:
    import ray
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class Echo:
        async def __call__(self, request: Any) -> Any:
            from starlette.responses import Response

            await request.body()
            return Response(b"ok")

    ray.init(address=address, log_to_driver=False)
    serve.run(Echo.bind(), name="echo", route_prefix="/echo")
    body, latencies = b"x" * 20_000, []
    try:
        for _ in range(WARM + queries):
            start = time.perf_counter()
            request = urllib.request.Request(f"http://127.0.0.1:{http_port}/echo", data=body)
            urllib.request.urlopen(request, timeout=30).read()
            latencies.append((time.perf_counter() - start) * 1e3)
    finally:
        serve.delete("echo")
    return _summary(latencies)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", required=True, help="the --dir of `recserve deploy ray --plan fleet.json`")
    p.add_argument("--models", default="hercules-rmc1", help="comma-separated planned models")
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--scale", type=float, default=1e-3)
    p.add_argument("--address", help="the Ray cluster: also time an empty app through the same proxy")
    p.add_argument("--http-port", type=int, default=8000)
    args = p.parse_args()
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    for model in args.models.split(","):
        print(f"{model}: {proxy_vs_direct(Path(args.dir), model, args.queries, args.scale)} (load {load})")
    if args.address:
        print(f"empty app through Ray's proxy: {empty_app(args.address, args.http_port, args.queries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
