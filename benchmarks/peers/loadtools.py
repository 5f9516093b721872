"""wrk and h2load, the C load generators of bench_wrk.py: their command lines, wrk's Lua script, and their
outputs read back into one result shape (requests/s, latency percentiles in ms, failures).

Neither tool is a Python package: where one is missing, the pass it runs is skipped with a note on how to
install it (:func:`missing`), never failed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

INSTALL_HINT = "apt-get install wrk nghttp2-client"
TOOL_OF = {"http": "wrk", "grpc": "h2load"}  # which tool drives which protocol
GRPC_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
WRK_MARK = "WRK_JSON "  # the line wrk's done() hook prints


def missing(protocol: str) -> str | None:
    """Why ``protocol``'s pass cannot run here (its tool is not on PATH), or None."""
    tool = TOOL_OF[protocol]
    if shutil.which(tool) is None:
        return f"{tool} not found on PATH: install it ({INSTALL_HINT}) to run this pass"
    return None


def lua_string(text: str) -> str:
    """A Lua string literal for ``text`` (quotes, backslashes and control characters escaped as ``\\ddd``)."""
    out = []
    for ch in text:
        if ch in '"\\' or ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\{ord(ch):03d}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def wrk_script(body_path: Path, headers: dict[str, str]) -> str:
    """wrk's Lua script: every request a POST of the file ``body_path`` with ``headers``; ``done`` prints the
    summary as one JSON line (latency in microseconds), so no text table is scraped."""
    lines = [f"local f = assert(io.open({lua_string(str(body_path))}, \"rb\"))",
             "wrk.body = f:read(\"*a\")", "f:close()", 'wrk.method = "POST"']
    lines += [f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()]
    fields = ", ".join(f'\\"{k}\\":%d' for k in ("requests", "duration_us", "bytes", "connect", "read", "write",
                                                  "status", "timeout", "p50_us", "p90_us", "p99_us", "max_us"))
    lines += ["done = function(summary, latency, requests)",
              "  local e = summary.errors",
              f'  io.write(string.format("{WRK_MARK}{{{fields}}}\\n", summary.requests, summary.duration,',
              "    summary.bytes, e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50),",
              "    latency:percentile(90), latency:percentile(99), latency.max))",
              "end"]
    return "\n".join(lines) + "\n"


def wrk_command(url: str, script: Path, duration_s: float, connections: int = 4, threads: int = 1,
                timeout_s: float = 10.0, wrk: str = "wrk") -> list[str]:
    return [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration_s:g}s", f"--timeout={timeout_s:g}s",
            "--latency", "-s", str(script), url]


def parse_wrk(stdout: str) -> dict:
    """The result of one wrk run from its output (the ``done`` hook's JSON line)."""
    line = next((ln for ln in stdout.splitlines() if ln.startswith(WRK_MARK)), None)
    if line is None:
        raise ValueError(f"no {WRK_MARK.strip()} line in wrk's output:\n{stdout[-1000:]}")
    raw = json.loads(line[len(WRK_MARK):])
    seconds = raw["duration_us"] / 1e6
    socket_errors = raw["connect"] + raw["read"] + raw["write"] + raw["timeout"]
    ok = raw["requests"] - raw["status"]
    return {"requests": raw["requests"], "seconds": seconds, "rps": ok / seconds if seconds else 0.0,
            "ok": ok, "non_2xx": raw["status"], "errors": socket_errors,
            "p50_ms": raw["p50_us"] / 1e3, "p90_ms": raw["p90_us"] / 1e3, "p99_ms": raw["p99_us"] / 1e3,
            "max_ms": raw["max_us"] / 1e3}


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message: flag 0 (not compressed), 4-byte big-endian length, the message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def h2load_command(url: str, data: Path, log: Path, duration_s: float, connections: int = 4, threads: int = 1,
                   warmup_s: float = 1.0, h2load: str = "h2load") -> list[str]:
    """h2load posting ``data`` as a gRPC call to ``url`` (``http://host:port``, HTTP/2 with prior knowledge),
    one stream per connection at a time, a per-request log in ``log`` (h2load takes whole seconds or ``ms``)."""
    return [h2load, f"-D{round(duration_s * 1000)}ms", f"--warm-up-time={round(warmup_s * 1000)}ms",
            f"-c{connections}", "-m1", f"-t{threads}", f"--data={data}", "-H", "content-type: application/grpc",
            "-H", "te: trailers",
            f"--log-file={log}", url.rstrip("/") + GRPC_INFER_PATH]


def _count(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"h2load output lacks {pattern!r}:\n{text[-1000:]}")
    return int(match.group(1))


def parse_h2load(stdout: str, log_text: str, answer_bytes: int | None = None) -> dict:
    """The result of one h2load run: counts from its summary, latency percentiles from its per-request log
    (status, microseconds in columns 2 and 3).  A gRPC error still comes as HTTP 200, without a message; so with
    ``answer_bytes`` (one framed answer's size) the DATA bytes received say how many 2xx carried an answer: only
    those count as ``ok``; the rest are ``grpc_errors``, counted in ``non_2xx`` (not a success) with the non-2xx
    statuses.  The latency percentiles take every 2xx (the log does not tell an error trailer from an answer)."""
    match = re.search(r"finished in ([\d.]+)(ms|s)", stdout)
    if match is None:
        raise ValueError(f"h2load output lacks its 'finished in' line:\n{stdout[-1000:]}")
    seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    total = _count(r"requests: (\d+) total", stdout)
    if total == 0:  # h2load exits 0 when it cannot connect
        raise ValueError(f"h2load sent no request:\n{stdout[-1000:]}")
    succeeded = _count(r"(\d+) succeeded", stdout)
    ok_status = _count(r"status codes: (\d+) 2xx", stdout)
    data = _count(r"headers \(space savings -?[\d.]+%\), [\d.]+\w*B \((\d+)\) data", stdout)
    rows = [ln.split("\t") for ln in log_text.splitlines() if ln.strip()]
    micros = np.array([float(r[2]) for r in rows if r[1].startswith("2")])
    pct = np.percentile(micros, [50, 90, 99]) / 1e3 if micros.size else [float("nan")] * 3
    answered = min(ok_status, data // answer_bytes) if answer_bytes else ok_status
    return {"requests": total, "seconds": seconds, "rps": answered / seconds if seconds else 0.0,
            "ok": answered, "non_2xx": succeeded - answered, "grpc_errors": ok_status - answered,
            "errors": total - succeeded, "p50_ms": float(pct[0]), "p90_ms": float(pct[1]), "p99_ms": float(pct[2]),
            "max_ms": float(micros.max() / 1e3) if micros.size else float("nan"), "data_bytes": data}
