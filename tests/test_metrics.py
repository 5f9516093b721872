"""``/metrics`` (serving/node/metrics.py): every family, label and value the node exports, as Prometheus parses them."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from recserve.serving.node.metrics import BUCKETS_S, ModelMetrics, NodeSnapshot, PrometheusExporter
from tests.support.scrape import metric_value, parse

# family -> (type, label names of its samples besides a histogram's ``le``): the exported contract
FAMILIES = {
    "recserve_requests": ("counter", {"model", "version"}),
    "recserve_request_success": ("counter", {"model", "version"}),
    "recserve_request_errors": ("counter", {"model", "version", "code"}),
    "recserve_requests_refused": ("counter", {"model", "version", "reason"}),
    "recserve_items": ("counter", {"model", "version"}),
    "recserve_items_per_second": ("gauge", {"model", "version"}),
    "recserve_queue_depth": ("gauge", {"model", "version"}),
    "recserve_workers": ("gauge", {"model", "version", "stage"}),
    "recserve_routed_queries": ("counter", {"model", "version", "kind"}),
    "recserve_routed_items": ("counter", {"model", "version", "kind"}),
    "recserve_accelerator_passes": ("counter", {"model", "version"}),
    "recserve_device_cache_lookups": ("counter", {"model", "version"}),
    "recserve_device_cache_hits": ("counter", {"model", "version"}),
    "recserve_http_read_pauses": ("counter", {"model", "version"}),
    **{f"recserve_tier_{name}": ("counter", {"model", "version"})
       for name in ("lookups", "hits", "misses", "ios", "bytes_read", "checksum_errors")},
    "recserve_worker_restarts": ("counter", {"model", "version"}),
    "recserve_request_latency_seconds": ("histogram", {"model", "version"}),
    "recserve_queue_latency_seconds": ("histogram", {"model", "version"}),
    "recserve_compute_latency_seconds": ("histogram", {"model", "version"}),
    # Triton's names (serving/node/triton_metrics.py): untyped, so that their samples keep Triton's exact names
    "nv_inference_request_success": ("unknown", {"model", "version"}),
    "nv_inference_request_failure": ("unknown", {"model", "version", "reason"}),
    "nv_inference_count": ("unknown", {"model", "version"}),
    "nv_inference_exec_count": ("unknown", {"model", "version"}),
    "nv_inference_request_duration_us": ("unknown", {"model", "version"}),
    "nv_inference_queue_duration_us": ("unknown", {"model", "version"}),
    "nv_inference_compute_infer_duration_us": ("unknown", {"model", "version"}),
    "nv_inference_pending_request_count": ("gauge", {"model", "version"}),
}


def busy_model() -> ModelMetrics:
    m = ModelMetrics()
    for _ in range(3):
        m.arrived()
    m.done(items=7, e2e_s=0.004, queue_s=0.001, compute_s=0.002, parts=1)
    m.done(items=3, e2e_s=0.3, queue_s=0.01, compute_s=0.2, parts=2)
    m.error("deadline")
    m.refused("slow_client")
    m.routed("cpu", 5)
    m.routed("accelerator", 9)
    m.accel_pass(items=9, queries=1, seconds=0.01)
    m.device_cache(lookups=10, hits=4)
    m.tier((100, 60, 40, 12, 49152, 1))
    m.tier((20, 15, 5, 2, 8192, 0))  # a later beat's deltas add up
    m.read_pauses, m.worker_restarts = 2, 1
    return m


def render(models: dict, node_refusals: dict[str, int] | None = None) -> str:
    snapshot: NodeSnapshot = (models, node_refusals or {})
    return PrometheusExporter(lambda: snapshot).render().decode()


def test_every_family_is_exported_with_its_type_and_labels():
    text = render({("a", "1"): (busy_model(), 2, {"model": 2, "accel": 1})}, {"unknown_model": 4})
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {name: f.type for name, f in families.items()} == {name: t for name, (t, _) in FAMILIES.items()}
    for name, (_, labels) in FAMILIES.items():
        assert families[name].samples, name
        for sample in families[name].samples:
            assert set(sample.labels) - {"le"} == labels, (sample.name, sample.labels)


def test_the_values_are_the_supervisors_counters():
    samples = parse(render({("a", "1"): (busy_model(), 2, {"model": 2, "accel": 1})}, {"unknown_model": 4}))
    expected = {
        ("recserve_requests_total", ("model", "a")): 3, ("recserve_request_success_total", ("model", "a")): 2,
        ("recserve_items_total", ("model", "a")): 10, ("recserve_queue_depth", ("model", "a")): 2,
        ("recserve_accelerator_passes_total", ("model", "a")): 1,
        ("recserve_device_cache_lookups_total", ("model", "a")): 10,
        ("recserve_device_cache_hits_total", ("model", "a")): 4,
        ("recserve_http_read_pauses_total", ("model", "a")): 2, ("recserve_worker_restarts_total", ("model", "a")): 1,
        ("recserve_tier_lookups_total", ("model", "a")): 120, ("recserve_tier_misses_total", ("model", "a")): 45,
        ("recserve_tier_bytes_read_total", ("model", "a")): 57344,
        ("recserve_tier_checksum_errors_total", ("model", "a")): 1,
        ("recserve_request_latency_seconds_count", ("model", "a")): 2,
    }
    for (name, (key, label)), count in expected.items():
        assert metric_value(samples, name, **{key: label, "version": "1"}) == count, name
    assert metric_value(samples, "recserve_request_errors_total", model="a", version="1", code="deadline") == 1
    assert metric_value(samples, "recserve_requests_refused_total", model="a", version="1", reason="slow_client") == 1
    assert metric_value(samples, "recserve_requests_refused_total", model="", version="", reason="unknown_model") == 4
    assert metric_value(samples, "recserve_routed_queries_total", model="a", version="1", kind="accelerator") == 1
    assert metric_value(samples, "recserve_routed_items_total", model="a", version="1", kind="cpu") == 5
    assert metric_value(samples, "recserve_workers", model="a", version="1", stage="accel") == 1
    assert abs(metric_value(samples, "recserve_request_latency_seconds_sum", model="a", version="1") - 0.304) < 1e-9


def test_tritons_names_carry_the_same_counts_in_tritons_units():
    """What a dashboard written for Triton reads: requests counted once whatever their batch, inferences by item,
    failures with refusals, durations in microseconds."""
    samples = parse(render({("a", "1"): (busy_model(), 2, {})}))
    expected = {"nv_inference_request_success": 2, "nv_inference_count": 10,
                "nv_inference_exec_count": 4, "nv_inference_pending_request_count": 2,
                "nv_inference_queue_duration_us": 11_000, "nv_inference_compute_infer_duration_us": 202_000}
    for name, value in expected.items():
        assert abs(metric_value(samples, name, model="a", version="1") - value) < 1.0, name
    assert metric_value(samples, "nv_inference_request_duration_us", model="a", version="1") >= 304_000
    failures = {reason: metric_value(samples, "nv_inference_request_failure", model="a", version="1", reason=reason)
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert failures == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}  # deadline; slow_client


def test_tritons_durations_sum_successful_requests_only_and_failures_carry_tritons_reason():
    """As Triton's InferenceStatsAggregator: a failure adds to the failure count only, so that
    rate(nv_inference_request_duration_us) / rate(nv_inference_request_success) is the mean latency of answered
    requests, and shed, cancelled and broken requests are told apart by ``reason``."""
    m = ModelMetrics()
    m.done(items=1, e2e_s=0.010, queue_s=0.001, compute_s=0.005, parts=1)
    for code, seconds in (("unavailable", 2.0), ("deadline", 3.0), ("internal", 0.5)):
        m.error(code)
        m.failed(seconds)
    for code in ("client_gone", "too_many_connections", "invalid"):
        m.refused(code)
    samples = parse(render({("a", "1"): (m, 0, {})}))
    assert abs(metric_value(samples, "nv_inference_request_duration_us", model="a", version="1") - 10_000) < 1.0
    failures = {reason: metric_value(samples, "nv_inference_request_failure", model="a", version="1", reason=reason)
                for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}
    assert failures == {"REJECTED": 3, "CANCELED": 1, "BACKEND": 1, "OTHER": 1}


def test_histogram_buckets_are_cumulative_up_to_the_count():
    samples = parse(render({("a", "1"): (busy_model(), 0, {})}))
    buckets = [metric_value(samples, "recserve_compute_latency_seconds_bucket", model="a", version="1", le=f"{edge:g}")
               for edge in BUCKETS_S]
    assert buckets == sorted(buckets) and buckets[BUCKETS_S.index(0.002)] == 1 and buckets[-1] == 2
    assert metric_value(samples, "recserve_compute_latency_seconds_bucket", model="a", version="1", le="+Inf") == 2


def test_accelerator_and_cache_samples_appear_only_for_models_that_use_them():
    samples = parse(render({("plain", "1"): (ModelMetrics(), 0, {"model": 1})}))
    assert metric_value(samples, "recserve_requests_total", model="plain", version="1") == 0
    assert metric_value(samples, "recserve_accelerator_passes_total", model="plain", version="1") is None
    assert metric_value(samples, "recserve_device_cache_lookups_total", model="plain", version="1") is None


def test_a_label_value_with_a_quote_a_backslash_and_a_newline_round_trips_escaped():
    name = 'we"ird\\mo\ndel'
    text = render({(name, "1"): (busy_model(), 1, {"model": 1})}, {'bad"reason\n': 1})
    assert 'model="we\\"ird\\\\mo\\ndel"' in text  # escaped in the exposition, one sample per line
    samples = parse(text)
    assert metric_value(samples, "recserve_requests_total", model=name, version="1") == 3
    assert metric_value(samples, "recserve_workers", model=name, version="1", stage="model") == 1
    assert metric_value(samples, "recserve_requests_refused_total", model="", version="", reason='bad"reason\n') == 1


def test_the_exporter_reads_the_counters_at_each_scrape():
    m = ModelMetrics()
    exporter = PrometheusExporter(lambda: ({("a", "1"): (m, 0, {})}, {}))
    assert metric_value(parse(exporter.render().decode()), "recserve_requests_total", model="a", version="1") == 0
    m.arrived()
    assert metric_value(parse(exporter.render().decode()), "recserve_requests_total", model="a", version="1") == 1
    assert exporter.content_type.startswith("text/plain; version=0.0.4")


def documented_names() -> set[str]:
    """The metric names docs/serving.md's Metrics and Monitoring sections mention, ``{a,b}`` expanded."""
    text = (Path(__file__).parent.parent / "docs" / "serving.md").read_text()
    section = text[text.index("## Metrics"):text.index("## Robustness")]
    names = set()
    for head, options, tail in re.findall(r"\b((?:recserve|nv)_[a-z_]*)(?:\{([a-z_,]+)\}([a-z_]*))?", section):
        names.update(head + option + tail for option in (options.split(",") if options else [""]))
    return {name for name in names if not name.endswith("_")}  # not ``nv_gpu_*``: families said to be absent


def test_the_docs_name_every_exported_family_and_only_those():
    text = render({("a", "1"): (busy_model(), 2, {"model": 2, "accel": 1})}, {"unknown_model": 4})
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    families = {n.removesuffix(suffix) for n in exported for suffix in ("_bucket", "_count", "_sum")
                if n.endswith(suffix) and n.removesuffix(suffix).endswith("_seconds")}
    documented = documented_names()
    assert documented - exported - families == set()
    assert {n for n in exported if not n.endswith(("_bucket", "_count", "_sum"))} | families <= documented
