"""CPU of each process and thread of a recserve node under fixed-rate load, as bench_peers starts the node.

A diagnostic kept with the measurements it made (not a benchmark). From the repository root:

    PYTHONPATH=src:. PROTO=binary|grpc .venv/bin/python docs/measured/xeon-2026-11-30/worker_threads.py \
        RATE SECONDS WORKERS
"""

import os
import sys

from benchmarks.common.timing import process_tree
from benchmarks.peers.proctree import ServerProcesses
from benchmarks.peers.servers import recserve_server
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.targets import GrpcTarget, HttpTarget
from recserve.specs import get_model

TICKS = os.sysconf("SC_CLK_TCK")


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each live thread of ``pid``, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rpartition(")")[2].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def command(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:90]
    except OSError:
        return "?"


def main() -> None:
    rate, seconds, workers = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    proto = os.environ.get("PROTO", "binary")
    pool = RequestPool.from_mix(get_model("hercules-rmc1"), 1e-3, "production", pool=64)
    with ServerProcesses.started() as procs:
        ctx = recserve_server("hercules-rmc1", 1e-3, workers, 100.0, protocol=proto)
        url = ctx.__enter__()
    try:
        target = (HttpTarget(url, "hercules-rmc1") if proto == "binary"
                  else GrpcTarget(url.split("//")[-1], "hercules-rmc1"))
        with LoadSession(target, pool, warm=True) as session:
            session.run(rate, 3.0)
            pids = process_tree(procs.roots)
            before = {p: threads_cpu(p) for p in pids}
            result = session.run(rate, seconds)
            after = {p: threads_cpu(p) for p in pids}
        queries = result.achieved_qps * seconds
        print(f"rate {rate}: achieved {result.achieved_qps:.1f}, p95 {result.p95:.1f} ms")
        total = 0.0
        for p in pids:
            spent = {t: after[p][t] - before[p].get(t, 0.0) for t in after[p]}
            total += sum(spent.values())
            print(f"pid {p} {sum(spent.values()) / queries * 1e3:6.3f} ms/query  {command(p)}")
            for t, v in sorted(spent.items(), key=lambda x: -x[1])[:4]:
                if v > 0.02:
                    print(f"      tid {t}{'(main)' if str(t) == str(p) else ''} {v / queries * 1e3:6.3f} ms/query")
        print(f"total {total / queries * 1e3:.3f} ms/query")
    finally:
        ctx.__exit__(None, None, None)


if __name__ == "__main__":
    main()
