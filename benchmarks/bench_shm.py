"""Triton's system shared memory (serving/wire/shm.py) for a hercules-rmc2 production-mix query (issue #16).

Part 1 (no server): what decoding a ~19 MB query costs the server, inline vs from a registered region --
``codec.parse_http_infer`` of a binary-extension body already received, of a header naming a region already mapped,
the first read of a fresh mapping (page-table faults, once per worker and region), and copying the ids out of the
region (what keeping mappings alive under the views avoids).

Part 2 (``--e2e``): a node serving hercules-rmc2 at ``--scale``; the same query sent inline (tritonclient.http
binary, tritonclient.grpc) and through a region registered once (the query written once, requests only reference
it), latency p50 and p90 over ``--requests`` each, alternating.

    .venv/bin/python -m benchmarks.bench_shm --batch 200 --e2e --requests 15     # writes results/shm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from multiprocessing import shared_memory as mpshm

import numpy as np

from benchmarks import harness
from benchmarks.harness import ROOT
from recserve.serving.wire import codec
from recserve.serving.wire.shm import Regions, Registry
from recserve.specs import get_model
from recserve.wire import OUTPUT_SCORES

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def query(model: str, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A production-shaped query without building the model: every table's pooling, ids drawn in range."""
    spec = get_model(model)
    rng = np.random.default_rng(seed)
    lengths = np.stack([rng.integers(max(1, t.pooling // 2), t.pooling + t.pooling // 2 + 1, size=batch)
                        for t in spec.tables]).astype(np.int32)
    ids = rng.integers(0, 100, size=int(lengths.sum()), dtype=np.int64)  # in range at any --scale >= 1e-4
    return {"dense": rng.standard_normal((batch, spec.dense_in), dtype=np.float32), "sparse_values": ids,
            "sparse_lengths": lengths}


def place(buf, arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    where, pos = {}, 0
    for name, arr in arrays.items():
        buf[pos : pos + arr.nbytes] = arr.tobytes()
        where[name] = (pos, arr.nbytes)
        pos += (arr.nbytes + 4095) // 4096 * 4096
    return where


def timed(fn, repeat: int) -> float:
    """Median milliseconds of ``fn()`` over ``repeat`` calls."""
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def decode_costs(arrays: dict[str, np.ndarray], repeat: int) -> dict[str, float]:
    body, head_len = codec.encode_http_request(arrays)
    size = sum((a.nbytes + 4095) // 4096 * 4096 for a in arrays.values())
    seg = mpshm.SharedMemory(f"recserve-bench-{uuid.uuid4().hex[:8]}", create=True, size=size)
    registry = Registry()
    try:
        where = place(seg.buf, arrays)
        registry.register("q", seg.name, 0, size)
        head = json.dumps({"inputs": [{"name": n, "datatype": DATATYPES[a.dtype], "shape": list(a.shape),
                                       "parameters": {"shared_memory_region": "q", "shared_memory_offset": where[n][0],
                                                      "shared_memory_byte_size": where[n][1]}}
                                      for n, a in arrays.items()]}).encode()
        worker = Regions(registry.directory)  # as a worker follows the supervisor's table
        codec.parse_http_infer(head, None, regions=worker)
        ids = worker.view("sparse_values", "q", where["sparse_values"][1], where["sparse_values"][0],
                          np.dtype("<i8"), arrays["sparse_values"].shape)

        def fresh_first_read() -> None:
            follower = Regions(registry.directory)
            _, got = codec.parse_http_infer(head, None, regions=follower)
            int(got["sparse_values"].sum())  # every page touched, as the model's lookups touch them

        return {
            "query_mb": round(sum(a.nbytes for a in arrays.values()) / 1e6, 2),
            "inline_binary_decode_ms": timed(lambda: codec.parse_http_infer(body, str(head_len)), repeat),
            "region_decode_ms": timed(lambda: codec.parse_http_infer(head, None, regions=worker), repeat),
            "region_read_ids_ms": timed(lambda: int(ids.sum()), repeat),
            "fresh_mapping_decode_and_read_ids_ms": timed(fresh_first_read, repeat),
            "copy_ids_out_of_region_ms": timed(lambda: np.array(ids), repeat),
        }
    finally:
        registry.close()
        seg.close()
        seg.unlink()


def e2e(arrays: dict[str, np.ndarray], model: str, scale: float, requests: int) -> dict[str, dict[str, float]]:
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    import tritonclient.utils.shared_memory as tshm

    from recserve.serving import NodeServer
    from recserve.serving.node.config import quick_config

    config = quick_config(model, scale=scale, workers=1)
    server = NodeServer(config)
    ports = server.start()
    size = sum((a.nbytes + 4095) // 4096 * 4096 for a in arrays.values())
    handle = tshm.create_shared_memory_region("q", f"/recserve-bench-{uuid.uuid4().hex[:8]}", size)
    http = thttp.InferenceServerClient(f"127.0.0.1:{ports.http}", network_timeout=120)
    grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
    try:
        where = place(handle._mpsm_handle.buf, arrays)
        http.register_system_shared_memory("q", handle._shm_key, size)

        def shm_inputs(client):
            out = []
            for n, a in arrays.items():
                x = client.InferInput(n, list(a.shape), DATATYPES[a.dtype])
                x.set_shared_memory("q", where[n][1], offset=where[n][0])
                out.append(x)
            return out

        paths = {
            "http_inline_binary": lambda: http.infer(model, codec.triton_inputs(thttp, arrays)),
            "http_shared_memory": lambda: http.infer(model, shm_inputs(thttp)),
            "grpc_inline": lambda: grpc.infer(model, codec.triton_inputs(tgrpc, arrays)),
            "grpc_shared_memory": lambda: grpc.infer(model, shm_inputs(tgrpc)),
        }
        first = {k: fn().as_numpy(OUTPUT_SCORES) for k, fn in paths.items()}  # warm, and equal
        for k, v in first.items():
            np.testing.assert_array_equal(v, first["http_inline_binary"], err_msg=k)
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(requests):
            for k, fn in paths.items():
                start = time.perf_counter()
                fn()
                times[k].append((time.perf_counter() - start) * 1e3)
        return {k: {"p50_ms": round(float(np.percentile(v, 50)), 1), "p90_ms": round(float(np.percentile(v, 90)), 1)}
                for k, v in times.items()}
    finally:
        http.unregister_system_shared_memory()
        http.close()
        grpc.close()
        tshm.destroy_shared_memory_region(handle)
        server.stop()


def headline(result: dict) -> list[dict]:
    """Decoding the query from a registered region against inline; with ``--e2e``, each path's p50 through a node."""
    decode = result["decode"]
    out = [harness.row(f"decode a {decode['query_mb']} MB query from a region (target: inline binary)",
                       decode["region_decode_ms"], "ms", decode["inline_binary_decode_ms"])]
    out += [harness.row(f"served p50, {path}", r["p50_ms"], "ms") for path, r in (result.get("e2e") or {}).items()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="hercules-rmc2")
    ap.add_argument("--batch", type=int, default=200, help="items (200 x 100 tables x ~120 ids = ~19 MB of ids)")
    ap.add_argument("--scale", type=float, default=1e-4)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--e2e", action="store_true", help="also serve the query from a node, inline vs region")
    ap.add_argument("--requests", type=int, default=15)
    args = ap.parse_args()
    arrays = query(args.model, args.batch)
    result = {"decode": {k: round(v, 3) if isinstance(v, float) else v
                         for k, v in decode_costs(arrays, args.repeat).items()}}
    if args.e2e:
        result["e2e"] = e2e(arrays, args.model, args.scale, args.requests)
    harness.write_result(ROOT / "results" / "shm.json", args, headline(result),
                         {"model": args.model, "batch": args.batch, **result})
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
