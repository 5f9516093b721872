"""Run every benchmark in ``benchmarks/`` with quick settings, then print ONE table of headline numbers.

Benchmarks run one after another (the host has 2 cores: running them side by side would measure
each other), each with its own timeout, its output in ``results/logs/<name>.log`` and progress on
stderr.  The summary reads each benchmark's ``results/*.json`` (whatever is there: from this run
or an earlier one), so a failed, timed-out or never-run benchmark shows as a row saying so; a
missing key shows as ``n/a``.  Writes results/summary.json and results/summary.md.

    .venv/bin/python benchmarks/run_all.py                 # everything (about 30-40 min on 2 cores)
    .venv/bin/python benchmarks/run_all.py --only limits,sim
    .venv/bin/python benchmarks/run_all.py --skip peers,route
    .venv/bin/python benchmarks/run_all.py --summary-only  # just summarise existing results/*.json
    .venv/bin/python benchmarks/run_all.py --list

A script ``benchmarks/bench_<name>.py`` that the table below does not know yet is run with no
arguments and reported by its exit status only.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
RESULTS = ROOT / "results"
LOGS = RESULTS / "logs"
DEFAULT_TIMEOUT_S = 600

Row = dict[str, Any]
Extractor = Callable[[dict[str, Any]], list[Row]]


def log(msg: str) -> None:
    print(f"[run_all] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- reading results safely


def dig(data: Any, *path: Any) -> Any:
    """``data[p0][p1]...`` or None when any step is missing (results files differ between versions)."""
    for key in path:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def div(a: Any, b: Any) -> float | None:
    a, b = num(a), num(b)
    return a / b if a is not None and b else None


def row(metric: str, value: Any, target: Any = None, ratio: float | None = None, unit: str = "") -> Row:
    """One headline number: ``target`` is the goal or the peer's value it is compared with."""
    return {"metric": metric, "value": num(value) if num(value) is not None else value, "unit": unit,
            "target": target, "ratio": ratio}


# ---------------------------------------------------------------- headline extractors, one per benchmark


def limits_rows(d: dict) -> list[Row]:
    out = []
    models = d.get("models") or {}
    first_scale = min((num(m.get("scale")) or 0 for m in models.values()), default=0)
    for key, m in models.items():
        g = max(m.get("gather") or [{}], key=lambda r: r.get("batch", 0))
        dn = max(m.get("dense") or [{}], key=lambda r: r.get("batch", 0))
        b = g.get("batch", "?")
        out.append(row(f"{key} gather GB/s per CPU-s, batch {b}, {num(m.get('table_mb')) or 0:.0f} MiB tables (peer = "
                       "profiler random read, same row size, table-sized array)", g.get("gbs_cpu"),
                       m.get("host_same_set_gbs_cpu"), g.get("ratio_same_set_cpu"), "GB/s"))
        if m.get("scale") != first_scale:
            continue  # the dense part does not depend on the table scale
        out.append(row(f"{key} dense GFLOP/s per CPU-s, batch {dn.get('batch', '?')} (vs 1-thread GEMM)",
                       dn.get("gflops_cpu"), dig(d, "host", "gemm_gflops_1t_cpu"), dn.get("ratio_gemm_cpu"),
                       "GFLOP/s"))
    o = d.get("overhead")
    if isinstance(o, dict):
        for proto in ("http", "grpc"):
            out.append(row(f"server overhead p50 at batch 1, {proto} ({o.get('model')}; target/peer = in-process "
                           "p50)", dig(o, proto, "p50_ms"), o.get("in_process_p50_ms"),
                           div(dig(o, proto, "p50_ms"), o.get("in_process_p50_ms")), "ms"))
            out.append(row(f"server CPU per request at batch 1, {proto} (client+front end+worker; vs in-process)",
                           dig(o, proto, "cpu_ms_per_request"), o.get("in_process_cpu_ms"),
                           div(dig(o, proto, "cpu_ms_per_request"), o.get("in_process_cpu_ms")), "CPU ms"))
    return out


def peers_rows(d: dict) -> list[Row]:
    sla = f"p{d.get('percentile', 95):g} <= {d.get('sla_ms')} ms"
    by_workers = d.get("by_workers") or {str(d.get("workers")): d.get("peers") or {}}  # older files: one count
    out = []
    for workers, peers in by_workers.items():
        base = dig(peers, "recserve", "max_qps")
        out.append(row(f"recserve max load at {sla}, {d.get('model')}, {workers} workers", base, unit="QPS"))
        for name, r in peers.items():
            if name != "recserve":
                out.append(row(f"recserve vs {name} max load, {workers} workers (target/peer = {name})", base,
                               dig(r, "max_qps"), div(base, dig(r, "max_qps")), "QPS"))
    return out


def loadgen_rows(d: dict) -> list[Row]:
    target = [r for r in d.get("rows") or [] if r.get("offered_qps") == 5000]
    return [row(f"load generator send-lag p99 at 5000 batch-1 qps, {r.get('procs')} process(es) "
                f"(achieved {r.get('achieved_qps')} qps)", dig(r, "send_lag_ms", "p99"), 1.0,
                div(dig(r, "send_lag_ms", "p99"), 1.0), "ms") for r in target]


def serving_overhead_rows(d: dict) -> list[Row]:
    out = []
    for b in ("1", "256"):
        local = dig(d, "overhead", b, "in_process", "p50_ms")
        for proto in ("http", "grpc"):
            v = dig(d, "overhead", b, proto, "p50_ms")
            out.append(row(f"{proto} p50 at batch {b} vs in-process p50", v, local, div(v, local), "ms"))
    tables = d.get("tables") or []
    shared = next((t for t in tables if t.get("share_tables")), {})
    copied = next((t for t in tables if t.get("share_tables") is False), {})
    out.append(row("worker PSS, shared tables vs copied", shared.get("worker_pss_mb_sum"),
                   copied.get("worker_pss_mb_sum"), div(shared.get("worker_pss_mb_sum"),
                                                        copied.get("worker_pss_mb_sum")), "MB"))
    return out


def embedding_kernels_rows(d: dict) -> list[Row]:
    res = [r for r in d.get("results") or [] if r.get("threads") == 1]
    base = {(r.get("name"), r.get("batch")): r for r in res if r.get("kernel") == "embeddingbag"}
    out = []
    for (shape, batch), r in sorted(base.items(), key=lambda kv: str(kv[0])):
        others = [o for o in res if (o.get("name"), o.get("batch")) == (shape, batch) and o is not r]
        best = max(others, key=lambda o: o.get("mlookups_per_cpu_s") or 0, default={})
        out.append(row(f"nn.EmbeddingBag M lookups per CPU-s, {shape}, batch {batch}, 1 thread "
                       f"(peer = best other kernel: {best.get('kernel', 'none')})", r.get("mlookups_per_cpu_s"),
                       best.get("mlookups_per_cpu_s"),
                       div(r.get("mlookups_per_cpu_s"), best.get("mlookups_per_cpu_s")), "M/s"))
    return out


def measure_rows(d: dict) -> list[Row]:
    gen = d.get("generator") or []
    ok = [g for g in gen if num(g.get("achieved_qps")) and num(g.get("offered_qps"))
          and g["achieved_qps"] >= 0.95 * g["offered_qps"]]
    best = max(ok, key=lambda g: g["achieved_qps"], default={})
    host = d.get("host") or {}
    return [row("load generator: highest offered rate it keeps up with (>= 95%)", best.get("achieved_qps"),
                best.get("offered_qps"), div(best.get("achieved_qps"), best.get("offered_qps")), "QPS"),
            row("host random-read bandwidth (1 thread, 64 B rows)", host.get("random_read_gbs_1t"), unit="GB/s"),
            row("host FP32 GEMM (1 thread)", host.get("gemm_gflops_1t"), unit="GFLOP/s")]


def zoo_rows(d: dict) -> list[Row]:
    res = d.get("results") or []
    out = []
    for b in sorted({r.get("batch") for r in res if isinstance(r.get("batch"), int)}):
        at_b = [r for r in res if r.get("batch") == b]
        ms = [(num(r.get("sparse_cpu_ms")) or 0.0) + (num(r.get("dense_cpu_ms")) or 0.0) for r in at_b]
        slowest = max(zip(ms, at_b, strict=True), key=lambda x: x[0], default=(None, {}))
        out.append(row(f"forward CPU ms per query, batch {b}, slowest of {len(at_b)} models "
                       f"({slowest[1].get('model')})", slowest[0], unit="ms"))
    return out


def perfmodel_rows(d: dict) -> list[Row]:
    return [row("perfmodel median abs. % error, held-out models", dig(d, "host_accuracy", "median_ape_heldout_models"),
                unit="%"),
            row("perfmodel median abs. % error, held-out batches",
                dig(d, "host_accuracy", "median_ape_heldout_batches"), unit="%"),
            row("Kairos EC2 instance ranking, mean Spearman (not fitted)", dig(d, "kairos", "mean_spearman"), 1.0,
                div(dig(d, "kairos", "mean_spearman"), 1.0)),
            row("Hercules search / exhaustive best QPS, worst pair", dig(d, "search", "min_ratio_to_exhaustive"), 1.0,
                num(dig(d, "search", "min_ratio_to_exhaustive"))),
            row("Hercules search evaluations / exhaustive, mean", dig(d, "search", "mean_eval_fraction"))]


def papers_rows(d: dict) -> list[Row]:
    rows = d.get("rows") or []
    verdicts = [r.get("reproduced") for r in rows if r.get("counted", True)]  # sensitivities/targets not counted
    out = [row("papers' claims reproduced (yes / direction only / no / n/a)",
               f"{verdicts.count('yes')} / {verdicts.count('direction')} / {verdicts.count('no')} / "
               f"{verdicts.count('n/a')}")]
    return out + [row(f"{r.get('claim')} (paper {r.get('paper')})", r.get("recserve")) for r in rows]


def transfer_rows(d: dict) -> list[Row]:
    out = []
    for host, res in (d.get("hosts") or {}).items():
        for how, r in res.items():
            out.append(row(f"perfmodel median abs. % error on {host}, {how}", r.get("median_ape"), 20.0,
                           div(r.get("median_ape"), 20.0), unit="%"))
    for how, k in (d.get("kairos") or {}).items():
        out.append(row(f"Kairos EC2 median abs. % error ({how})", k.get("median_ape_all"), 35.0,
                       div(k.get("median_ape_all"), 35.0), unit="%"))
        out.append(row(f"Kairos EC2 mean Spearman ({how})", k.get("mean_spearman"), 0.9,
                       div(k.get("mean_spearman"), 0.9)))
    return out


def planners_rows(d: dict) -> list[Row]:
    out = []
    for key, label, value in (("hera_affinity", "Hera affinity matrix, 200 models", "total_wall_s"),
                              ("hercules_provision_step", "Hercules provisioning step (ILP), median",
                               "ilp_wall_s_median"),
                              ("kairos_upper_bounds", "Kairos upper bounds, all configs <= budget", "wall_s")):
        v, t = dig(d, key, value), dig(d, key, "target_s")
        out.append(row(f"{label} (target = seconds allowed)", v, t, div(v, t), "s"))
    return out


def planners_scenarios_rows(d: dict) -> list[Row]:
    out = []
    h = d.get("hercules") or {}
    for base in ("greedy", "oblivious"):
        out.append(row(f"Hercules provisioning: avg power saving vs {base}",
                       dig(h, base, "hercules_power_saving_avg"), unit="fraction"))
    for model, k in sorted((d.get("kairos") or {}).items()):
        out.append(row(f"Kairos pool vs best homogeneous, {model}, same budget",
                       dig(k, "upper_bound_qps"), dig(k, "homogeneous", "qps"), num(dig(k, "gain")), "QPS"))
    runs = dig(d, "hera", "runs") or []
    if runs:
        last = runs[-1]
        out.append(row(f"Hera servers vs DeepRecSys (level {last.get('level')})", last.get("hera"),
                       last.get("deeprecsys"), div(last.get("hera"), last.get("deeprecsys")), "servers"))
    return out


def sim_rows(d: dict) -> list[Row]:
    t = d.get("target_queries_per_minute")
    return [row(f"simulated queries per CPU-minute, {policy}", dig(d, key, "sim_queries_per_minute_cpu"), t,
                div(dig(d, key, "sim_queries_per_minute_cpu"), t), "q/min")
            for key, policy in (("fcfs", "FCFS (Ribbon)"), ("kairos", "Kairos"))]


def dispatch_rows(d: dict) -> list[Row]:
    return [row(f"Kairos dispatch decision median, {d.get('queries')} queries x {d.get('instances')} instances",
                d.get("median_ms"), d.get("target_ms"), div(d.get("median_ms"), d.get("target_ms")), "ms"),
            row("Kairos dispatch decision p99 (CPU)", d.get("cpu_p99_ms"), d.get("target_ms"),
                div(d.get("cpu_p99_ms"), d.get("target_ms")), "ms")]


def sdm_rows(d: dict) -> list[Row]:
    configs = dig(d, "end_to_end", "configs") or []
    dram = next((c for c in configs if c.get("name") == "all-DRAM"), {})
    out = [row("SSD raw 512 B reads, best IOPS", max((num(x.get("iops")) or 0 for x in d.get("raw_io") or []),
                                                     default=None), unit="IOPS")]
    for c in configs:
        if c is not dram:
            out.append(row(f"{c.get('name')}: max QPS at SLA (vs all-DRAM), {num(c.get('dram_saved_mb')) or 0:.0f} MB "
                           "DRAM saved", c.get("max_qps"), dram.get("max_qps"),
                           div(c.get("max_qps"), dram.get("max_qps")), "QPS"))
    return out


def elasticrec_rows(d: dict) -> list[Row]:
    return [row(f"ElasticRec memory saving (PSS, model-wise / sharded), {d.get('model')}",
                d.get("memory_saving_pss"), unit="x"),
            row("ElasticRec sharded p95 at fixed load vs model-wise", dig(d, "sharded", "fixed_qps", "p95_ms"),
                dig(d, "modelwise", "fixed_qps", "p95_ms"),
                div(dig(d, "sharded", "fixed_qps", "p95_ms"), dig(d, "modelwise", "fixed_qps", "p95_ms")), "ms"),
            row("ElasticRec added latency p50 (sharded - model-wise, low load)", d.get("added_latency_p50_ms"),
                unit="ms")]


def route_rows(d: dict) -> list[Row]:
    k, r = dig(d, "live_allowable_qps", "kairos"), dig(d, "live_allowable_qps", "ribbon")
    sk, sr = dig(d, "simulated_qps", "kairos"), dig(d, "simulated_qps", "ribbon")
    return [row(f"live router: Kairos vs FCFS (Ribbon) allowable QPS at p99 QoS, {d.get('model')}", k, r, div(k, r),
                "QPS"),
            row("same pool simulated: Kairos vs FCFS", sk, sr, div(sk, sr), "QPS")]


def search_live_rows(d: dict) -> list[Row]:
    return [row(f"live Hercules / DeepRecSys re-measured max load, {m['model']}", dig(m, "confirm", "ratio"))
            for m in d.get("models", [])]


def rmu_live_rows(d: dict) -> list[Row]:
    return [row(f"live windows violating SLA, {name}", 100 * max(r["violation_fraction"].values()), unit="%")
            for name, r in d.items() if isinstance(r, dict) and "violation_fraction" in r]


# ---------------------------------------------------------------- the suite


@dataclass
class Bench:
    name: str
    script: str
    args: list[str]
    outputs: list[tuple[str, Extractor]]  # results file -> extractor
    timeout_s: int = DEFAULT_TIMEOUT_S
    state: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        return shlex.join([".venv/bin/python", f"benchmarks/{self.script}", *self.args])


def suite() -> list[Bench]:
    """Quick settings for a 2-core host.  Order: cheap and CPU-only first, live servers last."""
    return [
        Bench("limits", "bench_limits.py", ["--seconds", "0.5"], [("limits.json", limits_rows)], 900),
        Bench("zoo", "bench_zoo.py", ["--models", "hera-dlrm-a,hercules-rmc1,elasticrec-rm3,kairos-dien",
                                      "--min-time", "0.2"], [("zoo_forward.json", zoo_rows)], 300),
        Bench("embedding_kernels", "bench_embedding_kernels.py", ["--quick", "--threads", "1"],
              [("embedding_kernels.json", embedding_kernels_rows)], 300),
        Bench("measure", "bench_measure.py", ["--scale", "1e-3", "--array-mb", "256"],
              [("bench_measure.json", measure_rows)], 600),
        Bench("loadgen", "bench_loadgen.py", ["--seconds", "3"], [("loadgen.json", loadgen_rows)], 300),
        Bench("dispatch", "bench_dispatch.py", ["20", "20"], [("dispatch_decision.json", dispatch_rows)], 300),
        Bench("sim", "bench_sim.py", [], [("sim.json", sim_rows)], 300),
        Bench("planners", "bench_planners.py", [], [("planners.json", planners_rows),
                                                     ("planners_scenarios.json", planners_scenarios_rows)], 600),
        Bench("perfmodel", "bench_perfmodel.py", ["--quick"], [("perfmodel.json", perfmodel_rows)], 900),
        Bench("papers", "bench_papers.py", [], [("papers.json", papers_rows)], 900),
        Bench("transfer", "bench_transfer.py", ["--every", "3"], [("transfer.json", transfer_rows)], 900),
        Bench("sdm", "bench_sdm.py", ["--quick", "--out", "results/sdm_quick.json"],
              [("sdm_quick.json", sdm_rows)], 600),
        Bench("serving_overhead", "bench_serving_overhead.py", ["--requests", "100", "--seconds", "4"],
              [("serving_overhead.json", serving_overhead_rows)], 600),
        Bench("elasticrec_live", "bench_elasticrec_live.py", ["--seconds", "8", "--low-seconds", "5"],
              [("elasticrec_live.json", elasticrec_rows)], 600),
        Bench("route", "bench_route.py", [], [("route_live.json", route_rows)], 1200),
        Bench("search_live", "bench_search_live.py", [], [("search_live.json", search_live_rows)], 1800),
        Bench("rmu_live", "bench_rmu_live.py", [], [("rmu_live.json", rmu_live_rows)], 1800),
        Bench("peers", "bench_peers.py", ["--model", "hercules-rmc1", "--scale", "1e-3", "--sla-ms", "100",
                                          "--probe-s", "3", "--workers", "1,2", "--peers", "recserve,fastapi"],
              [("bench_peers.json", peers_rows)], 1500),
        Bench("wrk", "bench_wrk.py", ["--workers", "1,2", "--duration", "3", "--rows",
                                      "recserve,recserve-json,recserve-grpc,fastapi"], [], 900),
    ]


def with_unknown_scripts(benches: list[Bench]) -> list[Bench]:
    """Append any ``bench_*.py`` the table does not know (a new benchmark), run with no arguments."""
    known = {b.script for b in benches}
    extra = [Bench(p.stem.removeprefix("bench_"), p.name, [], [])
             for p in sorted(BENCH_DIR.glob("bench_*.py")) if p.name not in known]
    return benches + extra


def run_one(bench: Bench, timeout_scale: float) -> None:
    """Run one benchmark in its own process group (so a timeout also ends the servers it started)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{bench.name}.log"
    timeout = max(30, int(bench.timeout_s * timeout_scale))
    if not (BENCH_DIR / bench.script).exists():
        bench.state.update(status="missing", detail=f"benchmarks/{bench.script} not found")
        return
    start = time.perf_counter()
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([sys.executable, str(BENCH_DIR / bench.script), *bench.args], cwd=ROOT,
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
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


def summarise(benches: list[Bench]) -> list[Row]:
    rows: list[Row] = []
    for b in benches:
        status = b.state.get("status", "not run")
        if status not in ("ok", "not run"):
            rows.append({"benchmark": b.name, "metric": f"FAILED: {status} ({b.state.get('detail', '')})",
                         "value": None, "unit": "", "target": None, "ratio": None, "command": b.command(),
                         "status": status, "log": b.state.get("log")})
            continue
        if not b.outputs:
            rows.append({"benchmark": b.name, "metric": "ran (no headline extractor in run_all.py)", "value": None,
                         "unit": "", "target": None, "ratio": None, "command": b.command(), "status": status})
        for filename, extract in b.outputs:
            rows.extend(rows_of(b, filename, extract, status))
    return rows


def rows_of(b: Bench, filename: str, extract: Extractor, status: str) -> list[Row]:
    path = RESULTS / filename
    base = {"benchmark": b.name, "command": b.command(), "source": f"results/{filename}"}
    if not path.exists():
        return [{**base, "metric": f"MISSING: results/{filename} (not run yet?)", "value": None, "unit": "",
                 "target": None, "ratio": None, "status": "missing"}]
    try:
        data = json.loads(path.read_text())
        extracted = extract(data) if isinstance(data, dict) else []
    except Exception as exc:  # noqa: BLE001 - a broken results file is a failed row, not a crash
        return [{**base, "metric": f"FAILED to read results/{filename}: {type(exc).__name__}: {exc}",
                 "value": None, "unit": "", "target": None, "ratio": None, "status": "unreadable"}]
    if not extracted:
        extracted = [row(f"no headline numbers in results/{filename}", None)]
    when = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    stale = status == "not run"
    return [{**base, **r, "status": "earlier run" if stale else "ok", "written": when} for r in extracted]


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
        ratio = f"{r['ratio']:.2f}x" if isinstance(r.get("ratio"), float) else "n/a"
        lines.append(f"| {r['benchmark']} | {metric} | {fmt(r.get('value'))}{unit} | {fmt(r.get('target'))} "
                     f"| {ratio} | `{r['command']}` |")
    return "\n".join(lines) + "\n"


def main() -> int:
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
