"""Worker memory of a repository model whose tables come from a memory-mapped safetensors file: 1 vs N workers.

Each worker maps the same file, so its table pages are the page cache's, counted once whatever the worker count:
the node's total PSS (which splits shared pages among the processes mapping them) should grow by far less than
N x the table size.  Every worker is made to touch every table row (queries whose ids cover all rows, sent until
each worker's RSS holds the tables), then RSS / PSS per worker are read from /proc/<pid>/smaps_rollup.

Prints a table and writes results/repository_pss.json.  Usage:
    .venv/bin/python -m benchmarks.bench_repository_pss [--rows 250000] [--dim 64] [--tables 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import tritonclient.http as thttp

from benchmarks import harness
from recserve.serving.node.config import NodeConfig
from recserve.serving.node.control_client import ControlClient
from recserve.specs import model_from_dict
from recserve.zoo import FAMILY_CLASSES
from recserve.zoo.artifacts import write_version

DTYPE_NAMES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_repository(root: Path, rows: int, dim: int, tables: int) -> float:
    """One DLRM with ``tables`` tables of ``rows`` x ``dim``; returns the table size in MB."""
    spec = model_from_dict("big", dict(family="dlrm", dense_in=16, bottom_mlp=[64, dim], top_mlp=[64, 1],
                                       interaction="dot", sla=dict(target_ms=50),
                                       tables=[dict(name="t", rows=rows, dim=dim, pooling=1, repeat=tables)]))
    torch.manual_seed(0)
    write_version(FAMILY_CLASSES["dlrm"](spec, (rows,) * tables).eval(), root / "big", 1, "safetensors")
    return spec.embedding_bytes / 2**20


def covering_inputs(rows: int, tables: int, bags: int = 1000) -> list[thttp.InferInput]:
    """One query whose bags hold every row id of every table."""
    per_bag = -(-rows // bags)
    ids = np.arange(bags * per_bag, dtype=np.int64) % rows
    arrays = {"dense": np.zeros((bags, 16), np.float32), "sparse_values": np.tile(ids, tables),
              "sparse_lengths": np.full((tables, bags), per_bag, np.int32)}
    inputs = []
    for name, arr in arrays.items():
        x = thttp.InferInput(name, list(arr.shape), DTYPE_NAMES[arr.dtype])
        x.set_data_from_numpy(arr)
        inputs.append(x)
    return inputs


def measure(root: Path, workers: int, rows: int, tables: int, table_mb: float) -> dict:
    (root / "big" / "config.yaml").write_text(f"workers: {workers}\nmax_query_size: 1000\nqueue_limit: 64\n")
    with harness.node(NodeConfig(models=[], repository=str(root), max_body_bytes=256 * 2**20)) as server:
        ports = server.ports
        control = ControlClient("127.0.0.1", ports.http)
        inputs = covering_inputs(rows, tables)
        deadline = time.monotonic() + 120
        while True:  # new connections land on whichever worker accepts: send until every worker touched all rows
            with thttp.InferenceServerClient(f"127.0.0.1:{ports.http}", network_timeout=120) as client:
                client.infer("big", inputs)
            detail = control.get_model("big")["stages"]["model"]["worker_detail"]
            if all(w["rss_mb"] >= 0.95 * table_mb for w in detail) or time.monotonic() > deadline:
                break
        server_pss = control.get_model("big")
        detail = server_pss["stages"]["model"]["worker_detail"]
        return {"workers": workers, "table_mb": round(table_mb, 1),
                "rss_mb": [round(w["rss_mb"], 1) for w in detail], "pss_mb": [round(w["pss_mb"], 1) for w in detail],
                "total_pss_mb": round(sum(w["pss_mb"] for w in detail), 1),
                "every_worker_touched_all_rows": all(w["rss_mb"] >= 0.95 * table_mb for w in detail)}


def headline(result: dict) -> list[dict]:
    """Total PSS growth from 1 to N workers, as a share of N-1 more copies of the tables (shared: near 0)."""
    return [harness.row("repository model PSS growth / extra table copies", result["pss_growth_vs_copies"],
                        "fraction"),
            harness.row("repository model PSS growth, 1 -> N workers", result["pss_growth_mb"], "MB")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="results/repository_pss.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        table_mb = make_repository(root, args.rows, args.dim, args.tables)
        log(f"tables: {args.tables} x {args.rows} x {args.dim} FP32 = {table_mb:.1f} MB "
            f"in {root}/big/1/model.safetensors")
        runs = [measure(root, n, args.rows, args.tables, table_mb) for n in (1, args.workers)]
    one, many = runs
    growth = many["total_pss_mb"] - one["total_pss_mb"]
    result = {"runs": runs, "pss_growth_mb": round(growth, 1),
              "pss_growth_vs_copies": round(growth / ((args.workers - 1) * table_mb), 3)}
    print(f"{'workers':>7}  {'table MB':>8}  {'RSS MB per worker':<24}  {'PSS MB per worker':<24}  total PSS MB")
    for r in runs:
        print(f"{r['workers']:>7}  {r['table_mb']:>8}  {str(r['rss_mb']):<24}  {str(r['pss_mb']):<24}  "
              f"{r['total_pss_mb']}")
    print(f"total PSS grew {growth:.1f} MB from 1 to {args.workers} workers; "
          f"{args.workers - 1} more copies would be {(args.workers - 1) * table_mb:.1f} MB "
          f"(ratio {result['pss_growth_vs_copies']})")
    out = harness.write_result(args.out, args, headline(result), result)
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
