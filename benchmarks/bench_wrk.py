"""A closed-loop pass with C load generators: one fixed request, sent as fast as the server answers it over a
few connections, by wrk (HTTP) or h2load (gRPC), to every server bench_peers.py compares.

For each worker count in ``--workers`` all the servers are started (bench_peers' starters, ``peers/servers.py``),
and each fixed request (``--batches``: queries of that many items of the benchmark model, built as bench_peers
builds its pool) is first sent once with a Python client: the answer must be a success whose scores equal bit for
bit those of the model built in process (a mismatch is flagged, not fatal).  Then the servers take turns under
the tool: a 1 s warm-up, then ``--duration`` seconds measured.  The request is what the row's protocol carries:
v2 HTTP with the binary extension (``recserve`` and its ablations), plain JSON (``recserve-json`` and the peers'
HTTP rows, FastAPI's and Ray's too, which bench_peers drives in binary), or a gRPC ``ModelInferRequest`` with
raw tensor contents (``-grpc``).

Reported per row: successful requests/s, p50/p99 latency, non-2xx answers and socket errors, the ratio
recserve (binary) / it, the tool's own CPU and the host's busy cores during the run (on a small host the tool
competes with the server for cores), and for recserve's HTTP rows each worker's CPU, the tool's connections it
held and the queries forwarded to an idle sibling (how the load spreads over the workers).
A missing wrk or h2load skips its protocol's rows with a note; it never fails the benchmark.

Beside req/s each row reports its server's CPU per answer (every process descended from the one listening on
its port, sampled over the measured seconds), and that over recserve's row of the same wire: on a small host the
tool takes cores from the server, so req/s ratios move with it, while CPU per answer is the server's own work.
``--binary-rows fastapi`` sends FastAPI the binary extension, as bench_peers does, for a like-for-like HTTP row.

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_wrk --workers 1,2 --duration 5 [--binary-rows fastapi]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.bench_peers import compare_scores, reference_scores, worker_counts
from benchmarks.common.timing import connections_held, listening_pids, process_tree, tree_cpu_s
from benchmarks.peers import loadtools
from benchmarks.peers.servers import NOTES, PEERS, runnable, say
from recserve.measure.requests import RequestPool
from recserve.measure.sink import process_cpu_s
from recserve.measure.targets import (
    decode_grpc_response,
    decode_http_response,
    encode_grpc_request,
    encode_http_request,
    encode_json_request,
    grpc_messages,
)
from recserve.serving.wire.codec import HEADER_LENGTH
from recserve.specs import get_model
from recserve.wire import OUTPUT_SCORES

ROWS = ("recserve", "recserve-json", "recserve-grpc", "fastapi", "ray-serve", "kserve-rest", "kserve-grpc",
        "mlserver-rest", "mlserver-grpc")
BASE = "recserve"  # the row every ratio is taken against
# rows whose server computes outside the processes descended from the one listening on its port (Ray Serve's
# replicas are actors started by Ray's raylet, not by its HTTP proxy): their server CPU is not reported
PARTIAL_TREE = {"ray-serve"}


BINARY_PEERS = ("fastapi", "ray-serve")  # peers that read the binary tensor extension (bench_peers sends it them)


def as_json(name: str, url: str, binary_rows: frozenset[str] = frozenset()) -> str:
    """The row's URL: plain JSON for the peers' HTTP rows (what curl and most clients send) but those of
    ``binary_rows``; recserve's rows as bench_peers names them (``recserve`` and its ablations binary,
    ``recserve-json`` JSON)."""
    json_row = not name.startswith(BASE) and name not in binary_rows
    return url.replace("http://", "http+json://", 1) if json_row and url.startswith("http://") else url


def wire_of(url: str) -> str:
    """What a row's requests carry: ``grpc``, ``json`` or ``binary`` (the HTTP binary tensor extension)."""
    return "grpc" if url.startswith("grpc://") else "json" if url.startswith("http+json://") else "binary"


def protocol_of(url: str) -> str:
    return "grpc" if url.startswith("grpc://") else "http"


def fixed_request(url: str, model: str, pool: RequestPool, i: int) -> tuple[bytes, dict[str, str]]:
    """Pooled query ``i`` as the bytes the tool sends to ``url``: an HTTP body and its headers, or one framed
    gRPC message."""
    batch = pool.batch(i)
    if url.startswith("grpc://"):
        return loadtools.grpc_frame(encode_grpc_request(batch, model).SerializeToString()), {}
    if url.startswith("http+json://"):
        return encode_json_request(batch), {"Content-Type": "application/json"}
    body, head = encode_http_request(batch)
    return body, {HEADER_LENGTH: str(head), "Content-Type": "application/octet-stream"}


def http_base(url: str) -> str:
    return "http://" + url.split("://", 1)[1].rstrip("/")


def ask_once(url: str, model: str, body: bytes, headers: dict[str, str]) -> tuple[np.ndarray, int]:
    """The scores a server answers to exactly these bytes, and the answer's size on the wire (a framed gRPC
    message; the HTTP body); raises on a failure (an HTTP error status, a gRPC status other than OK)."""
    if url.startswith("grpc://"):
        import grpc

        with grpc.insecure_channel(url.removeprefix("grpc://"), options=[("grpc.max_receive_message_length", -1),
                                                                          ("grpc.max_send_message_length", -1)]) as ch:
            call = ch.unary_unary(loadtools.GRPC_INFER_PATH, request_serializer=None, response_deserializer=None)
            raw = call(body[5:], timeout=60)
        answer = decode_grpc_response(grpc_messages().ModelInferResponse.FromString(raw))
        return answer[OUTPUT_SCORES], len(raw) + 5
    request = urllib.request.Request(f"{http_base(url)}/v2/models/{model}/infer", body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=60) as resp:
        data, length = resp.read(), resp.headers.get(HEADER_LENGTH)
    return decode_http_response(data, int(length) if length is not None else None)[OUTPUT_SCORES], len(data)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (0 if it is gone)."""
    try:
        return process_cpu_s([pid])
    except OSError:
        return 0.0


def host_busy() -> tuple[float, float]:
    """The host's busy and total CPU jiffies so far (all cores, /proc/stat)."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def recserve_state(url: str, model: str) -> tuple[list[dict], dict]:
    """recserve's workers (id, pid) and its sibling-forwarding counts, from its control API."""
    with urllib.request.urlopen(f"{http_base(url)}/control/models/{model}", timeout=10) as resp:
        state = json.loads(resp.read())
    workers = [w for stage in state.get("stages", {}).values() for w in stage.get("worker_detail", [])]
    return workers, state.get("siblings", {})


def run_tool(url: str, model: str, body: bytes, headers: dict[str, str], args: argparse.Namespace,
             answer_bytes: int, folder: Path, per_worker: bool = False, server_cpu: bool = True) -> dict:
    """One measured run (after a 1 s warm-up) of the protocol's tool against ``url``, with its CPU, the host's, the
    server's (``server_cpu``: every process descended from the one listening on the port, per answer), and for a
    recserve HTTP row each worker's CPU and the tool's connections it held half-way through the run."""
    data = folder / "body.bin"
    data.write_bytes(body)
    if protocol_of(url) == "grpc":
        log = folder / "h2load.log"
        cmd = loadtools.h2load_command(http_base(url), data, log, args.duration, args.connections)
    else:
        script = folder / "post.lua"
        script.write_text(loadtools.wrk_script(data, headers))
        target = f"{http_base(url)}/v2/models/{model}/infer"
        subprocess.run(loadtools.wrk_command(target, script, 1, args.connections), capture_output=True, check=True)
        cmd = loadtools.wrk_command(target, script, args.duration, args.connections)
    workers, siblings = recserve_state(url, model) if per_worker else ([], {})
    cpu0 = [cpu_seconds(w["pid"]) for w in workers]
    port = int(url.rsplit(":", 1)[1])
    server = process_tree(listening_pids(port)) - {os.getpid()} if server_cpu else set()
    tool0, (busy0, all0), t0 = resource.getrusage(resource.RUSAGE_CHILDREN), host_busy(), time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    warm = 1 if protocol_of(url) == "grpc" else 0  # h2load warms up 1 s first (wrk warmed up above)
    time.sleep(warm)
    server0, server_t0 = tree_cpu_s(server), time.monotonic()
    time.sleep(args.duration / 2)
    conns = [connections_held(w["pid"], port) for w in workers]
    stdout, stderr = proc.communicate()
    tool1, (busy1, all1), wall = resource.getrusage(resource.RUSAGE_CHILDREN), host_busy(), time.monotonic() - t0
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd, stdout, stderr)
    if protocol_of(url) == "grpc":
        result = loadtools.parse_h2load(stdout, log.read_text(), answer_bytes)
    else:
        result = loadtools.parse_wrk(stdout)
    result["tool_cpu_per_s"] = (tool1.ru_utime + tool1.ru_stime - tool0.ru_utime - tool0.ru_stime) / wall
    result["host_busy_cores"] = (busy1 - busy0) / max(1, all1 - all0) * os.cpu_count()
    server_s, server_wall = tree_cpu_s(server) - server0, time.monotonic() - server_t0
    result["server_processes"] = len(server)
    result["server_cpu_per_s"] = server_s / server_wall if server else None
    result["server_cpu_us_per_answer"] = server_s / result["ok"] * 1e6 if server and result["ok"] else None
    if workers:
        result["per_worker"] = [{"id": w["id"], "connections": n, "cpu_per_s": (cpu_seconds(w["pid"]) - c0) / wall}
                                for w, n, c0 in zip(workers, conns, cpu0, strict=True)]
        worker_cpu = sum(w["cpu_per_s"] for w in result["per_worker"]) * wall
        result["worker_cpu_us_per_answer"] = worker_cpu / result["ok"] * 1e6 if result["ok"] else None
        after = recserve_state(url, model)[1]
        result["siblings"] = {k: after.get(k, 0) - v for k, v in siblings.items()}
    return result


def check_row(name: str, url: str, args: argparse.Namespace, pool: RequestPool, want: list[np.ndarray],
              i: int) -> tuple[dict, int]:
    """The fixed request sent once: its scores against the reference, and the answer's size."""
    body, headers = fixed_request(url, args.model, pool, i)
    try:
        got, answer_bytes = ask_once(url, args.model, body, headers)
    except Exception as exc:  # noqa: BLE001 - recorded: the row is still measured, its failures counted
        say(f"!! {name}: the fixed request of {pool.sizes[i]} failed: {type(exc).__name__}: {exc}")
        return {"identical": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}, 0
    check = compare_scores(got, want[i])
    if not check["identical"]:
        say(f"!! {name}: scores differ from the reference for batch {pool.sizes[i]}: {check}")
    return check, answer_bytes


def plan_rows(asked: list[str], can_run=runnable) -> tuple[list[str], dict[str, str]]:
    """The rows that can run here, and why each other one cannot: its server (``can_run``, bench_peers'
    check) or its protocol's tool missing."""
    skipped = {}
    for name in asked:
        if why := can_run(name) or loadtools.missing("grpc" if name.endswith("grpc") else "http"):
            skipped[name] = why
    return [name for name in asked if name not in skipped], skipped


def one_worker_count(rows: list[str], workers: int, pool: RequestPool, args: argparse.Namespace, sla_ms: float,
                     want: list[np.ndarray]) -> dict[str, dict]:
    """Every row's server up; for each batch, the rows take turns under the tool."""
    by_batch: dict[str, dict] = {str(size): {} for size in pool.sizes}
    with ExitStack() as stack:
        urls = {}
        for name in rows:
            say(f"== {name}, {workers} workers: starting")
            started = stack.enter_context(PEERS[name](args.model, args.scale, workers, sla_ms))
            urls[name] = as_json(name, started, frozenset(args.binary_rows))
        for i, size in enumerate(pool.sizes):
            for name in rows:
                check, answer_bytes = check_row(name, urls[name], args, pool, want, i)
                say(f"-- {name}, {workers} workers, batch {size} (load average {os.getloadavg()[0]:.2f})")
                body, headers = fixed_request(urls[name], args.model, pool, i)
                with tempfile.TemporaryDirectory(prefix="bench-wrk-") as folder:
                    try:
                        result = run_tool(urls[name], args.model, body, headers, args, answer_bytes, Path(folder),
                                          per_worker=name.startswith("recserve") and protocol_of(urls[name]) == "http",
                                          server_cpu=name not in PARTIAL_TREE)
                    except (subprocess.CalledProcessError, ValueError) as exc:
                        out = getattr(exc, "stderr", "") or ""
                        result = {"failed": f"{exc} {out[-500:]}".strip()}
                        say(f"!! {name}: {result['failed']}")
                by_batch[str(size)][name] = {**result, "score_check": check, "wire": wire_of(urls[name]),
                                             "load_avg": os.getloadavg()[0]}
    return by_batch


RECSERVE_ROW_OF = {"binary": BASE, "json": "recserve-json", "grpc": "recserve-grpc"}


def add_ratios(results: dict) -> None:
    """req/s of recserve (binary) over each row's; and each row's server CPU per answer over that of recserve's row
    carrying the same wire (how many times recserve's work per answer it does: capacity on a host with cores to
    spare, where req/s on a small host also counts the tool's CPU)."""
    for by_batch in results["by_workers"].values():
        for by_row in by_batch.values():
            base = by_row.get(BASE, {}).get("rps")
            for r in by_row.values():
                r["recserve_over_it"] = base / r["rps"] if base and r.get("rps") else None
                own = by_row.get(RECSERVE_ROW_OF.get(r.get("wire"), ""), {}).get("server_cpu_us_per_answer")
                it = r.get("server_cpu_us_per_answer")
                r["cpu_over_recserve"] = it / own if it and own else None


def print_table(results: dict) -> None:
    print(f"closed loop, one fixed request, {results['connections']} connections, {results['duration_s']:g} s per "
          f"run, {results['model']} scale {results['scale']}; load average {results['load_avg_before']:.2f} before, "
          f"{results['load_avg_after']:.2f} after")
    print(f"{'workers':>7} {'batch':>5} {'server':15s} {'wire':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'non-2xx':>7} {'errors':>6} {'recserve/it':>11} {'tool CPU':>8} {'host busy':>9} {'server CPU':>10} "
          f"{'us/answer':>9} {'x recserve':>10} {'scores':>6}  per worker (connections, CPU)")
    for workers, by_batch in results["by_workers"].items():
        for size, by_row in by_batch.items():
            for name, r in by_row.items():
                if "failed" in r:
                    print(f"{workers:>7} {size:>5} {name:15s} failed: {r['failed'][:80]}")
                    continue
                ratio = f"{r['recserve_over_it']:.2f}x" if r.get("recserve_over_it") else "n/a"
                scores = "same" if r["score_check"].get("identical") else "DIFFER"
                spread = " ".join(f"{w['connections']}/{w['cpu_per_s']:.2f}" for w in r.get("per_worker", []))
                if r.get("siblings"):
                    spread += (f" (forwarded {r['siblings'].get('forwarded', 0)}, "
                               f"{r['worker_cpu_us_per_answer'] or 0:.0f} us CPU per answer)")
                cores, per_answer, over = (r.get(k) for k in ("server_cpu_per_s", "server_cpu_us_per_answer",
                                                               "cpu_over_recserve"))
                print(f"{workers:>7} {size:>5} {name:15s} {r.get('wire', ''):>6} {r['rps']:>8.1f} {r['p50_ms']:>8.2f} "
                      f"{r['p99_ms']:>8.2f} {r['non_2xx']:>7} {r['errors']:>6} {ratio:>11} "
                      f"{r['tool_cpu_per_s']:>8.2f} {r['host_busy_cores']:>9.2f} "
                      f"{'n/a' if cores is None else f'{cores:.2f}':>10} "
                      f"{'n/a' if per_answer is None else f'{per_answer:.0f}':>9} "
                      f"{'n/a' if over is None else f'{over:.2f}x':>10} {scores:>6}  {spread}")
    print("(req/s: successful answers; non-2xx: for gRPC rows also the HTTP 200s that carried a gRPC error instead "
          "of an answer; tool CPU: cores; host busy: the host's busy cores, all processes; server CPU: cores of every "
          "process descended from the one listening on the row's port, us/answer its CPU per successful answer, "
          "x recserve that over recserve's row of the same wire)")
    for name, note in results["notes"].items():
        print(f"note: {name}: {note}")
    for name, why in results["skipped"].items():
        print(f"skipped: {name}: {why}")


def headline(results: dict) -> list[dict]:
    """Per worker count and batch: recserve's req/s under the tool, against each other row's."""
    out = []
    for workers, by_batch in (results.get("by_workers") or {}).items():
        for size, by_row in by_batch.items():
            base = by_row.get(BASE, {}).get("rps")
            out.append(harness.row(f"{BASE} req/s, {workers} workers, batch {size}", base, "req/s"))
            out += [harness.row(f"{BASE} req/s, {workers} workers, batch {size} (target: {name})", base, "req/s",
                                r.get("rps")) for name, r in by_row.items() if name != BASE]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--workers", type=worker_counts, default="1,2", help="worker counts, e.g. 1,2,all")
    parser.add_argument("--batches", default="1,256", help="items per fixed request, one pass each")
    parser.add_argument("--sla-ms", type=float, default=None,
                        help="recserve's query deadline (as bench_peers); default: the model's catalogue SLA")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--connections", type=int, default=4, help="connections (wrk -c, h2load -c)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {','.join(ROWS)}")
    parser.add_argument("--binary-rows", type=lambda t: [n.strip() for n in t.split(",") if n.strip()], default=[],
                        help=f"peer rows sent the HTTP binary tensor extension instead of JSON, of "
                             f"{','.join(BINARY_PEERS)}")
    parser.add_argument("--out", default="results/bench_wrk.json")
    args = parser.parse_args()
    if unknown := set(args.binary_rows) - set(BINARY_PEERS):
        parser.error(f"--binary-rows: {sorted(unknown)} read no binary tensors; choose from {','.join(BINARY_PEERS)}")
    spec = get_model(args.model)
    sla = args.sla_ms or spec.sla.target_ms
    pool = RequestPool(spec, args.scale, tuple(int(b) for b in args.batches.split(",")))
    rows, skipped = plan_rows([r.strip() for r in args.rows.split(",") if r.strip()])
    results = {"model": args.model, "scale": args.scale, "batches": list(pool.sizes), "sla_ms": sla,
               "duration_s": args.duration, "connections": args.connections, "tools": {"http": "wrk -t1",
                                                                                       "grpc": "h2load -t1 -m1"},
               "rows": rows, "skipped": skipped, "notes": {n: NOTES[n] for n in rows if n in NOTES},
               "load_avg_before": os.getloadavg()[0], "cores": os.cpu_count(), "by_workers": {}}
    for name, why in skipped.items():
        say(f"skipped: {name}: {why}")
    want = [reference_scores(args.model, args.scale, pool, i) for i in range(len(pool))]
    for workers in args.workers:
        results["by_workers"][str(workers)] = one_worker_count(rows, workers, pool, args, sla, want)
        harness.write_result(args.out, args, headline(results), results)
    results["load_avg_after"] = os.getloadavg()[0]
    add_ratios(results)
    print_table(results)
    harness.write_result(args.out, args, headline(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
