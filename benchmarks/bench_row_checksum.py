"""What verifying every row read from an SSD table file costs, next to the read itself.

For batches of row misses (the rows one query's table lookup reads), times (a) the O_DIRECT reads of their
aligned windows through ``BlockReader`` (the serving read path, page cache bypassed) and (b) the row CRC check
the tier now runs on every read (``RowChecksums.mismatches``: the CRC of each row, compared with the CRCs kept in DRAM),
for the zlib CRC32 the file format uses and, where the ``google-crc32c`` package happens to be installed,
CRC32C for comparison.  Prints a table and writes ``results/row_checksum.json``.

    .venv/bin/python -m benchmarks.bench_row_checksum            # ~20 s
    .venv/bin/python -m benchmarks.bench_row_checksum --rows 200000 --dim 64 --dir /mnt/ssd/bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
import zlib
from pathlib import Path

import numpy as np

from benchmarks import harness
from recserve.embedding.blockio import BlockReader
from recserve.embedding.tablefile import RowChecksums, read_header, row_crcs, write_table


def per_call_us(fn, repeats: int) -> float:
    fn()  # warm
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def timed_over(fn, repeats: int) -> float:
    """Mean microseconds of ``fn(k)`` for k in range(repeats): a different batch of rows each call."""
    fn(0)
    start = time.perf_counter()
    for k in range(repeats):
        fn(k)
    return (time.perf_counter() - start) / repeats * 1e6


def headline(results: dict) -> list[dict]:
    """Per rows-per-read: the CRC check's time as a share of the O_DIRECT read it verifies."""
    return [harness.row(f"row CRC check / O_DIRECT read, {r['rows_per_read']} rows per read", r["verify_over_read"],
                        "fraction") for r in results.get("batches") or []]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64, help="fp32 values per row (64 -> 256-byte rows)")
    parser.add_argument("--batches", default="1,16,256", help="rows read per lookup")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--dir", default=".row_checksum_bench", help="on the SSD (not tmpfs: O_DIRECT)")
    parser.add_argument("--out", default="results/row_checksum.json")
    args = parser.parse_args()

    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench.tbl"
    rng = np.random.default_rng(0)
    try:
        write_table(path, rng.standard_normal((args.rows, args.dim), dtype=np.float32))
        header = read_header(path)
        window = header.align if header.stride <= header.align else header.stride
        reader = BlockReader(path, window, engine="auto")
        checksums = RowChecksums(path, header)
        try:
            import google_crc32c  # optional: not a recserve dependency
        except ImportError:
            google_crc32c = None
        results = {"rows": args.rows, "row_bytes": header.row_bytes, "read_mode": reader.mode,
                   "engine": reader.engine, "batches": []}
        print(f"{args.rows} rows of {header.row_bytes} B; reads: {reader.mode}/{reader.engine}")
        print(f"{'rows/read':>9} {'read us':>10} {'verify us':>10} {'crc32 us':>9} {'crc32c us':>10} "
              f"{'verify/read':>12}")
        for batch in (int(b) for b in args.batches.split(",")):
            ids = [np.sort(rng.choice(args.rows, batch, replace=False)) for _ in range(args.repeats)]
            offsets = [header.data_offset + i * header.stride for i in ids]
            windows = [np.unique(o - o % window) for o in offsets]
            raw = rng.integers(0, 256, (batch, header.row_bytes), dtype=np.uint8)
            read_us = timed_over(lambda k, w=windows: reader.read(w[k]), args.repeats)
            verify_us = timed_over(lambda k, i=ids, r=raw: checksums.mismatches(i[k], r), args.repeats)
            crc_us = per_call_us(lambda r=raw: row_crcs(r), args.repeats)
            crc32c_us = (per_call_us(lambda r=raw: [google_crc32c.value(bytes(x)) for x in r], args.repeats)
                         if google_crc32c else None)
            row = {"rows_per_read": batch, "read_us": read_us, "verify_us": verify_us, "zlib_crc32_us": crc_us,
                   "crc32c_us": crc32c_us, "verify_over_read": verify_us / read_us}
            results["batches"].append(row)
            c32c = f"{crc32c_us:10.1f}" if crc32c_us is not None else f"{'n/a':>10}"
            print(f"{batch:9d} {read_us:10.1f} {verify_us:10.1f} {crc_us:9.1f} {c32c} {verify_us / read_us:11.1%}")
        results["zlib_crc32_one_row_us"] = per_call_us(lambda: zlib.crc32(raw[0]), 10_000)
        reader.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    out = harness.write_result(args.out, args, headline(results), results)
    print(f"wrote {out} (one zlib.crc32 of a row: {results['zlib_crc32_one_row_us']:.2f} us; pid {os.getpid()})")


if __name__ == "__main__":
    main()
