"""``configuration -> max load`` measured on this host: the live evaluator Hercules' search is given (``commands/``
assemble it; the search itself never measures).  A configuration is anything with ``mode``, ``threads``,
``cores_per_thread``, ``batch``, ``sparse_threads`` and ``label()`` (``planners.hercules.search.SchedConfig``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recserve.specs import SLA, ModelSpec, ServerType

SchedConfig = Any  # duck-typed, see the module docstring


class LiveEvaluator:
    """``config -> max load`` measured on this host: a node server per configuration, open-loop Poisson
    load from the production-like mix, and the latency-bounded throughput search of ``recserve bench``."""

    def __init__(self, spec: ModelSpec, server: ServerType, sla: SLA | None = None, scale: float = 1e-3,
                 duration_s: float = 3.0, sizes: str = "production", start_qps: float = 20.0,
                 log: Callable[[str], None] | None = None) -> None:
        from recserve.errors import RecserveError

        if server.name != "this-host":
            raise RecserveError(f"--live measures this host only (server 'this-host'), not {server.name!r}")
        self.spec, self.server, self.sla = spec, server, sla or spec.sla
        self.scale, self.duration_s, self.sizes, self.start_qps, self.log = scale, duration_s, sizes, start_qps, log
        self._measured: dict[SchedConfig, float | None] = {}

    def __call__(self, cfg: SchedConfig) -> float | None:
        """Measured once per configuration; the baselines reuse the measurement."""
        if cfg not in self._measured:
            self._measured[cfg] = self.measure(cfg)
        return self._measured[cfg]

    @property
    def measured(self) -> dict[SchedConfig, float | None]:
        """Every configuration measured so far and its max load (None: SLA unmet or does not fit)."""
        return dict(self._measured)

    def measure(self, cfg: SchedConfig) -> float | None:
        """A fresh measurement (not memoised): a new server, a new max-load search."""
        from recserve.errors import SpecError
        from recserve.measure.loadgen import LoadSession
        from recserve.measure.maxload import find_max_load
        from recserve.measure.requests import RequestPool
        from recserve.measure.served import LocalServer

        options: dict[str, Any] = {"threads": cfg.cores_per_thread, "sub_batch": cfg.batch, "mode": cfg.mode}
        if cfg.mode == "pipeline":
            options["sparse_workers"] = cfg.sparse_threads
        if self.log:
            self.log(f"[live] {cfg.label()}")
        try:
            server = LocalServer(self.spec.name, self.scale, workers=cfg.threads, **options)
        except SpecError as exc:  # e.g. more cores than this host has
            if self.log:
                self.log(f"[live] infeasible: {exc}")
            return None
        pool = RequestPool.from_mix(self.spec, self.scale, self.sizes, pool=32, seed=0, index="uniform")
        seeds = iter(range(10_000))
        with server, LoadSession(server.target("http"), pool, warm=True) as session:
            result = find_max_load(
                lambda rate: session.run(rate, self.duration_s, seed=next(seeds), min_requests=30),
                self.sla.target_ms, self.sla.percentile, start_qps=self.start_qps, rtol=0.1, max_probes=12,
                log=self.log)
        return result.max_qps if result.max_qps > 0 else None


def live_evaluator(spec: ModelSpec, server: ServerType, sla: SLA | None = None, **kwargs: Any) -> LiveEvaluator:
    """Measure each configuration through the node server on this host (slow: seconds per configuration)."""
    return LiveEvaluator(spec, server, sla, **kwargs)
