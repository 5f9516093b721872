"""What the worker's codec alone costs (CPU) per item of a query: a request decoded (``codec.parse_http_infer``, the
whole of the worker's decode but the model's own checks) and its answer encoded (``codec.http_infer_response``),
with the tensors as plain JSON ``data`` (what curl and ``tritonclient`` with ``binary_data=False`` send) and with
the binary tensor extension.

The queries have a catalogue model's shape (default hercules-rmc1: 256 dense features, 10 tables of ~80 ids a
row), made with numpy alone (no torch, no model).  JSON bodies come in two spellings: ``compact`` (no whitespace,
as orjson and most non-Python clients write) and ``spaced`` (``json.dumps``' default ``", "``, as tritonclient
sends).  Run it against another tree's codec for a before/after (``PYTHONPATH=/other/src``).

Prints a table and writes results/json_codec.json.  Usage:
    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_json_codec [--model hercules-rmc1] [--batches 1 16 256]
        [--repeat 30] [--out results/json_codec.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from benchmarks import harness
from recserve.serving.wire import codec
from recserve.specs import catalogue_models


def query(model: str, batch: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Wire arrays of a synthetic query of ``model`` (bags of pooling/2..3/2 pooling ids, as ``random_batch``)."""
    spec = catalogue_models()[model]
    rng = np.random.default_rng(seed)
    lengths = np.empty((len(spec.tables), batch), np.int32)
    values = []
    for k, t in enumerate(spec.tables):
        p = t.pooling
        lengths[k] = p if t.kind == "sequence" or p == 1 else rng.integers(max(1, p // 2), p + p // 2 + 1, batch)
        values.append(rng.integers(0, t.rows, int(lengths[k].sum())))
    dense = rng.standard_normal((batch, spec.dense_in), dtype=np.float32)
    return {"dense": dense, "sparse_values": np.concatenate(values).astype(np.int64), "sparse_lengths": lengths}


def json_body(arrays: dict[str, np.ndarray], spaced: bool) -> bytes:
    inputs = [{"name": name, "shape": list(a.shape), "datatype": codec.DATATYPES[a.dtype],
               "data": a.reshape(-1).tolist()} for name, a in arrays.items()]
    separators = (", ", ": ") if spaced else (",", ":")
    return json.dumps({"inputs": inputs}, separators=separators).encode()


def timed(fn, repeat: int) -> dict[str, float]:
    """CPU seconds of this thread per call (a shared host's other processes move wall time far more)."""
    fn()
    samples = []
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        samples.append(time.thread_time() - t)
    return {"median_us": statistics.median(samples) * 1e6, "min_us": min(samples) * 1e6}


def run(args: argparse.Namespace) -> dict:
    rows = []
    for batch in args.batches:
        arrays = query(args.model, batch)
        scores = np.random.default_rng(2).random(batch, dtype=np.float32)
        binary, head_length = codec.encode_http_request(arrays)
        bodies = {"binary": (binary, str(head_length)), "json_compact": (json_body(arrays, False), None),
                  "json_spaced": (json_body(arrays, True), None)}
        repeat = max(5, args.repeat * 16 // max(16, batch))
        for kind, (body, length) in bodies.items():
            request, _ = codec.parse_http_infer(body, length)
            if kind != "binary":  # answers as the request asks: JSON to a JSON request
                request = {k: v for k, v in request.items() if k != "outputs"}
            decode = timed(lambda b=body, n=length: codec.parse_http_infer(b, n), repeat)
            encode = timed(lambda r=request, s=scores: codec.http_infer_response("m", r, s), repeat * 4)
            rows.append({"batch": batch, "kind": kind, "bytes": len(body),
                         "decode_us": decode["median_us"], "decode_min_us": decode["min_us"],
                         "encode_us": encode["median_us"],
                         "decode_us_per_item": decode["median_us"] / batch,
                         "total_us_per_item": (decode["median_us"] + encode["median_us"]) / batch})
    return {"model": args.model, "codec": codec.__file__, "python": platform.python_version(),
            "numpy": np.__version__, "rows": rows}


def headline(result: dict) -> list[dict]:
    """Per batch: decode + encode us per item of compact JSON against the binary extension's."""
    base = {r["batch"]: r["total_us_per_item"] for r in result["rows"] if r["kind"] == "binary"}
    return [harness.row(f"JSON codec us per item, compact JSON, batch {r['batch']} (target: binary)",
                        r["total_us_per_item"], "us", base.get(r["batch"]))
            for r in result["rows"] if r["kind"] == "json_compact"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", default="results/json_codec.json")
    args = parser.parse_args()
    result = run(args)
    print(f"codec: {result['codec']}")
    print(f"{'batch':>5} {'kind':<13} {'bytes':>9} {'decode us':>10} {'encode us':>10} {'us/item':>8} {'x binary':>8}")
    base = {r["batch"]: r["total_us_per_item"] for r in result["rows"] if r["kind"] == "binary"}
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['kind']:<13} {r['bytes']:>9} {r['decode_us']:>10.1f} {r['encode_us']:>10.1f} "
              f"{r['total_us_per_item']:>8.2f} {r['total_us_per_item'] / base[r['batch']]:>8.1f}")
    harness.write_result(args.out, args, headline(result), result)


if __name__ == "__main__":
    main()
