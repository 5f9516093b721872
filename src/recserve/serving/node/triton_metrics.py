"""The node's counters under Triton's metric names too (``nv_inference_*``, labelled ``model`` and ``version``),
so that dashboards and alerts written for Triton read a node unchanged.

Triton declares these counters without the ``_total`` suffix that prometheus_client gives every counter's
samples, so they are exported untyped under Triton's exact names: a query by name (``rate()`` too) reads them as it
reads Triton's.  Durations are in microseconds, as Triton's; recserve does not time a pass's input and output
apart from its compute, so only ``nv_inference_compute_infer_duration_us`` is exported of the three.
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
    ("nv_inference_request_failure", "Inference requests that failed or were refused (one per request).",
     lambda m: sum(m.errors.values()) + sum(m.refusals.values())),
    ("nv_inference_count", "Inferences performed: a batch of n items counts n.", lambda m: m.items),
    ("nv_inference_exec_count", "Model executions (passes) performed.", lambda m: m.executions),
    ("nv_inference_request_duration_us", "Cumulative end-to-end request handling time, successes and failures.",
     lambda m: (m.success_d.ns + m.fail_d.ns) * US_PER_NS),
    ("nv_inference_queue_duration_us", "Cumulative time requests waited for a worker.",
     lambda m: m.queue_d.ns * US_PER_NS),
    ("nv_inference_compute_infer_duration_us", "Cumulative time requests spent in model passes.",
     lambda m: m.compute_d.ns * US_PER_NS),
)


def triton_families(models: dict[tuple[str, str], tuple[Any, int, Any]]) -> Iterator[Metric]:
    """Triton's per-model request families for every loaded version (``models``: ``metrics.ModelGauges`` by name
    and version)."""
    for name, help_text, value in COUNTS:
        family = UnknownMetricFamily(name, help_text, labels=LABELS)
        for (model, version), (metrics, _, _) in models.items():
            family.add_metric([model, version], value(metrics))
        yield family
    pending = GaugeMetricFamily("nv_inference_pending_request_count", "Inference requests admitted and not yet "
                                "answered.", labels=LABELS)
    for (model, version), (_, in_flight, _) in models.items():
        pending.add_metric([model, version], in_flight)
    yield pending
