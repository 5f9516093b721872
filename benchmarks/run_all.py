"""Run every benchmark in ``benchmarks/`` with quick settings, then print ONE table of headline numbers.

Benchmarks run one after another (the host has 2 cores: running them side by side would measure
each other), each as ``python -m benchmarks.<module>`` with its own timeout, its output in
``results/logs/<name>.log`` and progress on stderr.  The summary reads the common header of every
``results/*.json`` (``benchmarks/harness.py``: which benchmark wrote it, when, and its headline rows),
whatever is there: from this run or an earlier one; it knows no benchmark's own layout.  A failed,
timed-out or never-run benchmark shows as a row saying so.  Writes results/summary.json and
results/summary.md.

    .venv/bin/python -m benchmarks.run_all                 # everything (about 30-40 min on 2 cores)
    .venv/bin/python -m benchmarks.run_all --only limits,sim
    .venv/bin/python -m benchmarks.run_all --skip peers,route
    .venv/bin/python -m benchmarks.run_all --summary-only  # just summarise existing results/*.json
    .venv/bin/python -m benchmarks.run_all --list

A ``benchmarks/bench_<name>.py`` that the suite below does not list is run with no arguments; its
headline rows show like any other's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, num, read_header

BENCH_DIR = ROOT / "benchmarks"
RESULTS = ROOT / "results"
LOGS = RESULTS / "logs"
DEFAULT_TIMEOUT_S = 600

Row = dict[str, Any]


def log(msg: str) -> None:
    print(f"[run_all] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the suite


@dataclass
class Bench:
    name: str
    module: str  # benchmarks.<module>; the ``benchmark`` its results' header names
    args: list[str]
    timeout_s: int = DEFAULT_TIMEOUT_S
    state: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        return shlex.join([".venv/bin/python", "-m", f"benchmarks.{self.module}", *self.args])


def suite() -> list[Bench]:
    """Quick settings for a 2-core host.  Order: cheap and CPU-only first, live servers last."""
    return [
        Bench("limits", "bench_limits", ["--seconds", "0.5"], 900),
        Bench("zoo", "bench_zoo", ["--models", "hera-dlrm-a,hercules-rmc1,elasticrec-rm3,kairos-dien",
                                   "--min-time", "0.2"], 300),
        Bench("embedding_kernels", "bench_embedding_kernels", ["--quick", "--threads", "1"], 300),
        Bench("measure", "bench_measure", ["--scale", "1e-3", "--array-mb", "256"], 600),
        Bench("loadgen", "bench_loadgen", ["--seconds", "3"], 300),
        Bench("dispatch", "bench_dispatch", ["20", "20"], 300),
        Bench("sim", "bench_sim", [], 300),
        Bench("planners", "bench_planners", [], 600),
        Bench("perfmodel", "bench_perfmodel", ["--quick"], 900),
        Bench("papers", "bench_papers", [], 900),
        Bench("transfer", "bench_transfer", ["--every", "3"], 900),
        Bench("sdm", "bench_sdm", ["--quick", "--out", "results/sdm_quick.json"], 600),
        Bench("serving_overhead", "bench_serving_overhead", ["--requests", "100", "--seconds", "4"], 600),
        Bench("elasticrec_live", "bench_elasticrec_live", ["--seconds", "8", "--low-seconds", "5"], 600),
        Bench("route", "bench_route", [], 1200),
        Bench("search_live", "bench_search_live", [], 1800),
        Bench("rmu_live", "bench_rmu_live", [], 1800),
        Bench("rmu_steady", "bench_rmu_steady", ["--controllers", "hera,parties"], 600),
        Bench("peers", "bench_peers", ["--model", "hercules-rmc1", "--scale", "1e-3", "--sla-ms", "100",
                                       "--probe-s", "3", "--workers", "1,2", "--peers", "recserve,fastapi"], 1500),
        Bench("wrk", "bench_wrk", ["--workers", "1,2", "--duration", "3", "--rows",
                                   "recserve,recserve-json,recserve-grpc,fastapi"], 900),
    ]


def with_unknown_scripts(benches: list[Bench]) -> list[Bench]:
    """Append any ``bench_*.py`` the table does not know (a new benchmark), run with no arguments."""
    known = {b.module for b in benches}
    extra = [Bench(p.stem.removeprefix("bench_"), p.stem, [])
             for p in sorted(BENCH_DIR.glob("bench_*.py")) if p.stem not in known]
    return benches + extra


def run_one(bench: Bench, timeout_scale: float) -> None:
    """Run one benchmark in its own process group (so a timeout also ends the servers it started)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{bench.name}.log"
    timeout = max(30, int(bench.timeout_s * timeout_scale))
    if not (BENCH_DIR / f"{bench.module}.py").exists():
        bench.state.update(status="missing", detail=f"benchmarks/{bench.module}.py not found")
        return
    bench.state["started"] = time.time()
    start = time.perf_counter()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([sys.executable, "-m", f"benchmarks.{bench.module}", *bench.args], cwd=ROOT,
                                env=child_env(), stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = wait_with_heartbeat(proc, bench.name, timeout, log_path)
            status, detail = ("ok" if rc == 0 else "failed"), f"exit {rc}"
        except subprocess.TimeoutExpired:
            stop_group(proc)
            status, detail = "timeout", f"killed after {timeout} s"
        except KeyboardInterrupt:
            stop_group(proc)
            raise
    bench.state.update(status=status, detail=detail, seconds=round(time.perf_counter() - start, 1),
                       log=str(log_path.relative_to(ROOT)))
    if status != "ok":
        bench.state["log_tail"] = tail(log_path, 5)


def child_env() -> dict[str, str]:
    """This tree's sources first: the benchmarks measure this checkout, whatever else is installed."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def wait_with_heartbeat(proc: subprocess.Popen, name: str, timeout: float, log_path: Path,
                        every_s: float = 60.0) -> int:
    """Exit code of ``proc``; a progress line with the log's last line every ``every_s`` seconds.
    Raises TimeoutExpired after ``timeout`` seconds."""
    deadline = time.perf_counter() + timeout
    start = time.perf_counter()
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            return proc.wait(min(every_s, left))
        except subprocess.TimeoutExpired:
            last = (tail(log_path, 1) or [""])[0][:100]
            log(f"    {name}: running {time.perf_counter() - start:.0f} s ... {last}")


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the benchmark's process group, then SIGKILL what is left after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


# ---------------------------------------------------------------- summary


def results_by_benchmark(results: Path = RESULTS) -> dict[str, list[tuple[Path, dict]]]:
    """Every ``results/*.json`` with the common header, by the benchmark its header names."""
    found: dict[str, list[tuple[Path, dict]]] = {}
    for path in sorted(results.glob("*.json")):
        try:
            head = read_header(path)
        except (OSError, ValueError):  # not JSON, or being written: no header to read
            continue
        if head is not None:
            found.setdefault(str(head.get("benchmark")), []).append((path, head))
    return found


def summarise(benches: list[Bench], results: Path = RESULTS) -> list[Row]:
    found = results_by_benchmark(results)
    rows: list[Row] = []
    for b in benches:
        status = b.state.get("status", "not run")
        base = {"benchmark": b.name, "command": b.command(), "value": None, "unit": "", "target": None,
                "ratio": None}
        if status not in ("ok", "not run"):
            rows.append({**base, "metric": f"FAILED: {status} ({b.state.get('detail', '')})", "status": status,
                         "log": b.state.get("log")})
            continue
        files = found.get(b.module, [])
        if not files:
            rows.append({**base, "metric": f"MISSING: no results/*.json from benchmarks.{b.module} with a header "
                                           "(not run yet, or written before the harness)", "status": "missing"})
        for path, head in files:
            rows.extend(headline_rows(b, path, head, status))
    return rows


def headline_rows(b: Bench, path: Path, head: dict, status: str) -> list[Row]:
    """One table row per headline row of a result; *earlier run* when this run did not write the file."""
    earlier = status == "not run" or path.stat().st_mtime < b.state.get("started", 0)
    base = {"benchmark": b.name, "command": b.command(), "source": str(path.relative_to(path.parent.parent)),
            "status": "earlier run" if earlier else "ok", "written": head.get("date"), "commit": head.get("commit"),
            "arguments": head.get("arguments")}
    out = [{**base, "metric": str(h.get("name")), "value": h.get("value"), "unit": h.get("unit") or "",
            "target": h.get("target"), "ratio": ratio(h.get("value"), h.get("target"))}
           for h in head["headline"] if isinstance(h, dict)]
    return out or [{**base, "metric": f"no headline rows in {base['source']}", "value": None, "unit": "",
                    "target": None, "ratio": None}]


def ratio(value: Any, target: Any) -> float | None:
    v, t = num(value), num(target)
    return v / t if v is not None and t else None


def fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        if x == 0 or 0.01 <= abs(x) < 1e5:
            return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
        return f"{x:.3g}"
    return str(x)


def markdown(rows: list[Row]) -> str:
    lines = ["| benchmark | metric | value | target/peer | ratio | command |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = f" {r['unit']}" if r.get("unit") and r.get("value") is not None else ""
        metric = str(r["metric"]).replace("|", "/")
        if r.get("status") == "earlier run":
            metric += f" *(earlier run, {r.get('written')})*"
        ratio_text = f"{r['ratio']:.2f}x" if isinstance(r.get("ratio"), float) else "n/a"
        lines.append(f"| {r['benchmark']} | {metric} | {fmt(r.get('value'))}{unit} | {fmt(r.get('target'))} "
                     f"| {ratio_text} | `{r['command']}` |")
    return "\n".join(lines) + "\n"


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM (a ``timeout`` around run_all) as Ctrl-C: the running benchmark's process group is stopped too."""
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, interrupted)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma-separated benchmark names to run (see --list)")
    p.add_argument("--skip", default="", help="comma-separated benchmark names not to run")
    p.add_argument("--summary-only", action="store_true", help="run nothing; summarise existing results/*.json")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every per-benchmark timeout")
    p.add_argument("--strict", action="store_true", help="exit 1 when any benchmark failed or timed out")
    p.add_argument("--list", action="store_true", help="print the benchmarks and their commands, then exit")
    args = p.parse_args()
    benches = with_unknown_scripts(suite())
    if args.list:
        for b in benches:
            print(f"{b.name:18} timeout {b.timeout_s:5d} s   {b.command()}")
        return 0
    names = {b.name for b in benches}
    only = {n for n in args.only.split(",") if n}
    skip = {n for n in args.skip.split(",") if n}
    unknown = (only | skip) - names
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(names))}")
    selected = [] if args.summary_only else [b for b in benches if (not only or b.name in only) and b.name not in skip]
    t0 = time.perf_counter()
    for i, b in enumerate(selected, 1):
        log(f"({i}/{len(selected)}) {b.name}: {b.command()}  [timeout {int(b.timeout_s * args.timeout_scale)} s, "
            f"log results/logs/{b.name}.log]")
        run_one(b, args.timeout_scale)
        log(f"({i}/{len(selected)}) {b.name}: {b.state['status']} ({b.state.get('detail', '')}) "
            f"in {b.state.get('seconds', 0):.0f} s")
        for line in b.state.get("log_tail", []):
            log(f"    {line}")
    if selected:
        log(f"all done in {time.perf_counter() - t0:.0f} s")
    shown = [b for b in benches if (not only or b.name in only) and (args.summary_only or b.name not in skip)]
    rows = summarise(shown)
    table = markdown(rows)
    RESULTS.mkdir(parents=True, exist_ok=True)
    header = (f"# recserve benchmark summary\n\n{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC}, host cores "
              f"{len(os.sched_getaffinity(0))}, load average {os.getloadavg()[0]:.1f}.  "
              "ratio = value / target-or-peer; command = how run_all runs the benchmark (rows marked "
              "*earlier run* come from a results file written before this run, possibly with other "
              "settings).\n\n")
    (RESULTS / "summary.md").write_text(header + table)
    (RESULTS / "summary.json").write_text(json.dumps(
        {"generated": dt.datetime.now(dt.UTC).isoformat(), "load_average": os.getloadavg(),
         "runs": {b.name: {**b.state, "command": b.command()} for b in shown}, "rows": rows}, indent=1, default=str))
    print(table)
    log("wrote results/summary.md and results/summary.json")
    failed = [b.name for b in selected if b.state.get("status") != "ok"]
    if failed:
        log(f"failed: {', '.join(failed)}")
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
