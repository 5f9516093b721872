"""Simulator speed: simulated queries per minute of wall time on one core (target >= 1 million).

FCFS (Ribbon) gives the raw speed; Kairos (matching on every event) is reported too.  Runs the
Kairos RM2 pool (g4dn.xlarge=1, r5n.large=13) at about 80% of Kairos' allowable load.
CPU time (process_time) is the one-core figure; wall time is printed too (it includes waiting for
the core on a shared machine).  Writes results/sim.json.
"""

from __future__ import annotations

import argparse
import time

from benchmarks import harness
from recserve.policies.dispatch import make_policy
from recserve.reference import reference_path
from recserve.sim.cluster import ClusterSim, parse_pool
from recserve.sim.latency import ServiceModel, load_reference
from recserve.sim.queries import QueryStream

REFERENCE = str(reference_path("kairos_aws_latency.json"))
POOL = "g4dn.xlarge=1,r5n.large=13"


def rate(policy: str, n: int, qps: float, sim: ClusterSim, stream: QueryStream) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    res = sim.run(make_policy(policy, sim.qos_ms), stream, qps=qps, abort_on_violation=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"policy": policy, "queries": n, "qps_offered": qps, "wall_s": wall, "cpu_s": cpu,
           "sim_queries_per_minute_cpu": n / cpu * 60.0, "sim_queries_per_minute_wall": n / wall * 60.0,
           "p99_ms": res.tail(99.0), "events": res.events}
    print(f"{policy:8s}: {n} queries in {cpu:.2f} s CPU ({wall:.2f} s wall) -> "
          f"{out['sim_queries_per_minute_cpu'] / 1e6:.2f} M simulated queries per CPU-minute "
          f"({out['sim_queries_per_minute_wall'] / 1e6:.2f} M per wall minute; "
          f"p99 {out['p99_ms']:.1f} ms at {qps:g} qps)")
    return out


def headline(results: dict) -> list[dict]:
    """Simulated queries per CPU-minute of each policy against the 1 M target."""
    return [harness.row(f"simulated queries per CPU-minute, {policy}", results[key]["sim_queries_per_minute_cpu"],
                        "q/min", results["target_queries_per_minute"])
            for key, policy in (("fcfs", "FCFS (Ribbon)"), ("kairos", "Kairos"))]


def main() -> dict:
    ps = load_reference(REFERENCE)
    svc = ServiceModel.from_profiles(ps, "kairos-rm2")
    sim = ClusterSim(svc, parse_pool(POOL), qos_ms=350.0)
    n = 1_000_000
    results = {"pool": POOL, "model": "kairos-rm2",
               "fcfs": rate("ribbon", n, 15.0, sim, QueryStream(n, seed=0)),
               "kairos": rate("kairos", n // 5, 100.0, sim, QueryStream(n // 5, seed=0))}
    results["target_queries_per_minute"] = 1_000_000
    harness.write_result("results/sim.json", {}, headline(results), results)
    return results


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
