"""DeepRecSys' offload threshold found by measurement (issue #16): ``recserve bench --tune-offload``."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main
from recserve.measure.maxload import MaxLoadResult, Probe
from recserve.measure.offload import ThresholdResult, best_threshold, tune_offload
from recserve.serving import config_from_dict
from recserve.serving.node.control_client import ControlClient
from tests.support.nodes import started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


def _found(max_qps: float, tail_ms: float) -> MaxLoadResult:
    return MaxLoadResult(max_qps, 100.0, 95.0, [Probe(max_qps, tail_ms, True), Probe(2 * max_qps, 500.0, False)],
                         (max_qps, 2 * max_qps), True, "bracket")


def test_the_best_threshold_has_the_highest_max_load_then_the_lower_tail():
    results = [ThresholdResult(1, _found(300, 80)), ThresholdResult(64, _found(300, 40)),
               ThresholdResult(256, _found(200, 10))]
    assert best_threshold(results).min_items == 64
    with pytest.raises(ValueError):
        best_threshold([])


def test_tuning_sets_each_threshold_before_its_search_and_leaves_the_best_set():
    set_calls, searched_with = [], []
    current = {"k": None}

    def set_threshold(k: int) -> None:
        set_calls.append(k)
        current["k"] = k

    def search(k: int) -> MaxLoadResult:
        searched_with.append(current["k"])
        return _found({1: 100.0, 16: 250.0, 512: 180.0}[k], 50.0)

    best, results = tune_offload(set_threshold, search, [1, 16, 512])
    assert best.min_items == 16 and [r.min_items for r in results] == [1, 16, 512]
    assert searched_with == [1, 16, 512] and set_calls[-1] == 16


def test_bench_tune_offload_against_a_live_node(tmp_path, capsys):
    model = {"name": "ncf", "model": "hera-ncf", "scale": 1e-4, "workers": 1, "max_batch_size": 1024,
             "deadline_ms": 30_000, "accelerator": {"device": "cpu", "min_items": 256}}
    with started(config_from_dict({"models": [model]})) as server:
        url = f"http://127.0.0.1:{server.ports.http}"
        out = tmp_path / "tune.json"
        rc = main(["bench", "--model", "hera-ncf", "--scale", "1e-4", "--target", url, "--served-name", "ncf",
                   "--tune-offload", "8,1025", "--rate", "20", "--duration", "0.5", "--max-probes", "2",
                   "--min-requests", "5", "--sla-ms", "5000", "--json", str(out), "--quiet"])
        assert rc == 0
        result = json.loads(out.read_text())
        assert result["kind"] == "offload_threshold" and [r["min_items"] for r in result["results"]] == [8, 1025]
        assert all(r["max_qps"] > 0 for r in result["results"])  # a 5 s SLA is met at 20+ qps on any host
        state = ControlClient.from_url(url).get_model("ncf")["accelerator"]
        assert state["min_items"] == result["best_min_items"]  # the best threshold is left set
        assert "left set" in capsys.readouterr().out
        assert main(["bench", "--model", "hera-ncf", "--scale", "1e-4", "--target", url, "--served-name", "ncf",
                     "--tune-offload", "99999", "--duration", "0.5", "--quiet"]) == 2
        assert "refused min_items 99999" in capsys.readouterr().err
        assert main(["bench", "--model", "hera-ncf", "--target", "inprocess", "--tune-offload", "8",
                     "--duration", "0.5"]) == 2  # needs a node's URL
