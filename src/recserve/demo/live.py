"""The demo's live runs: a controller (Hera's RMU, PARTIES or none) resizing node A's workers window by window
under the live load, the windows it measured, and the run as standard JSON."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.demo.capacity import profiled_capacity
from recserve.demo.load import LIVE_MODELS, live_cores, live_rates, node_a_server, production_session
from recserve.errors import RecserveError

if TYPE_CHECKING:
    from recserve.demo.job import DemoRun

WORKER_SLOTS_PER_CORE = 2
LIVE_CONTROLLERS = ("hera", "static")  # the first is the report's main run; the others get the same load


@dataclass
class LiveWindow:
    t_s: float
    model: str
    offered_qps: float
    achieved_qps: float
    p95_ms: float
    sla_ms: float
    errors: int
    workers: int
    error_kinds: dict[str, int] = field(default_factory=dict)  # failed queries by kind (http_503, timeout, ...)

    def violates(self, window_s: float) -> bool:
        """The window missed its SLA: p95 over the target, or more than 5% of its queries failed (shed or late
        queries are misses too; a window where every query failed has no p95 at all)."""
        answered = self.achieved_qps * window_s + self.errors
        return not self.p95_ms <= self.sla_ms or self.errors > 0.05 * max(1.0, answered)


def live_stem(controller: str) -> str:
    """The file stem of a controller's live run (its JSON and figure): ``live`` for the report's main run."""
    return "live" if controller == LIVE_CONTROLLERS[0] else f"live_{controller}"


def _replica_router(run: DemoRun, model: str, scale: float, port_a: int, core: int, started: list[Any]) -> Any:
    """Node B (a replica of ``model`` on ``core``) and a Kairos router over node A's and node B's copies;
    both are appended to ``started`` so the caller stops them."""
    from recserve.policies.router import Router, RouterThread, load_pool
    from recserve.serving import NodeServer, config_from_dict
    from recserve.specs import get_model

    node_b = NodeServer(config_from_dict({"models": [
        {"model": model, "scale": scale, "workers": 1, "cores": [[core]], "queue_limit": 64}]}))
    ports_b = node_b.start()
    started.append(node_b)
    pool_file = run.path("live/pool.yaml")
    pool_file.parent.mkdir(parents=True, exist_ok=True)
    pool_file.write_text(
        f"qos_ms: {get_model(model).sla.target_ms}\npolicy: kairos\nbackends:\n"
        f"  - {{url: 'http://127.0.0.1:{port_a}', type: node-a, slots: 1, base: true}}\n"
        f"  - {{url: 'http://127.0.0.1:{ports_b.http}', type: node-b, slots: 1}}\n")
    router = RouterThread(Router(load_pool(pool_file)))
    router.start()  # sets router.port
    started.append(router)
    return router


def run_live(run: DemoRun, scale: float, seconds: float, window_s: float, controller_name: str = "hera",
             use_router: bool = True, shape: str = "diurnal",
             models: tuple[str, str] = LIVE_MODELS, peaks: tuple[float, ...] = (0.7, 0.6),
             capacity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Node A co-locates the two models, node B replicates the first behind the router (``use_router``);
    ``controller_name`` (hera | parties | static) resizes node A's workers every window under the
    ``shape`` load (see :func:`live_rates`), sized from ``capacity`` (default: the run's profile of this host),
    which is also the RMU's curve."""
    lo, hi = models
    capacity = capacity or profiled_capacity(run, models)
    _check_capacity(capacity, models)  # before any server starts
    node_a = node_a_server(models, scale)
    started: list[Any] = []
    try:
        ports_a = node_a.start()
        started.append(node_a)
        router = _replica_router(run, lo, scale, ports_a.http, live_cores()[-1], started) if use_router else None
        rates = live_rates(shape, capacity, max(4, int(seconds / window_s)), window_s, models, peaks)
        front = router.port if router is not None else ports_a.http
        urls = {lo: f"http://127.0.0.1:{front}", hi: f"http://127.0.0.1:{ports_a.http}"}
        controller, results, failures, loop_errors = _controlled_windows(controller_name, capacity, ports_a.http,
                                                                         models, urls, rates, scale, window_s)
        stats = router.router.stats() if router is not None else None
        if failures:
            raise RecserveError("load generation failed: " + "; ".join(failures))
    finally:
        for s in reversed(started):
            s.stop()
    return {"kind": "demo-live", "controller": controller_name, "router": use_router, "shape": shape,
            "models": list(models), "scale": scale, "window_s": window_s,
            "capacity_qps": {m: [capacity[m].max_qps(n) for n in (1, 2, 3)] for m in models},
            "peak_qps": {m: float(np.max(r)) for m, r in rates.items()}, "windows": [w.__dict__ for w in results],
            "violation_fraction": _violation_fraction(results, models, window_s),
            "decisions": [d.__dict__ for d in controller.log], "controller_errors": loop_errors,
            "held": [d.__dict__ for d in getattr(controller, "held", [])],
            "router_stats": stats}


def _check_capacity(capacity: dict[str, Any], models: tuple[str, str]) -> None:
    for m in models:
        if capacity[m].max_qps(1) <= 0:
            raise RecserveError(f"{m} misses its SLA even at no load on one worker of this host (max load 0)")


def _controlled_windows(controller_name: str, capacity: dict[str, Any], port_a: int, models: tuple[str, str],
                        urls: dict[str, str], rates: dict[str, np.ndarray], scale: float,
                        window_s: float) -> tuple[Any, list[LiveWindow], list[str], list[str]]:
    """The live load, window by window, while ``controller_name`` resizes node A's workers each window over its
    control API: (the controller, the windows measured, the load generators' failures, the control loop's)."""
    from recserve.policies.node_control import ControlLoop, ServerNodeControl
    from recserve.policies.rmu import make_controller
    from recserve.serving.node.control_client import ControlClient

    # Two co-located models on a 2-core host leave the RMU nothing to move (each needs one worker), so
    # the demo lets it place up to WORKER_SLOTS_PER_CORE workers per core (time-shared processes).
    control = ServerNodeControl(ControlClient(port=port_a), window_s=window_s, models=list(models),
                                total_cores=WORKER_SLOTS_PER_CORE * len(os.sched_getaffinity(0)))
    controller = make_controller(controller_name, capacity)
    with ControlLoop(controller, control, period_s=window_s) as loop:
        results, failures = _drive_windows(models, urls, rates, scale, window_s, control)
        loop_errors = list(loop.errors)
    return controller, results, failures, loop_errors


def _violation_fraction(results: list[LiveWindow], models: tuple[str, str], window_s: float) -> dict[str, float]:
    """Per model, the share of its windows that missed the SLA (1.0 where it has none)."""
    by_model = {m: [w for w in results if w.model == m] for m in models}
    return {m: float(np.mean([w.violates(window_s) for w in ws])) if ws else 1.0 for m, ws in by_model.items()}


def _drive_windows(models: tuple[str, ...], urls: dict[str, str], rates: dict[str, np.ndarray], scale: float,
                   window_s: float, control: Any) -> tuple[list[LiveWindow], list[str]]:
    """Every model's load, window by window at its ``rates``, each model from a thread of its own: the windows
    measured (with the workers ``control`` gave the model) and any generator's failure."""
    from recserve.specs import get_model

    results: list[LiveWindow] = []
    failures: list[str] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def drive(model: str) -> None:
        try:
            spec = get_model(model)
            with production_session(urls[model], model, scale, seed=1) as session:
                for w, rate in enumerate(rates[model]):
                    r = session.run(float(rate), window_s, seed=w, timeout_s=5.0, min_requests=1)
                    workers = control.get_workers(model) if model in control.models() else 1
                    with lock:
                        results.append(LiveWindow(time.monotonic() - t0, model, float(rate), r.achieved_qps,
                                                  _finite(r.p95), spec.sla.target_ms, r.failed, workers,
                                                  dict(r.errors)))
        except Exception as exc:  # noqa: BLE001 - reported by run_live
            failures.append(f"{model}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=drive, args=(m,), name=f"load-{m}") for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, failures


def strict_json(data: Any) -> Any:
    """``data`` with every NaN or infinite float as None: standard JSON (null), as ``bench --json`` writes it."""
    if isinstance(data, float):
        return data if np.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict_json(v) for v in data]
    return data


def _finite(x: float) -> float:
    return float(x) if np.isfinite(x) else float("nan")
