"""A model's 503s and 504s summed into one log line per period (``serving/node/overload_log.py``)."""

from __future__ import annotations

import logging

from recserve.serving.node.metrics import ModelMetrics
from recserve.serving.node.overload_log import OverloadLog


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_refusals_are_summed_into_one_line_per_period(caplog):
    caplog.set_level(logging.WARNING, logger="recserve")
    metrics, clock = ModelMetrics(), Clock()
    report = OverloadLog("rmc1", metrics, period_s=10.0, clock=clock)
    for _ in range(7):
        metrics.error("unavailable")
    metrics.error("deadline")
    metrics.error("invalid")  # the client's fault: not a sign of overload
    metrics.successes += 5
    clock.now += 5.0
    report.tick()
    assert caplog.records == []  # within the period: nothing yet
    clock.now += 5.0
    report.tick()
    assert [r.getMessage() for r in caplog.records] == [
        "model rmc1: in the last 10 s 7 queries were refused with 503 (overloaded or stopping) and 1 answered 504 "
        "(past their deadline); 5 were answered with scores"]
    caplog.clear()
    metrics.successes += 3
    clock.now += 10.0
    report.tick()
    assert caplog.records == []  # a period with no refusal writes nothing
