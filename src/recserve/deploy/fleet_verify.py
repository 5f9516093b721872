"""Verify a deployed FleetPlan: replay its traffic mix against the endpoints, measure each model's SLA
attainment, throughput and (optionally) max load, and set them beside what the plan predicted.

What the plan predicts for a deployment: a model's capacity is the QPS its planned servers carry at its SLA.
``recserve deploy local`` runs each server group as one node server with a share of this host's cores (the plan's
workers x threads per unit, scaled down, at least one worker per model), so the deployment carries the fraction
``deployed workers / (units x planned workers x threads)`` of the planned servers; the prediction for it is the
plan's capacity times that fraction (linear in cores: the same rule deploy local scales by).  A target that is a
plain URL (a router, or servers deployed as planned) is compared with the plan's capacity as it stands.

The traffic mix is each model's peak QPS times the same fraction (the peak share the deployed servers were planned
to carry), times ``load``; every model is driven at once, open loop (``LoadSession``), and its SLA percentile of
latency (failures count as infinitely slow) is held or not.  Max load is found per model with the others idle, by
the profiler's search (``profiler._search``: the unloaded check, then ``maxload.find_max_load``) and confirmed
(``maxload.confirm_max_load``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from recserve.deploy.local_fleet import served_name
from recserve.errors import RecserveError
from recserve.planners.fleet import FleetPlan
from recserve.specs import SLA, get_model


@dataclass
class Deployed:
    """One model as deployed: where it answers and the share of its planned servers it runs on."""

    model: str
    urls: list[str]
    scale: float
    fraction: float         # deployed / planned worker cores (1.0 when unknown)
    basis: str              # how the fraction was found
    served: str = ""        # the name the node serves it under (a repository path is served as its directory's name)
    workers: int = 1


def _planned_worker_cores(plan: FleetPlan, model: str) -> float:
    total = 0.0
    for g in plan.groups:
        if model in g.qps and g.kind in ("single", "pair"):
            a = g.alloc.get(model, {})
            total += g.count * a.get("workers", 1) * a.get("threads", 1)
    return total


def load_targets(plan: FleetPlan, target: str, scale: float | None = None) -> dict[str, Deployed]:
    """Each planned model's endpoints: ``target`` is one base URL serving every model, or the ``endpoints.json`` that
    ``recserve deploy local`` writes (then its ``node*.yaml`` beside it give the deployed workers and table scale)."""
    models = list(plan.models)
    if target.startswith(("http://", "https://")):
        return {m: Deployed(m, [target.rstrip("/")], scale if scale is not None else 1e-3, 1.0,
                            "a URL: compared with the plan's capacity as planned", served_name(m)) for m in models}
    path = Path(target)
    if not path.is_file():
        raise RecserveError(f"--target: {target!r} is neither an http:// URL nor an endpoints.json file")
    try:
        endpoints = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecserveError(f"{target}: not a JSON endpoints file ({exc})") from None
    if not isinstance(endpoints, dict) or not all(isinstance(v, list) for v in endpoints.values()):
        raise RecserveError(f"{target}: expected {{model: [url, ...]}} as `recserve deploy local` writes")
    missing = [m for m in models if m not in endpoints]
    if missing:
        raise RecserveError(f"{target}: no endpoint for planned model {missing[0]!r} (deployed: "
                            f"{', '.join(endpoints) or 'none'})")
    workers: dict[str, int] = {}
    scales: dict[str, float] = {}
    served: dict[str, str] = {}
    for node in sorted(path.parent.glob("node*.yaml")):
        cfg = yaml.safe_load(node.read_text()) or {}
        for m in cfg.get("models", []):
            key = m.get("model", m["name"])
            workers[key] = workers.get(key, 0) + int(m.get("workers", 1))
            scales[key] = float(m.get("scale", 1e-3))
            served[key] = m["name"]
    out = {}
    for m in models:
        planned = _planned_worker_cores(plan, m)
        if m in workers and planned > 0:
            fraction = min(1.0, workers[m] / planned)
            basis = f"{workers[m]} deployed worker(s) of {planned:g} planned worker cores"
        else:
            fraction, basis = 1.0, "no node config beside the endpoints: compared with the plan as planned"
        out[m] = Deployed(m, [str(u).rstrip("/") for u in endpoints[m]],
                          scale if scale is not None else scales.get(m, 1e-3), fraction, basis,
                          served.get(m, served_name(m)), workers.get(m, 1))
    return out


@dataclass
class ModelCheck:
    model: str
    sla: SLA
    peak_qps: float
    planned_capacity_qps: float
    predicted_qps: float          # the plan's capacity for what is deployed
    offered_qps: float = 0.0
    achieved_qps: float = 0.0
    latency_ms: float = math.inf  # at the SLA percentile, failures as infinite
    p50_ms: float = math.inf
    within_sla: float = 0.0       # share of queries answered within the SLA target
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    max_load_qps: float | None = None
    max_load_reason: str = ""
    max_load_probes: list[dict[str, Any]] = field(default_factory=list)   # rate, latency at pct, ok
    basis: str = ""

    @property
    def sla_held(self) -> bool:
        return self.latency_ms <= self.sla.target_ms

    @property
    def max_load_error(self) -> float | None:
        """(measured - predicted) / predicted max load."""
        if self.max_load_qps is None or self.predicted_qps <= 0:
            return None
        return self.max_load_qps / self.predicted_qps - 1.0

    def to_dict(self) -> dict[str, Any]:
        def fin(x: float | None) -> float | None:
            return x if x is None or math.isfinite(x) else None

        return {"model": self.model, "sla_ms": self.sla.target_ms, "percentile": self.sla.percentile,
                "peak_qps": self.peak_qps, "planned_capacity_qps": self.planned_capacity_qps,
                "predicted_qps": self.predicted_qps, "offered_qps": self.offered_qps,
                "achieved_qps": self.achieved_qps, "latency_ms": fin(self.latency_ms), "p50_ms": fin(self.p50_ms),
                "within_sla": self.within_sla, "sla_held": self.sla_held, "ok": self.ok, "errors": self.errors,
                "max_load_qps": self.max_load_qps, "max_load_reason": self.max_load_reason,
                "max_load_error": self.max_load_error, "max_load_probes": self.max_load_probes, "basis": self.basis}


class RoundRobin:
    """One model's endpoints on several node servers as one load-generator target: query k goes to endpoint k mod n
    (what a router in front of them would do, by count)."""

    def __init__(self, targets: list[Any]) -> None:
        self.targets = targets
        self.name = " | ".join(t.name for t in targets)
        self._next = 0

    async def prepare(self, pool: Any) -> None:
        for t in self.targets:
            await t.prepare(pool)

    async def infer(self, i: int) -> None:
        target = self.targets[self._next % len(self.targets)]
        self._next += 1
        await target.infer(i)

    async def close(self) -> None:
        for t in self.targets:
            await t.close()


def _session(model: str, dep: Deployed, pool_size: int, seed: int, timeout_s: float) -> Any:
    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import make_target

    spec = get_model(model)
    pool = RequestPool.from_mix(spec, dep.scale, pool=pool_size, seed=seed)
    targets = [make_target(u, dep.served or model, timeout_s=timeout_s) for u in dep.urls]
    return LoadSession(targets[0] if len(targets) == 1 else RoundRobin(targets), pool, warm=True)


def replay_mix(plan: FleetPlan, deployed: dict[str, Deployed], load: float = 1.0, seconds: float = 10.0,
               seed: int = 0, pool_size: int = 32, log: Callable[[str], None] | None = None) -> dict[str, ModelCheck]:
    """Every model driven at once at ``load`` x its peak share for ``seconds``; one ModelCheck per model."""
    checks: dict[str, ModelCheck] = {}
    sessions = {}
    try:
        for m, v in plan.models.items():
            dep = deployed[m]
            sla = SLA(float(v["sla_ms"]), float(v["percentile"]))
            checks[m] = ModelCheck(m, sla, float(v["peak_qps"]), float(v["capacity_qps"]),
                                   float(v["capacity_qps"]) * dep.fraction,
                                   offered_qps=load * float(v["peak_qps"]) * dep.fraction, basis=dep.basis)
            timeout_s = max(2.0, 10 * sla.target_ms / 1000.0)
            sessions[m] = _session(m, dep, pool_size, seed, timeout_s)
        if log:
            log("replaying the planned mix for " + f"{seconds:g} s: " + ", ".join(
                f"{m} {c.offered_qps:.1f} qps" for m, c in checks.items()))

        def one(m: str) -> Any:
            sla = checks[m].sla
            return sessions[m].run(checks[m].offered_qps, seconds, seed=seed, warmup_s=min(1.0, seconds / 5),
                                   timeout_s=max(2.0, 10 * sla.target_ms / 1000.0), min_requests=20)

        with ThreadPoolExecutor(len(sessions)) as ex:
            results = dict(zip(sessions, ex.map(one, sessions), strict=True))
        for m, r in results.items():
            c = checks[m]
            c.achieved_qps, c.ok, c.errors = r.achieved_qps, r.ok, dict(r.errors)
            c.latency_ms, c.p50_ms = r.percentile(c.sla.percentile), r.p50
            total = r.ok + r.failed
            c.within_sla = float((r.latencies_ms <= c.sla.target_ms).sum()) / total if total else 0.0
    finally:
        for s in sessions.values():
            s.close()
    return checks


def measure_max_loads(checks: dict[str, ModelCheck], deployed: dict[str, Deployed], probe_s: float = 3.0,
                      max_probes: int = 10, rtol: float = 0.1, seed: int = 100, pool_size: int = 32,
                      repeats: int = 1, log: Callable[[str], None] | None = None) -> None:
    """Each model's max load at its SLA, one model at a time (the others idle), into ``checks``: the median of
    ``repeats`` searches (each with its own arrivals), so one unlucky search on a busy host does not set it."""
    import numpy as np

    from recserve.measure.maxload import confirm_max_load
    from recserve.measure.profiler import Budget, _probe_fn, _search

    budget = Budget(False, 0, 0.0, 0, 0, 0.0, probe_s, 50, max_probes, rtol)
    for m, c in checks.items():
        if log:
            log(f"max load of {m} (SLA {c.sla.target_ms:g} ms p{c.sla.percentile:g}; predicted {c.predicted_qps:.1f}"
                " qps)")
        found = []
        with _session(m, deployed[m], pool_size, seed, max(2.0, 10 * c.sla.target_ms / 1000.0)) as session:
            for r in range(repeats):
                # the first probe at half the lower of the prediction and what the deployed workers serve one query
                # at a time: a prediction far too high would otherwise flood the node and leave a backlog behind
                unloaded = session.unloaded_latency_ms()
                ms = float(np.median(unloaded[np.isfinite(unloaded)])) if np.isfinite(unloaded).any() else 1000.0
                serial = deployed[m].workers * 1000.0 / max(ms, 1e-3)
                start = max(0.5, 0.5 * min(c.predicted_qps, serial) if c.predicted_qps > 0 else 0.5 * serial)
                s0 = seed + 1000 * r
                result, _ = _search(session, budget, c.sla, start, s0)
                result = confirm_max_load(_probe_fn(session, budget, c.sla.target_ms, s0 + 500), result)
                found.append(result)
                c.max_load_probes += [{"search": r, "rate": p.rate, "ok": p.ok,
                                       "latency_ms": p.latency_ms if math.isfinite(p.latency_ms) else None}
                                      for p in result.probes]
                if log:
                    log(f"  {m}: {result.max_qps:.1f} qps ({result.reason}; probes "
                        + ", ".join(f"{p.rate:.1f}{'' if p.ok else '!'}" for p in result.probes)
                        + ", ! = SLA missed)")
        rates = sorted(f.max_qps for f in found)
        c.max_load_qps = float(np.median(rates))
        c.max_load_reason = "; ".join(f.reason for f in found) + (f" (median of {repeats}: "
                                                                  + ", ".join(f"{x:.1f}" for x in rates) + ")"
                                                                  if repeats > 1 else "")


def verify_table(checks: dict[str, ModelCheck], load: float) -> str:
    from recserve.planners.plan import format_table

    def ms(x: float) -> str:
        return f"{x:.1f}" if math.isfinite(x) else "inf"

    rows = []
    for m, c in checks.items():
        err = c.max_load_error
        rows.append([m, f"{c.sla.target_ms:g} ms p{c.sla.percentile:g}", f"{c.offered_qps:.1f}",
                     f"{c.achieved_qps:.1f}", ms(c.latency_ms), f"{100 * c.within_sla:.1f}%",
                     sum(c.errors.values()), "yes" if c.sla_held else "NO", f"{c.predicted_qps:.1f}",
                     "-" if c.max_load_qps is None else f"{c.max_load_qps:.1f}",
                     "-" if err is None else f"{100 * err:+.0f}%"])
    head = ["model", "SLA", f"offered ({load:g} x peak share)", "achieved", "latency at pct", "within SLA", "errors",
            "SLA held", "plan capacity", "measured max load", "rel. error"]
    return format_table(head, rows)
