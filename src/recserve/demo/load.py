"""The demo's live load: node A (the two live models co-located), the rates each model is offered window by
window, and the production-mix sessions that send them (a neighbour's background load among them)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.errors import RecserveError

if TYPE_CHECKING:
    from recserve.measure.loadgen import LoadSession

# Live pair: a memory-bound, low-scalability DLRM and a compute-bound, high-scalability one whose
# SLA the production query mix (p99 920 items) can meet on one core of a 2-core host.
LIVE_MODELS = ("hera-dlrm-b", "elasticrec-rm3")
# the live load: Hera Fig. 14 as fractions of each model's max load with two workers on node A, measured just
# before beside the neighbour's load (the first model's plateau, the second's level at T1, its spike at T2: past one
# worker, within two)
LIVE_PEAKS = (0.35, 0.2, 0.8)
PEAK_SHARE = {"hera-dlrm-a": 0.3, "elasticrec-rm3": 0.6}


def diurnal_rates(peak: float, windows: int, ratio: float = 3.0) -> np.ndarray:
    """A compressed day: valley → evening peak → valley, one rate per window."""
    from recserve.workload.diurnal import diurnal_shape

    hours = np.linspace(8.0, 8.0 + 24.0, windows, endpoint=False)
    return peak * diurnal_shape(hours * 3600.0, peak_valley_ratio=ratio, peak_hour=20.0)


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


def live_cores() -> list[int]:
    """The two cores the live nodes use: node A's models start one on each, node B's replica takes the last."""
    return sorted(os.sched_getaffinity(0))[:2]


def node_a_server(models: tuple[str, str], scale: float) -> Any:
    """Node A: the two models co-located, one worker each on its own core; workers a controller adds go
    round-robin over both cores, so a model's worker count is its share of the node's CPU when both are busy."""
    from recserve.serving import NodeServer, config_from_dict

    cores = live_cores()
    lo, hi = models
    return NodeServer(config_from_dict({"models": [
        {"model": lo, "scale": scale, "workers": 1, "cores": cores, "queue_limit": 64},
        {"model": hi, "scale": scale, "workers": 1, "cores": cores[::-1], "queue_limit": 64}]}))


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
