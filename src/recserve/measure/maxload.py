"""Max load (latency-bounded QPS): the highest Poisson rate whose SLA percentile stays under target.

Hera §V-B: "start from a low arrival rate and gradually inject higher rates until the observed
(95th percentile) tail latency starts violating the SLA".  Here the rate doubles (``growth``) from
``start_qps`` until a probe violates the SLA, then the bracket [last ok, first violating] is
bisected until it is narrower than ``rtol`` × its upper end (or ``atol`` qps).  If the start rate
already violates, the rate halves until one passes.

The search is a pure function over an injected ``rate → latency`` callable, so the same code runs
against a live server, the in-process baseline, a queueing formula or the simulator.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from recserve.errors import RecserveError


@dataclass
class Probe:
    rate: float
    latency_ms: float
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class MaxLoadResult:
    max_qps: float
    sla_ms: float
    percentile: float
    probes: list[Probe]
    bracket: tuple[float, float]
    converged: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bracket"] = [b if math.isfinite(b) else None for b in self.bracket]  # strict JSON: no Infinity
        data["probes"] = [
            {**asdict(p), "latency_ms": p.latency_ms if math.isfinite(p.latency_ms) else None} for p in self.probes
        ]
        return data


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during a search: ``result`` holds the probes completed before it (its max load a lower
    bound), ``signal`` the interrupt itself, to raise again once the result is saved."""

    def __init__(self, result: MaxLoadResult, signal: KeyboardInterrupt) -> None:
        super().__init__()
        self.result, self.signal = result, signal


def interrupted_result(probes: list[Probe], sla_ms: float, percentile: float) -> MaxLoadResult:
    """The search so far: the highest passing rate below the lowest violating one, a lower bound on the max load."""
    hi = min((p.rate for p in probes if not p.ok), default=math.inf)
    lo = max((p.rate for p in probes if p.ok and p.rate < hi), default=0.0)
    return MaxLoadResult(lo, sla_ms, percentile, list(probes), (lo, hi), False,
                         f"interrupted after {len(probes)} probe(s): max load >= {lo:.2f} qps")


def unloaded_miss(unloaded_ms: Any, sla_ms: float, percentile: float) -> MaxLoadResult | None:
    """Max load 0 when queries sent one at a time (``unloaded_ms``, ms each) already miss the SLA percentile: no
    rate can meet it, and halving the rate probe after probe would only take minutes to say so.  None otherwise."""
    import numpy as np

    unloaded = np.asarray(unloaded_ms, dtype=float)
    floor = float(np.percentile(unloaded, percentile, method="higher")) if unloaded.size else math.inf
    if floor <= sla_ms:
        return None
    probe = Probe(0.0, floor, False, {"unloaded_latency_ms": [x if math.isfinite(x) else None for x in
                                                              map(float, unloaded)]})
    return MaxLoadResult(0.0, sla_ms, percentile, [probe], (0.0, 0.0), True,
                         f"unloaded p{percentile:g} {floor:.1f} ms misses the SLA")


def _failures(detail: dict[str, Any]) -> str:
    """A probe's failed queries for its log line: how many of each kind, and the server's most frequent refusal."""
    errors = detail.get("errors") or {}
    if not errors:
        return ""
    text = "; failed: " + ", ".join(f"{count} {kind}" for kind, count in errors.items())
    reasons = detail.get("refusal_reasons") or {}
    if reasons:
        reason, count = max(reasons.items(), key=lambda item: item[1])
        text += f" (most often, {count}x: {reason})"
    return text


def _latency_of(outcome: Any, percentile: float) -> tuple[float, dict[str, Any]]:
    """A probe's outcome is either the percentile latency (ms) or an object with ``percentile(p)``; a load run's
    detail also keeps the percentile of its answered queries alone (``answered_pctl_ms``)."""
    if hasattr(outcome, "percentile"):
        detail = outcome.to_dict() if hasattr(outcome, "to_dict") else {}
        if hasattr(outcome, "latencies_ms"):
            answered = float(outcome.percentile(percentile, failures_as_inf=False))
            detail["answered_pctl_ms"] = answered if math.isfinite(answered) else None
        return float(outcome.percentile(percentile)), detail
    return float(outcome), {}


REFUSAL_KINDS = ("http_503", "http_504", "http_429", "grpc_UNAVAILABLE", "grpc_DEADLINE_EXCEEDED",
                 "grpc_RESOURCE_EXHAUSTED")
"""Failures that are the server shedding a query (overloaded, past its own deadline), not a client failure."""


def refusal_bound(result: MaxLoadResult) -> str:
    """Why the SLA broke when the server's refusals, not latency, did it: every violating probe's answered queries
    met the SLA and the server refused some (a node whose deadline_ms is under the SLA sheds queries the SLA would
    still count as met).  Empty when latency bounded the search or it cannot tell."""
    violating = [p for p in result.probes if not p.ok and p.rate > 0]
    if not violating:
        return ""
    for p in violating:
        answered = p.detail.get("answered_pctl_ms")
        refused = sum((p.detail.get("errors") or {}).get(kind, 0) for kind in REFUSAL_KINDS)
        if answered is None or answered > result.sla_ms or refused == 0:
            return ""
    reasons: dict[str, int] = {}
    for p in violating:
        for reason, n in (p.detail.get("refusal_reasons") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + n
    top = max(reasons, key=lambda r: reasons[r]) if reasons else ""
    return ("bounded by the server's refusals, not by latency: the queries it answered met the SLA"
            + (f" (most often: {top})" if top else "")
            + "; a node sheds at its deadline_ms (default 2 x the model's SLA): raise it in the node's config, "
              "or give --sla-ms under it")


def _probe(run_at: Callable[[float], Any], rate: float, sla_ms: float, percentile: float) -> Probe:
    """One probe at ``rate``: its ``percentile`` latency against ``sla_ms``."""
    latency, detail = _latency_of(run_at(rate), percentile)
    return Probe(rate, latency, latency <= sla_ms, detail)


def find_max_load(
    run_at: Callable[[float], Any],
    sla_ms: float,
    percentile: float = 95.0,
    start_qps: float = 10.0,
    growth: float = 2.0,
    rtol: float = 0.05,
    atol: float = 0.0,
    max_qps: float = 1e6,
    min_qps: float = 1e-3,
    max_probes: int = 40,
    log: Callable[[str], None] | None = None,
) -> MaxLoadResult:
    """Largest rate at which ``run_at(rate)``'s ``percentile`` latency is ≤ ``sla_ms``.

    ``run_at`` returns either a latency in ms or a :class:`~recserve.measure.loadgen.LoadResult`
    (failures count as infinitely slow).  ``max_qps`` 0 is never returned unless even ``min_qps``
    violates, in which case the result is 0 with ``reason="start violates"``.
    """
    if sla_ms <= 0 or start_qps <= 0 or growth <= 1 or rtol < 0 or atol < 0:
        raise RecserveError("max-load search needs sla_ms > 0, start_qps > 0, growth > 1 and tolerances >= 0")
    search = _Search(run_at, sla_ms, percentile, max_probes, log)
    rate = min(start_qps, max_qps)
    # 1. grow until the SLA breaks (or shrink until it holds)
    bracket = (search.grow(rate, growth, max_qps) if search.probe(rate)
               else search.shrink(rate, growth, min_qps))
    if isinstance(bracket, MaxLoadResult):
        return bracket
    # 2. bisect the bracket
    return search.bisect(*bracket, rtol, atol)


@dataclass
class _Search:
    """A max-load search's probes so far, and what each needs: ``run_at``, the SLA, the probe budget, the log."""

    run_at: Callable[[float], Any]
    sla_ms: float
    percentile: float
    max_probes: int
    log: Callable[[str], None] | None
    probes: list[Probe] = field(default_factory=list)

    def probe(self, rate: float) -> bool:
        """One probe at ``rate``, kept and logged: whether it met the SLA.  Interrupted, the search so far is
        raised with the interrupt (``SearchInterrupted``)."""
        try:
            p = _probe(self.run_at, rate, self.sla_ms, self.percentile)
        except KeyboardInterrupt as exc:
            raise SearchInterrupted(interrupted_result(self.probes, self.sla_ms, self.percentile),
                                    getattr(exc, "signal", exc)) from exc
        self.probes.append(p)
        if self.log:
            self.log(f"  {rate:10.2f} qps: p{self.percentile:g} {p.latency_ms:9.2f} ms "
                     f"{'ok' if p.ok else 'VIOLATES'} SLA {self.sla_ms:g} ms{_failures(p.detail)}")
        return p.ok

    def result(self, max_qps: float, bracket: tuple[float, float], converged: bool, reason: str) -> MaxLoadResult:
        return MaxLoadResult(max_qps, self.sla_ms, self.percentile, self.probes, bracket, converged, reason)

    def grow(self, lo: float, growth: float, max_qps: float) -> tuple[float, float] | MaxLoadResult:
        """From a passing rate ``lo``, times ``growth`` until a probe violates: the bracket [last ok, first
        violating], or the result where ``max_qps`` or the probe budget came first."""
        hi = math.inf
        while len(self.probes) < self.max_probes and lo < max_qps:
            rate = min(lo * growth, max_qps)
            if self.probe(rate):
                lo = rate
            else:
                hi = rate
                break
        if math.isinf(hi):
            reason = "reached max_qps" if lo >= max_qps else "probe budget spent while growing"
            return self.result(lo, (lo, hi), lo >= max_qps, reason)
        return lo, hi

    def shrink(self, hi: float, growth: float, min_qps: float) -> tuple[float, float] | MaxLoadResult:
        """From a violating rate ``hi``, divided by ``growth`` until a probe passes: the bracket, or max load 0
        where the rate fell under ``min_qps`` or the probe budget was spent first."""
        lo = 0.0
        while len(self.probes) < self.max_probes:
            rate = hi / growth
            if rate < min_qps:
                return self.result(0.0, (0.0, hi), True, "start violates")
            if self.probe(rate):
                lo = rate
                break
            hi = rate
        if lo == 0.0:
            return self.result(0.0, (0.0, hi), False, "probe budget spent")
        return lo, hi

    def bisect(self, lo: float, hi: float, rtol: float, atol: float) -> MaxLoadResult:
        """The bracket halved until narrower than ``rtol`` x its upper end (or ``atol``), or the budget is spent."""
        while hi - lo > max(rtol * hi, atol) and len(self.probes) < self.max_probes:
            mid = 0.5 * (lo + hi)
            if self.probe(mid):
                lo = mid
            else:
                hi = mid
        converged = hi - lo <= max(rtol * hi, atol)
        return self.result(lo, (lo, hi), converged, "bisected" if converged else "probe budget spent while bisecting")


def confirm_max_load(run_at: Callable[[float], Any], result: MaxLoadResult, step: float = 0.1, tries: int = 3
                     ) -> MaxLoadResult:
    """``result`` probed again at its max load with ``run_at``'s next arrivals; each violation steps the rate down by
    ``step`` (of the found max) and probes again, up to ``tries`` probes.  The first rate that passes twice (in the
    search and here, or here after a step down) is the max load; none passing gives the highest rate that held in the
    search below the rates tried here (0 if none did), marked unconverged.

    Why: the search keeps the highest rate that passed once, so on a noisy host it picks the luckiest probe near the
    knee (docs/decisions/2026-11-28-demo-live-load-sized-live.md)."""
    if result.max_qps <= 0 or tries < 1:
        return result
    probes = list(result.probes)
    rate = result.max_qps
    for k in range(tries):
        rate = result.max_qps * (1.0 - step * k)
        if rate <= 0:
            break
        probes.append(p := _probe(run_at, rate, result.sla_ms, result.percentile))
        p.detail["confirm"] = True
        if p.ok:
            return MaxLoadResult(rate, result.sla_ms, result.percentile, probes, (rate, result.bracket[1]),
                                 result.converged, f"{result.reason}, confirmed" + (f" {k} step(s) down" if k else ""))
    held = max((p.rate for p in probes if p.ok and p.rate < rate), default=0.0)  # the best rate that held
    return MaxLoadResult(held, result.sla_ms, result.percentile, probes, (0.0, result.max_qps), False,
                         f"{result.reason}, not confirmed in {tries} probes: {held:.1f} qps, the highest that held "
                         "below them")


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def mm1_percentile_ms(service_rate: float, percentile: float = 95.0) -> Callable[[float], float]:
    """Sojourn-time percentile of an M/M/1 queue (``-ln(1-p)/(μ-λ)``): a known answer for tests and
    a sanity model; infinite at or above saturation."""

    def latency(rate: float) -> float:
        if rate >= service_rate:
            return math.inf
        return -math.log(1 - percentile / 100.0) / (service_rate - rate) * 1000.0

    return latency


def mm1_max_load(service_rate: float, sla_ms: float, percentile: float = 95.0) -> float:
    """The exact threshold of :func:`mm1_percentile_ms`: ``μ + ln(1-p)/SLA``."""
    return max(0.0, service_rate + math.log(1 - percentile / 100.0) / (sla_ms / 1000.0))
