"""Forward cost of every catalogue model in the live zoo: sparse and dense CPU time per query.

One thread (as one serving worker runs), tables at ``--scale``, uniform ids.  Times are process CPU
time (median over runs), which stays meaningful on a machine shared with other jobs; wall-clock
medians are in the JSON too.

``--fused`` adds the sparse part with the tables fused in place (``RecModel.fuse_tables``: one lookup per embedding
width, what a node's CPU workers run) beside the per-table one, timed in alternation.  ``--direct`` likewise adds
the dense part with its MLPs run direct (``RecModel.direct_layers``, what the workers run too).

Run: ``.venv/bin/python -m benchmarks.bench_zoo [--batch 1,256] [--models a,b] [--scale 1e-3] [--fused] [--direct]``
Prints a table and writes ``results/zoo_forward.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial

import torch

from benchmarks import harness
from recserve.specs import catalogue_models
from recserve.zoo import build, sample_batch
from recserve.zoo.flops import dense_flops_per_item

MAX_MFLOP_PER_ITEM = 40.0  # skip models (SDM M2, M3) whose dense part alone takes seconds per query here


def cpu_times(fn, min_time: float, min_runs: int = 3) -> tuple[float, float]:  # noqa: ANN001
    fn()
    cpu, wall = [], []
    start = time.perf_counter()
    while len(cpu) < min_runs or time.perf_counter() - start < min_time:
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu), statistics.median(wall)


def alternating(plain, other, min_time: float, rounds: int = 3):  # noqa: ANN001, ANN201
    """``plain``'s (CPU, wall) medians, and ``other``'s CPU median (None without ``other``), timed in alternating
    rounds so a drifting host moves both alike."""
    if other is None:
        return cpu_times(plain, min_time), None
    first, second = [], []
    for _ in range(rounds):
        first.append(cpu_times(plain, min_time / rounds))
        second.append(cpu_times(other, min_time / rounds)[0])
    return (statistics.median(c for c, _ in first), statistics.median(w for _, w in first)), \
        statistics.median(second)


def headline(rows: list[dict]) -> list[dict]:
    """Per batch size: the slowest model's forward CPU ms per query (sparse + dense)."""
    out = []
    for b in sorted({r.get("batch") for r in rows if isinstance(r.get("batch"), int)}):
        at_b = [r for r in rows if r.get("batch") == b]
        ms = [(harness.num(r.get("sparse_cpu_ms")) or 0.0) + (harness.num(r.get("dense_cpu_ms")) or 0.0) for r in at_b]
        slowest_ms, slowest = max(zip(ms, at_b, strict=True), key=lambda x: x[0])
        out.append(harness.row(f"forward CPU ms per query, batch {b}, slowest of {len(at_b)} models "
                               f"({slowest.get('model')})", slowest_ms, "ms"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,256")
    p.add_argument("--models", default="", help="comma-separated catalogue names (default: all)")
    p.add_argument("--scale", type=float, default=1e-3)
    p.add_argument("--min-time", type=float, default=0.5)
    p.add_argument("--out", default="results/zoo_forward.json")
    p.add_argument("--fused", action="store_true", help="also time the sparse part with the tables fused in place")
    p.add_argument("--direct", action="store_true", help="also time the dense part with its MLPs run direct")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batch.split(",")]
    names = [n for n in catalogue_models() if not args.models or n in args.models.split(",")]
    rows = []
    print(f"{'model':16s} {'family':6s} {'MFLOP/item':>10s} " + " ".join(
        f"{'B=' + str(b) + ' sparse ms':>15s}" + (f" {'fused':>7s}" if args.fused else "") + f" {'dense ms':>9s}"
        + (f" {'direct':>7s}" if args.direct else "") for b in batches))
    for name in names:
        spec = catalogue_models()[name]
        flops = dense_flops_per_item(spec)
        if flops / 1e6 > MAX_MFLOP_PER_ITEM:
            print(f"{name:16s} skipped: {flops / 1e6:,.0f} MFLOP/item", file=sys.stderr)
            continue
        model = build(spec, scale=args.scale)
        fused = None
        if args.fused:
            fused = build(spec, scale=args.scale)
            fused.fuse_tables()
        direct = None
        if args.direct:
            direct = build(spec, scale=args.scale)
            direct.direct_layers()
        cells = []
        for b in batches:
            batch = sample_batch(model, b, rng=b)
            with torch.no_grad():
                pooled = model.sparse(batch)
                sparse, fused_ms = alternating(partial(model.sparse, batch),
                                               partial(fused.sparse, batch) if fused is not None else None,
                                               args.min_time)
                dense, direct_ms = alternating(partial(model.dense, batch.dense, pooled),
                                               partial(direct.dense, batch.dense, pooled) if direct is not None
                                               else None, args.min_time)
            row = {"model": name, "family": spec.family, "batch": b, "scale": args.scale,
                   "mflop_per_item": flops / 1e6, "sparse_cpu_ms": sparse[0] * 1e3,
                   "dense_cpu_ms": dense[0] * 1e3, "sparse_wall_ms": sparse[1] * 1e3,
                   "dense_wall_ms": dense[1] * 1e3}
            if fused_ms is not None:
                row["fused_sparse_cpu_ms"] = fused_ms * 1e3
            if direct_ms is not None:
                row["direct_dense_cpu_ms"] = direct_ms * 1e3
            rows.append(row)
            cells.append(f"{sparse[0] * 1e3:15.2f}" + (f" {fused_ms * 1e3:7.2f}" if fused_ms is not None else "")
                         + f" {dense[0] * 1e3:9.2f}" + (f" {direct_ms * 1e3:7.2f}" if direct_ms is not None else ""))
        print(f"{name:16s} {spec.family:6s} {flops / 1e6:10.2f} " + " ".join(cells), flush=True)
    out = harness.write_result(args.out, args, headline(rows), {"threads": 1, "results": rows})
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
