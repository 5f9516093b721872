"""Node A's capacity for the live runs: each model's max load per worker count, measured just before them, alone
and beside its neighbour's load (or read from the run's profile of this host)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from recserve.demo.load import LIVE_MODELS, LIVE_PEAKS, background_load, live_rates, node_a_server, production_session

if TYPE_CHECKING:
    from recserve.demo.job import DemoRun

CONFIRM_PROBES = 3  # the capacity that sizes the live load: its max load must pass again (or a step lower)


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

    node = node_a_server(models, scale)
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
