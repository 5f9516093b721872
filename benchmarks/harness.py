"""What every benchmark shares: a node started and stopped for it, and its result file with one common header.

The header says which benchmark wrote the file, from which commit, on which host, when, with which arguments, and
its few headline numbers (``{"name", "value", "unit"}``, and ``"target"`` where a goal or a peer's value is what
the number is read against).  ``run_all`` reads only that header, so a benchmark's own body can take any layout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HEADER = "header"  # the key of the common header in every result file

Row = dict[str, Any]


# ---------------------------------------------------------------- headline rows


def num(x: Any) -> float | None:
    """``x`` as a float when it is a number (not a bool), else None."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def dig(data: Any, *path: Any) -> Any:
    """``data[p0][p1]...`` or None when any step is missing (a result cut short lacks its later parts)."""
    for key in path:
        if isinstance(data, dict) and key in data:
            data = data[key]
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def row(name: str, value: Any, unit: str = "", target: Any = None) -> Row:
    """One headline number; ``target`` is the goal or the peer's value it is read against (None: none)."""
    out: Row = {"name": name, "value": value if num(value) is None else num(value), "unit": unit}
    if target is not None:
        out["target"] = num(target) if num(target) is not None else target
    return out


# ---------------------------------------------------------------- the common header


def commit() -> str:
    """The checkout's commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "cpu_model": cpu_model(), "cores": os.cpu_count(),
            "usable_cores": len(os.sched_getaffinity(0)), "load_average": list(os.getloadavg())}


def running_benchmark() -> str:
    """The name of the benchmark this process runs: ``bench_x`` for ``python -m benchmarks.bench_x``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name.rsplit(".", 1)[-1]
    return Path(sys.argv[0]).stem or "unknown"


def arguments(args: argparse.Namespace | dict | None) -> dict[str, Any]:
    if args is None:
        return {}
    return dict(args) if isinstance(args, dict) else dict(vars(args))


def header(args: argparse.Namespace | dict | None, headline: list[Row], benchmark: str | None = None) -> dict:
    return {"benchmark": benchmark or running_benchmark(), "commit": commit(), "host": host(),
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "arguments": arguments(args),
            "headline": headline}


def _jsonable(x: Any) -> Any:
    """numpy scalars and arrays as numbers and lists, anything else JSON does not know (paths, objects) as text."""
    if callable(getattr(x, "tolist", None)):
        return x.tolist()
    return str(x)


def write_result(path: str | os.PathLike, args: argparse.Namespace | dict | None, headline: list[Row],
                 body: dict[str, Any], benchmark: str | None = None) -> Path:
    """Write ``{"header": {...}, **body}`` to ``path`` (atomically: a run cut short keeps the last whole file).

    ``body`` keeps the benchmark's own layout beside the header; it may not use the key ``header``."""
    if HEADER in body:
        raise ValueError(f"a result body may not have a {HEADER!r} key")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({HEADER: header(args, headline, benchmark), **body}, indent=1, default=_jsonable)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text(text)
    tmp.replace(out)
    return out


def read_header(path: str | os.PathLike) -> dict | None:
    """The common header of a result file, or None when the file has none (written before the harness)."""
    data = json.loads(Path(path).read_text())
    head = data.get(HEADER) if isinstance(data, dict) else None
    return head if isinstance(head, dict) and isinstance(head.get("headline"), list) else None


# ---------------------------------------------------------------- a node for a benchmark


@contextmanager
def node(config) -> Iterator[Any]:
    """A :class:`NodeServer` of ``config`` started in this process (its ports in ``.ports``), stopped on exit."""
    from recserve.serving import NodeServer

    server = NodeServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class ServerProcess:
    """``recserve serve`` in its own process, so its CPU time is not mixed with the client's (``served``: the name
    the node serves ``model`` under, when ``model`` is a repository path; ``env``: e.g. another tree's PYTHONPATH)."""

    def __init__(self, model: str, scale: float, cores: list[int] | None = None,
                 env: dict[str, str] | None = None, served: str | None = None) -> None:
        from recserve.serving.node.control_client import ControlClient

        pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None  # its workers inherit it
        self.proc = subprocess.Popen([sys.executable, "-m", "recserve.cli", "serve", "--model", model,
                                      "--scale", str(scale), "--workers", "1", "--http-port", "0",
                                      "--grpc-port", "0"], stderr=subprocess.PIPE, text=True, preexec_fn=pin,
                                     env=env)
        pattern = re.compile(r"on http://127\.0\.0\.1:(\d+) grpc 127\.0\.0\.1:(\d+)")
        for line in self.proc.stderr:
            m = pattern.search(line)
            if m:
                self.http, self.grpc = int(m.group(1)), int(m.group(2))
                break
        else:
            raise RuntimeError("server did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stderr], daemon=True).start()
        state = ControlClient("127.0.0.1", self.http).get_model(served or model)
        self.worker_pids = [w["pid"] for w in state["stages"]["model"]["worker_detail"]]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
