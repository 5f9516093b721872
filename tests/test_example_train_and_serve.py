"""The worked example (examples/train_and_serve/), shortened: train, export both ways, serve, query."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_and_serve" / "train_and_serve.py"


def test_train_export_serve_and_query_a_small_dlrm(tmp_path):
    spec = importlib.util.spec_from_file_location("train_and_serve", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    summary = example.main(["--out", str(tmp_path), "--samples", "60000", "--test-samples", "3000", "--epochs", "1"])
    assert summary["auc_ground_truth"] > 0.85  # the rule separates clicks well
    assert 0.6 < summary["auc_model"] <= summary["auc_ground_truth"] + 0.02
    assert set(summary["served"]) == {f"{m} {p}" for m in ("ctr", "ctr_pt2", "ctr_ts") for p in ("http", "grpc")}
    for result in summary["served"].values():
        assert result["max_abs_diff"] <= 1e-6
        assert abs(result["auc"] - summary["auc_model"]) < 1e-6
    assert (tmp_path / "repo" / "ctr" / "1" / "spec.yaml").exists()
