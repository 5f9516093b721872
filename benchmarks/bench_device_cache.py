"""Device row cache (zoo/device_cache.py, issue #16): what it costs on the host and how often it hits.

Two measurements on the host (they need no GPU and claim nothing about one), and one on a device:

- ``cost``: host-side time per query of ``DeviceTableCache.prepare`` (global ids, remap to device slots, sampled
  counting, misses deduplicated and gathered into the spare region) at each batch size, per budget, on queries
  drawn from ``--sampler`` after ``--warm`` other queries were counted and their hot rows cached; beside it
  ``remap`` = the global ids + ``np.take`` alone (the floor of any host-side remap), the rows gathered per query,
  and the bytes a pass would copy to the device: cached (dense + int32 slots + lengths + missed rows) against
  today's whole-table path (dense + int64 ids + lengths), and the device memory the cache's weights then take
  (cached rows + the spare region, which grows to the passes' distinct misses) against the tables' bytes.  With
  device ``cpu`` the gather writes into the cache's host-side "device" weight; on a GPU it writes a pinned buffer
  of the same size and the copy is queued, so the host work is the same; the copy itself is not measured.
- ``hit``: share of lookups served from the cache vs budget (share of the tables' bytes) for the catalogue's index
  samplers (hot rows scattered over the ids): ``prefix`` = the initial cache (a prefix of every table), ``counted``
  = after ``--warm`` queries counted and one refresh, ``online`` = serving with the default refresh policy (second
  half of ``--online`` queries), ``oracle`` = the truly hottest rows (from the sampler's own rank order).
- ``pass`` (with ``--device cuda``): the whole accelerator pass (``device_runner``: prepare, copies, device pass,
  scores back) per budget against whole tables on the device, and its max abs difference from the CPU model.

    .venv/bin/python -m benchmarks.bench_device_cache                      # hera-dlrm-a @ 0.01, batches 1,256,4096
    .venv/bin/python -m benchmarks.bench_device_cache --model hercules-rmc2 --batches 1,256
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.commands._plan_common import int_list
from recserve.specs import catalogue_models
from recserve.workload.indices import index_sampler
from recserve.zoo import build, sample_batch
from recserve.zoo.device_cache import DeviceTableCache


def table_bytes(model: Any) -> int:
    return sum(t.weight.numel() * t.weight.element_size() for t in model.tables)


def queries(model: Any, batch: int, count: int, sampler: Any, seed: int) -> list[tuple[np.ndarray, ...]]:
    out = []
    for i in range(count):
        b = sample_batch(model, batch, rng=seed + i, sampler=sampler)
        out.append((b.dense.numpy(), b.values.numpy(), b.lengths.numpy()))
    return out


def cost(model: Any, args: argparse.Namespace, sampler: Any) -> list[dict[str, Any]]:
    rows = []
    total = table_bytes(model)
    warm = queries(model, args.hit_batch, args.warm, sampler, seed=10_000)
    for batch in args.batches:
        pool = queries(model, batch, args.pool, sampler, seed=batch)
        reps = max(3, min(args.reps, int(args.ids_budget // max(1, pool[0][1].size))))
        for share in args.budgets:
            cache = DeviceTableCache(model, "cpu", share * total)
            if cache.whole:  # a pass does no host work: the ids are resolved on the device (FusedModel's path)
                print(f"  batch {batch:5d}  budget {share:5.0%}  whole tables cached: no host-side work per query")
                rows.append({"batch": batch, "budget_share": share, "whole": True, "prepare_us": 0.0})
                continue
            for _, values, lengths in warm:  # other queries counted, their hot rows cached: the steady state
                cache.observe(values, lengths)
            cache.refresh()
            gathered, lookups, hits = cache.gathered, cache.lookups, cache.hits
            times, floor = [], []
            for r in range(reps):
                dense, values, lengths = pool[r % len(pool)]
                start = time.perf_counter()
                cache.prepare(values, lengths)
                times.append(time.perf_counter() - start)
                start = time.perf_counter()
                np.take(cache.remap, cache._global_ids(values, lengths))
                floor.append(time.perf_counter() - start)
            missed = (cache.gathered - gathered) / reps
            width_bytes = cache.host[0].shape[1] * cache.host[0].element_size()
            dense, values, lengths = pool[0]
            today = dense.nbytes + values.size * 8 + lengths.nbytes
            cached = dense.nbytes + values.size * 4 + lengths.nbytes + missed * width_bytes
            row = {"batch": batch, "budget_share": share, "ids": int(values.size), "reps": reps,
                   "prepare_us": 1e6 * statistics.median(times), "prepare_us_min": 1e6 * min(times),
                   "remap_floor_us": 1e6 * statistics.median(floor),
                   "hit_rate": (cache.hits - hits) / max(1, cache.lookups - lookups), "gathered_rows": missed,
                   "h2d_bytes_cached": cached, "h2d_bytes_whole_tables": today,
                   "device_bytes": cache.device_bytes(), "table_bytes": total}
            rows.append(row)
            print(f"  batch {batch:5d}  budget {share:5.0%}  ids {values.size:9d}"
                  f"  prepare {row['prepare_us']:9.1f} us (min {row['prepare_us_min']:9.1f})"
                  f"  (remap floor {row['remap_floor_us']:9.1f} us)  hit {row['hit_rate']:.3f}"
                  f"  rows gathered {missed:9.0f}  to device {cached / 1e6:8.2f} MB (whole tables: {today / 1e6:.2f})"
                  f"  device memory {cache.device_bytes() / 1e6:.1f} MB (tables {total / 1e6:.1f})")
    return rows


def oracle_rows(cache: DeviceTableCache, model: Any, sampler: Any) -> list[np.ndarray]:
    """Per group, each table's truly hottest rows (its pro-rata share of the group's capacity)."""
    out = []
    for g in range(len(cache.host)):
        group_rows = int(cache.host[g].shape[0])
        parts = []
        for t in np.flatnonzero(cache.table_group == g):
            rows_t = model.rows[t]
            take = int(cache.capacity[g] * rows_t / group_rows)
            parts.append(cache.table_first[t] + sampler.rank_to_row(np.arange(take), rows_t))
        out.append(np.concatenate(parts) if parts else np.empty(0, np.int64))
    return out


def hit_rates(model: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    total = table_bytes(model)
    for spec in args.samplers:
        sampler = index_sampler(spec)
        warm = queries(model, args.hit_batch, args.warm, sampler, seed=10_000)
        test = queries(model, args.hit_batch, args.test, sampler, seed=20_000)
        online = queries(model, args.hit_batch, args.online, sampler, seed=30_000)

        def rate(cache: DeviceTableCache, pool: list) -> float:
            lookups, hits = cache.lookups, cache.hits
            for _, values, lengths in pool:
                cache.prepare(values, lengths)
            return (cache.hits - hits) / max(1, cache.lookups - lookups)

        for share in args.budgets:
            cache = DeviceTableCache(model, "cpu", share * total, refresh_ids=10**15)
            prefix = rate(cache, test)
            for _, values, lengths in warm:
                cache.observe(values, lengths)
            start = time.perf_counter()
            copied = cache.refresh()
            refresh_ms = 1e3 * (time.perf_counter() - start)
            counted = rate(cache, test)
            live = DeviceTableCache(model, "cpu", share * total)
            rate(live, online[:len(online) // 2])
            steady = rate(live, online[len(online) // 2:])
            oracle = None
            if hasattr(sampler, "rank_to_row"):
                best = DeviceTableCache(model, "cpu", share * total, refresh_ids=10**15)
                for g, chosen in enumerate(oracle_rows(best, model, sampler)):
                    best._install(g, chosen)
                oracle = rate(best, test)
            row = {"sampler": spec, "budget_share": share, "prefix": prefix, "counted": counted, "online": steady,
                   "oracle": oracle, "refresh_ms": refresh_ms, "refresh_rows_copied": copied,
                   "online_refreshes": live.refreshes}
            rows.append(row)
            print(f"  {spec:18s} budget {share:5.0%}  prefix {prefix:.3f}  counted {counted:.3f}  online {steady:.3f}"
                  f"  oracle {'-' if oracle is None else f'{oracle:.3f}'}  refresh {refresh_ms:7.1f} ms"
                  f" ({copied} rows)")
    return rows


def device_pass(model: Any, args: argparse.Namespace, sampler: Any) -> list[dict[str, Any]]:
    """The whole accelerator pass on ``--device`` (``serving.accel.device_runner``: host prepare, copies, device
    pass, scores back) with whole tables on the device vs each budget, and the max abs difference of its scores
    from the in-process CPU model: what the cache costs where it runs, not only its host side."""
    from recserve.serving.worker.accel import device_runner
    from recserve.zoo.batch import QueryBatch

    rows, total = [], table_bytes(model)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    warm = queries(model, args.hit_batch, args.warm, sampler, seed=10_000)
    for share in args.budgets:
        budget_mb = None if share >= 1 else share * total / 2**20
        runner = device_runner(copy.deepcopy(model), args.device, table_mb=budget_mb)
        for arrays in warm:  # counted and (for a budget) refreshed: the steady state
            runner(arrays)
        for batch in args.batches:
            pool = queries(model, batch, args.pool, sampler, seed=batch)
            reps = max(3, min(args.reps, int(args.ids_budget // max(1, pool[0][1].size))))
            diff = max(float(np.abs(runner(q) - model(QueryBatch(*(torch.from_numpy(a) for a in q))).numpy()).max())
                       for q in pool)
            times = []
            for r in range(reps):
                sync()
                start = time.perf_counter()
                runner(pool[r % len(pool)])
                times.append(time.perf_counter() - start)
            row = {"batch": batch, "budget_share": share, "reps": reps, "pass_ms": 1e3 * statistics.median(times),
                   "pass_ms_min": 1e3 * min(times), "max_abs_diff_vs_cpu": diff}
            rows.append(row)
            print(f"  batch {batch:5d}  budget {'whole' if share >= 1 else f'{share:.0%}':>6}  pass "
                  f"{row['pass_ms']:8.3f} ms (min {row['pass_ms_min']:8.3f})  max abs diff vs CPU {diff:.2e}")
    return rows


def headline(result: dict) -> list[dict]:
    """Host-side remap + gather us per query at each batch, at the largest budget measured."""
    rows = harness.dig(result, "cost", "rows") or []
    out = []
    for batch in sorted({r["batch"] for r in rows}):
        r = max((r for r in rows if r["batch"] == batch), key=lambda r: r["budget_share"])
        out.append(harness.row(f"device cache host-side us per query, batch {batch}, budget {r['budget_share']:.0%}",
                               r.get("prepare_us"), "us"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hera-dlrm-a")
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--batches", type=int_list, default=[1, 256, 4096])
    parser.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.1, 0.5, 2.0],
                        help="device budgets as shares of the tables' bytes (>= 1: whole tables)")
    parser.add_argument("--sampler", default="zipf:alpha=1.05", help="index sampler of the cost queries")
    parser.add_argument("--samplers", type=lambda s: s.split(","), default=["uniform", "locality:p=0.9",
                                                                              "zipf:alpha=1.05"])
    parser.add_argument("--pool", type=int, default=4, help="distinct queries per batch size (cost)")
    parser.add_argument("--reps", type=int, default=200, help="timed prepares per point, at most")
    parser.add_argument("--ids-budget", type=float, default=5e7, help="fewer reps at large batches: ids per point")
    parser.add_argument("--hit-batch", type=int, default=256)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--test", type=int, default=20)
    parser.add_argument("--online", type=int, default=200)
    parser.add_argument("--skip", choices=("cost", "hit", "pass"), action="append", default=[])
    parser.add_argument("--device", default="",
                        help="also time the whole accelerator pass on this device (cuda, cuda:N, cpu) for each "
                             "budget against whole tables, and check its scores against the CPU model")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (an accelerator worker's accelerator.threads, default 1)")
    parser.add_argument("--out", type=Path, default=None, help="default: results/device_cache_<model>.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build(catalogue_models()[args.model], scale=args.scale).eval()
    print(f"{args.model} @ {args.scale}: {len(model.tables)} tables, {sum(model.rows):,} rows, "
          f"{table_bytes(model) / 2**20:.1f} MiB; cost and hit on the host (device cpu)"
          + (f", whole passes on {args.device}" if args.device else ", no device pass measured"))
    result: dict[str, Any] = {"model": args.model, "scale": args.scale, "threads": args.threads,
                              "rows": int(sum(model.rows)),
                              "table_bytes": table_bytes(model), "device": "cpu (cost, hit: host side)"}
    if "cost" not in args.skip:
        print(f"host-side cost per query ({args.sampler}):")
        result["cost"] = {"sampler": args.sampler, "rows": cost(model, args, index_sampler(args.sampler))}
    if "hit" not in args.skip:
        print(f"hit rate vs budget (batch {args.hit_batch}):")
        result["hit"] = {"batch": args.hit_batch, "warm": args.warm, "test": args.test, "online": args.online,
                         "rows": hit_rates(model, args)}
    if args.device and "pass" not in args.skip:
        print(f"whole pass on {args.device} ({args.sampler}):")
        with torch.inference_mode():
            result["pass"] = {"device": args.device, "sampler": args.sampler,
                              "rows": device_pass(model, args, index_sampler(args.sampler))}
    args.out = args.out or ROOT / "results" / f"device_cache_{args.model}.json"
    harness.write_result(args.out, args, headline(result), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
