"""``NodeControl`` over a live node server's control API, and the monitor-and-adjust loop.

The resource managers in :mod:`recserve.policies.rmu` only talk to a ``NodeControl``; this class maps
it onto :class:`recserve.serving.node.control_client.ControlClient` (``/control/...`` endpoints), so the
same Hera RMU / PARTIES / static controllers that run in the simulator resize a real server's workers
and LLC ways.  Where the host cannot partition its LLC (no resctrl: HTTP 501) the way counts are
kept locally and reported as ``llc_applied = False``; workers are always real.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from recserve.policies.rmu import Controller, WindowStats


class ServerNodeControl:
    """A live node server as a ``NodeControl``; window statistics cover the last ``window_s`` seconds."""

    def __init__(self, client: Any, window_s: float = 2.0, models: list[str] | None = None,
                 total_cores: int | None = None) -> None:
        from recserve.serving.node.control_client import LlcUnsupportedError

        self._unsupported = LlcUnsupportedError
        self.client = client
        self.window_s = float(window_s)
        node = client.node()
        self._models = models or [m["name"] for m in client.models()]
        self._cores = int(total_cores or len(node.get("cores", [])) or 1)
        llc = node.get("llc", {}) or {}
        self.llc_applied = bool(llc.get("supported"))
        self._ways_total = int(llc.get("total_ways") or len(self._models))
        self._ways: dict[str, int] = {}
        self._sla: dict[str, tuple[float, float]] = {}

    def models(self) -> list[str]:
        return list(self._models)

    def sla(self, model: str) -> tuple[float, float]:
        if model not in self._sla:
            s = self.client.get_model(model)["sla"]
            self._sla[model] = (float(s["target_ms"]), float(s["percentile"]))
        return self._sla[model]

    def total_cores(self) -> int:
        return self._cores

    def total_ways(self) -> int:
        return self._ways_total

    def _stage(self, state: dict[str, Any]) -> dict[str, Any]:
        stages = state["stages"]
        return stages.get("model") or next(iter(stages.values()))

    def get_workers(self, model: str) -> int:
        return int(self._stage(self.client.get_model(model))["workers"])

    def set_workers(self, model: str, workers: int) -> None:
        self.client.set_workers(model, int(workers))

    def get_ways(self, model: str) -> int:
        if self.llc_applied:
            ways = self.client.get_model(model).get("llc_ways")
            if ways:
                return int(ways)
        return self._ways.get(model, max(1, self._ways_total // max(1, len(self._models))))

    def set_ways(self, model: str, ways: int) -> None:
        self._ways[model] = int(ways)
        if self.llc_applied:
            try:
                self.client.set_llc_ways(model, int(ways))
            except self._unsupported:
                self.llc_applied = False

    def window_stats(self, model: str) -> WindowStats:
        """The node's window, with its failed queries counted as over the SLA: the tail of completed queries alone
        hid the overload a node sheds, so the RMU saw slack and shrank a model that was refusing queries
        (docs/decisions/2026-11-28-rmu-sees-client-failures.md)."""
        w = self.client.window_stats(model, seconds=self.window_s)
        done, arrived = int(w.get("completed") or 0), float(w.get("arrival_qps") or 0.0)
        failed = int(w.get("failed") or 0)
        tail = float(w.get("tail_ms") or 0.0)
        if (done == 0 and arrived > 0) or failed > (1.0 - float(w.get("percentile") or 95.0) / 100.0) * (done + failed):
            tail = math.inf  # no progress, or more failures than the SLA percentile leaves room for
        return WindowStats(tail, float(w.get("qps") or 0.0), arrived, done)


class ControlLoop:
    """Runs ``controller.step`` every ``period_s`` in a background thread (Hera's monitor-and-adjust)."""

    def __init__(self, controller: Controller, control: Any, period_s: float = 2.0, start_even: bool = False) -> None:
        self.controller, self.control, self.period_s = controller, control, float(period_s)
        self.start_even = start_even
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ControlLoop:
        if self.start_even:
            self.controller.start(self.control)
        self._thread = threading.Thread(target=self._run, daemon=True, name="recserve-rmu")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 30)

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.wait(self.period_s):
            try:
                self.controller.step(time.monotonic() - t0, self.control)
            except Exception as exc:  # noqa: BLE001 - keep monitoring; the error is reported to the caller
                self.errors.append(f"{type(exc).__name__}: {exc}")
