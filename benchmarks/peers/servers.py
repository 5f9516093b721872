"""The servers bench_peers.py compares, each a context manager ``(model, scale, workers, sla_ms) -> URL`` that
starts it on 127.0.0.1 and always stops it; the URL's scheme is the protocol the load generator speaks to it
(``http://`` binary extension, ``http+json://`` plain JSON, ``grpc://``)."""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.peers.venvs import ROOT, PeerVenv, peer_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    """Until ``url`` answers 200; a server process that exits first is reported at once."""
    end = time.time() + timeout_s
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before {url} was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


@contextmanager
def server_process(cmd: list[str], env: dict[str, str], ready_url: str, name: str) -> Iterator[None]:
    """A peer server started as its own process group (its workers included), ready when ``ready_url`` answers 200;
    always stopped: SIGTERM to the group, SIGKILL after 30 s.  Its output goes to a log file, whose tail is shown
    if it does not start."""
    log = tempfile.NamedTemporaryFile(prefix=f"bench-peers-{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_ready(ready_url, proc=proc)
        except RuntimeError as exc:
            tail = Path(log.name).read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name}: {exc}; its log {log.name} ends:\n{tail}") from exc
        yield
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the process group ``proc`` leads, SIGKILL to it if ``proc`` is still up after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the leader is gone; workers it left behind go too
        except ProcessLookupError:
            pass
        return


def recserve_node(model: str, scale: float, workers: int, sla_ms: float, **options: Any):
    """The one place the recserve node is built (switch its data-plane options here).  Its queries' deadline is
    the benchmark's SLA: what would miss it is shed at once (and counted as a failure, as a late answer is)."""
    from recserve.serving import NodeServer, quick_config

    return NodeServer(quick_config(model, scale=scale, workers=workers, **{"deadline_ms": sla_ms, **options}))


def _recserve_main(conn, model: str, scale: float, workers: int, sla_ms: float, options: dict) -> None:
    """Serve from a process of its own (like the peers), so it shares no GIL with the load generator."""
    try:
        server = recserve_node(model, scale, workers, sla_ms, **options)
        ports = server.start()
        conn.send((ports.http, ports.grpc))
    except Exception as exc:  # the parent reports why instead of waiting for a port
        conn.send(f"{type(exc).__name__}: {exc}")
        raise
    try:
        conn.recv()  # any message, or the parent gone, means stop
    except EOFError:
        pass
    finally:
        server.stop()


@contextmanager
def recserve_server(model: str, scale: float, workers: int, sla_ms: float, protocol: str = "binary",
                    **options: Any) -> Iterator[str]:
    """A recserve node spoken to in ``protocol``: ``binary`` (v2 HTTP with the binary extension), ``rest`` (plain
    JSON) or ``grpc`` (raw tensor contents)."""
    mine, theirs = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=_recserve_main,
                                           args=(theirs, model, scale, workers, sla_ms, options))
    proc.start()  # not a daemon: the node starts worker processes of its own
    try:
        if not mine.poll(600):
            raise RuntimeError("recserve node did not start within 600 s")
        ports = mine.recv()
        if not isinstance(ports, tuple):
            raise RuntimeError(f"recserve node did not start: {ports}")
        yield f"http://127.0.0.1:{ports[0]}" if protocol == "binary" else protocol_url(protocol, *ports)
    finally:
        mine.send("stop")
        proc.join(timeout=60)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10)


BASE_SRC_ENV = "RECSERVE_BASE_SRC"
_BASE_NODE = """
import sys
from recserve.serving import NodeServer, quick_config
model, scale, workers, sla_ms = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
server = NodeServer(quick_config(model, scale=scale, workers=workers, deadline_ms=sla_ms))
ports = server.start()
print(ports.http, ports.grpc, flush=True)
sys.stdin.read()  # closed: stop
server.stop()
"""


@contextmanager
def recserve_base_server(model: str, scale: float, workers: int, sla_ms: float, protocol: str = "binary"
                         ) -> Iterator[str]:
    """recserve built from another tree's ``src/`` (``$RECSERVE_BASE_SRC``), for a before/after in one run: its
    probes alternate with this tree's like any peer's (``protocol`` as for ``recserve_server``)."""
    src = os.environ.get(BASE_SRC_ENV)
    if not src or not Path(src, "recserve").is_dir():
        raise RuntimeError(f"recserve-base needs {BASE_SRC_ENV}=<another tree>/src")
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.Popen([sys.executable, "-c", _BASE_NODE, model, str(scale), str(workers), str(sla_ms)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = proc.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError(f"recserve-base did not start (exit {proc.poll()})")
        ports = int(line[0]), int(line[1])
        yield f"http://127.0.0.1:{ports[0]}" if protocol == "binary" else protocol_url(protocol, *ports)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stop_group(proc)


def _peer_env(model: str, scale: float) -> dict[str, str]:
    return {**os.environ, "RECSERVE_PEER_MODEL": model, "RECSERVE_PEER_SCALE": str(scale),
            "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}


@contextmanager
def fastapi_server(model: str, scale: float, workers: int, _sla_ms: float) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "benchmarks.peers.fastapi_app:app", "--host", "127.0.0.1", "--port",
           str(port), "--workers", str(workers), "--log-level", "warning"]
    with server_process(cmd, _peer_env(model, scale), f"http://127.0.0.1:{port}/v2/health/ready", "fastapi"):
        yield f"http://127.0.0.1:{port}"


def kserve_command(python: Path, http_port: int, grpc_port: int, workers: int) -> list[str]:
    """KServe's ModelServer with the benchmark model: ``workers`` uvicorn processes for REST, gRPC in the main one."""
    return [str(python), "-m", "benchmarks.peers.kserve_app", "--http_port", str(http_port),
            "--grpc_port", str(grpc_port), "--workers", str(workers)]


def mlserver_command(python: Path, repository: Path) -> list[str]:
    return [str(python.parent / "mlserver"), "start", str(repository)]


def mlserver_settings(http_port: int, grpc_port: int, metrics_port: int, workers: int) -> dict[str, str]:
    """MLServer's server settings as its ``MLSERVER_*`` variables: loopback, the ports, ``workers`` inference
    processes (``parallel_workers``)."""
    return {"MLSERVER_HOST": "127.0.0.1", "MLSERVER_HTTP_PORT": str(http_port), "MLSERVER_GRPC_PORT": str(grpc_port),
            "MLSERVER_METRICS_PORT": str(metrics_port), "MLSERVER_PARALLEL_WORKERS": str(workers)}


def mlserver_repository(folder: Path, model: str) -> Path:
    """A model repository holding ``model``: ``<folder>/<model>/model-settings.json`` (MLServer names a model after
    its folder), copied from ``peers/mlserver-model-settings.json``."""
    (folder / model).mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "benchmarks" / "peers" / "mlserver-model-settings.json", folder / model / "model-settings.json")
    return folder


def protocol_url(protocol: str, http_port: int, grpc_port: int) -> str:
    """The load generator's target for a v2 peer: ``rest`` is plain JSON, ``grpc`` raw tensor contents."""
    if protocol == "rest":
        return f"http+json://127.0.0.1:{http_port}"
    if protocol == "grpc":
        return f"grpc://127.0.0.1:{grpc_port}"
    raise ValueError(f"protocol must be rest or grpc, got {protocol!r}")


@contextmanager
def kserve_server(protocol: str, model: str, scale: float, workers: int, _sla_ms: float) -> Iterator[str]:
    python = PeerVenv.of("kserve").ensure(log=say)
    http_port, grpc_port = free_port(), free_port()
    with server_process(kserve_command(python, http_port, grpc_port, workers), peer_env(python, model, scale),
                        f"http://127.0.0.1:{http_port}/v2/models/{model}/ready", f"kserve-{protocol}"):
        yield protocol_url(protocol, http_port, grpc_port)


@contextmanager
def mlserver_server(protocol: str, model: str, scale: float, workers: int, _sla_ms: float) -> Iterator[str]:
    python = PeerVenv.of("mlserver").ensure(log=say)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="bench-peers-mlserver-") as folder:
        env = {**peer_env(python, model, scale), **mlserver_settings(http_port, grpc_port, metrics_port, workers)}
        with server_process(mlserver_command(python, mlserver_repository(Path(folder), model)), env,
                            f"http://127.0.0.1:{http_port}/v2/models/{model}/ready", f"mlserver-{protocol}"):
            yield protocol_url(protocol, http_port, grpc_port)


def say(line: str) -> None:
    print(line, file=sys.stderr)


@contextmanager
def ray_server(model: str, scale: float, workers: int, _sla_ms: float) -> Iterator[str]:
    os.environ.update(_peer_env(model, scale))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from benchmarks.peers.ray_app import RecModelDeployment

    port = free_port()
    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=workers)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = RecModelDeployment.options(num_replicas=workers, ray_actor_options={"num_cpus": 1}).bind()
        serve.run(app, name="peer", route_prefix=f"/v2/models/{model}")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


PEERS: dict[str, Callable] = {
    "recserve": recserve_server,
    "recserve-json": partial(recserve_server, protocol="rest"),
    "recserve-grpc": partial(recserve_server, protocol="grpc"),
    # recserve computing one query per forward pass (fusion off): what fusing queued queries buys
    "recserve-nofuse": partial(recserve_server, fuse_items=0),
    # recserve pooling each embedding table with its own lookup: what table fusion buys
    "recserve-per-table": partial(recserve_server, fuse_tables=False),
    # recserve whose busy workers keep their queries (no idle sibling computes them): what forwarding buys
    "recserve-noforward": partial(recserve_server, forward_to_idle=False),
    # recserve from another tree (RECSERVE_BASE_SRC=<tree>/src): a before/after in one run
    "recserve-base": recserve_base_server,
    "recserve-base-grpc": partial(recserve_base_server, protocol="grpc"),
    "ray-serve": ray_server,
    "fastapi": fastapi_server,
    "kserve-rest": partial(kserve_server, "rest"),
    "kserve-grpc": partial(kserve_server, "grpc"),
    "mlserver-rest": partial(mlserver_server, "rest"),
    "mlserver-grpc": partial(mlserver_server, "grpc"),
}
# where a server does not give each of --workers its own model worker
NOTES = {
    "kserve-grpc": "KServe serves gRPC from its main process alone: one model copy at any worker count",
    "mlserver-rest": "one front-end process; the model runs in `workers` inference processes (parallel_workers)",
    "mlserver-grpc": "one front-end process; the model runs in `workers` inference processes (parallel_workers)",
}
# what --peers all means: the servers compared, not recserve's ablations
ALL_PEERS = ("recserve", "fastapi", "ray-serve", "kserve-rest", "kserve-grpc", "mlserver-rest", "mlserver-grpc")
VENV_OF = {"kserve-rest": "kserve", "kserve-grpc": "kserve", "mlserver-rest": "mlserver", "mlserver-grpc": "mlserver"}
IMPORTS_OF = {"fastapi": ("fastapi", "uvicorn"), "ray-serve": ("ray",)}


def choose_peers(text: str) -> list[str]:
    """``--peers``: names, or ``all`` (every server of ``ALL_PEERS``; which of them can run is :func:`runnable`'s
    call)."""
    names = list(ALL_PEERS) if text.strip() == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from all or {sorted(PEERS)}")
    return names


def runnable(name: str) -> str | None:
    """Why peer ``name`` cannot run here (a module this interpreter lacks, a venv that cannot be made), or None;
    makes a missing venv."""
    missing = [m for m in IMPORTS_OF.get(name, ()) if importlib.util.find_spec(m) is None]
    if missing:
        return f"not installed here: {', '.join(missing)}"
    if name in VENV_OF:
        try:
            PeerVenv.of(VENV_OF[name]).ensure(log=say)
        except RuntimeError as exc:
            return str(exc)
    return None
