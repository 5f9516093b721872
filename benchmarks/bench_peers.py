"""Serving benchmark: max load at the SLA for the same model, the same cores and the same query
mix, served by recserve, by a plain FastAPI + uvicorn + PyTorch server, by Ray Serve, by KServe's
ModelServer (REST and gRPC) and by Seldon MLServer (REST and gRPC).

For each worker count in ``--workers`` every server gets that many single-threaded model workers where
it can (``NOTES`` in ``peers/servers.py`` says where not), each runs as its own process(es) and is driven
by recserve's open-loop Poisson load generator (``--procs`` generator processes) in the server's
protocol: v2 HTTP with the binary tensor extension (recserve, FastAPI, Ray), v2 REST in plain JSON
(KServe, MLServer: ``-rest``) or v2 gRPC with raw tensor contents (``-grpc``); latency counts from the
scheduled send time.  KServe and MLServer run in virtual environments of their own (``peers/venvs.py``),
made on first use.  Before any load, every server scores one fixed query, whose scores must equal bit
for bit those of the model built in process (what every server builds, recserve included:
``score_check`` in the JSON; a mismatch is flagged, not fatal).  Ratios are taken within one run (the
machine is shared and noisy).  At each max-load point the generator's own send lag p99 and CPU are
reported: if the lag is large there, the generator, not the server, may have set the limit; so is the server's own
CPU at every probe (its processes' core-seconds per second and per query answered: ``peers/proctree.py``).

For each worker count the servers are all started, then their max-load searches take turns probe by
probe (only one server is loaded at a time; the others idle): a shared VM's speed moved up to 2x
within an hour, so searches run one after the other compared different machines (the 2-worker ratio
ranged 1.06x-1.47x over five sequential runs).  ``--sequential`` runs one search after the other.
Each search's best rate is then probed again (``--confirm``, stepping down 8 % after a miss): a search
keeps the luckiest probe near the knee, and one 6 s probe there passes or fails by chance.

    .venv/bin/python -m benchmarks.bench_peers --model hercules-rmc1 --scale 0.001 --sla-ms 100 --workers 1,2,all
    .venv/bin/python -m benchmarks.bench_peers --peers recserve,kserve-grpc,mlserver-rest --workers 1
    .venv/bin/python -m benchmarks.bench_peers --replot results/bench_peers.json --plot results/bench_peers.png
    RECSERVE_BASE_SRC=/other/tree/src .venv/bin/python -m benchmarks.bench_peers --peers recserve,recserve-base,fastapi
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from benchmarks.peers.figure import plot_max_loads
from benchmarks.peers.proctree import ServerProcesses
from benchmarks.peers.servers import ALL_PEERS, NOTES, PEERS, choose_peers, runnable, say
from recserve.measure.loadgen import LoadSession
from recserve.measure.maxload import confirm_max_load, find_max_load
from recserve.measure.requests import RequestPool
from recserve.measure.targets import make_target
from recserve.specs import get_model
from recserve.wire import OUTPUT_SCORES


class Turns:
    """Several searches probing one at a time, in turn (a finished search drops out of the rotation)."""

    def __init__(self, n: int) -> None:
        self._cv = threading.Condition()
        self._n, self._turn, self._done = n, 0, set[int]()

    @contextmanager
    def take(self, i: int) -> Iterator[None]:
        with self._cv:
            self._cv.wait_for(lambda: self._turn == i)
        try:
            yield
        finally:
            with self._cv:
                self._pass(i)

    def finish(self, i: int) -> None:
        with self._cv:
            self._done.add(i)
            if self._turn == i:
                self._pass(i)

    def _pass(self, i: int) -> None:
        waiting = [(i + k) % self._n for k in range(1, self._n + 1) if (i + k) % self._n not in self._done]
        if waiting:
            self._turn = waiting[0]
        self._cv.notify_all()


class ProbeWithServer:
    """One probe's load result with the server's CPU over it: ``to_dict()["server"]`` holds its processes' core-seconds
    per second and, over the answers per second, its CPU per query (``proctree``: what a peer's work costs at the
    load, beside what its latency shows)."""

    def __init__(self, result: Any, server: ServerProcesses, before: dict[int, float], started: float) -> None:
        self.result = result
        self.cpu_s, self.procs = server.cpu_since(before)
        self.wall_s = time.monotonic() - started

    def percentile(self, p: float) -> float:
        return self.result.percentile(p)

    def to_dict(self) -> dict[str, Any]:
        data = self.result.to_dict()
        per_s = self.cpu_s / self.wall_s if self.wall_s > 0 else None
        achieved = data.get("achieved_qps") or 0.0
        data["server"] = {"procs": self.procs, "cpu_s": self.cpu_s, "cpu_per_s": per_s,
                          "cpu_ms_per_query": 1e3 * per_s / achieved if per_s is not None and achieved > 0 else None}
        return data


def max_load(url: str, model: str, pool: RequestPool, args: argparse.Namespace, sla_ms: float,
             turn: Callable[[], Any] = nullcontext, label: str = "", server: ServerProcesses | None = None) -> dict:
    """The max-load search against one server, with the generator's lag and CPU at the max-load point and, given
    ``server``, the server's CPU at every probe; each probe runs inside ``turn()`` (the interleaving of several
    searches)."""
    target = make_target(url, model, timeout_s=max(5.0, 10 * sla_ms / 1000))
    with LoadSession(target, pool, warm=True, procs=args.procs) as session:
        def run_at(rate: float):
            with turn():
                before, started = (server.reading() if server else {}), time.monotonic()
                result = session.run(rate, args.probe_s, warmup_s=1.0, seed=int(rate * 1000) % 2**31)
                return ProbeWithServer(result, server, before, started) if server else result

        run_at(args.start_qps)  # warm every worker before the search
        found = find_max_load(run_at, sla_ms, args.percentile, start_qps=args.start_qps, rtol=0.08,
                              max_probes=args.max_probes, log=lambda line: print(f"{label}{line}", file=sys.stderr))
        result = confirm_max_load(run_at, found, step=0.08, tries=args.confirm).to_dict()
        if args.confirm:
            print(f"{label}  max load {result['max_qps']:.1f} qps ({result['reason']})", file=sys.stderr)
    at_max = next((p["detail"] for p in result["probes"] if p["ok"] and p["rate"] == result["max_qps"]), {})
    result["generator_at_max"] = {"send_lag_ms_p99": (at_max.get("send_lag_ms") or {}).get("p99"),
                                  **{k: v for k, v in (at_max.get("generator") or {}).items()
                                     if k in ("procs", "cpu_per_s", "loop_cpu_s")}}
    result["server_at_max"] = at_max.get("server") or {}
    return result


def scores_of(url: str, model: str, pool: RequestPool, query: int = 0) -> np.ndarray:
    """A server's scores for pooled query ``query``, asked in the protocol the load test speaks to it."""

    async def ask() -> np.ndarray:
        target = make_target(url, model, timeout_s=60.0)
        try:
            await target.prepare(pool)
            return (await target.infer_outputs(query))[OUTPUT_SCORES]
        finally:
            await target.close()

    return asyncio.run(ask())


def reference_scores(model: str, scale: float, pool: RequestPool, query: int = 0) -> np.ndarray:
    """Query ``query``'s scores from the model every server builds (``zoo.build``, seed 0), on one torch thread."""
    import torch

    from recserve.zoo import build

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            return build(get_model(model), scale=scale)(pool.batch(query)).numpy()
    finally:
        torch.set_num_threads(threads)


def compare_scores(got: np.ndarray, want: np.ndarray) -> dict:
    """Bit-for-bit equality of two score arrays, and their largest difference where shapes agree."""
    same_shape = got.shape == want.shape
    diff = float(np.max(np.abs(got.astype(np.float64) - want))) if same_shape and got.size else None
    return {"identical": bool(same_shape and np.array_equal(got, want)), "shape": list(got.shape),
            "max_abs_diff": diff}


def score_check(name: str, url: str, args: argparse.Namespace, pool: RequestPool, want: np.ndarray) -> dict:
    """One server's answer to the fixed query against the reference; a mismatch is printed and recorded, the
    server still measured."""
    result = compare_scores(scores_of(url, args.model, pool), want)
    if not result["identical"]:
        say(f"!! {name}: scores differ from the reference (shape {result['shape']}, "
             f"max |diff| {result['max_abs_diff']})")
    return result


def worker_counts(text: str) -> list[int]:
    """``1,2,all``: ``all`` is the cores this process may use."""
    usable = len(os.sched_getaffinity(0))
    return sorted({usable if x.strip() == "all" else int(x) for x in text.split(",") if x.strip()})


def print_table(results: dict) -> None:
    print(f"max load at p{results['percentile']:g} <= {results['sla_ms']:g} ms, {results['model']} scale "
          f"{results['scale']}, {results['mix']} mix, {results['procs']} generator process(es)")
    print(f"{'workers':>7} {'server':18s} {'max QPS':>9} {'recserve/it':>11} {'gen lag p99':>11} {'gen CPU':>8} "
          f"{'srv CPU':>8} {'ms/query':>8} {'scores':>8}")
    for workers, by_peer in results["by_workers"].items():
        base = by_peer.get("recserve", {}).get("max_qps")
        for name, r in by_peer.items():
            ratio = f"{base / r['max_qps']:.2f}x" if base and r["max_qps"] else "n/a"
            gen = r["generator_at_max"]
            lag = f"{gen['send_lag_ms_p99']:.2f} ms" if gen.get("send_lag_ms_p99") is not None else "n/a"
            cpu = f"{gen['cpu_per_s']:.2f}" if gen.get("cpu_per_s") is not None else "n/a"
            srv = r.get("server_at_max") or {}
            srv_cpu = f"{srv['cpu_per_s']:.2f}" if srv.get("cpu_per_s") is not None else "n/a"
            per_query = f"{srv['cpu_ms_per_query']:.2f}" if srv.get("cpu_ms_per_query") is not None else "n/a"
            check = r.get("score_check") or {}
            scores = "same" if check.get("identical") else ("DIFFER" if check else "n/a")
            print(f"{workers:>7} {name:18s} {r['max_qps']:>9.1f} {ratio:>11} {lag:>11} {cpu:>8} {srv_cpu:>8} "
                  f"{per_query:>8} {scores:>8}")
    print("(gen = the load generator at the max-load probe; CPU in core-seconds per second; srv = the server's "
          "processes at that probe, ms/query = their CPU per query answered; scores: the fixed query's scores "
          "against the model built in process)")
    for name, note in results.get("notes", {}).items():
        print(f"note: {name}: {note}")
    for name, why in results.get("skipped", {}).items():
        print(f"skipped: {name}: {why}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", type=worker_counts, default="2", help="worker counts, e.g. 1,2,all")
    parser.add_argument("--sla-ms", type=float, default=None, help="default: the model's catalogue SLA")
    parser.add_argument("--percentile", type=float, default=95.0)
    parser.add_argument("--mix", default="production", help="query-size mix")
    parser.add_argument("--probe-s", type=float, default=6.0, help="seconds per load probe")
    parser.add_argument("--start-qps", type=float, default=5.0)
    parser.add_argument("--max-probes", type=int, default=14)
    parser.add_argument("--procs", type=int, default=1, help="load-generator processes")
    parser.add_argument("--peers", type=choose_peers, default="all",
                        help=f"comma-separated, of {','.join(PEERS)}; all (default): {','.join(ALL_PEERS)}, those "
                             "that can run here (FastAPI and Ray if installed; KServe's and MLServer's venvs are made "
                             "on first use)")
    parser.add_argument("--confirm", type=int, default=3,
                        help="probes re-checking each max load, 8%% lower after each miss (0: the search's best probe)")
    parser.add_argument("--sequential", action="store_true",
                        help="one server at a time, each search whole (default: all up, probes in turn)")
    parser.add_argument("--out", default="results/bench_peers.json")
    parser.add_argument("--plot", metavar="PNG", help="also draw each server's max load by protocol and workers")
    parser.add_argument("--replot", metavar="JSON",
                        help="only draw --plot (default: the JSON's name, .png) from an earlier run's JSON")
    args = parser.parse_args()
    if args.replot:
        earlier = json.loads(Path(args.replot).read_text())
        print(f"wrote {plot_max_loads(earlier, args.plot or Path(args.replot).with_suffix('.png'))}")
        return 0
    signal.signal(signal.SIGTERM, _terminated)  # a `timeout` around the run: the servers it started are stopped
    spec = get_model(args.model)
    sla = args.sla_ms or spec.sla.target_ms
    pool = RequestPool.from_mix(spec, args.scale, args.mix, pool=64)
    results = {"model": args.model, "scale": args.scale, "workers": args.workers, "sla_ms": sla,
               "order": "sequential" if args.sequential else "interleaved", "confirm_probes": args.confirm,
               "percentile": args.percentile, "mix": args.mix, "procs": args.procs, "probe_s": args.probe_s,
               "load_avg_before": os.getloadavg()[0], "by_workers": {}}
    asked_all = args.peers == list(ALL_PEERS)
    results["skipped"] = {name: why for name in args.peers if (why := runnable(name))}
    if results["skipped"] and not asked_all:
        parser.error(f"--peers: cannot run {results['skipped']}")
    peers = [name for name in args.peers if name not in results["skipped"]]
    results["peers"], results["notes"] = peers, {name: NOTES[name] for name in peers if name in NOTES}
    want = reference_scores(args.model, args.scale, pool)
    for workers in args.workers:
        by_peer = results["by_workers"].setdefault(str(workers), {})
        if args.sequential:
            for name in peers:
                print(f"== {name}, {workers} workers (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
                with ExitStack() as stack:
                    with ServerProcesses.started() as server:
                        url = stack.enter_context(PEERS[name](args.model, args.scale, workers, sla))
                    check = score_check(name, url, args, pool, want)
                    by_peer[name] = {**max_load(url, args.model, pool, args, sla, server=server),
                                     "score_check": check}
                save(results, args)  # after every search: a run cut short (a time limit) keeps what it measured
        else:
            by_peer.update(interleaved(peers, workers, pool, args, sla, want))
            save(results, args)
    results["load_avg_after"] = os.getloadavg()[0]
    print_table(results)
    save(results, args)
    if args.plot:
        print(f"wrote {plot_max_loads(results, args.plot)}")
    return 0


def _terminated(signum: int, _frame: Any) -> None:
    """SIGTERM as an exit of the main thread, so that every server's context (its process group) is stopped: the
    peer servers run in sessions of their own, which a signal to this process alone does not reach."""
    raise SystemExit(128 + signum)


def interleaved(peers: list[str], workers: int, pool: RequestPool, args: argparse.Namespace,
                sla_ms: float, want: np.ndarray) -> dict[str, dict]:
    """Every peer's server up at once; their searches probe in turn, so a drift of the host's speed falls on all."""
    turns, found, failed = Turns(len(peers)), {}, []
    with ExitStack() as stack:
        urls, checks, servers = {}, {}, {}
        for name in peers:
            print(f"== {name}, {workers} workers: starting", file=sys.stderr)
            with ServerProcesses.started() as servers[name]:
                urls[name] = stack.enter_context(PEERS[name](args.model, args.scale, workers, sla_ms))
            checks[name] = score_check(name, urls[name], args, pool, want)
        print(f"== {workers} workers, searches in turn (load average {os.getloadavg()[0]:.2f})", file=sys.stderr)

        def search(i: int, name: str) -> None:
            try:
                found[name] = max_load(urls[name], args.model, pool, args, sla_ms,
                                       lambda: turns.take(i), f"[{name}] ", servers[name])
            except BaseException as exc:  # noqa: BLE001 - re-raised below, after the other searches end
                failed.append(exc)
            finally:
                turns.finish(i)

        # daemons: a run ended by SIGTERM stops the servers and exits without waiting for searches that probe them
        threads = [threading.Thread(target=search, args=(i, name), daemon=True) for i, name in enumerate(peers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    return {name: {**found[name], "score_check": checks[name]} for name in peers}


def headline(results: dict) -> list[dict]:
    """Per worker count: recserve's max load at the SLA, and against each peer's."""
    sla = f"p{results.get('percentile', 95):g} <= {results.get('sla_ms')} ms"
    out = []
    for workers, peers in (results.get("by_workers") or {}).items():
        base = harness.dig(peers, "recserve", "max_qps")
        out.append(harness.row(f"recserve max load at {sla}, {results.get('model')}, {workers} workers", base, "QPS"))
        out += [harness.row(f"recserve max load, {workers} workers (target: {name})", base, "QPS",
                            harness.dig(r, "max_qps")) for name, r in peers.items() if name != "recserve"]
    return out


def save(results: dict, args: argparse.Namespace) -> None:
    """The result so far (written after every search: a run cut short keeps what it measured)."""
    harness.write_result(args.out, args, headline(results), results)


if __name__ == "__main__":
    sys.exit(main())
