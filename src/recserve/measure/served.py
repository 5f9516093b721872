"""A real node server for one model on loopback, for measurements "through the server".

By default the server is its own process (``recserve serve --config`` on ports it picks itself and names in its
ready line), so its front end does not share a GIL or an event loop with the load generator, as in a deployment;
with ``in_process=True`` it runs in a background thread of this process instead (faster to start, what tests of
the server itself do).  Workers are resized through the control API between load levels,
and worker memory (PSS) is read from the same API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from recserve import tethered
from recserve.errors import RecserveError
from recserve.hostinfo import how_it_ended, log_tail
from recserve.measure.targets import GrpcTarget, HttpTarget, Target


def _log(msg: str) -> None:
    print(f"[measure] {msg}", file=sys.stderr, flush=True)


class LocalServer:
    """``with LocalServer("hera-ncf", 1e-3, workers=2) as s: s.target("http")``."""

    def __init__(self, model: str, scale: float, workers: int = 1, queue_limit: int = 512, in_process: bool = False,
                 start_timeout_s: float = 600.0, **model_options: Any) -> None:
        try:
            from recserve.serving import quick_config
        except ImportError as exc:  # the serving package is optional for measurement
            raise RecserveError(f"the node server is not available: {exc}") from exc
        self.model, self.in_process, self.start_timeout_s = model, in_process, start_timeout_s
        self.config = quick_config(model, scale=scale, workers=workers, queue_limit=queue_limit, **model_options)
        self.served = self.config.models[0].name  # a URL-safe name (a repository model's path is not)
        self.ports: Any = None
        self._server: Any = None
        self._proc: subprocess.Popen | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._control: Any = None

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> LocalServer:
        from recserve.serving import NodeServer
        from recserve.serving.node.control_client import ControlClient
        from recserve.serving.node.server import Ports

        where = "in this process" if self.in_process else "as its own process"
        _log(f"starting a node server for {self.model} ({self.config.models[0].workers} workers) {where} ...")
        if self.in_process:
            self._server = NodeServer(self.config)
            self.ports = self._server.start()
        else:
            try:
                self.ports = Ports(*self._spawn())
            except BaseException:
                self._terminate()
                raise
        self._control = ControlClient("127.0.0.1", self.ports.http)
        _log(f"node server up: http {self.ports.http}, grpc {self.ports.grpc}")
        return self

    def node_config(self, http_port: int, grpc_port: int) -> dict[str, Any]:
        """The node config the spawned server runs (``recserve serve --config``)."""
        model = self.config.models[0]
        return {"http_port": http_port, "grpc_port": grpc_port, "host": "127.0.0.1",
                "models": [{"model": model.model, "name": model.name, "scale": model.scale, "workers": model.workers,
                            "queue_limit": model.queue_limit, "threads": model.threads,
                            "deadline_ms": model.deadline_ms}]}

    def _spawn(self) -> tuple[int, int]:
        """Starts the server on ports 0 (it binds free ones itself, ``tethered.ready_ports``) and returns its (http,
        grpc) ports, read from its ready line, once it answers ready."""
        cfg = self.node_config(0, 0)
        self._tmp = tempfile.TemporaryDirectory(prefix="recserve-measure-")
        path = Path(self._tmp.name) / "node.yaml"
        path.write_text(yaml.safe_dump(cfg))
        log_path = Path(self._tmp.name) / "server.log"
        log = open(log_path, "wb")  # noqa: SIM115 - kept open for the child's life
        self._proc = subprocess.Popen(tethered.command("serve", "--config", str(path)),  # stops with this process
                                      stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        deadline = time.monotonic() + self.start_timeout_s
        ports: tuple[int, int] | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RecserveError(f"node server {how_it_ended(self._proc.returncode)}: {self._log_tail()}")
            if ports is None:
                ports = tethered.ready_ports(log_path.read_bytes())
            if ports is not None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=2) as resp:
                        if resp.status == 200:
                            return ports
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.2)
        raise RecserveError(f"node server not ready after {self.start_timeout_s:g} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        if self._tmp is None:
            return ""
        return " | ".join(log_tail(Path(self._tmp.name) / "server.log", lines=3))

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()  # SIGTERM: the server drains and stops its workers
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.stop(drain=False)
        self._terminate()

    # ---------------------------------------------------------------- use
    def target(self, protocol: str = "http", timeout_s: float = 10.0) -> Target:
        if self.ports is None:
            raise RecserveError("server not started")
        if protocol == "http":
            return HttpTarget(f"http://127.0.0.1:{self.ports.http}", self.served, timeout_s=timeout_s)
        if protocol == "grpc":
            return GrpcTarget(f"127.0.0.1:{self.ports.grpc}", self.served, timeout_s=timeout_s)
        raise RecserveError(f"protocol must be http or grpc, got {protocol!r}")

    @property
    def pid(self) -> int:
        """The server process (this process when ``in_process``)."""
        return self._proc.pid if self._proc is not None else os.getpid()

    def set_workers(self, n: int, stage: str | None = None) -> None:
        """Resize the model's worker pool, or its ``stage`` (``accel``: its accelerator workers); returns once
        retired workers are gone."""
        self._control.set_workers(self.served, n, stage=stage)

    def worker_pss_gb(self) -> float:
        """Sum of the model's worker processes' PSS (shared tables split among them), in GB."""
        state = self._control.get_model(self.served)
        total_mb = 0.0
        for stage in state.get("stages", {}).values():
            for worker in stage.get("worker_detail", []):
                if worker.get("pid"):
                    total_mb += float(worker.get("pss_mb") or worker.get("rss_mb") or 0.0)
        return total_mb / 1024.0

    def busy(self) -> bool:
        """Whether the model still has queries in flight, queued parts or busy workers."""
        state = self._control.get_model(self.served)
        if state.get("in_flight"):
            return True
        for stage in state.get("stages", {}).values():
            if stage.get("pending_parts") or any(w.get("busy") for w in stage.get("worker_detail", [])):
                return True
        return False

    def wait_idle(self, timeout_s: float = 120.0, poll_s: float = 0.05) -> bool:
        """Block until :meth:`busy` is false (work left by timed-out queries), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.busy():
            if time.monotonic() > deadline:
                _log(f"server still busy after {timeout_s:g} s; measuring anyway")
                return False
            time.sleep(poll_s)
        return True
