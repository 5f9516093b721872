"""Does one gRPC channel get more from a second worker? (issue #51) Open-loop probes, A/B of two source trees.

recserve's own open-loop generator (``measure/loadgen.py``) sends the production mix on ONE gRPC channel
(``GrpcTarget``: what a user's client opens) and, in the same run, on HTTP's binary extension (keep-alive pool),
to nodes of 1 and 2 workers.  Each node runs from the source tree of its variant (``--variants
base=/work/main/src,mine=src``: its ``PYTHONPATH``), in a process of its own; the generator is this script's.
Every (variant, workers, protocol) gets a max-load search at p95 <= ``--sla-ms``, the searches probing in turn so
the host's drift falls on all.  For each probe: the p95, each worker's CPU seconds and the queries it served
(``worker_detail``'s ``queries_done`` where the node reports it, else from CPU), the queries busy workers
forwarded to idle siblings, and the generator's CPU; the load average before and after.

    .venv/bin/python -m benchmarks.bench_grpc_scale --workers 1,2 --variants base=/work/main/src,mine=src
    .venv/bin/python -m benchmarks.bench_grpc_scale --rates 120,200,260 --probe-s 4   # fixed rates, no search
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.common.timing import cpu_s
from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import find_max_load
from recserve.measure.requests import RequestPool
from recserve.measure.targets import GrpcTarget, HttpTarget, JsonHttpTarget
from recserve.serving.node.control_client import ControlClient
from recserve.specs import get_model

NODE = """
import json, sys
from recserve.serving import NodeServer, quick_config
server = NodeServer(quick_config(sys.argv[1], scale=float(sys.argv[2]), workers=int(sys.argv[3]),
                                 deadline_ms=float(sys.argv[4])))
ports = server.start()
print(json.dumps({"http": ports.http, "grpc": ports.grpc}), flush=True)
sys.stdin.read()
server.stop()
"""


def cpu_or_zero(pid: int) -> float:
    """A process's CPU seconds (``timing.cpu_s``), 0 if it is gone."""
    try:
        return cpu_s(pid)
    except OSError:
        return 0.0


@contextmanager
def node(src: str, model: str, scale: float, workers: int, sla_ms: float) -> Iterator[dict]:
    """A node running ``src``'s recserve in a process of its own; yields its ports."""
    inherited = os.environ.get("PYTHONPATH", "")  # what else the node needs (wheels installed elsewhere)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(src).resolve()), inherited]))}
    proc = subprocess.Popen([sys.executable, "-c", NODE, model, str(scale), str(workers), str(sla_ms)], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"node from {src} did not start")
        yield json.loads(line)
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Observed:
    """A node's per-worker CPU and served queries, and its forwarded count, read around a probe."""

    def __init__(self, http_port: int, model: str) -> None:
        self.control, self.model = ControlClient("127.0.0.1", http_port), model

    def snapshot(self) -> dict[str, Any]:
        info = self.control.get_model(self.model)
        workers = info["stages"]["model"]["worker_detail"]
        return {"cpu": [cpu_or_zero(w["pid"]) for w in workers], "served": [w.get("queries_done") for w in workers],
                "forwarded": info.get("siblings", {}).get("forwarded", 0),
                "returned": info.get("siblings", {}).get("returned", 0)}

    @staticmethod
    def delta(before: dict, after: dict) -> dict[str, Any]:
        served = after["served"]
        if all(s is not None for s in served + before["served"]) and len(served) == len(before["served"]):
            served = [a - b for a, b in zip(served, before["served"], strict=True)]
        else:
            served = None
        return {"worker_cpu_s": [round(a - b, 3) for a, b in zip(after["cpu"], before["cpu"], strict=False)],
                "worker_served": served, "forwarded": after["forwarded"] - before["forwarded"],
                "returned": after["returned"] - before["returned"]}


def probe(session: LoadSession, observed: Observed, rate: float, seconds: float) -> Any:
    before = observed.snapshot()
    result = session.run(rate, seconds, warmup_s=1.0, seed=int(rate * 1000) % 2**31)
    time.sleep(0.2)  # the workers' stats are flushed every few ms
    result.node = Observed.delta(before, observed.snapshot())
    return result


def describe(result: Any) -> dict[str, Any]:
    d = result.to_dict()
    return {"rate": result.offered_qps, "achieved_qps": result.achieved_qps, "p95_ms": result.p95,
            "queries": round(result.achieved_qps * result.run_s),
            "errors": d.get("errors"), "refusals": d.get("refusal_reasons") or {},
            "generator_cpu_s": result.cpu_s, "send_lag_ms_p99": result.send_lag(99),
            **result.node}


def headline(out: dict) -> list[dict]:
    """Each variant, protocol and worker count's max load at the SLA (absent after fixed-rate runs)."""
    return [harness.row(f"max load at p95 <= {out['sla_ms']:g} ms, {key}", run.get("max_qps"), "QPS")
            for key, run in out["runs"].items() if "max_qps" in run]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--variants", default="mine=src", help="name=src_dir,...: each node runs that tree")
    parser.add_argument("--protocols", default="grpc,http", help="of grpc, http (binary extension), json (plain JSON)")
    parser.add_argument("--sla-ms", type=float, default=100.0)
    parser.add_argument("--rates", default="", help="fixed rates to probe (no search), comma separated")
    parser.add_argument("--probe-s", type=float, default=5.0)
    parser.add_argument("--start-qps", type=float, default=40.0)
    parser.add_argument("--max-probes", type=int, default=9)
    parser.add_argument("--out", default="results/grpc_scale.json")
    parser.add_argument("--summarize", default="", help="print the summary of an earlier run's JSON and exit")
    args = parser.parse_args()
    if args.summarize:
        summary(json.loads(Path(args.summarize).read_text()))
        return 0
    variants = dict(v.split("=", 1) for v in args.variants.split(","))
    counts = [int(w) for w in args.workers.split(",")]
    protocols = args.protocols.split(",")
    pool = RequestPool.from_mix(get_model(args.model), args.scale, "production", pool=64)
    out: dict[str, Any] = {"model": args.model, "scale": args.scale, "sla_ms": args.sla_ms, "variants": variants,
                           "load_avg_before": os.getloadavg(), "runs": {}}
    for workers in counts:
        with ExitStack() as stack:
            sessions = {}
            for name, src in variants.items():
                ports = stack.enter_context(node(src, args.model, args.scale, workers, args.sla_ms))
                for proto in protocols:
                    target = (GrpcTarget(f"127.0.0.1:{ports['grpc']}", args.model) if proto == "grpc" else
                              JsonHttpTarget(f"http://127.0.0.1:{ports['http']}", args.model) if proto == "json" else
                              HttpTarget(f"http://127.0.0.1:{ports['http']}", args.model))
                    session = stack.enter_context(LoadSession(target, pool, warm=True))
                    sessions[(name, proto)] = (session, Observed(ports["http"], args.model))
            print(f"== {workers} workers (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
            if args.rates:
                runs = fixed_rates(sessions, [float(r) for r in args.rates.split(",")], args.probe_s)
            else:
                runs = searches(sessions, args)
            for (name, proto), run in runs.items():
                out["runs"][f"{name} {proto} {workers}w"] = run
        out["load_avg_after"] = os.getloadavg()
        harness.write_result(args.out, args, headline(out), out)  # after each worker count: a run cut short keeps it
    summary(out)
    return 0


def fixed_rates(sessions: dict, rates: list[float], seconds: float) -> dict:
    runs: dict = {key: {"probes": []} for key in sessions}
    for rate in rates:
        for key, (session, observed) in sessions.items():
            row = describe(probe(session, observed, rate, seconds))
            runs[key]["probes"].append(row)
            log(key, row)
    return runs


def searches(sessions: dict, args: argparse.Namespace) -> dict:
    """One max-load search per session, their probes in turn (each search advanced one probe at a time)."""
    import threading

    runs: dict = {key: {"probes": []} for key in sessions}
    turn = threading.Lock()

    def search(key: tuple) -> None:
        session, observed = sessions[key]

        def run_at(rate: float) -> Any:
            with turn:
                result = probe(session, observed, rate, args.probe_s)
            row = describe(result)
            runs[key]["probes"].append(row)
            log(key, row)
            time.sleep(0.05)  # let the other searches take the lock
            return result

        run_at(args.start_qps)  # warm every worker
        found = find_max_load(run_at, args.sla_ms, 95.0, start_qps=args.start_qps, rtol=0.08,
                              max_probes=args.max_probes)
        runs[key]["max_qps"] = found.max_qps

    threads = [threading.Thread(target=search, args=(key,)) for key in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return runs


def log(key: tuple, row: dict) -> None:
    served = row["worker_served"]
    print(f"  {key[0]:>5} {key[1]:>4} {row['rate']:7.1f} qps: p95 {row['p95_ms']:8.1f} ms, achieved "
          f"{row['achieved_qps']:6.1f}, worker CPU {row['worker_cpu_s']}, served {served}, forwarded "
          f"{row['forwarded']} (returned {row.get('returned')}), generator CPU {row['generator_cpu_s']:.2f} s "
          f"(lag p99 {row.get('send_lag_ms_p99', float('nan')):.1f} ms), errors {row['errors']}, "
          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    for reason, count in row.get("refusals", {}).items():  # the server's own words for what it refused, and how often
        print(f"      {count} x {reason}", file=sys.stderr, flush=True)


def summary(out: dict) -> None:
    """Per run: its max load, the workers' CPU per answered query and each worker's share of the CPU and of the
    queries served (over every probe of the run)."""
    print(f"max load at p95 <= {out['sla_ms']:g} ms, {out['model']} @{out['scale']:g}; load average "
          f"{out['load_avg_before'][0]:.2f} before, {out['load_avg_after'][0]:.2f} after")
    for key, run in out["runs"].items():
        probes = run["probes"]
        per_worker = [sum(col) for col in zip(*(p["worker_cpu_s"] for p in probes), strict=True)]
        cpu, queries = sum(per_worker), sum(p["queries"] for p in probes)
        served = [p["worker_served"] for p in probes if p["worker_served"]]
        share = None
        if served:
            totals = [sum(col) for col in zip(*served, strict=True)]
            share = [round(t / max(1, sum(totals)), 2) for t in totals]
        print(f"  {key:>16}: max {run.get('max_qps', float('nan')):7.1f} qps, worker CPU per query "
              f"{cpu / max(queries, 1) * 1e3:.2f} ms, CPU share {[round(c / max(cpu, 1e-9), 2) for c in per_worker]}, "
              f"served share {share}")


if __name__ == "__main__":
    sys.exit(main())
