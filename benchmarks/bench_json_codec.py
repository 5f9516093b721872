"""What the worker's codec alone costs (CPU) per item of a query: a request decoded (``codec.parse_http_infer``, the
whole of the worker's decode but the model's own checks) and its answer encoded (``codec.http_infer_response``),
with the tensors as plain JSON ``data`` (what curl and ``tritonclient`` with ``binary_data=False`` send) and with
the binary tensor extension.

The queries have a catalogue model's shape (default hercules-rmc1: 256 dense features, 10 tables of ~80 ids a
row), made with numpy alone (no torch, no model).  JSON bodies come in two spellings: ``compact`` (no whitespace,
as orjson and most non-Python clients write) and ``spaced`` (``json.dumps``' default ``", "``, as tritonclient
sends).  Run it against another tree's codec for a before/after (``PYTHONPATH=/other/src``), or with
``RECSERVE_JSON_READERS=simdjson`` for the readers but the native one (both the codec pass and the node).

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
from recserve.measure.sink import process_cpu_s
from recserve.serving.wire import codec, json_numbers
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
        for kind, (raw, length) in bodies.items():
            body = memoryview(bytearray(raw))  # as a worker holds it: its receive buffer (slices of it copy nothing)
            request, _ = codec.parse_http_infer(body, length)
            if kind != "binary":  # answers as the request asks: JSON to a JSON request
                request = {k: v for k, v in request.items() if k != "outputs"}
            decode = timed(lambda b=body, n=length: codec.parse_http_infer(b, n), repeat)
            encode = timed(lambda r=request, s=scores: codec.http_infer_response("m", r, s), repeat * 4)
            rows.append({"batch": batch, "kind": kind, "bytes": len(raw),
                         "decode_us": decode["median_us"], "decode_min_us": decode["min_us"],
                         "encode_us": encode["median_us"],
                         "decode_us_per_item": decode["median_us"] / batch,
                         "total_us_per_item": (decode["median_us"] + encode["median_us"]) / batch})
    return {"model": args.model, "codec": codec.__file__, "python": platform.python_version(),
            "numpy": np.__version__, "rows": rows}


def served(args: argparse.Namespace) -> list[dict]:
    """The same queries answered by a node (one worker, unloaded, one keep-alive connection): the client's wall time
    and the worker's CPU per query, binary against plain JSON, alternating."""
    import http.client

    from recserve.serving import NodeServer
    from recserve.serving.node.config import quick_config
    from recserve.serving.node.control_client import ControlClient

    config = quick_config(args.model, scale=args.scale, workers=1, deadline_ms=60_000.0)
    config.max_body_bytes = 64 * 1024 * 1024
    server = NodeServer(config)
    ports = server.start()
    rows = []
    try:
        control = ControlClient("127.0.0.1", ports.http)
        detail = control.get_model(config.models[0].name)
        pid = detail["stages"]["model"]["worker_detail"][0]["pid"]
        conn = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=120)
        path = f"/v2/models/{config.models[0].name}/infer"
        rows_held = min(catalogue_models()[args.model].scaled_rows(args.scale))
        for batch in args.batches:
            arrays = query(args.model, batch)
            arrays["sparse_values"] %= rows_held  # ids within the served (scaled) tables
            binary, head_length = codec.encode_http_request(arrays)
            bodies = {"binary": (binary, {codec.HEADER_LENGTH: str(head_length)}),
                      "json_compact": (json_body(arrays, False), {"Content-Type": "application/json"})}
            walls: dict[str, list[float]] = {k: [] for k in bodies}
            cpus = dict.fromkeys(bodies, 0.0)
            for i in range(args.served_repeat + 2):
                for kind, (body, headers) in bodies.items():
                    cpu = process_cpu_s([pid])
                    start = time.perf_counter()
                    conn.request("POST", path, body=body, headers=headers)
                    answer = conn.getresponse()
                    text = answer.read()
                    if answer.status != 200:
                        raise SystemExit(f"{kind} batch {batch}: HTTP {answer.status}: {text[:300]!r}")
                    if i >= 2:  # the first two warm both paths
                        walls[kind].append(time.perf_counter() - start)
                        cpus[kind] += process_cpu_s([pid]) - cpu  # clock ticks: summed over the queries, then divided
            for kind in bodies:
                count = len(walls[kind]) * batch
                rows.append({"batch": batch, "kind": kind,
                             "wall_us_per_item": statistics.median(walls[kind]) * 1e6 / batch,
                             "worker_cpu_us_per_item": cpus[kind] * 1e6 / count})
        conn.close()
        rows.append({"json_reader": control.get_model(config.models[0].name).get("json_reader")})
    finally:
        server.stop()
    return rows


def headline(result: dict) -> list[dict]:
    """Per batch: decode + encode us per item of compact JSON against the binary extension's."""
    base = {r["batch"]: r["total_us_per_item"] for r in result["rows"] if r["kind"] == "binary"}
    served_binary = {r["batch"]: r["wall_us_per_item"] for r in result.get("served", []) if r.get("kind") == "binary"}
    return [harness.row(f"JSON codec us per item, compact JSON, batch {r['batch']} (target: binary)",
                        r["total_us_per_item"], "us", base.get(r["batch"]))
            for r in result["rows"] if r["kind"] == "json_compact"] + [
        harness.row(f"served wall us per item, compact JSON, batch {r['batch']} (target: binary)",
                    r["wall_us_per_item"], "us", served_binary.get(r["batch"]))
        for r in result.get("served", []) if r.get("kind") == "json_compact"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="hercules-rmc1")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--served", action="store_true", help="also time the queries answered by a node")
    parser.add_argument("--served-repeat", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1e-3, help="the served model's scale")
    parser.add_argument("--out", default="results/json_codec.json")
    args = parser.parse_args()
    json_numbers.enable(json_numbers.probe()[0])  # as a node does (the codec pass; a node probes for itself)
    result = run(args)
    readers = getattr(json_numbers, "readers", None)  # an older tree's codec (A/B) has one reader, on or off
    result["json_reader"] = ("+".join(readers()) if readers else "simdjson" if json_numbers.enabled() else "") \
        or "lists"
    print(f"codec: {result['codec']}")
    print(f"{'batch':>5} {'kind':<13} {'bytes':>9} {'decode us':>10} {'encode us':>10} {'us/item':>8} {'x binary':>8}")
    base = {r["batch"]: r["total_us_per_item"] for r in result["rows"] if r["kind"] == "binary"}
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['kind']:<13} {r['bytes']:>9} {r['decode_us']:>10.1f} {r['encode_us']:>10.1f} "
              f"{r['total_us_per_item']:>8.2f} {r['total_us_per_item'] / base[r['batch']]:>8.1f}")
    if args.served:
        result["served"] = served(args)
        print("served (one worker, unloaded): us per item, median")
        print(f"{'batch':>5} {'kind':<13} {'wall':>8} {'worker CPU':>10} {'x binary':>8}")
        base = {r["batch"]: r for r in result["served"] if r.get("kind") == "binary"}
        for r in result["served"]:
            if "kind" in r:
                b = base[r["batch"]]
                print(f"{r['batch']:>5} {r['kind']:<13} {r['wall_us_per_item']:>8.1f} "
                      f"{r['worker_cpu_us_per_item']:>10.1f} {r['wall_us_per_item'] / b['wall_us_per_item']:>8.2f}")
    harness.write_result(args.out, args, headline(result), result)


if __name__ == "__main__":
    main()
