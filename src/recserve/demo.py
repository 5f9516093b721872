"""The main job (``recserve demo``): the whole pipeline on this host in a few minutes.

specs → profiles (measured here, quick) → calibrated perfmodel → plans (Hera co-location, Kairos
pool, Hercules provisioning, ElasticRec shards, SDM tiers, dispatch simulation) → a live
deployment (a node server co-locating two models, a second node server, the Kairos router in
front) under a diurnal-shaped Poisson load with the production query mix while the Hera resource
manager resizes workers → metrics → an HTML report and a terminal summary.

Every step is the same code the CLI runs; each step's outputs (JSON, PNG) land in ``--out``.
A failed step is reported and the demo carries on with what does not depend on it; the exit code
is non-zero if any step failed.  Everything started is stopped.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve import report
from recserve.cli import main as cli
from recserve.errors import RecserveError
from recserve.measure.plot import pyplot

if TYPE_CHECKING:
    from recserve.measure.loadgen import LoadSession

# Live pair: a memory-bound, low-scalability DLRM and a compute-bound, high-scalability one whose
# SLA the production query mix (p99 920 items) can meet on one core of a 2-core host.
LIVE_MODELS = ("hera-dlrm-b", "elasticrec-rm3")
# Hercules' heterogeneous cluster (counts are ours: the paper gives the types, not a fleet) and a day of load
HERCULES_DAY = """available: {hercules-t1: 40, hercules-t2: 40, hercules-t3: 20, hercules-t4: 20, hercules-t5: 10,
            hercules-t6: 10, hercules-t7: 10, hercules-t8: 10, hercules-t9: 10, hercules-t10: 10}
peak_qps: {hercules-rmc1: 20000, hercules-rmc2: 3000, hercules-rmc3: 5000, hercules-din: 2000}
"""
WORKER_SLOTS_PER_CORE = 2
# the live load: Hera Fig. 14 as fractions of each model's max load with two workers on node A, measured just
# before beside the neighbour's load (the first model's plateau, the second's level at T1, its spike at T2: past one
# worker, within two)
LIVE_PEAKS = (0.35, 0.2, 0.8)
CONFIRM_PROBES = 3  # the capacity that sizes the live load: its max load must pass again (or a step lower)
LIVE_CONTROLLERS = ("hera", "static")  # the first is the report's main run; the others get the same load
PEAK_SHARE = {"hera-dlrm-a": 0.3, "elasticrec-rm3": 0.6}
HERA_MODELS = ("hera-dlrm-a", "hera-dlrm-b", "hera-dlrm-c", "hera-dlrm-d", "hera-ncf", "hera-dien", "hera-din",
               "hera-wnd")


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    ok: bool = False
    summary: str = ""
    outputs: list[str] = field(default_factory=list)
    error: str = ""


class DemoRun:
    """Runs named steps with timing, progress lines and failure isolation."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.steps: list[Step] = []
        self.started = time.monotonic()

    def path(self, name: str) -> Path:
        return self.out / name

    def step(self, name: str, fn: Callable[[Step], None]) -> Step:
        step = Step(name)
        self.steps.append(step)
        elapsed = time.monotonic() - self.started
        print(f"[{elapsed:6.1f}s] {name} ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            fn(step)
            step.ok = True
        except Exception as exc:  # noqa: BLE001 - a failed step is reported, the demo goes on
            step.error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc(file=sys.stderr)
        step.seconds = time.monotonic() - start
        mark = "ok" if step.ok else f"FAILED ({step.error})"
        print(f"[{time.monotonic() - self.started:6.1f}s] {name}: {mark} {step.summary}", file=sys.stderr, flush=True)
        return step

    def cli(self, step: Step, args: list[str], outputs: list[Path]) -> None:
        code = cli(args)
        if code != 0:
            raise RecserveError(f"`recserve {' '.join(args)}` exited with {code}")
        step.outputs += [str(p) for p in outputs if p.exists()]


# ------------------------------------------------------------------------------ steps


def profile_step(run: DemoRun, scale: float, quick: bool) -> Callable[[Step], None]:
    def go(step: Step) -> None:
        measured = run.path("profiles/this-host.json")
        args = ["profile", "host", "--models", ",".join(LIVE_MODELS), "--scale", str(scale), "--via", "inprocess",
                "--batches", "1,16,64,256,1024", "--workers", "1,2", "--out", str(measured)]
        run.cli(step, args + (["--quick"] if quick else []), [measured])
        calibration = run.path("profiles/calibration.json")
        run.cli(step, ["profile", "calibrate", "--measured", str(measured), "--out", str(calibration)], [calibration])
        from recserve.profiles import ProfileSet

        tables = ProfileSet.load(measured)
        maxload = {t.model: t.interp(1, "max_qps") for t in tables.find(kind="maxload_vs_workers")}
        step.summary = "max load, 1 worker: " + ", ".join(f"{m} {q:.1f} QPS" for m, q in maxload.items())
    return go


def plan_steps(run: DemoRun) -> list[tuple[str, Callable[[Step], None]]]:
    calibration = run.path("profiles/calibration.json")

    def colocate(step: Step) -> None:
        out, png = run.path("plans/colocate.json"), run.path("plans/colocate.png")
        run.cli(step, ["plan", "colocate", "--server", "hera-xeon", "--models", ",".join(HERA_MODELS), "--level", "4",
                       "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def pool(step: Step) -> None:
        out, png = run.path("plans/pool.json"), run.path("plans/pool.png")
        run.cli(step, ["plan", "pool", "--reference", "kairos", "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def provision(step: Step) -> None:
        traffic = run.path("plans/day.yaml")
        traffic.parent.mkdir(parents=True, exist_ok=True)
        traffic.write_text(HERCULES_DAY)
        out, png = run.path("plans/provision.json"), run.path("plans/provision.png")
        run.cli(step, ["plan", "provision", "--traffic", str(traffic), "--steps", "24", "--json", str(out),
                       "--plot", str(png)], [traffic, out, png])
        step.summary = _plan_summary(out)

    def dispatch(step: Step) -> None:
        out, png = run.path("plans/dispatch.json"), run.path("plans/dispatch.png")
        run.cli(step, ["simulate", "dispatch", "--reference", "kairos", "--model", "rm2", "--queries", "4000",
                       "--json-out", str(out), "--plot", str(png)], [out, png])
        step.summary = _plan_summary(out)

    def shard(step: Step) -> None:
        out, png = run.path("plans/shard.json"), run.path("plans/shard.png")
        run.cli(step, ["plan", "shard", "--model", "elasticrec-rm1", "--qps", "3000", "--grid", "128",
                       "--json", str(out), "--plot", str(png)], [out, png])
        step.summary = f"{json.loads(out.read_text())['saving_vs_modelwise']:.2f}x less memory than model-wise"

    def tier(step: Step) -> None:
        out = run.path("plans/tier.json")
        run.cli(step, ["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "200", "--out", str(out)],
                [out])
        step.summary = _plan_summary(out)

    del calibration  # the planners use the bundled constants; the calibration feeds the live capacity
    return [("plan: Hera co-location (8 Hera models, hera-xeon)", colocate),
            ("plan: Kairos pool ($2.5/hr, AWS reference latencies)", pool),
            ("plan: Hercules provisioning over a day", provision),
            ("simulate: Kairos dispatch vs Ribbon/DRS/Clockwork/Oracle", dispatch),
            ("plan: ElasticRec shards for RM1", shard),
            ("plan: SDM tiering for M1", tier)]


def _plan_summary(path: Path) -> str:
    """One line of headline numbers from a plan or simulation JSON (by its ``kind``)."""
    data = json.loads(path.read_text())
    s, b = data.get("summary", {}), data.get("baselines", {})
    kind = data.get("kind")
    if kind == "colocate":
        pairs = ("no co-located pairs" if s.get("min_pair_emu") is None
                 else f"chosen pairs' EMU {s['min_pair_emu']:.2f}-{s['max_pair_emu']:.2f}")
        return (f"Hera {s['servers']:.0f} servers vs DeepRecSys {b['deeprecsys']['servers']:.0f}, "
                f"Random {b['random']['servers']:.1f}; {pairs}")
    if kind == "pool":
        return f"upper-bound throughput {s['mean_ub_gain_vs_homogeneous']:.2f}x the best homogeneous pool (mean of 5)"
    if kind == "provision":
        g, o = b["greedy"], b["oblivious"]
        return (f"peak provisioned power {s['peak_power_w']:,.0f} W vs greedy {g['peak_power_w']:,.0f} W, "
                f"oblivious {o['peak_power_w']:,.0f} W")
    if kind == "tier":
        return (f"{s['dram_saved_gb']:.0f} GB DRAM saved, hit rate {s['hit_rate']:.2f}, "
                f"{s['required_iops']:,.0f} IOPS of {s['ssd_iops']:,.0f}")
    if "results" in data:
        r = data["results"][0]
        qps = {k: v["max_qps"] for k, v in r["policies"].items()}
        return (f"{r['model']} on {r['pool']}: " + ", ".join(f"{k} {v:.0f}" for k, v in qps.items())
                + f" QPS; homogeneous {r['homogeneous']['max_qps']:.0f}")
    return ""


# ------------------------------------------------------------------------------ live


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


def diurnal_rates(peak: float, windows: int, ratio: float = 3.0) -> np.ndarray:
    """A compressed day: valley → evening peak → valley, one rate per window."""
    from recserve.workload.diurnal import diurnal_shape

    hours = np.linspace(8.0, 8.0 + 24.0, windows, endpoint=False)
    return peak * diurnal_shape(hours * 3600.0, peak_valley_ratio=ratio, peak_hour=20.0)


def live_step(run: DemoRun, scale: float, seconds: float, window_s: float) -> Callable[[Step], None]:
    """Measure node A's capacity now, then one run per controller in ``LIVE_CONTROLLERS`` under the same load, sent
    to node A directly: through the Kairos router (node A + a replica on node B, one slot each) the router's own
    queueing dominated the p95, so the comparison would have measured the router, not the RMU
    (docs/decisions/2026-11-28-demo-live-load-sized-live.md)."""
    def go(step: Step) -> None:
        measured = measured_capacity(run, scale, LIVE_MODELS, "fig14", LIVE_PEAKS)
        runs = {name: run_live(run, scale, seconds, window_s, name, use_router=False, shape="fig14",
                               peaks=LIVE_PEAKS, capacity=measured.profiles) for name in LIVE_CONTROLLERS}
        compared = {name: d["violation_fraction"] for name, d in runs.items()}
        for name, data in runs.items():
            data.update(measured.to_dict())
            if name == LIVE_CONTROLLERS[0]:
                data["compared"] = compared
            path = run.path(f"live/{live_stem(name)}.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(strict_json(data), indent=1, allow_nan=False))
            step.outputs += [str(path), str(plot_live(data, path.with_suffix(".png")))]
        lead = runs[LIVE_CONTROLLERS[0]]
        step.summary = (f"{len(lead['windows']) // 2} windows per model; SLA violated in "
                        + "; ".join(f"{name}: " + ", ".join(f"{m} {100 * f:.0f}%" for m, f in v.items())
                                    for name, v in compared.items())
                        + f"; {len(lead['decisions'])} RMU decisions")
    return go


def live_stem(controller: str) -> str:
    """The file stem of a controller's live run (its JSON and figure): ``live`` for the report's main run."""
    return "live" if controller == LIVE_CONTROLLERS[0] else f"live_{controller}"


def live_rates(shape: str, capacity: dict[str, Any], windows: int, window_s: float,
               models: tuple[str, str] = LIVE_MODELS, peaks: tuple[float, ...] = (0.7, 0.6)
               ) -> dict[str, np.ndarray]:
    """Offered load per window for the two live models.

    ``diurnal``: a compressed day peaking at ``PEAK_SHARE`` of one worker's profiled max load.
    ``fig14``: Hera Fig. 14 (gradual rise; at T1 the second model drops to 20%; at T2 it spikes while the first
    drops to 10%), as fractions of each model's max load alone on the node's two cores; ``peaks`` are the first
    model's plateau, the second's level at T1 and, if given, its spike at T2 (default the paper's 60%).
    """
    from recserve.sim.colocate import hera_fig14

    if shape == "diurnal":
        return {m: diurnal_rates(PEAK_SHARE.get(m, 0.5) * capacity[m].max_qps(1), windows) for m in models}
    if shape == "fig14":
        mids = (np.arange(windows) + 0.5) * window_s
        shapes = dict(zip(models, hera_fig14(duration_s=windows * window_s, memory_peak=peaks[0],
                                             cache_peak=peaks[1], cache_spike=(*peaks, 0.6)[2]), strict=True))
        return {m: np.array([shapes[m].rate(capacity[m].max_qps(2))(t) for t in mids]) for m in models}
    raise RecserveError(f"unknown live load shape {shape!r}; known: diurnal, fig14")


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


def _live_cores() -> list[int]:
    """The two cores the live nodes use: node A's models start one on each, node B's replica takes the last."""
    return sorted(os.sched_getaffinity(0))[:2]


def _node_a(models: tuple[str, str], scale: float) -> Any:
    """Node A: the two models co-located, one worker each on its own core; workers a controller adds go
    round-robin over both cores, so a model's worker count is its share of the node's CPU when both are busy."""
    from recserve.serving import NodeServer, config_from_dict

    cores = _live_cores()
    lo, hi = models
    return NodeServer(config_from_dict({"models": [
        {"model": lo, "scale": scale, "workers": 1, "cores": cores, "queue_limit": 64},
        {"model": hi, "scale": scale, "workers": 1, "cores": cores[::-1], "queue_limit": 64}]}))


def profiled_capacity(run: DemoRun, models: tuple[str, str] = LIVE_MODELS) -> dict[str, Any]:
    """Each model's CapacityProfile from the run's profile of this host (``profiles/this-host.json``)."""
    from recserve.policies.rmu import CapacityProfile
    from recserve.profiles import ProfileSet

    profiles = ProfileSet.load(run.path("profiles/this-host.json"))
    return {m: CapacityProfile.from_profiles(profiles, m, "this-host") for m in models}


@dataclass
class LiveCapacity:
    """Node A's max load per model and worker count, measured twice: ``alone`` (the neighbour idle) and ``beside``
    (the neighbour driven at ``neighbour_qps``, the load it carries while this model peaks in the live shape).
    ``profiles`` (from ``beside``) size the live load and are the RMU's curve."""

    alone: dict[str, dict[int, float]]
    beside: dict[str, dict[int, float]]
    neighbour_qps: dict[str, float]
    profiles: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"capacity_alone": _by_workers(self.alone), "capacity_measured": _by_workers(self.beside),
                "neighbour_qps_while_measured": self.neighbour_qps}


def _by_workers(points: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
    return {m: {str(n): q for n, q in qs.items()} for m, qs in points.items()}


def measured_capacity(run: DemoRun, scale: float, models: tuple[str, str] = LIVE_MODELS, shape: str = "fig14",
                      peaks: tuple[float, ...] = LIVE_PEAKS) -> LiveCapacity:
    """:func:`live_capacity` twice: alone (searches seeded at half the run's profiled one-worker max load, when the
    run has a profile), then beside the neighbour at its load during this model's peak in ``shape``.

    Why twice: sized from a capacity measured with the neighbour idle, the demo's spike was past what two workers
    held once the neighbour and its load generator were running too, so every controller missed the live bar
    (docs/decisions/2026-11-28-demo-live-load-sized-live.md)."""
    from recserve.policies.rmu import CapacityProfile

    profiled = profiled_capacity(run, models) if run.path("profiles/this-host.json").exists() else {}
    alone = live_capacity(scale, models, start_qps={m: 0.5 * c.max_qps(1) for m, c in profiled.items()})
    neighbour = neighbour_load(shape, {m: CapacityProfile.from_points(q) for m, q in alone.items()}, models, peaks)
    beside = live_capacity(scale, models, start_qps={m: 0.7 * q[min(q)] for m, q in alone.items()},
                           neighbour_qps=neighbour, confirm=CONFIRM_PROBES)
    return LiveCapacity(alone, beside, neighbour, {m: CapacityProfile.from_points(q) for m, q in beside.items()})


def neighbour_load(shape: str, capacity: dict[str, Any], models: tuple[str, str] = LIVE_MODELS,
                   peaks: tuple[float, ...] = LIVE_PEAKS, windows: int = 60) -> dict[str, float]:
    """For each model, the highest rate its neighbour is offered while this model is within 5% of its own peak in
    ``shape`` (Fig. 14: beside rm3's spike, dlrm-b at 10%; beside dlrm-b's plateau, rm3 at 20%)."""
    rates = live_rates(shape, capacity, windows, 1.0, models, peaks)
    out: dict[str, float] = {}
    for m, other in (models, models[::-1]):
        at_peak = rates[m] >= 0.95 * rates[m].max()
        out[m] = float(rates[other][at_peak].max())
    return out


def live_capacity(scale: float, models: tuple[str, str] = LIVE_MODELS, workers: tuple[int, ...] = (1, 2),
                  start_qps: dict[str, float] | None = None, neighbour_qps: dict[str, float] | None = None,
                  confirm: int = 0) -> dict[str, dict[int, float]]:
    """Each model's max load on node A now with each worker count, over HTTP, while the other model is offered
    ``neighbour_qps[model]`` (default idle) from the same process, as in the live runs; ``confirm`` > 0 probes
    each result again before it counts (:func:`~recserve.measure.maxload.confirm_max_load`).

    Why: the live runs' load and the RMU's curve must describe this node at this hour.  On a shared host a profile
    taken in-process, or an hour earlier, was up to 2x off live, which made a load meant to be within reach
    impossible for every controller (docs/decisions/2026-11-28-demo-live-load-sized-live.md)."""
    from recserve.measure.profiler import DEFAULT_START_QPS, node_max_loads
    from recserve.serving.node.control_client import ControlClient
    from recserve.specs import get_model

    node = _node_a(models, scale)
    out: dict[str, dict[int, float]] = {}
    try:
        ports = node.start()
        url = f"http://127.0.0.1:{ports.http}"
        control = ControlClient(port=ports.http)
        for m, other in (models, models[::-1]):
            with background_load(url, other, scale, (neighbour_qps or {}).get(m, 0.0)), \
                    production_session(url, m, scale, seed=2) as session:
                out[m] = node_max_loads(session, lambda n, m=m: control.set_workers(m, n), get_model(m).sla, workers,
                                        (start_qps or {}).get(m, DEFAULT_START_QPS), confirm=confirm, model=m)
            control.set_workers(m, 1)
    finally:
        node.stop()
    return out


def production_session(url: str, model: str, scale: float, seed: int) -> LoadSession:
    """A warmed-up load session sending ``model``'s production query mix (a pool of 32) to the node at ``url``: what
    the live runs, the capacity searches and the neighbour's background load all send."""
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.specs import get_model

    pool = RequestPool.from_mix(get_model(model), scale, "production", pool=32, seed=seed)
    return LoadSession(HttpTarget(url, model), pool, warm=True)


@contextmanager
def background_load(url: str, model: str, scale: float, qps: float, chunk_s: float = 2.0) -> Iterator[None]:
    """Offer ``model`` at ``url`` a Poisson load of ``qps`` (production mix) from a thread until the block ends;
    a failure in that thread (or a stretch of ``chunk_s`` with no query answered) is raised when the block ends.
    ``qps`` <= 0: nothing is sent."""
    if qps <= 0:
        yield
        return
    stop, failures = threading.Event(), []
    ready = threading.Event()

    def drive() -> None:
        try:
            with production_session(url, model, scale, seed=3) as session:
                ready.set()
                k = 0
                while not stop.is_set():
                    r = session.run(qps, chunk_s, seed=1000 + k, timeout_s=5.0, min_requests=1)
                    if r.ok == 0:  # the neighbour is not loaded as meant: a capacity beside it would be wrong
                        raise RecserveError(f"none of {r.sent} queries answered ({dict(r.errors)})")
                    k += 1
        except Exception as exc:  # noqa: BLE001 - re-raised in the caller's thread below
            failures.append(f"{model}: {type(exc).__name__}: {exc}")
        finally:
            ready.set()

    thread = threading.Thread(target=drive, name=f"background-{model}", daemon=True)
    thread.start()
    ready.wait()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if failures:
        raise RecserveError("background load failed: " + "; ".join(failures))


def run_live(run: DemoRun, scale: float, seconds: float, window_s: float, controller_name: str = "hera",
             use_router: bool = True, shape: str = "diurnal",
             models: tuple[str, str] = LIVE_MODELS, peaks: tuple[float, ...] = (0.7, 0.6),
             capacity: dict[str, Any] | None = None) -> dict[str, Any]:
    """Node A co-locates the two models, node B replicates the first behind the router (``use_router``);
    ``controller_name`` (hera | parties | static) resizes node A's workers every window under the
    ``shape`` load (see :func:`live_rates`), sized from ``capacity`` (default: the run's profile of this host),
    which is also the RMU's curve."""
    from recserve.policies.node_control import ControlLoop, ServerNodeControl
    from recserve.policies.rmu import make_controller
    from recserve.serving.node.control_client import ControlClient

    lo, hi = models
    capacity = capacity or profiled_capacity(run, models)
    for m in models:  # before any server starts
        if capacity[m].max_qps(1) <= 0:
            raise RecserveError(f"{m} misses its SLA even at no load on one worker of this host (max load 0)")
    node_a = _node_a(models, scale)
    started: list[Any] = []
    try:
        ports_a = node_a.start()
        started.append(node_a)
        router = _replica_router(run, lo, scale, ports_a.http, _live_cores()[-1], started) if use_router else None
        windows = max(4, int(seconds / window_s))
        rates = live_rates(shape, capacity, windows, window_s, models, peaks)
        peak = {m: float(np.max(r)) for m, r in rates.items()}
        front = router.port if router is not None else ports_a.http
        urls = {lo: f"http://127.0.0.1:{front}", hi: f"http://127.0.0.1:{ports_a.http}"}
        # Two co-located models on a 2-core host leave the RMU nothing to move (each needs one worker), so
        # the demo lets it place up to WORKER_SLOTS_PER_CORE workers per core (time-shared processes).
        control = ServerNodeControl(ControlClient(port=ports_a.http), window_s=window_s, models=list(models),
                                    total_cores=WORKER_SLOTS_PER_CORE * len(os.sched_getaffinity(0)))
        controller = make_controller(controller_name, capacity)
        with ControlLoop(controller, control, period_s=window_s) as loop:
            results, failures = _drive_windows(models, urls, rates, scale, window_s, control)
            loop_errors = list(loop.errors)
        stats = router.router.stats() if router is not None else None
        if failures:
            raise RecserveError("load generation failed: " + "; ".join(failures))
    finally:
        for s in reversed(started):
            s.stop()
    by_model = {m: [w for w in results if w.model == m] for m in models}
    violation = {m: float(np.mean([w.violates(window_s) for w in ws])) if ws else 1.0 for m, ws in by_model.items()}
    return {"kind": "demo-live", "controller": controller_name, "router": use_router, "shape": shape,
            "models": list(models), "scale": scale, "window_s": window_s,
            "capacity_qps": {m: [capacity[m].max_qps(n) for n in (1, 2, 3)] for m in models},
            "peak_qps": peak, "windows": [w.__dict__ for w in results], "violation_fraction": violation,
            "decisions": [d.__dict__ for d in controller.log], "controller_errors": loop_errors,
            "held": [d.__dict__ for d in getattr(controller, "held", [])],
            "router_stats": stats}


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


def plot_live(data: dict[str, Any], path: Path) -> Path:
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for m in data["models"]:
        ws = [w for w in data["windows"] if w["model"] == m]
        t = [w["t_s"] for w in ws]
        line = axes[0].plot(t, [w["p95_ms"] for w in ws], marker=".", label=f"{m} p95")[0]
        axes[0].axhline(ws[0]["sla_ms"] if ws else 0, color=line.get_color(), ls="--", lw=1, label=f"{m} SLA")
        axes[1].plot(t, [w["offered_qps"] for w in ws], ls="--", color=line.get_color(), label=f"{m} offered")
        axes[1].plot(t, [w["achieved_qps"] for w in ws], color=line.get_color(), label=f"{m} served")
        failed = [(w["t_s"], w["errors"] / data["window_s"]) for w in ws if w.get("errors")]
        if failed:  # a window whose queries failed may have no p95 point at all
            axes[1].scatter(*zip(*failed, strict=True), marker="x", color=line.get_color(), label=f"{m} failed")
        axes[2].step(t, [w["workers"] for w in ws], where="post", color=line.get_color(), label=m)
    axes[0].set_ylabel("p95 latency (ms)")
    axes[0].set_yscale("log")
    axes[1].set_ylabel("QPS")
    axes[2].set_ylabel("workers (node A)")
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_ylim(0, max((w["workers"] for w in data["windows"]), default=1) + 0.5)
    axes[2].set_xlabel("seconds into the compressed day")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.suptitle(f"live: {data.get('shape', 'diurnal')} load, "
                 + ("Kairos router, " if data.get("router") else "") + f"controller {data.get('controller', 'hera')}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------ report


def render_live(data: dict[str, Any], base: Path) -> str:
    rows = []
    for m in data["models"]:
        ws = [w for w in data["windows"] if w["model"] == m]
        p95 = [w["p95_ms"] for w in ws if w["p95_ms"] is not None and w["p95_ms"] == w["p95_ms"]]
        rows.append({"model": m, "windows": len(ws), "SLA ms": ws[0]["sla_ms"] if ws else "",
                     "median p95 ms": float(np.median(p95)) if p95 else float("nan"),
                     "windows violating": f"{100 * data['violation_fraction'][m]:.0f}%",
                     "peak offered QPS": data["peak_qps"][m],
                     "errors": sum(w["errors"] for w in ws)})
    decisions = sorted(({"t (s)": round(d["time_s"], 1), "model": d["model"], "action": d["action"],
                         "detail": json.dumps(d["detail"])[:100]} for d in data["decisions"] + data.get("held", [])),
                       key=lambda row: row["t (s)"])
    compared = [{"controller": name, **{m: f"{100 * f:.0f}%" for m, f in v.items()}}
                for name, v in data.get("compared", {}).items()]
    return ("<h2>Live deployment on this host</h2>" + report.table(rows)
            + (("<h3>Windows over the SLA, same load, by controller</h3>" + report.table(compared)) if compared else "")
            + report.image(base / f"{live_stem(data.get('controller', LIVE_CONTROLLERS[0]))}.png")
            + "<h3>Resource-manager decisions</h3>" + report.table(decisions))


def render_demo(data: dict[str, Any], base: Path) -> str:
    rows = [{"step": s["name"], "status": "ok" if s["ok"] else "FAILED", "seconds": round(s["seconds"], 1),
             "result": s["summary"] or s["error"]} for s in data["steps"]]
    return "<h2>Steps</h2>" + report.table(rows)


report.register("demo-live", render_live, models=list, windows=list, peak_qps=dict, violation_fraction=dict,
                decisions=list)
report.register("demo", render_demo, steps=list)


def write_report(run: DemoRun) -> Path:
    summary = {"kind": "demo", "steps": [s.__dict__ for s in run.steps]}
    summary_path = run.path("demo.json")
    summary_path.write_text(json.dumps(summary, indent=1))
    sections = [render_demo(summary, run.out)]
    live = run.path("live/live.json")
    if live.exists():
        sections.append(render_live(json.loads(live.read_text()), live.parent))
    for s in run.steps:
        if s.name.startswith(("plan", "simulate")):
            images = [report.image(p) for p in s.outputs if p.endswith(".png")]
            sections.append(f"<h2>{report.esc(s.name)}</h2><p>{report.esc(s.summary)}</p>" + "".join(images))
    html_path = run.path("report.html")
    html_path.write_text(report.page("recserve demo", sections, time.strftime("%Y-%m-%d %H:%M:%S")))
    return html_path


def run_demo(out: Path, scale: float = 1e-3, live_seconds: float = 90.0, window_s: float = 3.0,
             quick: bool = True) -> int:
    out.mkdir(parents=True, exist_ok=True)
    run = DemoRun(out)
    profiled = run.step("profile two models on this host", profile_step(run, scale, quick))
    for name, fn in plan_steps(run):
        run.step(name, fn)
    if profiled.ok:
        run.step("live: node server + Hera RMU vs static, Hera Fig. 14 load",
                 live_step(run, scale, live_seconds, window_s))
    html = write_report(run)
    print_summary(run, html)
    return 0 if all(s.ok for s in run.steps) else 1


def print_summary(run: DemoRun, html: Path) -> None:
    print(f"\nrecserve demo — {time.monotonic() - run.started:.0f} s")
    for s in run.steps:
        status = "ok    " if s.ok else "FAILED"
        print(f"  {status} {s.name:58s} {s.seconds:6.1f}s  {s.summary or s.error}")
    print(f"report: {html}")
