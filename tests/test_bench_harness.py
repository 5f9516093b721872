"""The benchmarks' harness: one header on every result, run_all reading only that header, benchmarks as modules."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import pytest

from benchmarks import harness, run_all

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
MODULES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem.startswith(("bench_", "stress_")))


def test_write_result_puts_the_common_header_beside_the_body(tmp_path: Path) -> None:
    args = argparse.Namespace(model="m", out=tmp_path / "r.json", batches=[1, 2])
    rows = [harness.row("p50", 1.5, "ms", 3.0), harness.row("count", 4)]
    path = harness.write_result(tmp_path / "sub" / "r.json", args, rows, {"rows": [1, 2]}, benchmark="bench_x")
    data = json.loads(path.read_text())
    head = data["header"]
    assert set(head) == {"benchmark", "commit", "host", "date", "arguments", "headline"}
    assert head["benchmark"] == "bench_x"
    assert head["commit"] != ""
    assert {"hostname", "cpu_model", "cores"} <= set(head["host"])
    assert head["arguments"] == {"model": "m", "out": str(tmp_path / "r.json"), "batches": [1, 2]}
    assert head["headline"] == [{"name": "p50", "value": 1.5, "unit": "ms", "target": 3.0},
                                {"name": "count", "value": 4.0, "unit": ""}]
    assert data["rows"] == [1, 2]
    assert harness.read_header(path) == head
    assert not list(tmp_path.glob("sub/*.partial"))


def test_write_result_refuses_a_body_that_would_hide_the_header(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="header"):
        harness.write_result(tmp_path / "r.json", None, [], {"header": 1})


def test_numpy_values_are_written_as_numbers(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    path = harness.write_result(tmp_path / "r.json", {}, [], {"x": np.float32(0.5), "a": np.arange(2)}, benchmark="b")
    data = json.loads(path.read_text())
    assert data["x"] == 0.5 and data["a"] == [0, 1]


def _result(results: Path, name: str, benchmark: str, headline: list[dict]) -> None:
    harness.write_result(results / name, {}, headline, {"anything": {"deep": [1]}}, benchmark=benchmark)


def test_run_all_tables_the_headline_of_every_result_and_nothing_else(tmp_path: Path) -> None:
    _result(tmp_path, "a.json", "bench_a", [harness.row("qps", 50.0, "QPS", 100.0), harness.row("n", 3)])
    _result(tmp_path, "a_quick.json", "bench_a", [harness.row("qps quick", 10.0, "QPS")])
    (tmp_path / "old.json").write_text(json.dumps({"rows": [1]}))  # before the harness: no header
    (tmp_path / "broken.json").write_text("{")
    benches = [run_all.Bench("a", "bench_a", []), run_all.Bench("b", "bench_b", [])]
    rows = run_all.summarise(benches, tmp_path)
    assert [(r["benchmark"], r["metric"], r["value"], r["ratio"]) for r in rows if r["benchmark"] == "a"] == [
        ("a", "qps", 50.0, 0.5), ("a", "n", 3.0, None), ("a", "qps quick", 10.0, None)]
    assert all(r["status"] == "earlier run" for r in rows if r["benchmark"] == "a")  # not run by this run_all
    (missing,) = [r for r in rows if r["benchmark"] == "b"]
    assert missing["status"] == "missing" and missing["metric"].startswith("MISSING")
    assert "| a | qps *(earlier run," in run_all.markdown(rows)


def test_run_all_marks_this_runs_results_ok_and_failures_failed(tmp_path: Path) -> None:
    ran = run_all.Bench("a", "bench_a", [], state={"status": "ok", "started": 0.0})
    failed = run_all.Bench("b", "bench_b", [], state={"status": "timeout", "detail": "killed after 30 s"})
    _result(tmp_path, "a.json", "bench_a", [harness.row("qps", 1.0)])
    _result(tmp_path, "b.json", "bench_b", [harness.row("qps", 2.0)])
    rows = run_all.summarise([ran, failed], tmp_path)
    assert [(r["benchmark"], r["status"]) for r in rows] == [("a", "ok"), ("b", "timeout")]
    assert rows[1]["metric"].startswith("FAILED: timeout")


def test_run_all_runs_benchmarks_as_modules() -> None:
    assert all(b.command().startswith(".venv/bin/python -m benchmarks.bench_") for b in run_all.suite())
    known = {b.module for b in run_all.suite()}
    assert known <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_writes_through_the_harness_and_leaves_sys_path_alone(name: str) -> None:
    text = (BENCHMARKS / f"{name}.py").read_text()
    assert "harness.write_result(" in text
    assert "sys.path" not in text


@pytest.mark.parametrize("name", MODULES)
def test_every_benchmark_imports_as_a_module(name: str) -> None:
    try:
        importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as exc:  # an optional third-party package (ray, fastapi, ...) is not installed here
        if (exc.name or "").split(".")[0] in ("benchmarks", "recserve", "bench_serving_overhead", "bench_planners",
                                              "bench_perfmodel", "bench_transfer"):
            raise
        pytest.skip(f"{name} needs {exc.name}")
