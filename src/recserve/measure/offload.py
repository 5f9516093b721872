"""DeepRecSys' offload threshold, found by measurement on a live node.

A node whose model has accelerator workers sends queries of at least ``min_items`` items to them.  The best
threshold depends on the model, the host and the query mix (on an H100 host hera-dlrm-a's best was 1, everything to
the GPU, because forwarding a query costs a CPU worker less than computing it), so it is searched, not assumed:
the max load at the SLA with each candidate threshold, set through the control API, and the best one left set.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from recserve.measure.maxload import MaxLoadResult

SETTLE_S = 0.2  # the control API answers once the threshold is sent to the workers, not once their loops read it


@dataclass(frozen=True)
class ThresholdResult:
    min_items: int
    search: MaxLoadResult

    @property
    def tail_at_max_ms(self) -> float:
        """The SLA percentile at the highest passing probe (inf when none passed)."""
        passing = [p.latency_ms for p in self.search.probes if p.ok and p.rate == self.search.max_qps]
        return min(passing, default=float("inf"))

    def to_dict(self) -> dict[str, Any]:
        return {"min_items": self.min_items, "max_qps": self.search.max_qps, "search": self.search.to_dict()}


def best_threshold(results: Sequence[ThresholdResult]) -> ThresholdResult:
    """The highest max load; between equal ones, the lower tail latency there."""
    if not results:
        raise ValueError("no thresholds were measured")
    return max(results, key=lambda r: (r.search.max_qps, -r.tail_at_max_ms))


def tune_offload(set_threshold: Callable[[int], Any], search: Callable[[int], MaxLoadResult],
                 thresholds: Sequence[int], log: Callable[[str], None] = lambda _m: None
                 ) -> tuple[ThresholdResult, list[ThresholdResult]]:
    """Measure ``search(k)`` (a max-load search) with each threshold ``k`` set, then leave the best one set."""
    results = []
    for k in thresholds:
        set_threshold(k)
        time.sleep(SETTLE_S)
        results.append(ThresholdResult(k, search(k)))
        log(f"min_items {k}: max load {results[-1].search.max_qps:.2f} qps")
    best = best_threshold(results)
    set_threshold(best.min_items)
    return best, results
