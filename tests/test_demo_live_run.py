"""The demo's live run (``demo.run_live``) without servers: node A, the router, the control loop and the load replaced
by fakes, pinning what it starts and stops, where each model's load goes, and every field of the run it returns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from recserve.demo import live
from recserve.demo.live import LiveWindow, run_live
from recserve.errors import RecserveError
from recserve.policies import node_control, rmu
from recserve.policies.rmu import CapacityProfile
from recserve.serving.node import control_client

MODELS = ("hera-dlrm-b", "elasticrec-rm3")
CAPACITY = {MODELS[0]: CapacityProfile.from_points({1: 40.0, 2: 70.0}),
            MODELS[1]: CapacityProfile.from_points({1: 20.0, 2: 38.0})}


class Fakes:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, failures: list[str] | None = None) -> None:
        self.events: list = []
        self.drive_args: tuple = ()
        fakes = self

        class Node:
            def start(self):
                fakes.events.append("start node A")
                return SimpleNamespace(http=8101)

            def stop(self):
                fakes.events.append("stop node A")

        class Router:
            port = 8202
            router = SimpleNamespace(stats=lambda: {"completed": 7})

            def stop(self):
                fakes.events.append("stop router")

        def replica_router(run, model, scale, port_a, core, started):
            self.events.append(("router", model, scale, port_a))
            started.append(Router())
            return started[-1]

        class Loop:
            def __init__(self, controller, control, period_s):
                fakes.events.append(("loop", type(controller).__name__, control.total_cores, period_s))
                self.errors = ["one late tick"]

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        def drive(models, urls, rates, scale, window_s, control):
            self.drive_args = (models, urls, {m: [round(float(r), 6) for r in v] for m, v in rates.items()}, scale,
                               window_s)
            return ([LiveWindow(1.0, models[0], 10.0, 10.0, 20.0, 50.0, 0, 1),
                     LiveWindow(1.0, models[1], 5.0, 4.0, 90.0, 50.0, 1, 2, {"http_503": 1}),
                     LiveWindow(2.0, models[0], 12.0, 12.0, 60.0, 50.0, 0, 2)], failures or [])

        monkeypatch.setattr(live, "node_a_server", lambda models, scale: Node())
        monkeypatch.setattr(live, "_replica_router", replica_router)
        monkeypatch.setattr(live, "live_cores", lambda: [0, 1])
        monkeypatch.setattr(live, "_drive_windows", drive)
        monkeypatch.setattr(live.os, "sched_getaffinity", lambda pid: {0, 1})
        monkeypatch.setattr(node_control, "ControlLoop", Loop)
        monkeypatch.setattr(control_client, "ControlClient", lambda port: SimpleNamespace(port=port))
        monkeypatch.setattr(node_control, "ServerNodeControl",
                            lambda client, window_s, models, total_cores: SimpleNamespace(total_cores=total_cores))
        monkeypatch.setattr(rmu, "make_controller", lambda name, capacity: SimpleNamespace(
            log=[SimpleNamespace(time_s=1.5, model=MODELS[1], action="grow")]))


@pytest.mark.parametrize("use_router", [True, False])
def test_live_run_sends_each_models_load_and_reports_its_windows(monkeypatch, use_router):
    fakes = Fakes(monkeypatch)
    data = run_live(SimpleNamespace(), 1e-3, 12.0, 3.0, "hera", use_router=use_router, shape="fig14",
                    models=MODELS, peaks=(0.35, 0.2, 0.8), capacity=CAPACITY)
    front = 8202 if use_router else 8101
    assert fakes.events == ["start node A", *([("router", MODELS[0], 1e-3, 8101)] if use_router else []),
                            ("loop", "SimpleNamespace", 4, 3.0),
                            *(["stop router"] if use_router else []), "stop node A"]
    models, urls, rates, scale, window_s = fakes.drive_args
    assert (models, scale, window_s) == (MODELS, 1e-3, 3.0)
    assert urls == {MODELS[0]: f"http://127.0.0.1:{front}", MODELS[1]: "http://127.0.0.1:8101"}
    assert {m: len(r) for m, r in rates.items()} == {MODELS[0]: 4, MODELS[1]: 4}
    assert data["peak_qps"] == {m: pytest.approx(max(r)) for m, r in rates.items()}
    assert {k: v for k, v in data.items() if k not in ("peak_qps", "windows")} == {
        "kind": "demo-live", "controller": "hera", "router": use_router, "shape": "fig14", "models": list(MODELS),
        "scale": 1e-3, "window_s": 3.0,
        "capacity_qps": {m: [CAPACITY[m].max_qps(n) for n in (1, 2, 3)] for m in MODELS},
        "violation_fraction": {MODELS[0]: 0.5, MODELS[1]: 1.0},
        "decisions": [{"time_s": 1.5, "model": MODELS[1], "action": "grow"}],
        "controller_errors": ["one late tick"], "held": [],
        "router_stats": {"completed": 7} if use_router else None}
    assert [w["p95_ms"] for w in data["windows"]] == [20.0, 90.0, 60.0]


def test_a_failed_load_generator_fails_the_run_after_every_server_stopped(monkeypatch):
    fakes = Fakes(monkeypatch, failures=["hera-dlrm-b: OSError: refused"])
    with pytest.raises(RecserveError, match="load generation failed: hera-dlrm-b: OSError: refused"):
        run_live(SimpleNamespace(), 1e-3, 12.0, 3.0, models=MODELS, capacity=CAPACITY)
    assert fakes.events[-2:] == ["stop router", "stop node A"]


def test_a_model_with_no_capacity_is_refused_before_any_server_starts(monkeypatch):
    fakes = Fakes(monkeypatch)
    none = {**CAPACITY, MODELS[1]: CapacityProfile.from_points({1: 0.0})}
    with pytest.raises(RecserveError, match="elasticrec-rm3 misses its SLA even at no load"):
        run_live(SimpleNamespace(), 1e-3, 12.0, 3.0, models=MODELS, capacity=none)
    assert fakes.events == []
