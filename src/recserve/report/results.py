"""Dedicated report sections for what ``bench`` and ``profile`` write: the measured numbers as tables.

A load run shows its latency percentiles, failed queries by kind and the server's refusal reasons; a max-load
search or sweep its probes; an offload tuning each threshold's search; a profile set each table's rows.  Fields a
section does not lay out itself follow in the structural tables of :mod:`recserve.report.structure`, so nothing
is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recserve.report.html import esc, fmt, table
from recserve.report.structure import cell, render_value

LOAD_HEAD = ("model", "target", "scale", "sizes", "index", "offered_qps", "achieved_qps", "duration_s", "elapsed_s",
             "sent", "measured", "ok", "sla_ms", "percentile", "meets_sla", "interrupted")
LATENCY = ("p50", "p95", "p99", "mean_ok", "max_ok")
SEARCH_HEAD = ("model", "target", "scale", "sizes", "index", "max_qps", "sla_ms", "percentile", "bracket",
               "converged", "reason", "limited_by", "limited_note", "interrupted")


def _fields(data: dict[str, Any], names: tuple[str, ...]) -> str:
    return table([{"field": k, "value": cell(data[k])} for k in names if k in data], ["field", "value"])


def _rest(data: dict[str, Any], shown: set[str]) -> str:
    """The fields a section did not lay out, as structural tables."""
    rest = {k: v for k, v in data.items() if k not in shown and k != "kind"}
    return ("<h3>Other fields</h3>" + render_value(rest, "h4")) if rest else ""


def _counts(counts: dict[str, Any], what: str) -> str:
    rows = [{what: k, "queries": n} for k, n in sorted(counts.items(), key=lambda kv: -(kv[1] or 0))]
    return table(rows, [what, "queries"]) if rows else "<p class=muted>none</p>"


def load_run(data: dict[str, Any]) -> str:
    """One ``bench`` run: headline, latency percentiles, failed queries by kind, the server's refusal reasons."""
    latency = data.get("latency_ms") or {}
    parts = ["<h3>Run</h3>", _fields(data, LOAD_HEAD),
             "<h3>Latency of answered queries (ms, from the scheduled send time)</h3>",
             table([{k: latency.get(k) for k in LATENCY}], list(LATENCY)),
             "<p class=muted>— : not finite (failed queries reach into that percentile)</p>",
             "<h3>Failed queries by kind</h3>", _counts(data.get("errors") or {}, "kind"),
             "<h3>The server's error answers (refusals and server errors)</h3>",
             _counts(data.get("refusal_reasons") or {}, "reason")]
    shown = set(LOAD_HEAD) | {"latency_ms", "errors", "refusal_reasons"}
    return "".join(parts) + _rest(data, shown)


def _top(counts: dict[str, Any]) -> str:
    if not counts:
        return ""
    key, n = max(counts.items(), key=lambda kv: kv[1] or 0)
    return f"{key} (x{n})"


def probe_row(probe: dict[str, Any], percentile: Any) -> dict[str, Any]:
    """One probe of a search as a table row: rate, its SLA percentile, verdict, what was answered and what failed."""
    detail = probe.get("detail") or {}
    latency = detail.get("latency_ms") or {}
    errors = detail.get("errors") or {}
    return {"rate qps": probe.get("rate"), f"p{fmt(percentile)} ms": probe.get("latency_ms"),
            "SLA": "ok" if probe.get("ok") else "VIOLATES", "achieved qps": detail.get("achieved_qps"),
            "ok": detail.get("ok"), "measured": detail.get("measured"), "p50 ms": latency.get("p50"),
            "p99 ms": latency.get("p99"), "failed": ", ".join(f"{k}={v}" for k, v in errors.items()),
            "most frequent refusal": _top(detail.get("refusal_reasons") or {}),
            "confirm": "yes" if detail.get("confirm") else ""}


def probes_table(data: dict[str, Any]) -> str:
    rows = [probe_row(p, data.get("percentile", "")) for p in data.get("probes") or []]
    return f"<h3>Probes ({len(rows)})</h3>" + table(rows)


def max_load(data: dict[str, Any]) -> str:
    """A ``--find-max-load`` search or a ``--sweep``: its answer and every probe."""
    shown = set(SEARCH_HEAD) | {"probes"}
    return "<h3>Search</h3>" + _fields(data, SEARCH_HEAD) + probes_table(data) + _rest(data, shown)


def offload_threshold(data: dict[str, Any]) -> str:
    """``--tune-offload``: the max load at each threshold, then each threshold's probes."""
    results = data.get("results") or []
    rows = [{"min_items": r.get("min_items"), "max qps": r.get("max_qps"),
             "best": "yes" if r.get("min_items") == data.get("best_min_items") else "",
             "reason": (r.get("search") or {}).get("reason")} for r in results]
    parts = [_fields(data, ("model", "target", "scale", "sizes", "sla_ms", "percentile", "best_min_items")),
             "<h3>Max load by threshold</h3>", table(rows)]
    for r in results:
        parts.append(f"<h4>min_items {esc(r.get('min_items'))}</h4>" + probes_table(r.get("search") or {}))
    return "".join(parts) + _rest(data, {"model", "target", "scale", "sizes", "sla_ms", "percentile",
                                         "best_min_items", "results"})


def is_profile_set(data: dict[str, Any]) -> bool:
    """A ``profile`` file (a ProfileSet: version, meta, tables of columns and rows) rather than a kinded result."""
    tables = data.get("tables")
    return "kind" not in data and "version" in data and isinstance(tables, list) and all(
        isinstance(t, dict) and "columns" in t and "rows" in t for t in tables)


def profile_set(data: dict[str, Any]) -> str:
    """Each profile table's rows under its kind, model, server and conditions; the meta after them."""
    parts = []
    for t in data["tables"]:
        conditions = ", ".join(f"{k} {v}" for k, v in (t.get("conditions") or {}).items())
        rows = [dict(zip(map(str, t["columns"]), row, strict=False)) for row in t["rows"]]
        parts.append(f"<h3>{esc(t.get('kind'))}: {esc(t.get('model'))} on {esc(t.get('server'))} "
                     f"({esc(t.get('source', ''))})</h3><p class=muted>{esc(conditions)}</p>"
                     + table(rows, [str(c) for c in t["columns"]]))
    return "".join(parts) + _rest(data, {"tables"})


BODIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "load_run": load_run, "max_load": max_load, "sweep": max_load, "offload_threshold": offload_threshold,
}
