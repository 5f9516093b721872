"""``configuration -> max load`` from the analytic model: the evaluator Hercules' search is given (``commands/``
assemble it; the search itself never models).  A configuration is anything with ``allocation(base)`` returning
an :class:`~recserve.perfmodel.model.Allocation` (``planners.hercules.search.SchedConfig``)."""

from __future__ import annotations

from typing import Any

from recserve.perfmodel.model import Allocation, LoadResult, PerfModel
from recserve.perfmodel.queueing import SizeMix
from recserve.specs import SLA, ModelSpec, ServerType

SchedConfig = Any  # duck-typed: hashable, with ``allocation(base) -> Allocation``


class PerfModelEvaluator:
    """``config -> max load`` from the analytic model, with an optional power budget (Hercules' constraint)."""

    def __init__(self, spec: ModelSpec, server: ServerType, model: PerfModel | None = None,
                 sizes: SizeMix | Any = None, sla: SLA | None = None, power_budget_w: float | None = None,
                 base: Allocation | None = None) -> None:
        self.spec, self.server = spec, server
        self.model = model or PerfModel()
        self.mix = sizes if isinstance(sizes, SizeMix) else SizeMix.of(sizes)
        self.sla = sla or spec.sla
        self.power_budget_w = power_budget_w
        self.base = base or Allocation()
        self._cache: dict[SchedConfig, LoadResult] = {}

    def detail(self, cfg: SchedConfig) -> LoadResult:
        if cfg not in self._cache:
            self._cache[cfg] = self.model.evaluate(self.spec, self.server, cfg.allocation(self.base), self.mix,
                                                   self.sla, with_latency=False)
        return self._cache[cfg]

    def prefetch(self, configs: list[SchedConfig]) -> None:
        """Evaluate many configurations in one vectorised pass (exhaustive search)."""
        todo = [c for c in configs if c not in self._cache]
        results = self.model.evaluate_many(self.spec, self.server, [c.allocation(self.base) for c in todo],
                                           self.mix, self.sla)
        self._cache.update(zip(todo, results, strict=True))

    def __call__(self, cfg: SchedConfig) -> float | None:
        r = self.detail(cfg)
        if not r.feasible or r.max_qps <= 0:
            return None
        if self.power_budget_w is not None and r.power_w > self.power_budget_w:
            return None
        return r.max_qps


def perfmodel_evaluator(spec: ModelSpec, server: ServerType, model: PerfModel | None = None,
                        sizes: SizeMix | Any = None, sla: SLA | None = None,
                        power_budget_w: float | None = None) -> PerfModelEvaluator:
    return PerfModelEvaluator(spec, server, model, sizes, sla, power_budget_w)
