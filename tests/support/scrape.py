"""A node's ``/metrics`` read as Prometheus reads it (prometheus_client's parser), not by matching text: label
order and number formatting are the exposition library's business."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.support import http

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition: (sample name, labels) -> value."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(port: int, timeout_s: float = 30) -> Samples:
    reply = http.get(port, "/metrics", timeout_s=timeout_s)
    assert reply.status == 200, (reply.status, reply.body[:300])
    return parse(reply.body.decode())


def metric_value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly these labels, or None when it is not exported."""
    return samples.get((name, frozenset(labels.items())))
