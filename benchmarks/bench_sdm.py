"""Software Defined Memory on this host: SSD-tiered user tables behind DRAM caches vs all-DRAM.

Prints and writes ``results/sdm.json`` (and ``results/sdm.png``):

1. raw device reads: IOPS and latency of aligned 512 B O_DIRECT reads, io_uring vs thread pool, by queue depth;
2. row-cache policies (LRU / CLOCK / LFU) and hit rate vs cache size for locality P = 0.5 and 0.9;
3. pooled-embedding cache hit rate vs ``min_len`` (recurring users whose histories drift);
4. a scaled DLRM whose user tables are larger than the DRAM budget: p95 latency and max load (open-loop Poisson,
   in process, one worker) all-DRAM vs tiered with two cache sizes; read amplification; DRAM saved.

Table files go under ``--dir`` (default ``./.sdm_bench`` on the repository's disk: /tmp may be tmpfs, where
O_DIRECT is refused and the fallback would be measured instead).

    .venv/bin/python -m benchmarks.bench_sdm            # ~25 min on the shared 2-core host
    .venv/bin/python -m benchmarks.bench_sdm --quick    # ~5 min
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from recserve.embedding.blockio import BlockReader, io_uring_available
from recserve.embedding.row_index import available, slot_overhead_bytes
from recserve.embedding.rowcache import POLICIES, PooledCache, RowCache, bag_keys
from recserve.embedding.tablefile import write_table
from recserve.embedding.tiered import tier_model, tier_stats
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import QueryBatch, build

try:  # the team's workload generators; a local equivalent otherwise
    from recserve.workload import LocalitySampler, ZipfSampler, zipf_alpha_for_locality

    def locality_sampler(p: float):
        return LocalitySampler(p=p)

    def zipf_sampler(p: float, rows: int):
        return ZipfSampler(alpha=zipf_alpha_for_locality(p, rows))

    SAMPLER_SOURCE = "recserve.workload.LocalitySampler (two-level) and ZipfSampler (alpha matched to P)"
except ImportError:  # pragma: no cover - depends on the tree
    zipf_sampler = None

    def locality_sampler(p: float):
        def sample(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
            hot = max(1, rows // 10)
            perm = np.random.default_rng(rows).permutation(rows)
            ranks = np.where(rng.random(n) < p, rng.integers(0, hot, n), rng.integers(hot, rows, n))
            return perm[ranks]
        return sample

    SAMPLER_SOURCE = "local two-level generator (top 10% rows get share P)"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- 1. raw reads


def bench_raw_io(directory: Path, quick: bool) -> list[dict]:
    path = directory / "raw.tbl"
    rows = 400_000
    write_table(path, np.zeros((rows, 32), dtype=np.float32), "fp32")
    rng = np.random.default_rng(0)
    out = []
    engines = ["threads"] + (["io_uring"] if io_uring_available() else [])
    n = 1000 if quick else 3000
    for engine in engines:
        for depth in (1, 8, 32):
            reader = BlockReader(path, 512, engine, depth)
            offsets = np.unique(4096 + rng.integers(0, rows, n) * 128 // 512 * 512)
            t0, c0 = time.perf_counter(), time.process_time()
            reader.read(offsets)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            out.append({"engine": engine, "mode": reader.mode, "queue_depth": depth, "ios": int(offsets.size),
                        "iops": offsets.size / dt, "us_per_io": dt / offsets.size * 1e6,
                        "cpu_us_per_io": dc / offsets.size * 1e6})
            reader.close()
            log(f"  raw {engine:8s} qd={depth:2d} {reader.mode}: {out[-1]['iops']:,.0f} IOPS")
    path.unlink()
    return out


# ---------------------------------------------------------------- 2. row cache


def query_ids(sampler, rows: int, pooling: int, queries: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Distinct ids of one user table per query (user batch = 1)."""
    return [np.unique(sampler(rows, pooling, rng)) for _ in range(queries)]


def run_cache(stream: list[np.ndarray], slots: int, policy: str, warm: int,
              index: str = "dict") -> tuple[float, float, float]:
    """(hit rate, wall µs/query, CPU µs/query) after ``warm`` queries; CPU time is robust to a busy host."""
    cache = RowCache(slots * 16, 16, policy, index=index)
    payload = np.zeros((4096, 16), dtype=np.uint8)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, ids in enumerate(stream):
        if i == warm:
            cache.reset_stats()
            t0, c0 = time.perf_counter(), time.process_time()
        found = cache.lookup(ids)
        miss = ids[found < 0]
        cache.insert(miss, payload[: miss.size])
    n = max(1, len(stream) - warm)
    return cache.hit_rate, (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def bench_row_cache(quick: bool) -> dict:
    rows, pooling = 100_000, 40  # small enough that the stream reaches steady state (≈ 20+ touches per hot row)
    queries = 3000 if quick else 8000
    warm = queries // 3
    fractions = [0.01, 0.05, 0.1, 0.2] if quick else [0.01, 0.02, 0.05, 0.1, 0.2]
    out: dict = {"rows": rows, "pooling": pooling, "queries": queries, "warmup_queries": warm,
                 "sampler": SAMPLER_SOURCE, "curves": []}
    streams = [("two-level", p, locality_sampler(p)) for p in (0.5, 0.9)]
    if zipf_sampler is not None:
        streams += [("zipf", p, zipf_sampler(p, rows)) for p in (0.5, 0.9)]
    for dist, p, sampler in streams:
        stream = query_ids(sampler, rows, pooling, queries, np.random.default_rng(1))
        for policy in POLICIES:
            for f in fractions:
                hit, us, cpu = run_cache(stream, int(rows * f), policy, warm)
                out["curves"].append({"distribution": dist, "locality": p, "policy": policy, "cache_fraction": f,
                                      "hit_rate": hit, "us_per_query": us, "cpu_us_per_query": cpu})
                log(f"  cache {dist} P={p} {policy:5s} {f:5.0%}: hit {hit:.3f}  {cpu:.0f} CPU us/query")
        if dist == "two-level" and p == 0.9:
            out["index"] = []
            for index in ("dict", "native") if available()[0] else ("dict",):
                for policy in POLICIES:
                    hit, us, cpu = run_cache(stream, int(rows * 0.05), policy, warm, index)
                    overhead = slot_overhead_bytes(policy, index)
                    out["index"].append({"index": index, "policy": policy, "cache_fraction": 0.05, "hit_rate": hit,
                                         "cpu_us_per_query": cpu, "slot_overhead_bytes": overhead})
                    log(f"  index {index:6s} {policy:5s}: {cpu:.0f} CPU us/query, {overhead:.0f} B beside each row")
    return out


# ---------------------------------------------------------------- 3. pooled cache


def bench_pooled(quick: bool) -> dict:
    """Recurring users (locality 0.9 over users) whose histories drift between visits: each id is replaced with
    probability ``drift`` per visit, so a long history repeats exactly less often than a short one."""
    rng = np.random.default_rng(2)
    users, rows = 20_000, 1_000_000
    visits = 10_000 if quick else 60_000
    drift = 0.01
    lengths = np.clip(rng.geometric(1 / 20, users), 1, 120)
    history = [rng.integers(0, rows, n) for n in lengths]
    who = locality_sampler(0.9)(users, visits, rng)
    out = {"users": users, "visits": visits, "drift": drift, "mean_len": float(lengths.mean()), "points": []}
    for min_len in (1, 4, 8, 16, 32):
        cache = PooledCache(64 * 2**20, min_len)
        hist = [h.copy() for h in history]
        r2 = np.random.default_rng(3)
        hit_len, eligible = [], 0
        vec = torch.zeros(32)
        for u in who:
            h = hist[u]
            changed = r2.random(h.size) < drift
            if changed.any():
                h[changed] = r2.integers(0, rows, int(changed.sum()))
            if h.size < min_len:
                continue
            eligible += 1
            hi, lo = bag_keys(h, np.zeros(1, dtype=np.int64), 0)
            key = (int(hi[0]), int(lo[0]))
            if cache.get(key) is not None:
                hit_len.append(h.size)
            else:
                cache.put(key, vec)
        point = {"min_len": min_len, "hit_rate_all_bags": len(hit_len) / visits,
                 "hit_rate_eligible": len(hit_len) / max(1, eligible), "hit_avg_len": float(np.mean(hit_len or [0]))}
        out["points"].append(point)
        log(f"  pooled min_len={min_len:2d}: hit {point['hit_rate_all_bags']:.3f} of all bags, "
            f"avg hit len {point['hit_avg_len']:.1f}")
    return out


# ---------------------------------------------------------------- 4. end to end


def bench_spec(user_rows: int) -> ModelSpec:
    tables = (
        TableSpec("user", user_rows, 32, pooling=40, side="user"),
        TableSpec("user_b", user_rows, 32, pooling=40, side="user"),
        TableSpec("user_c", user_rows, 32, pooling=40, side="user"),
        TableSpec("user_d", user_rows, 32, pooling=40, side="user"),
        TableSpec("user_e", user_rows, 32, pooling=40, side="user"),
        TableSpec("user_f", user_rows, 32, pooling=40, side="user"),
        TableSpec("item_a", 200_000, 32, pooling=8, side="item"),
        TableSpec("item_b", 200_000, 32, pooling=8, side="item"),
    )
    return ModelSpec("sdm-bench", "dlrm", 16, tables, "concat", SLA(50.0), bottom_mlp=(128, 64),
                     top_mlp=(256, 64, 1))


def make_queries(spec: ModelSpec, n: int, items: int, p: float, seed: int) -> list[QueryBatch]:
    """One user (same user bag for all candidates: user batch 1) × ``items`` candidates per query."""
    rng = np.random.default_rng(seed)
    sampler = locality_sampler(p)
    out = []
    for _ in range(n):
        lengths = np.empty((len(spec.tables), items), dtype=np.int32)
        values = []
        for t, tab in enumerate(spec.tables):
            if tab.side == "user":
                bag = sampler(tab.rows, tab.pooling, rng)
                lengths[t] = tab.pooling
                values.append(np.tile(bag, items))
            else:
                lengths[t] = tab.pooling
                values.append(sampler(tab.rows, tab.pooling * items, rng))
        dense = rng.standard_normal((items, spec.dense_in), dtype=np.float32)
        out.append(QueryBatch(torch.from_numpy(dense), torch.from_numpy(np.concatenate(values)),
                              torch.from_numpy(lengths)))
    return out


class QueryStream:
    """Fresh queries for every run (replaying the same queries would inflate cache hit rates)."""

    def __init__(self, spec: ModelSpec, items: int, p: float, seed: int) -> None:
        self.spec, self.items, self.p, self.seed = spec, items, p, seed

    def take(self, n: int) -> list[QueryBatch]:
        self.seed += 1
        return make_queries(self.spec, n, self.items, self.p, self.seed)


def open_loop(model, queries: list[QueryBatch], rate: float, seed: int) -> np.ndarray:
    """One worker, FIFO, Poisson arrivals at ``rate`` in real time; per-query latency (s)."""
    gaps = np.random.default_rng(seed).exponential(1 / rate, len(queries))
    arrivals = np.cumsum(gaps)
    start = time.perf_counter()
    free_at = 0.0
    lat = np.empty(len(queries))
    with torch.no_grad():
        for i, q in enumerate(queries):
            now = time.perf_counter() - start
            if now < arrivals[i]:
                time.sleep(arrivals[i] - now)
            model(q)
            free_at = time.perf_counter() - start
            lat[i] = free_at - arrivals[i]
    return lat


def max_load(model, stream: QueryStream, n: int, sla_s: float, lo: float, hi: float, steps: int) -> dict:
    """Highest Poisson rate whose p95 stays under the SLA: raise until violated, then bisect.  A violation is
    confirmed by a second run (the lower p95 counts): the shared host has multi-second stalls (other tenants'
    CPU and disk bursts) that otherwise decide the result."""
    best = 0.0
    trials = []

    def p95_at(rate: float) -> float:
        worst = []
        for attempt in range(2):
            lat = open_loop(model, stream.take(n), rate, 7 + attempt)
            p95 = float(np.percentile(lat, 95))
            worst.append(float(lat.max()))
            if p95 <= sla_s:
                break
        stalls.append(max(worst))
        return p95

    stalls: list[float] = []
    rate = lo
    while rate < hi:
        p95 = p95_at(rate)
        trials.append((rate, p95))
        if p95 > sla_s:
            hi = rate
            break
        best, rate = rate, rate * 2
    lo_ok = best
    for _ in range(steps):
        if hi <= lo_ok * 1.05:
            break
        mid = (lo_ok + hi) / 2
        p95 = p95_at(mid)
        trials.append((mid, p95))
        if p95 <= sla_s:
            lo_ok = mid
        else:
            hi = mid
    return {"max_qps": lo_ok, "trials": [{"rate": r, "p95_ms": p * 1e3, "max_ms": m * 1e3}
                                         for (r, p), m in zip(trials, stalls, strict=True)]}


def bench_end_to_end(directory: Path, quick: bool, p: float) -> dict:
    user_rows = 200_000 if quick else 400_000
    spec = bench_spec(user_rows)
    torch.manual_seed(0)
    dram_model = build(spec, scale=1.0)
    user_bytes = sum(t.bytes() for t in spec.tables if t.side == "user")
    item_bytes = sum(t.bytes() for t in spec.tables if t.side == "item")
    items = 50
    n_warm = 1000 if quick else 4000
    n_trial = 100 if quick else 300
    stream = QueryStream(spec, items, p, seed=10)
    sla = spec.sla.target_ms / 1e3
    out: dict = {"spec": {"user_tables": 6, "user_rows": user_rows, "dim": 32, "user_pooling": 40,
                          "item_tables": 2, "items_per_query": items, "locality": p},
                 "user_table_mb": user_bytes / 2**20, "item_table_mb": item_bytes / 2**20,
                 "sla_ms": spec.sla.target_ms, "warmup_queries": n_warm, "queries_per_trial": n_trial,
                 "configs": []}
    log(f"  model: user tables {user_bytes / 2**20:.0f} MB (on SSD when tiered), item {item_bytes / 2**20:.0f} MB")

    def service_ms(model, n: int = 100) -> float:
        times = []
        with torch.no_grad():
            for q in stream.take(n):
                t0 = time.perf_counter()
                model(q)
                times.append(time.perf_counter() - t0)
        return float(np.mean(times) * 1e3)

    def measure(name: str, model, cache_mb: float, resources=None) -> None:
        with torch.no_grad():
            for q in stream.take(n_warm if resources is not None else 100):
                model(q)
        if resources is not None:
            for t in model.tables:
                if hasattr(t, "stats"):
                    t.stats = type(t.stats)()
            resources.row_cache.reset_stats()
        service = service_ms(model)
        light = open_loop(model, stream.take(n_trial), rate=min(20.0, 200 / service), seed=3)
        ml = max_load(model, stream, n_trial, sla, lo=max(5.0, 400 / service), hi=4000.0, steps=3 if quick else 5)
        rec = {"name": name, "cache_mb": cache_mb, "mean_service_ms": service,
               "p95_ms_light_load": float(np.percentile(light, 95) * 1e3),
               "p50_ms_light_load": float(np.percentile(light, 50) * 1e3), **ml}
        if resources is not None:
            st = tier_stats(model)
            queries = 100 + n_trial * (1 + len(ml["trials"]))
            rec.update({"row_cache_hit_rate": st.hit_rate, "read_amplification": st.read_amplification,
                        "ios_per_query": st.ios / queries, "io_engine": model.tables[0].reader.engine,
                        "io_mode": model.tables[0].reader.mode,
                        "dram_embedding_mb": (item_bytes + resources.row_cache.dram_bytes) / 2**20})
            resources.prefetch_handle.remove()
            rec["mean_service_ms_no_prefetch"] = service_ms(model)
        else:
            rec["dram_embedding_mb"] = (user_bytes + item_bytes) / 2**20
        rec["dram_saved_mb"] = (user_bytes + item_bytes) / 2**20 - rec["dram_embedding_mb"]
        out["configs"].append(rec)
        log(f"  {name}: service {rec['mean_service_ms']:.2f} ms, p95 light {rec['p95_ms_light_load']:.2f} ms, "
            f"max load {rec['max_qps']:.0f} qps" + (f", hit {rec['row_cache_hit_rate']:.3f}, "
                                                     f"RA {rec['read_amplification']:.2f}" if resources else ""))

    measure("all-DRAM", dram_model, 0.0)
    for frac in (0.05, 0.2):
        cache_mb = user_bytes * frac / 2**20
        model = copy.deepcopy(dram_model)
        res = tier_model(model, [i for i, t in enumerate(spec.tables) if t.side == "user"], directory / "e2e",
                         cache_bytes=int(cache_mb * 2**20))
        measure(f"tiered, cache {frac:.0%} of user tables", model, cache_mb, res)
        for t in model.tables:
            if hasattr(t, "close"):
                t.close()
    return out


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for p in (0.5, 0.9):
        for policy in POLICIES:
            pts = [c for c in results["row_cache"]["curves"]
                   if c["locality"] == p and c["policy"] == policy and c["distribution"] == "zipf"]
            if not pts:
                pts = [c for c in results["row_cache"]["curves"] if c["locality"] == p and c["policy"] == policy]
            ax[0].plot([c["cache_fraction"] * 100 for c in pts], [c["hit_rate"] for c in pts], marker="o",
                       label=f"P={p} {policy}")
    ax[0].set_xscale("log")
    ax[0].set_xlabel("row cache size (% of table rows)")
    ax[0].set_ylabel("hit rate")
    ax[0].legend(fontsize=7)
    cfg = results["end_to_end"]["configs"]
    ax[1].bar([c["name"].replace(", ", "\n") for c in cfg], [c["max_qps"] for c in cfg])
    ax[1].set_ylabel(f"max load (qps) at p95 < {results['end_to_end']['sla_ms']:g} ms")
    ax[1].tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def headline(results: dict) -> list[dict]:
    """The SSD's best raw 512 B IOPS; each tiered configuration's max QPS at the SLA against all-DRAM's."""
    configs = harness.dig(results, "end_to_end", "configs") or []
    dram = next((c for c in configs if c.get("name") == "all-DRAM"), {})
    iops = [harness.num(x.get("iops")) or 0 for x in results.get("raw_io") or []]
    out = [harness.row("SSD raw 512 B reads, best IOPS", max(iops, default=None), "IOPS")]
    out += [harness.row(f"{c.get('name')}: max QPS at SLA, {harness.num(c.get('dram_saved_mb')) or 0:.0f} MB DRAM "
                        "saved (target: all-DRAM)", c.get("max_qps"), "QPS", dram.get("max_qps"))
            for c in configs if c is not dram]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=".sdm_bench", help="directory on a real disk for the table files")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="results/sdm.json")
    parser.add_argument("--locality", type=float, default=0.9, help="locality P of the end-to-end index stream")
    parser.add_argument("--only", help="comma list of sections to (re)run into an existing --out: raw_io, "
                        "row_cache, pooled_cache, end_to_end")
    args = parser.parse_args()
    torch.set_num_threads(1)
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    fs = subprocess.run(["df", "-T", str(directory)], capture_output=True, text=True).stdout.splitlines()[-1:]
    results: dict = {"host": {"cpus": len(os.sched_getaffinity(0)), "filesystem": fs[0] if fs else "?",
                              "io_uring": io_uring_available(), "loadavg_start": os.getloadavg()},
                     "quick": args.quick}
    out = Path(args.out)
    sections = set(args.only.split(",")) if args.only else {"raw_io", "row_cache", "pooled_cache", "end_to_end"}
    if args.only and out.exists():  # refresh some sections of an earlier run
        earlier = {k: v for k, v in json.loads(out.read_text()).items() if k != harness.HEADER}
        results = {**earlier, "host": results["host"]}
    if "raw_io" in sections:
        log("1/4 raw reads")
        results["raw_io"] = bench_raw_io(directory, args.quick)
    if "row_cache" in sections:
        log("2/4 row cache policies and hit rate vs size")
        results["row_cache"] = bench_row_cache(args.quick)
    if "pooled_cache" in sections:
        log("3/4 pooled-embedding cache vs min_len")
        results["pooled_cache"] = bench_pooled(args.quick)
    if "end_to_end" in sections:
        log("4/4 end to end: all-DRAM vs tiered")
        results["end_to_end"] = bench_end_to_end(directory, args.quick, args.locality)
        shutil.rmtree(directory / "e2e", ignore_errors=True)
    results["host"]["loadavg_end"] = os.getloadavg()
    harness.write_result(out, args, headline(results), results)
    plot(results, out.with_suffix(".png"))
    print_summary(results)
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def print_summary(r: dict) -> None:
    print("raw 512 B O_DIRECT reads:")
    for x in r["raw_io"]:
        print(f"  {x['engine']:8s} qd={x['queue_depth']:2d} {x['mode']}: {x['iops']:9,.0f} IOPS "
              f"{x['us_per_io']:7.1f} us/IO wall, {x['cpu_us_per_io']:5.1f} us/IO CPU")
    print("row cache hit rate (cache size as % of rows):")
    for dist in sorted({c["distribution"] for c in r["row_cache"]["curves"]}, reverse=True):
        for p in (0.5, 0.9):
            for policy in POLICIES:
                pts = [c for c in r["row_cache"]["curves"]
                       if c["locality"] == p and c["policy"] == policy and c["distribution"] == dist]
                cells = "  ".join(f"{c['cache_fraction']:.0%}:{c['hit_rate']:.3f}" for c in pts)
                cpu = np.mean([c["cpu_us_per_query"] for c in pts])
                print(f"  {dist:9s} P={p} {policy:5s} {cells}   ({cpu:.0f} CPU us/query)")
    print("key index, P=0.9 two-level, cache 5% (CPU us per query of 40 ids):")
    for x in r["row_cache"].get("index", []):
        print(f"  {x['index']:5s} {x['policy']:5s} {x['cpu_us_per_query']:6.0f}")
    print("pooled cache:")
    for x in r["pooled_cache"]["points"]:
        print(f"  min_len={x['min_len']:2d} hit {x['hit_rate_all_bags']:.3f} of all bags "
              f"({x['hit_rate_eligible']:.3f} of eligible), avg hit length {x['hit_avg_len']:.1f}")
    e = r["end_to_end"]
    print(f"load average (1 min) at start / end: {r['host']['loadavg_start'][0]:.1f} / "
          f"{r['host']['loadavg_end'][0]:.1f} on {r['host']['cpus']} CPUs")
    print(f"end to end (user tables {e['user_table_mb']:.0f} MB, SLA p95 < {e['sla_ms']:g} ms, "
          f"locality {e['spec']['locality']}):")
    for c in e["configs"]:
        extra = (f" hit {c['row_cache_hit_rate']:.3f} RA {c['read_amplification']:.2f} {c['io_mode']}/"
                 f"{c['io_engine']}" if "io_engine" in c else "")
        if "mean_service_ms_no_prefetch" in c:
            extra += f" (service without cross-table prefetch {c['mean_service_ms_no_prefetch']:.2f} ms)"
        print(f"  {c['name']:32s} service {c['mean_service_ms']:6.2f} ms  p95 light {c['p95_ms_light_load']:6.2f} ms  "
              f"max load {c['max_qps']:6.0f} qps  DRAM {c['dram_embedding_mb']:6.0f} MB (saved "
              f"{c['dram_saved_mb']:.0f}){extra}")


if __name__ == "__main__":
    sys.exit(main())
