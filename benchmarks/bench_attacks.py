"""Hostile clients beside a well-behaved one: does one client stall, bloat or kill a node's workers?

A node (its own process) serves one model with N workers.  For each attack, one phase without it (the baseline)
and one with it: a well-behaved gRPC client sends an open-loop load at a fixed rate (its p99), a prober asks
``/v2/health/ready`` every 0.1 s (its slowest answer), and the workers' RSS is sampled; after the attacker leaves,
RSS again and the worker restarts the node counted.  The attacker is another process on loopback; each attack is
bounded in time.  Prints a table and writes JSON.

    python -m benchmarks.bench_attacks [--model hercules-rmc1] [--scale 1e-3] [--workers 2] [--seconds 5]
        [--qps 50] [--attacks ping,settings,...] [--out results/attacks.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import sys
import threading
import time
import urllib.request
from typing import Any

import numpy as np

from benchmarks import harness
from recserve.measure.http_client import HttpClientError, HttpPool, encode_post
from recserve.measure.loadgen import LoadSession
from recserve.measure.requests import RequestPool
from recserve.measure.served import LocalServer
from recserve.measure.sink import process_cpu_s
from recserve.measure.targets import encode_grpc_request, encode_http_request
from recserve.serving.transport.h2frames import PREFACE
from recserve.serving.transport.h2frames import frame as _frame
from recserve.serving.wire.codec import DATATYPES
from recserve.serving.worker.reporter import TRIM_QUIET_S
from recserve.specs import get_model

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 8, 9
END_STREAM, END_HEADERS = 0x1, 0x4
SERVICE = "/inference.GRPCInferenceService/"


def log(msg: str) -> None:
    print(f"[attacks] {msg}", file=sys.stderr, flush=True)


# ---- the attacker (a process of its own) ----------------------------------------------------------------------
def _block(path: str) -> bytes:
    """A literal-only HPACK header block of a gRPC call to ``path``."""
    def literal(name: bytes, value: bytes) -> bytes:
        return b"\x00" + _length(name) + name + _length(value) + value

    return (b"\x83\x86" + literal(b":path", path.encode()) + literal(b":authority", b"x")
            + literal(b"content-type", b"application/grpc") + literal(b"te", b"trailers"))


def _length(value: bytes) -> bytes:
    n = len(value)
    if n < 127:
        return bytes([n])
    out, n = [127], n - 127
    while n >= 128:
        out.append(n % 128 + 128)
        n //= 128
    return bytes(out + [n])


def _message(raw: bytes) -> bytes:
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def _rapid_reset(path: str, raw: bytes, first: int, count: int) -> bytes:
    block, body = _block(path), _message(raw)
    return b"".join(_frame(HEADERS, END_HEADERS, s, block) + _frame(DATA, END_STREAM, s, body)
                    + _frame(RST_STREAM, 0, s, b"\x00\x00\x00\x08") for s in range(first, first + 2 * count, 2))


def _grpc_flood(kind: str, raw: bytes) -> tuple[bytes, Any]:
    """What an HTTP/2 attacker sends first on a connection, and a function giving its next burst (given the burst
    number)."""
    hello = PREFACE + _frame(SETTINGS, 0, 0)
    if kind == "ping":
        return hello, lambda i: _frame(PING, 0, 0, b"12345678") * 1000
    if kind == "settings":
        return hello, lambda i: _frame(SETTINGS, 0, 0) * 1000
    if kind == "window_update":  # the connection's window opened a byte at a time
        return hello, lambda i: _frame(WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x01") * 1000
    if kind == "priority":  # PRIORITY frames for idle streams (RFC 9113 deprecates the scheme; they still parse)
        return hello, lambda i: b"".join(_frame(PRIORITY, 0, 2 * k + 1, b"\x00\x00\x00\x00\x10")
                                         for k in range(1000 * i, 1000 * i + 1000))
    if kind == "unknown_frames":  # a frame type no one defines: ignored by RFC 9113 5.5
        return hello, lambda i: _frame(0x42, 0, 0, b"x" * 8) * 1000
    if kind == "header_lists":  # 64 KiB header blocks of empty literal fields (HPACK's decoded size: 32 a field)
        return hello, lambda i: _frame(HEADERS, END_HEADERS, 2 * i + 1, b"\x00\x00\x00" * 21845)
    if kind == "empty_data":
        return hello + _frame(HEADERS, END_HEADERS, 1, _block(SERVICE + "ModelInfer")), \
            lambda i: _frame(DATA, 0, 1) * 1000
    if kind == "continuation":
        return hello + _frame(HEADERS, 0, 1, _block(SERVICE + "ModelInfer")), \
            lambda i: _frame(CONTINUATION, 0, 1) * 1000
    if kind == "rapid_reset_infer":
        return hello, lambda i: _rapid_reset(SERVICE + "ModelInfer", raw, 1 + 200 * i, 100)
    if kind == "rapid_reset_forwarded":
        return hello, lambda i: _rapid_reset(SERVICE + "ServerReady", b"", 1 + 200 * i, 100)
    if kind == "incomplete_messages":  # streams each sending 1 MiB of a 32 MiB message, never completed
        chunk = b"\x00" + (32 << 20).to_bytes(4, "big") + b"x" * ((1 << 20) - 5)
        block = _block(SERVICE + "ModelInfer")
        return hello, lambda i: (_frame(HEADERS, END_HEADERS, 2 * i + 1, block) + _frame(DATA, 0, 2 * i + 1, chunk)
                                 if i < 1024 else b"")
    if kind == "tiny_fields":  # whole requests of empty inputs (two bytes each), each 1 MiB: one stream window
        block, body = _block(SERVICE + "ModelInfer"), _message(b"\x2a\x00" * ((1 << 19) - 3))
        return hello, lambda i: (_frame(HEADERS, END_HEADERS, 2 * i + 1, block) + _frame(DATA, END_STREAM, 2 * i + 1,
                                                                                        body) if i < 256 else b"")
    raise ValueError(kind)


def _flood_grpc(kind: str, port: int, seconds: float, raw: bytes) -> dict[str, int]:
    """Send bursts until ``seconds`` pass; reconnect whenever the server closes the connection."""
    hello, burst = _grpc_flood(kind, raw)
    end, sent, connections = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                connections += 1
                sock.sendall(hello)
                sock.setblocking(False)
                i = 0
                while time.monotonic() < end:
                    data = burst(i)
                    i += 1
                    if not data:
                        time.sleep(0.05)
                        continue
                    sock.setblocking(True)
                    sock.settimeout(1.0)
                    sock.sendall(data)
                    sent += len(data)
                    sock.setblocking(False)
                    try:
                        while sock.recv(1 << 20):
                            pass
                        break  # closed by the server
                    except BlockingIOError:
                        pass
        except (OSError, TimeoutError):
            time.sleep(0.01)
    return {"bytes_sent": sent, "connections": connections}


def _http_pipeline(port: int, seconds: float, request: bytes) -> dict[str, int]:
    """Pipelined infers written as fast as the socket takes them; answers read only to drain them."""
    end, sent, answered, last = time.monotonic() + seconds, 0, 0, b""
    batch = memoryview(request * 64)
    pending = batch  # what is left of the batch being written: a partial send resumes where it stopped
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setblocking(False)
        try:
            while time.monotonic() < end:
                try:
                    n = sock.send(pending)
                    sent, pending = sent + n, pending[n:] or batch
                except BlockingIOError:
                    time.sleep(0.001)
                try:
                    data = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    break
                answered += len(data)
                last = (last + data)[-4096:]
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection: say after what
    status = last.rsplit(b"HTTP/1.1 ", 1)[-1][:3].decode("latin-1") if b"HTTP/1.1 " in last else ""
    return {"bytes_sent": sent, "bytes_answered": answered, "closed_early": time.monotonic() < end,
            "last_status": status}


def _json_burst(port: int, seconds: float, request: bytes, connections: int = 8) -> dict[str, int]:
    """Large, well-formed plain-JSON infers (batch 256, ~2 MB) on ``connections`` keep-alive connections, each
    sending its next as soon as its answer is read: what wrk did to a worker in issue #51."""
    end, counts = time.monotonic() + seconds, {"answered": 0, "failed": 0}

    async def burst() -> None:
        pool = HttpPool("127.0.0.1", port, limit=connections)

        async def one() -> None:
            while time.monotonic() < end:
                try:
                    await pool.send(request, 30.0)
                    counts["answered"] += 1
                except (HttpClientError, TimeoutError):
                    counts["failed"] += 1
                    await asyncio.sleep(0.05)

        try:
            await asyncio.gather(*(one() for _ in range(connections)))
        finally:
            pool.close()

    asyncio.run(burst())
    return counts


HIDDEN = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"  # a request smuggled where a parser may see a body


def _ambiguous_heads(path: str) -> list[bytes]:
    """Request heads that frame their body ambiguously (RFC 9112 6.3, 5.2; the request-smuggling classes), each with
    a second request hidden behind it: a server must refuse the head and close, never answer the hidden one."""
    post, n = f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode(), len(HIDDEN)
    return [post + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % n + HIDDEN,  # CL.CL
            post + b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n\r\n0\r\n\r\n" % n + HIDDEN,  # TE.CL
            post + b"Transfer-Encoding: gzip\r\n\r\n" + HIDDEN,  # TE not ending in chunked
            post + b"X-A: a\r\n Content-Length: %d\r\n\r\n" % n + HIDDEN,  # obs-fold
            post + b"Content-Length : %d\r\n\r\n" % n + HIDDEN,  # space before the colon
            post + b"Content-Length: +%d\r\n\r\n" % n + HIDDEN,  # a signed length
            post + b"X-A: a\rContent-Length: 0\r\n\r\n" + HIDDEN]  # a bare CR


def _ambiguous(port: int, seconds: float, path: str) -> dict[str, int]:
    """Each ambiguous head on a connection of its own, round after round: counts refusals (4xx/5xx and a close),
    and answers to a hidden request (must stay 0)."""
    end, counts = time.monotonic() + seconds, {"sent": 0, "refused_and_closed": 0, "hidden_answered": 0}
    heads = _ambiguous_heads(path)
    while time.monotonic() < end:
        for message in heads:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(message)
                reply = b""
                try:
                    while chunk := sock.recv(1 << 16):
                        reply += chunk
                except OSError:
                    pass
            counts["sent"] += 1
            statuses = [line[9:12] for line in reply.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")]
            counts["hidden_answered"] += sum(st == b"200" for st in statuses)
            counts["refused_and_closed"] += len(statuses) == 1 and statuses[0][:1] in (b"4", b"5")
    return counts


def _idle(ports: tuple[int, int], seconds: float, count: int) -> dict[str, int]:
    held = []
    for i in range(count):
        try:
            held.append(socket.create_connection(("127.0.0.1", ports[i % 2]), timeout=2))
        except OSError:
            break
    time.sleep(max(0.0, seconds))
    for sock in held:
        sock.close()
    return {"held": len(held)}


def _abandoned_calls(port: int, seconds: float, raw: bytes) -> dict[str, int]:
    """Whole ``ModelInfer`` calls, each on a connection of its own closed (FIN) before its answer arrives: what
    clients that give up leave a worker (the row's RSS before and after says whether it keeps it)."""
    call = (PREFACE + _frame(SETTINGS, 0, 0) + _frame(HEADERS, END_HEADERS, 1, _block(SERVICE + "ModelInfer"))
            + _frame(DATA, END_STREAM, 1, _message(raw)))
    end, sent = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(call)
            sent += 1
    return {"sent": sent}


def attacker(kind: str, http_port: int, grpc_port: int, seconds: float, raw: bytes, http_request: bytes,
             json_request: bytes, results: Any) -> None:
    if kind == "http_pipeline":
        results.put(_http_pipeline(http_port, seconds, http_request))
    elif kind == "json_burst":
        results.put(_json_burst(http_port, seconds, json_request))
    elif kind == "json_containers":  # 8 MiB of empty arrays in one data array, back to back on one connection
        path = http_request.split(b" ", 2)[1].decode()
        body = (b'{"inputs":[{"name":"dense","shape":[1],"datatype":"FP32","data":['
                + b",".join([b"[]"] * (4 << 20)) + b"]}]}")
        results.put(_json_burst(http_port, seconds, encode_post("127.0.0.1", path, body, {}), connections=1))
    elif kind == "idle_connections":
        results.put(_idle((http_port, grpc_port), seconds, 1500))
    elif kind == "ambiguous_heads":
        results.put(_ambiguous(http_port, seconds, http_request.split(b" ", 2)[1].decode()))
    elif kind == "abandoned_calls":
        results.put(_abandoned_calls(grpc_port, seconds, raw))
    else:
        results.put(_flood_grpc(kind, grpc_port, seconds, raw))


ATTACKS = ("ping", "settings", "window_update", "priority", "unknown_frames", "header_lists", "empty_data",
           "continuation", "rapid_reset_infer", "rapid_reset_forwarded", "incomplete_messages", "tiny_fields",
           "http_pipeline", "ambiguous_heads", "idle_connections", "json_burst", "json_containers", "abandoned_calls")


def _json_body(batch: Any) -> bytes:
    """A plain-JSON infer body (every tensor as a ``data`` list), as curl or tritonclient without binary send."""
    inputs = [{"name": name, "shape": list(a.shape), "datatype": DATATYPES[a.dtype], "data": a.reshape(-1).tolist()}
              for name, a in batch.as_arrays().items()]
    return json.dumps({"inputs": inputs}, separators=(",", ":")).encode()


# ---- the observers ------------------------------------------------------------------------------------------
class Prober(threading.Thread):
    """``/v2/health/ready`` every 0.1 s; the slowest answer (a failure counts as its timeout, 5 s)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/v2/health/ready"
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            start = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    r.read()
            except OSError:
                self.failures += 1
            self.latencies.append(time.monotonic() - start)


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        return sum(float(line.rsplit(" ", 1)[1]) for line in r.read().decode().splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))


def _workers(server: LocalServer) -> list[dict]:
    """The model's workers as its control API describes them (pid, RSS, ...)."""
    state = server._control.get_model(server.served)
    return [w for stage in state.get("stages", {}).values() for w in stage.get("worker_detail", [])]


def _workers_rss_mb(server: LocalServer) -> float:
    return sum(float(w.get("rss_mb") or 0.0) for w in _workers(server))


def _workers_cpu_s(server: LocalServer) -> float:
    """CPU seconds (user + system) the model's workers have used: what an attack costs the server beyond the
    well-behaved client's load (the p99 on a small host moves with the attacker's own CPU too).  A worker gone
    meanwhile counts nothing."""
    total = 0.0
    for worker in _workers(server):
        with contextlib.suppress(OSError, KeyError, TypeError):
            total += process_cpu_s([worker["pid"]])
    return total


def phase(server: LocalServer, session: LoadSession, qps: float, seconds: float, attack: str | None,
          raw: bytes, http_request: bytes, json_request: bytes) -> dict[str, Any]:
    prober = Prober(server.ports.http)
    prober.start()
    rss: list[float] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            try:
                rss.append(_workers_rss_mb(server))
            except OSError:
                pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    process, results = None, None
    if attack is not None:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        process = ctx.Process(target=attacker, args=(attack, server.ports.http, server.ports.grpc, seconds, raw,
                                                     http_request, json_request, results), daemon=True)
        process.start()
        time.sleep(0.5)  # the attack under way before the measured load starts
    cpu_start = _workers_cpu_s(server)
    result = session.run(qps, seconds, seed=7, timeout_s=10.0)
    cpu_s = _workers_cpu_s(server) - cpu_start
    attack_stats = {}
    if process is not None:
        process.join(seconds + 30)
        if process.is_alive():
            process.kill()
        attack_stats = results.get(timeout=5) if not results.empty() else {}
    prober.stop.set()
    prober.join(10)
    sampling.set()
    sampler.join(10)
    lat = result.latencies_ms[np.isfinite(result.latencies_ms)]
    return {"attack": attack, "client_p99_ms": float(np.percentile(lat, 99)) if lat.size else float("inf"),
            "client_ok": result.ok, "client_errors": dict(result.errors),
            "health_max_s": max(prober.latencies, default=float("nan")), "health_failures": prober.failures,
            "rss_peak_mb": max(rss, default=float("nan")), "workers_cpu_s": cpu_s, "attacker": attack_stats}


def headline(rows: list[dict]) -> list[dict]:
    """Per attack: legitimate clients' p99 under it against without it, and worker restarts."""
    out = []
    for r in rows:
        out.append(harness.row(f"client p99 under {r['attack']} (target: no attack)", r["attacked"]["client_p99_ms"],
                               "ms", r["baseline"]["client_p99_ms"]))
        out.append(harness.row(f"worker restarts under {r['attack']}", r["worker_restarts"], "restarts"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="hercules-rmc1")
    ap.add_argument("--scale", type=float, default=1e-3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=5.0, help="each phase's length")
    ap.add_argument("--qps", type=float, default=50.0, help="the well-behaved client's rate")
    ap.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated, of {', '.join(ATTACKS)}")
    ap.add_argument("--out", default="results/attacks.json")
    args = ap.parse_args(argv)
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown:
        ap.error(f"unknown attacks {unknown}; choose from {', '.join(ATTACKS)}")
    spec = get_model(args.model)
    pool = RequestPool.from_mix(spec, args.scale, "fixed:8", pool=8, seed=1)
    rows = []
    with LocalServer(args.model, args.scale, workers=args.workers, deadline_ms=10_000.0) as server:
        raw = encode_grpc_request(pool.batch(0), server.served).SerializeToString()
        body, header_length = encode_http_request(pool.batch(0))
        http_request = encode_post("127.0.0.1", f"/v2/models/{server.served}/infer", body,
                                   {"Inference-Header-Content-Length": str(header_length)})
        json_request = encode_post("127.0.0.1", f"/v2/models/{server.served}/infer",
                                   _json_body(RequestPool.from_mix(spec, args.scale, "fixed:256", pool=1).batch(0)), {})
        with LoadSession(server.target("grpc"), pool, warm=True) as session:
            for attack in attacks:
                restarts = _metric(server.ports.http, "recserve_worker_restarts_total")
                rss_before = _workers_rss_mb(server)
                base = phase(server, session, args.qps, args.seconds, None, raw, http_request, json_request)
                hit = phase(server, session, args.qps, args.seconds, attack, raw, http_request, json_request)
                time.sleep(TRIM_QUIET_S + 1.0)  # RSS after: once a worker may have returned a burst's free memory
                row = {"attack": attack, "baseline": base, "attacked": hit, "rss_before_mb": rss_before,
                       "rss_after_mb": _workers_rss_mb(server),
                       "worker_restarts": _metric(server.ports.http, "recserve_worker_restarts_total") - restarts}
                row["p99_ratio"] = hit["client_p99_ms"] / max(base["client_p99_ms"], 1e-9)
                rows.append(row)
                log(f"{attack}: client p99 {base['client_p99_ms']:.1f} -> {hit['client_p99_ms']:.1f} ms "
                    f"({row['p99_ratio']:.2f}x), workers' CPU {base['workers_cpu_s']:.1f} -> "
                    f"{hit['workers_cpu_s']:.1f} s, health max {hit['health_max_s']:.2f} s, RSS {rss_before:.0f} -> "
                    f"peak {hit['rss_peak_mb']:.0f} -> {row['rss_after_mb']:.0f} MB, restarts "
                    f"{row['worker_restarts']:g}, attacker {hit['attacker']}")
    print(f"\n{'attack':24} {'p99 base':>9} {'p99 hit':>9} {'ratio':>6} {'health max':>10} {'RSS before':>10} "
          f"{'peak':>7} {'after':>7} {'restarts':>8}")
    for r in rows:
        print(f"{r['attack']:24} {r['baseline']['client_p99_ms']:9.1f} {r['attacked']['client_p99_ms']:9.1f} "
              f"{r['p99_ratio']:6.2f} {r['attacked']['health_max_s']:10.2f} {r['rss_before_mb']:10.0f} "
              f"{r['attacked']['rss_peak_mb']:7.0f} {r['rss_after_mb']:7.0f} {r['worker_restarts']:8g}")
    out = harness.write_result(args.out, args, headline(rows), {"args": vars(args), "rows": rows})
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
