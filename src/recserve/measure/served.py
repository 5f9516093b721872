"""A real node server for one model on loopback, for measurements "through the server".

Starts ``recserve.serving.NodeServer`` on free ports in this process (its workers are separate
processes), resizes its workers through the control API between load levels, and reads worker
memory (PSS) from the same API.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from recserve.errors import RecserveError
from recserve.measure.targets import GrpcTarget, HttpTarget, Target


class LocalServer:
    """``with LocalServer("hera-ncf", 1e-3, workers=2) as s: s.target("http")``."""

    def __init__(self, model: str, scale: float, workers: int = 1, queue_limit: int = 512,
                 **model_options: Any) -> None:
        try:
            from recserve.serving import NodeServer, quick_config
        except ImportError as exc:  # the serving package is optional for measurement
            raise RecserveError(f"the node server is not available: {exc}") from exc
        self.model = model
        self.config = quick_config(model, scale=scale, workers=workers, queue_limit=queue_limit, **model_options)
        self.server = NodeServer(self.config)
        self.ports = None
        self._control = None

    def __enter__(self) -> LocalServer:
        print(f"[measure] starting node server for {self.model} ...", file=sys.stderr, flush=True)
        self.ports = self.server.start()
        from recserve.serving.control_client import ControlClient

        self._control = ControlClient("127.0.0.1", self.ports.http)
        print(f"[measure] node server up: http {self.ports.http}, grpc {self.ports.grpc}", file=sys.stderr,
              flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(drain=False)

    def target(self, protocol: str = "http", timeout_s: float = 10.0) -> Target:
        if self.ports is None:
            raise RecserveError("server not started")
        if protocol == "http":
            return HttpTarget(f"http://127.0.0.1:{self.ports.http}", self.model, timeout_s=timeout_s)
        if protocol == "grpc":
            return GrpcTarget(f"127.0.0.1:{self.ports.grpc}", self.model, timeout_s=timeout_s)
        raise RecserveError(f"protocol must be http or grpc, got {protocol!r}")

    def set_workers(self, n: int) -> None:
        """Resize the model's worker pool (returns once retired workers are gone)."""
        self._control.set_workers(self.model, n)

    def worker_pss_gb(self) -> float:
        """Sum of the model's worker processes' PSS (shared tables split among them), in GB."""
        state = self._control.get_model(self.model)
        total_mb = 0.0
        for stage in state.get("stages", {}).values():
            for worker in stage.get("worker_detail", []):
                if worker.get("pid"):
                    total_mb += float(worker.get("pss_mb") or worker.get("rss_mb") or 0.0)
        return total_mb / 1024.0

    def busy(self) -> bool:
        """Whether the model still has queries in flight, queued parts or busy workers."""
        state = self._control.get_model(self.model)
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
                print(f"[measure] server still busy after {timeout_s:g} s; measuring anyway", file=sys.stderr)
                return False
            time.sleep(poll_s)
        return True
