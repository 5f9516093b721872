"""``bench --find-max-load`` says when the server's refusals, not latency, bounded the max load."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from recserve.commands.bench import Measured
from recserve.measure.loadgen import LoadResult
from recserve.measure.maxload import find_max_load, refusal_bound

REASON = "model 'm' is overloaded: this query would finish N ms after its deadline"


def _run(rate: float, answered_ms: float, refused: int) -> LoadResult:
    return LoadResult(target="grpc t", offered_qps=rate, duration_s=5.0, elapsed_s=5.0, sent=100 + refused,
                      latencies_ms=np.full(100, answered_ms), errors={"grpc_UNAVAILABLE": refused} if refused else {},
                      measured=100 + refused, refusal_reasons={REASON: refused} if refused else {})


def test_a_search_bounded_by_refusals_says_so_with_the_servers_reason_and_the_deadline():
    result = find_max_load(lambda r: _run(r, 15.0, 20 if r > 40 else 0), 200.0, start_qps=5.0, max_probes=8)
    note = refusal_bound(result)
    assert "bounded by the server's refusals, not by latency" in note and REASON in note and "deadline_ms" in note


def test_a_search_bounded_by_latency_has_no_such_note():
    slow = find_max_load(lambda r: _run(r, 15.0 if r <= 40 else 500.0, 3 if r > 40 else 0), 200.0, start_qps=5.0,
                         max_probes=8)
    assert refusal_bound(slow) == ""


def test_the_printed_line_and_the_json_carry_the_note(capsys):
    result = find_max_load(lambda r: _run(r, 15.0, 20 if r > 40 else 0), 200.0, start_qps=5.0, max_probes=8)
    args = SimpleNamespace(scale=1e-3, sizes="production", index="uniform", sweep=None)
    measured = Measured(args, SimpleNamespace(name="m"), SimpleNamespace(name="grpc t"), 200.0, 95.0)
    measured.search(result)
    line = capsys.readouterr().out
    assert line.startswith("max load 40.00 qps") and "bounded by the server's refusals" in line
    assert measured.out["limited_by"] == "refusals" and "deadline_ms" in measured.out["limited_note"]


def test_an_sla_missed_even_unloaded_gives_max_load_0_at_once(tmp_path, capsys):
    import json
    import time

    from recserve.cli import main

    out = tmp_path / "m.json"
    t0 = time.monotonic()
    assert main(["bench", "--model", "hera-ncf", "--target", "inprocess:thread", "--find-max-load", "--sla-ms",
                 "0.0001", "--duration", "1", "--quiet", "--json", str(out)]) == 0
    assert time.monotonic() - t0 < 60  # halving from 10 qps with 50-query probes would take hours
    captured = capsys.readouterr()
    assert captured.out.startswith("max load 0.00 qps") and "unloaded p95" in captured.out
    assert "no rate can meet it" in captured.err
    saved = json.loads(out.read_text())
    assert saved["max_qps"] == 0 and len(saved["probes"]) == 1 and saved["probes"][0]["rate"] == 0
