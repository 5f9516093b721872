"""A model's refusals in the log: queries shed as overloaded (503) or answered past their deadline (504) are
counted per query in ``/metrics``, and summed here into one warning line per period at most, so an operator reading
the log sees that a model is shedding, and how much, without a line per query."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from recserve.serving.node.metrics import ModelMetrics

log = logging.getLogger("recserve.serving")

PERIOD_S = 10.0
CODES = ("unavailable", "deadline")  # 503 (shed, no worker, draining) and 504 (past its deadline)


class OverloadLog:
    """Called on every watchdog tick; writes at most one line per ``period_s``, and only when queries failed."""

    def __init__(self, name: str, metrics: ModelMetrics, period_s: float = PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.metrics = metrics
        self.period_s = period_s
        self.clock = clock
        self._since = clock()
        self._counts = self._now()

    def _now(self) -> tuple[int, int, int]:
        errors = self.metrics.errors
        return errors.get(CODES[0], 0), errors.get(CODES[1], 0), self.metrics.successes

    def tick(self) -> None:
        now = self.clock()
        if now - self._since < self.period_s:
            return
        counts = self._now()
        shed, late, answered = (c - before for c, before in zip(counts, self._counts, strict=True))
        if shed or late:
            log.warning("model %s: in the last %.0f s %d queries were refused with 503 (overloaded or stopping) and "
                        "%d answered 504 (past their deadline); %d were answered with scores", self.name,
                        now - self._since, shed, late, answered)
        self._since, self._counts = now, counts
