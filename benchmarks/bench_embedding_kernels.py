"""Embedding-bag kernels on CPU: plain ``nn.EmbeddingBag`` (what ``zoo.DramTable`` uses) vs TorchRec.

Measures pooled lookups per second on the catalogue's table shapes (dim 32/64, pooling 1/20/80/120,
batch 256, 1e5..1e6 rows, several tables per query), fed from the zoo's own input format
(``QueryBatch``: values table-major + lengths ``[T, B]``, which is exactly a KeyedJaggedTensor).

Kernels:
- ``embeddingbag``  one ``nn.EmbeddingBag(mode="sum")`` per table (PyTorch's fbgemm-backed CPU kernel)
- ``eb-fused``      one ``nn.EmbeddingBag`` over all tables' rows stacked (ids shifted per table):
                    table batching in plain PyTorch, one op per query instead of one per table
- ``trec-ebc``      ``torchrec.EmbeddingBagCollection`` (FP32; per-table EmbeddingBag + KJT plumbing)
- ``trec-tbe-fp32`` ``torchrec.quant.EmbeddingBagCollection`` with FP32 rows: fbgemm's batched
                    ``IntNBitTableBatchedEmbeddingBagsCodegen`` inference kernel, all tables in one op
- ``trec-tbe-fp16`` / ``trec-tbe-int8``: the same kernel on FP16 / row-wise INT8 rows (fewer bytes per
                    lookup; changes the model's numbers, so shown for reference, not as drop-ins)

TorchRec is optional: without it only ``embeddingbag`` runs.  Install (pins that load with torch 2.13):
    .venv/bin/pip install --no-deps torchrec==1.9.2 fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics \\
        pyre-extensions typing_inspect mypy_extensions tqdm lightning-utilities cloudpickle orjson \\
        pyvers importlib_metadata==8.7.0 zipp

Run: ``.venv/bin/python -m benchmarks.bench_embedding_kernels [--quick] [--threads 1,2]``
Prints a table and writes ``results/embedding_kernels.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn

from benchmarks import harness
from recserve.zoo.batch import QueryBatch, random_batch

Kernel = Callable[[QueryBatch], torch.Tensor]  # → pooled embeddings [B, T * dim]


@dataclass(frozen=True)
class Shape:
    name: str
    dim: int
    pooling: int
    rows: int
    tables: int

    @property
    def gb(self) -> float:
        return self.rows * self.dim * 4 * self.tables / 1e9


# Table shapes of the catalogue's models (rows capped so two copies of every shape fit in a few GB).
SHAPES = [
    Shape("rm1-like", dim=32, pooling=80, rows=1_000_000, tables=8),
    Shape("rm2-like", dim=64, pooling=120, rows=500_000, tables=8),
    Shape("rm3-like", dim=32, pooling=20, rows=1_000_000, tables=8),
    Shape("wnd-like", dim=32, pooling=1, rows=250_000, tables=26),
    Shape("ncf-like", dim=64, pooling=1, rows=100_000, tables=4),
    Shape("rm1-100k", dim=32, pooling=80, rows=100_000, tables=8),
]
QUICK = [Shape("quick", dim=32, pooling=20, rows=100_000, tables=4)]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def plain_kernel(weights: list[torch.Tensor]) -> Kernel:
    bags = [nn.EmbeddingBag.from_pretrained(w, freeze=True, mode="sum") for w in weights]

    def run(batch: QueryBatch) -> torch.Tensor:
        return torch.cat([bag(i, o) for bag, (i, o) in zip(bags, batch.tables(), strict=True)], dim=1)

    return run


def fused_kernel(weights: list[torch.Tensor]) -> Kernel:
    """All tables of one dim as ONE ``nn.EmbeddingBag`` over stacked rows (ids shifted by each
    table's base row): what fbgemm's table-batched kernel does, in plain PyTorch."""
    bag = nn.EmbeddingBag.from_pretrained(torch.cat(weights), freeze=True, mode="sum")
    base = torch.tensor([0] + [w.shape[0] for w in weights[:-1]]).cumsum(0)
    dim, tables = weights[0].shape[1], len(weights)

    def run(batch: QueryBatch) -> torch.Tensor:
        lengths = batch.lengths.to(torch.int64)
        ids = batch.values + torch.repeat_interleave(base, lengths.sum(dim=1))
        flat = lengths.reshape(-1)
        offsets = torch.zeros_like(flat)
        offsets[1:] = torch.cumsum(flat[:-1], 0)
        pooled = bag(ids, offsets).view(tables, batch.size, dim)
        return pooled.transpose(0, 1).reshape(batch.size, tables * dim)

    return run


def _torchrec_configs(shape: Shape, data_type):  # noqa: ANN001, ANN202 - torchrec types are optional
    from torchrec import EmbeddingBagConfig
    from torchrec.modules.embedding_configs import PoolingType

    return [
        EmbeddingBagConfig(name=f"t{t}", embedding_dim=shape.dim, num_embeddings=shape.rows,
                           feature_names=[f"f{t}"], pooling=PoolingType.SUM, data_type=data_type)
        for t in range(shape.tables)
    ]


def _kjt(batch: QueryBatch):  # noqa: ANN202
    from torchrec import KeyedJaggedTensor

    keys = [f"f{t}" for t in range(batch.num_tables)]
    return KeyedJaggedTensor(keys=keys, values=batch.values, lengths=batch.lengths.reshape(-1).to(torch.int32))


def torchrec_ebc_kernel(shape: Shape, weights: list[torch.Tensor]) -> Kernel:
    from torchrec import EmbeddingBagCollection
    from torchrec.modules.embedding_configs import DataType

    ebc = EmbeddingBagCollection(tables=_torchrec_configs(shape, DataType.FP32), device=torch.device("meta"))
    for t, w in enumerate(weights):  # share the plain kernel's rows: no second FP32 copy
        bag = nn.EmbeddingBag.from_pretrained(w, freeze=True, mode="sum", include_last_offset=True)
        ebc.embedding_bags[f"t{t}"] = bag
    ebc.eval()
    return lambda batch: ebc(_kjt(batch)).values()


def torchrec_tbe_kernel(shape: Shape, weights: list[torch.Tensor], precision: str) -> Kernel:
    from torchrec.modules.embedding_configs import DataType
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as QuantEBC

    data_type = {"fp32": DataType.FP32, "fp16": DataType.FP16, "int8": DataType.INT8}[precision]
    qebc = QuantEBC(tables=_torchrec_configs(shape, data_type), is_weighted=False, device=torch.device("cpu"))
    (tbe,) = qebc._emb_modules
    for t, w in enumerate(weights):
        _load_rows(tbe, t, w, precision)
    return lambda batch: qebc(_kjt(batch)).values()


def _load_rows(tbe, t: int, w: torch.Tensor, precision: str) -> None:  # noqa: ANN001
    """Write FP32 rows into table ``t`` of an fbgemm inference TBE in its storage format."""
    rows, scale_bias = tbe.split_embedding_weights()[t]
    if precision == "fp32":
        rows[:, : w.shape[1] * 4].copy_(w.contiguous().view(torch.uint8))
    elif precision == "fp16":
        rows[:, : w.shape[1] * 2].copy_(w.half().contiguous().view(torch.uint8))
    else:  # row-wise INT8: per-row scale and bias (fp16) in scale_bias
        lo, hi = w.min(dim=1).values, w.max(dim=1).values
        scale = ((hi - lo) / 255.0).clamp_min(1e-12)
        q = torch.round((w - lo[:, None]) / scale[:, None]).clamp(0, 255).to(torch.uint8)
        rows[:, : w.shape[1]].copy_(q)
        scale_bias.copy_(torch.stack([scale, lo], dim=1).half().contiguous().view(torch.uint8))


def time_round_robin(kernels: dict[str, Kernel], batch: QueryBatch, min_time: float,
                     per_round: int = 3) -> dict[str, list[tuple[float, float]]]:
    """Per-call (wall, process CPU) seconds of every kernel, interleaved round by round so that load
    from other processes on a shared machine falls on all kernels alike.  CPU time excludes the time
    this process waited for a core, which on a machine with more runnable threads than cores is
    most of the wall time."""
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in kernels}
    with torch.no_grad():
        for kernel in kernels.values():
            kernel(batch), kernel(batch)
        start = time.perf_counter()
        while time.perf_counter() - start < min_time * len(kernels) or len(times[next(iter(times))]) < 10:
            for name, kernel in kernels.items():
                for _ in range(per_round):
                    c0, t0 = time.process_time(), time.perf_counter()
                    kernel(batch)
                    times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def kernels_for(shape: Shape, weights: list[torch.Tensor], with_torchrec: bool) -> dict[str, Kernel]:
    kernels: dict[str, Kernel] = {"embeddingbag": plain_kernel(weights), "eb-fused": fused_kernel(weights)}
    if with_torchrec:
        kernels["trec-ebc"] = torchrec_ebc_kernel(shape, weights)
        for precision in ("fp32", "fp16", "int8"):
            kernels[f"trec-tbe-{precision}"] = torchrec_tbe_kernel(shape, weights, precision)
    return kernels


def bench_shape(shape: Shape, batch_size: int, threads: list[int], min_time: float, with_torchrec: bool,
                seed: int = 0) -> list[dict]:
    log(f"{shape.name}: allocating {shape.tables} x {shape.rows:,} x {shape.dim} ({shape.gb:.2f} GB FP32)")
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.empty(shape.rows, shape.dim).uniform_(-0.05, 0.05, generator=gen) for _ in range(shape.tables)]
    batch = random_batch(1, (shape.rows,) * shape.tables, (shape.pooling,) * shape.tables, batch_size,
                         rng=seed, fixed=(True,) * shape.tables)
    lookups = batch.values.numel()
    kernels = kernels_for(shape, weights, with_torchrec)
    with torch.no_grad():
        reference = kernels["embeddingbag"](batch)
    errors = {}
    with torch.no_grad():
        for name, kernel in kernels.items():
            errors[name] = float((kernel(batch) - reference).abs().max())
    results = []
    for n in threads:
        torch.set_num_threads(n)
        for name, times in time_round_robin(kernels, batch, min_time).items():
            wall = [w for w, _ in times]
            cpu = statistics.median(c for _, c in times)
            med, best = statistics.median(wall), min(wall)
            row = {**asdict(shape), "batch": batch_size, "kernel": name, "threads": n, "lookups": lookups,
                   "median_ms": med * 1e3, "min_ms": best * 1e3, "cpu_median_ms": cpu * 1e3, "runs": len(times),
                   "mlookups_per_s": lookups / med / 1e6, "mlookups_per_s_best": lookups / best / 1e6,
                   "mlookups_per_cpu_s": lookups / cpu / 1e6, "max_abs_err": errors[name]}
            results.append(row)
            log(f"  {name:14s} threads={n}  wall median {row['median_ms']:8.3f} ms  min {row['min_ms']:8.3f} ms"
                f"  CPU median {row['cpu_median_ms']:8.3f} ms  {row['mlookups_per_cpu_s']:7.1f} M lookups/CPU-s"
                f"  err {errors[name]:.1e}")
    del kernels, weights
    gc.collect()
    return results


def print_table(results: list[dict], key: str, title: str, threads: list[int]) -> None:
    kernels = list(dict.fromkeys(r["kernel"] for r in results))
    cols = [(k, n) for k in kernels for n in threads]
    print(f"{title}, batch {results[0]['batch']}")
    head = ["shape", "dim", "pool", "rows", "T"] + [f"{k}@{n}t" for k, n in cols]
    print("  ".join(f"{h:>14s}" if i >= 5 else f"{h:>9s}" for i, h in enumerate(head)))
    for shape in dict.fromkeys(r["name"] for r in results):
        rows = {(r["kernel"], r["threads"]): r for r in results if r["name"] == shape}
        any_row = next(iter(rows.values()))
        cells = [shape, any_row["dim"], any_row["pooling"], f"{any_row['rows']:.0e}", any_row["tables"]]
        cells += [f"{rows[c][key]:.1f}" if c in rows else "-" for c in cols]
        print("  ".join(f"{c:>14}" if i >= 5 else f"{c!s:>9}" for i, c in enumerate(cells)))
    print()


def has_torchrec() -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchrec  # noqa: F401
        return True
    except Exception as exc:  # noqa: BLE001 - any import failure means: measure without it
        log(f"torchrec not usable ({type(exc).__name__}: {exc}); measuring nn.EmbeddingBag only")
        return False


def headline(results: list[dict]) -> list[dict]:
    """Per shape and batch, 1 thread: nn.EmbeddingBag's M lookups per CPU-s against the best other kernel's."""
    res = [r for r in results if r.get("threads") == 1]
    base = {(r.get("name"), r.get("batch")): r for r in res if r.get("kernel") == "embeddingbag"}
    out = []
    for (shape, batch), r in sorted(base.items(), key=lambda kv: str(kv[0])):
        others = [o for o in res if (o.get("name"), o.get("batch")) == (shape, batch) and o is not r]
        best = max(others, key=lambda o: o.get("mlookups_per_cpu_s") or 0, default={})
        out.append(harness.row(f"nn.EmbeddingBag M lookups per CPU-s, {shape}, batch {batch}, 1 thread (target: best "
                               f"other kernel, {best.get('kernel', 'none')})", r.get("mlookups_per_cpu_s"), "M/s",
                               best.get("mlookups_per_cpu_s")))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", default=f"1,{torch.get_num_threads()}", help="comma-separated thread counts")
    p.add_argument("--min-time", type=float, default=0.5, help="seconds of timed runs per kernel and thread count")
    p.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    p.add_argument("--quick", action="store_true", help="one small shape (smoke run)")
    p.add_argument("--no-torchrec", action="store_true")
    p.add_argument("--out", default="results/embedding_kernels.json")
    args = p.parse_args(argv)
    threads = sorted({int(t) for t in args.threads.split(",")})
    with_torchrec = not args.no_torchrec and has_torchrec()
    load_before = os.getloadavg()
    results = []
    shapes = QUICK if args.quick else [s for s in SHAPES if not args.shapes or s.name in args.shapes.split(",")]
    for shape in shapes:
        results += bench_shape(shape, args.batch, threads, args.min_time, with_torchrec)
    print_table(results, "mlookups_per_cpu_s", "M lookups per CPU-second (median), 1 thread", [1])
    print_table(results, "mlookups_per_s_best", "M lookups/s wall-clock, fastest interleaved run", threads)
    meta = {
        "host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "torchrec": _version("torchrec") if with_torchrec else None, "fbgemm_gpu": _version("fbgemm_gpu"),
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "index_distribution": "uniform",
    }
    out = harness.write_result(args.out, args, headline(results), {"meta": meta, "results": results})
    log(f"wrote {out}")
    return 0


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in (module, module.replace("_", "-"), "fbgemm-gpu-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


if __name__ == "__main__":
    sys.exit(main())
