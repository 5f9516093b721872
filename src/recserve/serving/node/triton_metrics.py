"""The node's counters under Triton's metric names too (``nv_inference_*``, labelled ``model`` and ``version``),
so that dashboards and alerts written for Triton read a node unchanged.

Triton declares these counters without the ``_total`` suffix that prometheus_client gives every counter's
samples, so they are exported untyped under Triton's exact names: a query by name (``rate()`` too) reads them as it
reads Triton's.  They mean what Triton's mean (its ``InferenceStatsAggregator``): durations in microseconds, summed
over successful requests only (``request_duration / request_success`` is the mean latency), and failures labelled
with Triton's ``reason`` (``REJECTED``, ``CANCELED``, ``BACKEND``, ``OTHER``).  recserve does not time a pass's
input and output apart from its compute, so only ``nv_inference_compute_infer_duration_us`` is exported of the
three.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily

LABELS = ["model", "version"]
US_PER_NS = 1e-3

COUNTS: tuple[tuple[str, str, Callable[[Any], float]], ...] = (  # of a ``metrics.ModelMetrics``
    ("nv_inference_request_success", "Inference requests answered with scores (one per request, whatever its batch).",
     lambda m: m.successes),
    ("nv_inference_count", "Inferences performed: a batch of n items counts n.", lambda m: m.items),
    ("nv_inference_exec_count", "Model executions (passes) performed.", lambda m: m.executions),
    ("nv_inference_request_duration_us", "Cumulative end-to-end handling time of successful requests.",
     lambda m: m.success_d.ns * US_PER_NS),
    ("nv_inference_queue_duration_us", "Cumulative time successful requests waited for a worker.",
     lambda m: m.queue_d.ns * US_PER_NS),
    ("nv_inference_compute_infer_duration_us", "Cumulative time successful requests spent in model passes.",
     lambda m: m.compute_d.ns * US_PER_NS),
)

# Triton's failure reasons, of recserve's error and refusal codes (``wire/errors.STATUS``, the transports' reasons)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
REASON_OF = {"unavailable": "REJECTED", "deadline": "REJECTED", "too_many_connections": "REJECTED",
             "client_gone": "CANCELED", "internal": "BACKEND", "data_loss": "BACKEND"}


def failures_by_reason(metrics: Any) -> dict[str, int]:
    """A model's failed and refused requests (``metrics.ModelMetrics``) by Triton's reason, every reason present."""
    counts = dict.fromkeys(FAILURE_REASONS, 0)
    for by_code in (metrics.errors, metrics.refusals):
        for code, count in by_code.items():
            counts[REASON_OF.get(code, "OTHER")] += count
    return counts


def triton_families(models: dict[tuple[str, str], tuple[Any, int, Any]]) -> Iterator[Metric]:
    """Triton's per-model request families for every loaded version (``models``: ``metrics.ModelGauges`` by name
    and version)."""
    for name, help_text, value in COUNTS:
        family = UnknownMetricFamily(name, help_text, labels=LABELS)
        for (model, version), (metrics, _, _) in models.items():
            family.add_metric([model, version], value(metrics))
        yield family
    failures = UnknownMetricFamily("nv_inference_request_failure", "Inference requests that failed or were refused "
                                   "(one per request), by Triton's reason.", labels=[*LABELS, "reason"])
    for (model, version), (metrics, _, _) in models.items():
        for reason, count in failures_by_reason(metrics).items():
            failures.add_metric([model, version, reason], count)
    yield failures
    pending = GaugeMetricFamily("nv_inference_pending_request_count", "Inference requests admitted and not yet "
                                "answered.", labels=LABELS)
    for (model, version), (_, in_flight, _) in models.items():
        pending.add_metric([model, version], in_flight)
    yield pending
