"""``recserve report`` shows what each kind of result measured: no field of a result is dropped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve.cli import main
from recserve.measure.loadgen import LoadResult
from recserve.measure.maxload import MaxLoadResult, Probe


def _run(rate: float, failed: int = 0) -> LoadResult:
    return LoadResult(target="http t", offered_qps=rate, duration_s=5.0, elapsed_s=5.0, sent=50 + failed,
                      latencies_ms=np.linspace(3.0, 41.0, 50), errors={"http_500": failed} if failed else {},
                      measured=50 + failed, refusal_reasons={"<b>internal failure</b> N": failed} if failed else {})


def _report(tmp_path, data, name="r.json") -> str:
    (tmp_path / name).write_text(json.dumps(data))
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / name), "--out", str(out)]) == 0
    return out.read_text()


def test_a_load_run_shows_its_percentiles_errors_and_refusal_reasons_escaped(tmp_path):
    run = _run(10.0, failed=7)
    html = _report(tmp_path, {"kind": "load_run", "model": "m", "sla_ms": 20, "percentile": 95, **run.to_dict()})
    assert "Latency of answered queries" in html and ">p95<" in html and ">p99<" in html
    latency = run.to_dict()["latency_ms"]
    assert f">{latency['p50']:.4g}<" in html and f">{latency['max_ok']:.4g}<" in html and latency["p99"] is None
    assert "http_500" in html and ">7<" in html
    assert "&lt;b&gt;internal failure&lt;/b&gt; N" in html and "<b>internal" not in html
    assert "generator.cpu_per_s" in html and "send_lag_ms.max" in html  # the rest, flattened


def test_a_max_load_result_and_a_sweep_show_every_probe(tmp_path):
    probes = [Probe(r, run.p95, r < 30, run.to_dict()) for r, run in ((10.0, _run(10.0)), (20.0, _run(20.0)),
                                                                        (40.0, _run(40.0, failed=9)))]
    result = MaxLoadResult(20.0, 50.0, 95.0, probes, (20.0, 40.0), False, "probe budget spent")
    for kind in ("max_load", "sweep"):
        html = _report(tmp_path, {"kind": kind, "model": "m", **result.to_dict()})
        assert "Probes (3)" in html and html.count("VIOLATES") == 1 and "http_500=9" in html
        assert ">p95 ms<" in html and "probe budget spent" in html


def test_an_offload_tuning_shows_each_thresholds_search(tmp_path):
    search = MaxLoadResult(20.0, 50.0, 95.0, [Probe(20.0, 9.0, True, _run(20.0).to_dict())], (20.0, 40.0), True,
                           "bisected").to_dict()
    html = _report(tmp_path, {"kind": "offload_threshold", "model": "m", "best_min_items": 64,
                              "results": [{"min_items": k, "max_qps": 20.0, "search": search} for k in (16, 64)]})
    assert "Max load by threshold" in html and "min_items 16" in html and html.count("Probes (1)") == 2


def test_a_profile_set_shows_every_table_and_row(tmp_path):
    tables = [{"model": "rmc1", "server": "this-host", "kind": kind, "source": "measured", "conditions": {"sla_ms": 20},
               "columns": columns, "rows": [[k + 1, 100.5 * (k + 1), 7.25] for k in range(4)]}
              for kind, columns in (("latency_vs_batch", ["batch", "mean_ms", "p99_ms"]),
                                    ("maxload_vs_workers", ["workers", "max_qps", "unloaded_pctl_ms"]))]
    html = _report(tmp_path, {"version": 1, "meta": {"server": "this-host", "load_avg_before": [2.5, 2.0]},
                              "tables": tables})
    assert "latency_vs_batch: rmc1 on this-host" in html and "maxload_vs_workers: rmc1 on this-host" in html
    assert ">unloaded_pctl_ms<" in html and html.count("<td class=num>402</td>") == 2  # each table's last row
    assert "meta.load_avg_before" in html


@pytest.mark.parametrize("kind", ["tier", "some-future-kind"])
def test_any_other_result_shows_every_nested_field_and_list_of_records(tmp_path, kind):
    data = {"kind": kind, "planner": "sdm/sm-cache", "summary": {"hit_rate_marker": "leaf-a", "deep": {"x": "leaf-b"}},
            "notes": ["leaf-c", "leaf-d"], "tables": [{"table": "user0", "tier": "leaf-e"}, {"table": "user14",
                                                                                             "extra": "leaf-f"}],
            "grid": [[1, "leaf-g"], [2, "leaf-h"]], "mixed": [1, {"k": "leaf-i"}]}
    html = _report(tmp_path, data)
    for leaf in "abcdefghi":
        assert f"leaf-{leaf}" in html
    assert "summary.deep.x" in html and "user14" in html
