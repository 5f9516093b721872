"""Per-model counters and latency histograms, exported as Prometheus text (prometheus_client) and as Triton
statistics.

Everything is updated on the supervisor's event-loop thread from the workers' reports, so no locking is needed;
a scrape reads the same counters through :class:`NodeCollector`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from recserve.serving.node.triton_metrics import triton_families

BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
RATE_WINDOW_S = 10.0
HISTORY_S = 60.0  # longest window the control API can report


class SlidingWindow:
    """Timestamped values over the last ``horizon_s`` seconds: the one place rates and tail latencies over a
    recent window are computed (node-server control API, Ray Serve autoscaling stats)."""

    def __init__(self, horizon_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.horizon_s = float(horizon_s)
        self.clock = clock
        self.events: deque[tuple[float, float]] = deque()

    def add(self, value: float = 1.0, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self.events.append((now, value))
        self.trim(now)

    def trim(self, now: float) -> None:
        while self.events and self.events[0][0] < now - self.horizon_s:
            self.events.popleft()

    def values(self, seconds: float | None = None, now: float | None = None) -> list[float]:
        now = self.clock() if now is None else now
        self.trim(now)
        since = now - (self.horizon_s if seconds is None else seconds)
        return [v for t, v in self.events if t >= since]

    def rate(self, seconds: float | None = None, now: float | None = None) -> float:
        """Events per second over the last ``seconds`` (default: the horizon)."""
        seconds = self.horizon_s if seconds is None else seconds
        return len(self.values(seconds, now)) / seconds

    def total_rate(self, seconds: float | None = None, now: float | None = None) -> float:
        """Sum of values per second (e.g. items scored per second)."""
        seconds = self.horizon_s if seconds is None else seconds
        return sum(self.values(seconds, now)) / seconds

    def tail(self, percentile: float, seconds: float | None = None, now: float | None = None) -> float:
        """The ``percentile`` of the values in the window (0 when empty)."""
        recent = self.values(seconds, now)
        return float(np.percentile(recent, percentile)) if recent else 0.0



@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS_S))
    total: int = 0
    sum_s: float = 0.0

    def observe(self, seconds: float) -> None:
        self.total += 1
        self.sum_s += seconds
        for i, edge in enumerate(BUCKETS_S):
            if seconds <= edge:
                self.counts[i] += 1
                break

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound (``le``), ending with ``+Inf``: the total."""
        cumulative = list(itertools.accumulate(self.counts))
        bounded = [(f"{edge:g}", count) for edge, count in zip(BUCKETS_S, cumulative, strict=True)]
        return [*bounded, ("+Inf", self.total)]


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class ModelMetrics:
    """What one served model has done since the server started."""

    requests: int = 0
    successes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)  # requests not readable as queries, by reason
    items: int = 0
    executions: int = 0
    worker_restarts: int = 0
    last_inference_ms: int = 0
    e2e: Histogram = field(default_factory=Histogram)
    queue: Histogram = field(default_factory=Histogram)
    compute: Histogram = field(default_factory=Histogram)
    success_d: Duration = field(default_factory=Duration)
    fail_d: Duration = field(default_factory=Duration)
    queue_d: Duration = field(default_factory=Duration)
    compute_d: Duration = field(default_factory=Duration)
    recent_items: SlidingWindow = field(default_factory=lambda: SlidingWindow(HISTORY_S, time.time))  # items
    recent_latency: SlidingWindow = field(default_factory=lambda: SlidingWindow(HISTORY_S, time.time))  # e2e s
    arrivals: SlidingWindow = field(default_factory=lambda: SlidingWindow(HISTORY_S, time.time))
    recent_failures: SlidingWindow = field(default_factory=lambda: SlidingWindow(HISTORY_S, time.time))
    # a model with accelerator workers: queries and items sent to each kind ("cpu", "accelerator"), fused passes
    routed_queries: dict[str, int] = field(default_factory=dict)
    routed_items: dict[str, int] = field(default_factory=dict)
    accel_passes: int = 0
    accel_pass_items: int = 0
    accel_pass_s: float = 0.0  # time in passes (host->device copy, model, scores back), the accelerator's busy time
    cache_lookups: int = 0  # rows looked up through accelerator workers' device row caches (device_table_mb)
    cache_hits: int = 0  # of those, rows found on the device
    read_pauses: int = 0  # HTTP/1.1 connections whose reading paused: a client pipelined too far ahead
    tier_counts: dict[str, int] = field(default_factory=dict)  # SSD tier counters (worker/tier_counts.FIELDS)

    def routed(self, kind: str, items: int) -> None:
        self.routed_queries[kind] = self.routed_queries.get(kind, 0) + 1
        self.routed_items[kind] = self.routed_items.get(kind, 0) + items

    def accel_pass(self, items: int, queries: int, seconds: float = 0.0) -> None:
        """One fused launch on an accelerator worker (counted as one execution, as Triton counts them)."""
        self.accel_passes += 1
        self.accel_pass_items += items
        self.accel_pass_s += seconds
        self.executions += 1

    def device_cache(self, lookups: int, hits: int) -> None:
        self.cache_lookups += lookups
        self.cache_hits += hits

    def tier(self, deltas: tuple) -> None:
        """A worker's SSD-tier counters since its last beat, in ``worker/tier_counts.FIELDS`` order."""
        from recserve.serving.worker.tier_counts import FIELDS

        for name, delta in zip(FIELDS, deltas, strict=False):
            self.tier_counts[name] = self.tier_counts.get(name, 0) + int(delta)

    def arrived(self) -> None:
        self.requests += 1
        self.arrivals.add()

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def refused(self, code: str) -> None:
        self.refusals[code] = self.refusals.get(code, 0) + 1

    def done(self, items: int, e2e_s: float, queue_s: float, compute_s: float, parts: int) -> None:
        now = time.time()
        self.successes += 1
        self.items += items
        self.executions += parts
        self.last_inference_ms = int(now * 1000)
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.compute.observe(compute_s)
        self.success_d.add(e2e_s)
        self.queue_d.add(queue_s)
        self.compute_d.add(compute_s)
        self.recent_items.add(items, now)
        self.recent_latency.add(e2e_s, now)

    def failed(self, e2e_s: float) -> None:
        self.fail_d.add(e2e_s)
        self.recent_failures.add()

    def items_per_s(self) -> float:
        return self.recent_items.total_rate(RATE_WINDOW_S)

    def window(self, seconds: float, percentile: float) -> dict[str, float]:
        """Tail latency, completions/s and arrivals/s over the last ``seconds`` (for the node resource manager);
        ``failed``: queries answered with an error in the window (shed under overload, past their deadline), which
        the tail of completed queries cannot show."""
        now = time.time()
        seconds = min(max(seconds, 1e-3), HISTORY_S)
        completed = len(self.recent_latency.values(seconds, now))
        return {"seconds": seconds, "percentile": percentile,
                "tail_ms": self.recent_latency.tail(percentile, seconds, now) * 1e3, "completed": completed,
                "qps": completed / seconds, "arrival_qps": self.arrivals.rate(seconds, now),
                "failed": len(self.recent_failures.values(seconds, now)), "errors": int(sum(self.errors.values()))}

    def triton_stats(self, name: str, version: str) -> dict:
        """One entry of Triton's ``model_stats`` list (ints, as Triton's HTTP endpoint returns them).

        ``compute_input`` and ``compute_output`` carry the count of ``compute_infer`` with no time of their own:
        perf_analyzer aborts ("Server side statistics compute counts must be the same") unless the three counts
        agree, and recserve times a query's decoding inside ``queue`` and its encoding inside ``success``.
        """
        zero = Duration().as_dict()
        counted = Duration(count=self.compute_d.count).as_dict()
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.items,
            "execution_count": self.executions,
            "inference_stats": {
                "success": self.success_d.as_dict(),
                "fail": self.fail_d.as_dict(),
                "queue": self.queue_d.as_dict(),
                "compute_input": counted,
                "compute_infer": self.compute_d.as_dict(),
                "compute_output": counted,
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": [],
        }


ModelGauges = tuple[ModelMetrics, int, dict[str, int]]  # metrics, queries in flight, ready workers per stage
# (served name, version) -> gauges; node-wide refusals by reason
NodeSnapshot = tuple[dict[tuple[str, str], ModelGauges], dict[str, int]]
MODEL_LABELS = ["model", "version"]  # every per-model family's labels, as Triton labels its own (nv_inference_*)


class NodeCollector(Collector):
    """The node's ``/metrics`` families, built at scrape time from the supervisor's aggregated counters (the
    workers keep counting as they do; nothing here runs per query). ``source`` returns the models' gauges and the
    inference requests refused before a model was known (unknown model, unreadable request), by reason."""

    def __init__(self, source: Callable[[], NodeSnapshot]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        models, node_refusals = self.source()
        yield from _request_families(models, node_refusals)
        yield from _load_families(models)
        yield from _accelerator_families(models)
        yield from _tier_families(models)
        yield from _health_families(models)
        yield from _latency_families(models)
        yield from triton_families(models)


class PrometheusExporter:
    """Prometheus text exposition of one node: a private registry holding one :class:`NodeCollector`."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"  # the text format generate_latest writes

    def __init__(self, source: Callable[[], NodeSnapshot]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(source))

    def render(self) -> bytes:
        return generate_latest(self.registry)


Models = dict[tuple[str, str], ModelGauges]
Rows = Iterable[tuple[list[str], float]]


def _counter(name: str, help_text: str, labels: list[str], rows: Rows) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=labels)  # the sample keeps ``name``'s ``_total``
    for values, count in rows:
        family.add_metric(values, count)
    return family


def _gauge(name: str, help_text: str, labels: list[str], rows: Rows) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def _each(models: Models, value: Callable[[ModelMetrics], float],
          keep: Callable[[ModelMetrics], bool] = lambda _: True) -> Rows:
    """One row per loaded version: its labels and ``value`` of its counters."""
    return (([name, version], value(m)) for (name, version), (m, _, _) in models.items() if keep(m))


def _each_by(models: Models, counts: Callable[[ModelGauges], dict[str, int]]) -> Rows:
    """One row per loaded version and key of ``counts`` (an error code, a kind, a stage)."""
    return (([name, version, key], count) for (name, version), gauges in models.items()
            for key, count in sorted(counts(gauges).items()))


def _request_families(models: Models, node_refusals: dict[str, int]) -> Iterator[Metric]:
    yield _counter("recserve_requests_total", "Queries that reached admission (read and valid; refused ones are in "
                   "recserve_requests_refused_total).", MODEL_LABELS, _each(models, lambda m: m.requests))
    yield _counter("recserve_request_success_total", "Inference requests answered with scores.", MODEL_LABELS,
                   _each(models, lambda m: m.successes))
    yield _counter("recserve_request_errors_total", "Queries that reached admission and failed, by code.",
                   [*MODEL_LABELS, "code"], _each_by(models, lambda g: g[0].errors))
    refused = [*_each_by(models, lambda g: g[0].refusals)]
    refused += [(["", "", code], count) for code, count in sorted(node_refusals.items())]
    yield _counter("recserve_requests_refused_total",
                   "Inference requests refused before admission (unreadable, invalid, too large, too slow, the "
                   "client gone) and connections past max_connections, by reason; model=\"\" and version=\"\" when "
                   "no served model was named (the server process's own connections).", [*MODEL_LABELS, "reason"],
                   refused)
    yield _counter("recserve_items_total", "Candidate items scored.", MODEL_LABELS, _each(models, lambda m: m.items))


def _load_families(models: Models) -> Iterator[Metric]:
    yield _gauge("recserve_items_per_second", f"Items scored per second over the last {RATE_WINDOW_S:g} s.",
                 MODEL_LABELS, _each(models, ModelMetrics.items_per_s))
    yield _gauge("recserve_queue_depth", "Queries admitted and not yet answered.", MODEL_LABELS,
                 (([name, version], depth) for (name, version), (_, depth, _) in models.items()))
    yield _gauge("recserve_workers", "Ready worker processes per stage.", [*MODEL_LABELS, "stage"],
                 _each_by(models, lambda g: g[2]))


def _accelerator_families(models: Models) -> Iterator[Metric]:
    yield _counter("recserve_routed_queries_total",
                   "Queries of models with accelerator workers, by the kind of worker that computed them.",
                   [*MODEL_LABELS, "kind"], _each_by(models, lambda g: g[0].routed_queries))
    yield _counter("recserve_routed_items_total", "Items of those queries, by kind of worker.",
                   [*MODEL_LABELS, "kind"], _each_by(models, lambda g: g[0].routed_items))
    yield _counter("recserve_accelerator_passes_total", "Fused passes (launches) of accelerator workers.",
                   MODEL_LABELS, _each(models, lambda m: m.accel_passes, lambda m: bool(m.routed_queries)))
    yield _counter("recserve_device_cache_lookups_total",
                   "Embedding rows looked up through accelerator workers' device row caches "
                   "(accelerator.device_table_mb).", MODEL_LABELS,
                   _each(models, lambda m: m.cache_lookups, lambda m: bool(m.cache_lookups)))
    yield _counter("recserve_device_cache_hits_total", "Of those, rows found in device memory.", MODEL_LABELS,
                   _each(models, lambda m: m.cache_hits, lambda m: bool(m.cache_lookups)))


TIER_HELP = {"lookups": "Embedding ids looked up in the model's SSD-tiered tables.",
             "hits": "Of the distinct ids of each batch, rows found in the DRAM row cache.",
             "misses": "Of those, rows read from the SSD table files.",
             "ios": "Reads submitted to the SSD table files.",
             "bytes_read": "Bytes read from the SSD table files (read amplification: over the rows used).",
             "checksum_errors": "Rows read whose checksum did not match (each failed its query)."}


def _tier_families(models: Models) -> Iterator[Metric]:
    for name, text in TIER_HELP.items():
        yield _counter(f"recserve_tier_{name}_total", text, MODEL_LABELS,
                       _each(models, lambda m, n=name: m.tier_counts.get(n, 0), lambda m: bool(m.tier_counts)))


def _health_families(models: Models) -> Iterator[Metric]:
    yield _counter("recserve_http_read_pauses_total",
                   "HTTP/1.1 connections that stopped being read while over 64 KiB waited behind the request in "
                   "flight (a pipelining client held back by TCP).", MODEL_LABELS,
                   _each(models, lambda m: m.read_pauses))
    yield _counter("recserve_worker_restarts_total", "Workers that died and were replaced.", MODEL_LABELS,
                   _each(models, lambda m: m.worker_restarts))


def _latency_families(models: Models) -> Iterator[Metric]:
    for metric, attr, help_text in (
        ("recserve_request_latency_seconds", "e2e", "End-to-end latency of successful queries."),
        ("recserve_queue_latency_seconds", "queue", "Time queries waited for a worker (summed over stages)."),
        ("recserve_compute_latency_seconds", "compute", "Worker compute time per query (longest part per stage)."),
    ):
        family = HistogramMetricFamily(metric, help_text, labels=MODEL_LABELS)
        for (name, version), (m, _, _) in models.items():
            histogram: Histogram = getattr(m, attr)
            family.add_metric([name, version], histogram.buckets(), histogram.sum_s)
        yield family
