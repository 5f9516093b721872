"""Node-level online resource management for co-located models (Hera Sec. VI-C, Alg. 3) and baselines.

Every ``T_monitor`` the controller reads each model's window statistics (tail latency, QPS served,
arrival rate) through a :class:`NodeControl` and adjusts workers (cores) and LLC ways.  The same
controllers drive the simulated node (``recserve.sim.node.SimNodeControl``) and a live node server
through its control API (a ``NodeControl`` over ``recserve.serving.node.control_client``).

- :class:`HeraRMU` (Alg. 3): if slack = tail/SLA is > 1.0 or < 0.8, pick the fewest workers whose
  profiled max load covers ``urgency × arrival rate`` (urgency = max(1, tail/SLA)); when any worker
  count changed, re-split the LLC ways to maximise the profiled aggregate QPS.
- ``parties.PartiesController``: PARTIES' feedback loop, one unit of cores or LLC ways at a time, each judged
  before the next and reverted if it cost a model its QoS (its own module).
- :class:`StaticController`: the initial even split, never changed.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from recserve.errors import ProfileError, RecserveError
from recserve.profiles import ProfileSet


@dataclass
class WindowStats:
    """One model over the last monitoring window."""

    tail_ms: float       # SLA percentile of latencies completed in the window (inf if overloaded, 0 if idle)
    qps: float           # queries completed per second
    arrival_qps: float   # queries arrived per second
    completed: int = 0


class NodeControl(Protocol):
    """What a resource manager may read and change on one node."""

    def models(self) -> list[str]: ...
    def sla(self, model: str) -> tuple[float, float]: ...  # (target_ms, percentile)
    def total_cores(self) -> int: ...
    def total_ways(self) -> int: ...
    def get_workers(self, model: str) -> int: ...
    def set_workers(self, model: str, workers: int) -> None: ...
    def get_ways(self, model: str) -> int: ...
    def set_ways(self, model: str, ways: int) -> None: ...
    def window_stats(self, model: str) -> WindowStats: ...


def apply_split(models: list[str], values: list[int], get, put) -> None:
    """Set a new split of one resource, shrinking models before growing others, so that no intermediate
    step asks for more than the node has."""
    for m, v in sorted(zip(models, values, strict=True), key=lambda mv: mv[1] - get(mv[0])):
        if get(m) != v:
            put(m, v)


def even_split(control: NodeControl) -> None:
    """Hera's initialisation: cores and LLC ways divided evenly among the co-located models."""
    models = control.models()
    k = len(models)
    cores, ways = control.total_cores(), control.total_ways()
    apply_split(models, [max(1, cores // k + (1 if i < cores % k else 0)) for i in range(k)],
                control.get_workers, control.set_workers)
    apply_split(models, [max(1, ways // k + (1 if i < ways % k else 0)) for i in range(k)],
                control.get_ways, control.set_ways)


# ------------------------------------------------------------------ profile lookups


class CapacityProfile:
    """Profiled max load of a model as a function of (workers, LLC ways) on one server type.

    Built from ``maxload_vs_workers`` (at full LLC) and optionally ``maxload_vs_ways``; a ways table
    that carries a ``workers`` column is used directly as Hera's 3-D lookup, otherwise the ways curve
    is applied as a relative factor to the workers curve.
    """

    def __init__(self, workers_curve: Callable[[int], float], ways_factor: Callable[[int, int], float]) -> None:
        self._workers = _nondecreasing(workers_curve)
        self._ways = ways_factor

    def qps(self, workers: int, ways: int) -> float:
        return self._workers(workers) * self._ways(workers, ways)

    def max_qps(self, workers: int) -> float:
        return self._workers(workers)

    @classmethod
    def from_points(cls, max_qps: dict[int, float]) -> CapacityProfile:
        """A curve measured at a few worker counts (linear between them, flat past the last), full LLC."""
        counts = sorted(max_qps)
        if not counts or counts[0] < 1:
            raise RecserveError(f"a capacity curve needs max loads at worker counts >= 1, got {sorted(max_qps)}")
        xs, ys = np.array(counts, dtype=float), np.array([max_qps[n] for n in counts], dtype=float)
        return cls(lambda n: max(float(np.interp(float(n), xs, ys)), 0.0), lambda _n, _w: 1.0)

    @classmethod
    def from_profiles(cls, profiles: ProfileSet, model: str, server: str) -> CapacityProfile:
        wt = profiles.find(model, server, "maxload_vs_workers")
        if not wt:
            raise ProfileError(f"no maxload_vs_workers profile for {model!r} on {server!r} (Hera needs worker "
                               f"scalability: measure it with `recserve profile`, model it with the perfmodel, or let "
                               f"`recserve simulate colocate` profile its simulated node)")
        workers_tab = wt[0]

        def workers_curve(n: int) -> float:
            return max(workers_tab.interp(float(n), "max_qps"), 0.0)

        wy = profiles.find(model, server, "maxload_vs_ways")
        if not wy:
            return cls(workers_curve, lambda _n, _w: 1.0)
        with_workers = [t for t in wy if "workers" in t.columns]
        if with_workers:
            # Hera's 3-D lookup; perfmodel/measure write one table per worker count (conditions workers=w)
            w_col = np.concatenate([t.column("workers") for t in with_workers])
            y_col = np.concatenate([t.column("ways") for t in with_workers])
            q_col = np.concatenate([t.column("max_qps") for t in with_workers])

            def factor3(n: int, w: int) -> float:
                # nearest profiled worker count, relative to that count's full-LLC value
                near = w_col[np.argmin(np.abs(w_col - n))]
                sel = w_col == near
                xs, ys = y_col[sel], q_col[sel]
                order = np.argsort(xs)
                top = float(ys[order][-1])
                return float(np.interp(w, xs[order], ys[order])) / top if top > 0 else 0.0

            return cls(workers_curve, factor3)
        ways_tab = wy[0]
        full = float(ways_tab.column("ways").max())
        top = ways_tab.interp(full, "max_qps")
        return cls(workers_curve, lambda _n, w: ways_tab.interp(float(w), "max_qps") / top if top > 0 else 0.0)


def _nondecreasing(curve: Callable[[int], float]) -> Callable[[int], float]:
    """Max load with n workers as the best of 1..n: the controllers choose how many workers run, so a measured dip
    (noise, or a worker past the knee time-sharing a core) means "no gain", never "more workers lose load"."""
    @functools.cache
    def best(n: int) -> float:
        return max(curve(k) for k in range(1, max(1, int(n)) + 1))
    return best


# ------------------------------------------------------------------ controllers


@dataclass
class Decision:
    time_s: float
    model: str
    action: str
    detail: dict[str, Any] = field(default_factory=dict)


class Controller:
    name = "controller"

    def __init__(self) -> None:
        self.log: list[Decision] = []

    def start(self, control: NodeControl) -> None:
        even_split(control)

    def step(self, now_s: float, control: NodeControl) -> None:
        raise NotImplementedError


class StaticController(Controller):
    name = "static"

    def step(self, now_s: float, control: NodeControl) -> None:
        return None


MARGINAL = 0.05
"""Share of the best profiled max load a worker must add to be worth a core when no count covers the traffic."""
MAX_BACKOFF = 8  # a count that keeps failing at a steady load is avoided for at most 8 x memory_windows
RATE_SMOOTHING = 0.3
"""Weight of the newest window in a model's smoothed arrival rate (what the loads at a remembered failure are compared
by): a 1-s window at ~60 queries/s reads +-13% from Poisson noise alone, the smoothed rate about +-5%."""


class Failure(NamedTuple):
    """A worker count seen to miss the SLA: at what arrival rate, when, for how many windows it is remembered, and
    the neighbours' smoothed arrival rates then."""

    rate: float
    step: int
    span: int
    neighbours: dict[str, float]


class HeraRMU(Controller):
    """Hera Alg. 3 with the profiled worker-scalability curve and (workers, ways) QPS lookup.

    One addition to the paper's algorithm: what a worker count was just seen to fail at corrects the profile.  A count
    observed to violate the SLA at some arrival rate (and any smaller count) is not chosen again for that rate (or more)
    during the next ``memory_windows`` decisions, and while that failure is remembered the whole curve is scaled by
    (failed rate / profiled max load of that count), so no count is trusted with more than the observed ratio lets it
    carry.  Why: the curve is profiled with the model alone, and a co-located node sustains less; without the memory the
    RMU oscillated between a count that failed and one with slack, and with the exclusion alone it went back to a count
    just under the rate it had failed at (docs/decisions/2026-11-28-rmu-sees-client-failures.md).  A window in which the
    count grew (the decision before it) is not counted as that count failing: the new workers were starting and the old
    backlog draining; a count shrunk to is judged on its first window (nothing starts, and a failure there is what keeps
    the RMU from shrinking to it again at once).  A model with slack is never given more workers, and one over its SLA
    fewer only to stop at the curve's knee.  Only a model's own load teaches the memory: one missing its SLA well under
    its workers' profiled load, beside a neighbour nearer its own that misses too, is left as it is
    (:meth:`_victims`).  A count that fails again soon after its memory lapsed, at a rate not clearly below the one
    remembered, is remembered twice as long (up to ``MAX_BACKOFF`` x): at a steady load the RMU would otherwise retry
    the failing count every ``memory_windows`` windows and miss the SLA each time.  Past its span a failure is still
    remembered (up to ``MAX_BACKOFF`` x ``memory_windows``) while the model's and its neighbours' loads are as they were
    then: under the same loads a retry would fail as the first try did, while any load that moves (a neighbour's
    burst that caused the failure passing, the model's own rate changing) ends the memory at its span as before."""

    name = "hera"

    def __init__(self, capacity: dict[str, CapacityProfile], low: float = 0.8, high: float = 1.0,
                 memory_windows: int = 10) -> None:
        super().__init__()
        self.capacity = capacity
        self.low, self.high = low, high
        self.memory_windows = memory_windows
        self._steps = 0
        self._failed: dict[str, dict[int, Failure]] = {}  # model -> workers -> the failure remembered
        self._rates: dict[str, float] = {}  # model -> smoothed arrival rate (``RATE_SMOOTHING``)
        self._grown_at: dict[str, int] = {}  # model -> the step that last gave it more workers
        # windows in which a model over its SLA was held as a victim (``_victims``): kept apart from ``log``, which
        # counts changes made, so a user can see why a missing model was not given more workers
        self.held: list[Decision] = []

    def find_number_of_workers(self, model: str, traffic_qps: float, limit: int, current: int | None = None) -> int:
        """The fewest workers whose profiled max load (scaled by :meth:`derating`) covers ``traffic_qps``, among the
        counts not just seen to fail at this rate.  If none covers it, the fewest of those that reach all but
        ``MARGINAL`` of their best profiled max load (not simply ``limit``: a worker past the curve's knee adds no
        capacity and takes a core).  ``current`` is one of those even if it just failed: no count is moved to unless its
        profile promises more (a flat curve past the knee would otherwise send a failing model to a count that sheds
        more); if every count has just failed, ``current`` stays
        (docs/decisions/2026-11-28-rmu-sees-client-failures.md)."""
        covering = self._covering(model, traffic_qps, limit)
        return covering if covering is not None else self._knee(model, traffic_qps, limit, current)

    def _knee(self, model: str, traffic_qps: float, limit: int, current: int | None) -> int:
        """The fewest workers whose max load is within ``MARGINAL`` of the best, among the counts not just seen to
        fail at this rate (and ``current``): where the curve's knee is when no count covers the traffic."""
        cap = self.capacity[model]
        fresh = [n for n in range(1, limit + 1) if not self._failed_at(model, n, traffic_qps)]
        knee = sorted({*fresh, min(current, limit)} if current is not None else fresh)
        if not knee:
            return limit
        best = max(cap.max_qps(n) for n in knee)
        return next(n for n in knee if cap.max_qps(n) >= (1.0 - MARGINAL) * best)

    def _covering(self, model: str, traffic_qps: float, limit: int) -> int | None:
        """The fewest workers, among those not just seen to fail at this rate, whose derated max load covers it."""
        cap, derate = self.capacity[model], self.derating(model)
        return next((n for n in range(1, limit + 1) if not self._failed_at(model, n, traffic_qps)
                     and derate * cap.max_qps(n) >= traffic_qps), None)

    def derating(self, model: str) -> float:
        """The factor (<= 1) the profiled curve is trusted with: the lowest (rate a count failed at / that count's
        profiled max load) among the failures remembered."""
        cap = self.capacity[model]
        return min([1.0, *(rate / cap.max_qps(n) for n, rate in self._recent_failures(model) if cap.max_qps(n) > 0)])

    def _failed_at(self, model: str, workers: int, traffic_qps: float) -> bool:
        """This many workers, or more, violated the SLA in a failure still remembered, at a rate this one
        is not clearly below (fewer workers than a count that failed would fail too).  "Clearly" is the slack band's
        ``low``: a rate read from one window is noisy, and a count that failed would be chosen again as soon as one
        window read a little less."""
        return any(n >= workers and traffic_qps >= self.low * rate
                   for n, rate in self._recent_failures(model, held=True))

    def _recent_failures(self, model: str, held: bool = False) -> list[tuple[int, float]]:
        """(workers, arrival qps) of the failures still remembered, each for its span (``_span``); ``held``: also
        those past it, up to ``MAX_BACKOFF`` x ``memory_windows``, while the node's loads are as they were then
        (what keeps a count from being tried again; the curve's derating uses the span alone, so an old failure in
        another regime does not hold the whole curve down and leave a missing model at its knee)."""
        cap = MAX_BACKOFF * self.memory_windows
        return [(n, f.rate) for n, f in self._failed.get(model, {}).items()
                if self._steps - f.step < f.span
                or (held and self._steps - f.step < cap and self._unchanged(model, f))]

    def _unchanged(self, model: str, failure: Failure) -> bool:
        """The node's load is as it was at ``failure``: the model's and every neighbour's smoothed arrival rate within
        ``low`` .. 1 / ``low`` x its rate then (a neighbour that left, or came, is a change)."""
        then = {model: failure.rate, **failure.neighbours}
        return set(then) == set(self._rates) and all(
            self.low * rate <= self._rates[m] <= rate / self.low for m, rate in then.items())

    def _observe_rates(self, window: dict[str, WindowStats]) -> None:
        for m, w in window.items():
            before = self._rates.get(m)
            self._rates[m] = w.arrival_qps if before is None else before + RATE_SMOOTHING * (w.arrival_qps - before)
        for m in set(self._rates) - set(window):
            del self._rates[m]

    def _remember(self, model: str, workers: int, stats: WindowStats, slack: float) -> None:
        settled = self._grown_at.get(model, -1) < self._steps - 1  # not grown at the decision before this window
        if slack > self.high and stats.arrival_qps > 0 and settled:
            failed = self._failed.setdefault(model, {})
            neighbours = {o: r for o, r in self._rates.items() if o != model}
            failed[workers] = Failure(stats.arrival_qps, self._steps,
                                      self._span(failed.get(workers), stats.arrival_qps), neighbours)

    def _span(self, before: Failure | None, rate: float) -> int:
        """How many windows a failure at ``rate`` is remembered: ``memory_windows``, doubled (up to ``MAX_BACKOFF``
        x) when the same count failed before at a rate not clearly above this one and its memory lapsed no longer
        ago than it lasted (a retry of a count still too small), kept while that memory still holds."""
        if before is None or rate < self.low * before[0]:
            return self.memory_windows
        step, span = before.step, before.span
        age = self._steps - step
        if age < span:
            return span
        return min(2 * span, MAX_BACKOFF * self.memory_windows) if age < 2 * span else self.memory_windows

    def _set_workers(self, control: NodeControl, model: str, workers: int) -> None:
        if workers > control.get_workers(model):
            self._grown_at[model] = self._steps
        control.set_workers(model, workers)

    def _slack(self, control: NodeControl, model: str, stats: WindowStats) -> float:
        return stats.tail_ms / control.sla(model)[0]

    def _victims(self, control: NodeControl, stats: dict[str, WindowStats], slack: dict[str, float]
                 ) -> dict[str, dict[str, Any]]:
        """The models over their SLA at an arrival rate under ``low`` x their workers' profiled max load while a
        neighbour that runs nearer its own profile is over its SLA too: when co-located models miss together, the
        one further under its profile is starved by the other (cores, cache, memory bandwidth, the host's front
        end) and waits.  A victim keeps its workers and its miss is not remembered against its count; more workers
        of its own would only take more of the node from the model that needs it.  Plain rates, not urgency x rate:
        a window with a failed query reads as infinite slack (urgency 4), which would make a starved model look
        loaded past its workers' profile (docs/decisions/2026-11-28-rmu-sees-client-failures.md)."""
        use = {m: s.arrival_qps / max(self.capacity[m].max_qps(control.get_workers(m)), 1e-9)
               for m, s in stats.items()}
        over = {m for m in stats if slack[m] > self.high}
        return {m: {"slack": slack[m], "arrival_qps": stats[m].arrival_qps, "use_of_profile": use[m],
                    "starved_by": max(over - {m}, key=lambda o: use[o])}
                for m in over if use[m] < self.low and any(use[o] > use[m] for o in over - {m})}

    def step(self, now_s: float, control: NodeControl) -> None:
        self._steps += 1
        changed = False
        models = control.models()
        window = {m: control.window_stats(m) for m in models}
        self._observe_rates(window)
        slacks = {m: self._slack(control, m, window[m]) for m in models}
        victims = self._victims(control, window, slacks)
        for m in models:
            if m in victims:
                self.held.append(Decision(now_s, m, "held (starved by a neighbour)", victims[m]))
                continue
            stats, slack = window[m], slacks[m]
            current = control.get_workers(m)
            self._remember(m, current, stats, slack)
            if self.low <= slack <= self.high:
                continue
            urgency = max(1.0, slack if math.isfinite(slack) else 4.0)
            traffic = urgency * stats.arrival_qps
            others = sum(control.get_workers(o) for o in models if o != m)
            limit = max(1, control.total_cores() - (len(models) - 1)) if others else control.total_cores()
            covering = self._covering(m, traffic, limit)
            want = covering if covering is not None else self._knee(m, traffic, limit, current)
            if slack < self.low:  # slack left: only ever fewer workers (a remembered failure must not grow it)
                want = min(want, current)
            elif covering is not None:  # over the SLA: fewer only as the curve's knee (a rate just under a smaller
                want = max(want, current)  # count's failure must not send the model back to it)
            free = control.total_cores() - others
            if want > free:  # take cores back from over-provisioned neighbours (their slack is large)
                self._reclaim(control, m, want - free, window, slacks)
                free = control.total_cores() - sum(control.get_workers(o) for o in models if o != m)
            want = max(1, min(want, free))
            if want != current:
                self._set_workers(control, m, want)
                changed = True
                self.log.append(Decision(now_s, m, "workers", {"workers": want, "slack": slack,
                                                               "urgency": urgency, "traffic_qps": traffic}))
        if changed:
            self.adjust_llc_partition(now_s, control)

    def _reclaim(self, control: NodeControl, model: str, need: int, window: dict[str, WindowStats],
                 slacks: dict[str, float]) -> None:
        """Up to ``need`` workers back from neighbours with more than this window's load needs."""
        for o in control.models():
            if o == model or need <= 0:
                continue
            have = control.get_workers(o)
            keep = self.find_number_of_workers(o, max(1.0, slacks[o]) * window[o].arrival_qps, have, have)
            give = min(need, have - keep)
            if give > 0:
                self._set_workers(control, o, have - give)
                need -= give

    def adjust_llc_partition(self, now_s: float, control: NodeControl) -> None:
        models = control.models()
        total = control.total_ways()
        best, best_split = -1.0, None
        for split in _compositions(total, len(models)):
            qps = sum(self.capacity[m].qps(control.get_workers(m), w) for m, w in zip(models, split, strict=True))
            if qps > best:
                best, best_split = qps, split
        if best_split is None:
            return
        apply_split(models, list(best_split), control.get_ways, control.set_ways)
        self.log.append(Decision(now_s, "*", "ways", {"split": dict(zip(models, best_split, strict=True)),
                                                      "profiled_qps": best}))


def _compositions(total: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to give ``parts`` models >= 1 way each, summing to ``total`` (small: ways <= ~20)."""
    if parts == 1:
        return [(total,)]
    out = []
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        out.append(tuple(bounds[i + 1] - bounds[i] for i in range(parts)))
    return out


CONTROLLERS = ("hera", "parties", "static")


def make_controller(name: str, capacity: dict[str, CapacityProfile] | None = None) -> Controller:
    if name == "hera":
        if capacity is None:
            raise RecserveError("the Hera RMU needs capacity profiles (maxload_vs_workers per model)")
        return HeraRMU(capacity)
    if name == "parties":
        from recserve.policies.parties import PartiesController

        return PartiesController()
    if name == "static":
        return StaticController()
    raise RecserveError(f"unknown controller {name!r}; known: {', '.join(CONTROLLERS)}")


def violation_fraction(windows: Sequence[dict[str, WindowStats]], sla: dict[str, float]) -> float:
    """Fraction of monitoring windows in which any model's tail latency exceeded its SLA."""
    if not windows:
        return 0.0
    bad = sum(1 for w in windows if any(s.tail_ms > sla[m] for m, s in w.items()))
    return bad / len(windows)
