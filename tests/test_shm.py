"""Triton's system shared-memory extension (serving/wire/shm.py): the registry and its errors, the workers' view of it,
zero-copy inputs that outlive an unregister, the codec on every transport, and a 2-worker node driven by
tritonclient.http and tritonclient.grpc with ``tritonclient.utils.shared_memory`` regions."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from multiprocessing import shared_memory as mpshm

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as tshm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from recserve.measure.requests import RequestPool
from recserve.measure.targets import HttpTarget, SharedMemoryHttpTarget, make_target
from recserve.serving import build_worker_model
from recserve.serving.node.config import quick_config
from recserve.serving.wire import codec
from recserve.serving.wire.errors import InferError
from recserve.serving.wire.shm import Regions, Registry, register_request, tensor_params
from recserve.specs import get_model
from recserve.wire import INPUT_DENSE, INPUT_LENGTHS, INPUT_VALUES, OUTPUT_SCORES
from recserve.zoo import sample_batch
from tests.support import grpc_client, http, models
from tests.support.nodes import node_config, started

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}


def same_scores(got: np.ndarray, want: np.ndarray) -> None:
    """Scores of one query answered by two workers: equal to float32 rounding.  Not bit-equal: a worker's GEMMs may
    take another code path for inputs at another alignment (a region vs a request body), 1 ulp apart (seen once)."""
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _key() -> str:
    return f"recserve-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def segment():
    """A POSIX shared-memory object of 64 KiB: (key, SharedMemory); unlinked afterwards."""
    key = _key()
    seg = mpshm.SharedMemory(key, create=True, size=65536)
    try:
        yield key, seg
    finally:
        seg.close()
        try:
            seg.unlink()
        except FileNotFoundError:
            pass


@pytest.fixture
def registry():
    reg = Registry()
    try:
        yield reg
    finally:
        reg.close()


def _invalid(fn, *args, field: str | None = None, match: str = "") -> InferError:
    with pytest.raises(InferError) as info:
        fn(*args)
    assert info.value.code == "invalid", info.value
    if field is not None:
        assert info.value.field == field
    assert match in str(info.value)
    return info.value


# ---------------------------------------------------------------- registry


def test_register_status_unregister(registry, segment):
    key, _ = segment
    registry.register("a", "/" + key, 4096, 1024)  # tritonclient's keys start with '/': shm_open drops it
    registry.register("b", key, 0, 65536)
    assert registry.status() == [{"name": "a", "key": "/" + key, "offset": 4096, "byte_size": 1024},
                                 {"name": "b", "key": key, "offset": 0, "byte_size": 65536}]
    assert registry.status("b") == [{"name": "b", "key": key, "offset": 0, "byte_size": 65536}]
    registry.unregister("a")
    registry.unregister("a")  # unknown: no error (Triton's rule)
    assert [r["name"] for r in registry.status()] == ["b"]
    registry.unregister()
    assert registry.status() == []
    with pytest.raises(InferError) as info:
        registry.status("b")
    assert info.value.code == "not_found" and info.value.status.http == 404


def test_register_refuses_duplicates_bad_keys_and_spans_past_the_object(registry, segment):
    key, _ = segment
    registry.register("r", key, 0, 100)
    _invalid(registry.register, "r", key, 0, 100, field="name", match="already registered")
    missing = _invalid(registry.register, "s", _key(), 0, 8, field="key", match="unable to open")
    assert "No such file" in str(missing)
    for bad in ("", "/", "a/b", "..", "/x/y"):
        _invalid(registry.register, "s", bad, 0, 8, field="key", match="not a shared memory key")
    past = _invalid(registry.register, "s", key, 65536 - 8, 16, field="byte_size", match="runs past the end")
    assert "65536 bytes" in str(past)
    _invalid(registry.register, "s", key, 0, 0, field="byte_size")
    _invalid(registry.register, "s", key, -1, 8, field="offset")
    _invalid(registry.register, "", key, 0, 8, field="name")
    assert [r["name"] for r in registry.status()] == ["r"]  # nothing half-registered


def test_register_request_schema():
    assert register_request({"key": "/k", "offset": 8, "byte_size": 16}) == ("/k", 8, 16)
    assert register_request({"key": "/k", "byte_size": 16}) == ("/k", 0, 16)
    _invalid(register_request, {"key": "/k"}, field="byte_size", match="required")
    _invalid(register_request, {"key": 3, "byte_size": 1}, field="key")
    _invalid(register_request, {"key": "/k", "byte_size": True}, field="byte_size")
    _invalid(register_request, {"key": "/k", "byte_size": 1, "size": 2}, field="size", match="unknown field")


def test_tensor_parameters_come_in_pairs():
    assert tensor_params("x", {"binary_data_size": 3}) is None
    assert tensor_params("x", {"shared_memory_region": "r", "shared_memory_byte_size": 8}) == ("r", 8, 0)
    assert tensor_params("x", {"shared_memory_region": "r", "shared_memory_byte_size": 8,
                               "shared_memory_offset": 16}) == ("r", 8, 16)
    _invalid(tensor_params, "x", {"shared_memory_region": "r"}, field="x", match="together")
    _invalid(tensor_params, "x", {"shared_memory_byte_size": 8}, field="x", match="together")
    _invalid(tensor_params, "x", {"shared_memory_offset": 8}, field="x")
    _invalid(tensor_params, "x", {"shared_memory_region": "r", "shared_memory_byte_size": -1}, field="x")
    _invalid(tensor_params, "x", {"shared_memory_region": 5, "shared_memory_byte_size": 8}, field="x")


def test_views_are_checked_against_shape_and_region(registry, segment):
    key, seg = segment
    ids = np.arange(100, dtype=np.int64)
    seg.buf[4096 + 64 : 4096 + 64 + ids.nbytes] = ids.tobytes()
    registry.register("r", key, 4096, 8192)
    got = registry.view("sparse_values", "r", ids.nbytes, 64, np.dtype("<i8"), (100,))
    assert np.array_equal(got, ids)
    _invalid(registry.view, "sparse_values", "r", ids.nbytes - 8, 64, np.dtype("<i8"), (100,),
             field="sparse_values", match="shape [100] of int64 needs 800")
    _invalid(registry.view, "sparse_values", "r", 800, 8192 - 792, np.dtype("<i8"), (100,),
             field="sparse_values", match="runs past region 'r' of 8192 bytes")
    _invalid(registry.view, "sparse_values", "nope", 800, 0, np.dtype("<i8"), (100,),
             field="sparse_values", match="'nope' is not a registered")
    odd = registry.view("sparse_values", "r", 8, 65, np.dtype("<i8"), (1,))  # unaligned start: copied
    assert odd.flags.aligned and odd.flags.owndata


def test_outputs_are_written_into_the_region(registry, segment):
    key, seg = segment
    registry.register("out", key, 1024, 64)
    scores = np.arange(6, dtype=np.float32).reshape(3, 2)
    registry.write("scores", "out", 32, 8, scores)
    assert np.array_equal(np.frombuffer(seg.buf, np.float32, 6, 1024 + 8).reshape(3, 2), scores)
    _invalid(registry.write, "scores", "out", 16, 0, scores, match="too small")
    _invalid(registry.check_output, "scores", "out", 64, 8, match="runs past")


def test_a_follower_sees_every_change_and_maps_the_registered_object(registry, segment):
    """A worker's ``Regions`` follows the supervisor's table: a register, a re-register under the same name with
    another object, an unregister; the object mapped is the one registered even after its key was unlinked."""
    key, seg = segment
    follower = Regions(registry.directory)
    seg.buf[:8] = np.int64(7).tobytes()
    registry.register("r", key, 0, 4096)
    assert follower.view("x", "r", 8, 0, np.dtype("<i8"), (1,))[0] == 7
    other = mpshm.SharedMemory(_key(), create=True, size=4096)
    try:
        other.buf[:8] = np.int64(9).tobytes()
        registry.unregister("r")
        _invalid(follower.view, "x", "r", 8, 0, np.dtype("<i8"), (1,), match="not a registered")
        registry.register("r", other.name, 0, 4096)
        assert follower.view("x", "r", 8, 0, np.dtype("<i8"), (1,))[0] == 9
        other.unlink()  # the client removed the name; the registered object lives on through the supervisor's fd
        fresh = Regions(registry.directory)
        assert fresh.view("x", "r", 8, 0, np.dtype("<i8"), (1,))[0] == 9
    finally:
        other.close()


def test_zero_copy_view_outlives_unregister(registry, segment):
    """An input view taken before an unregister stays readable (the mapping lives as long as a view of it); the
    follower lets go of the mapping, so the memory is released once the query is answered."""
    key, seg = segment
    data = np.arange(4096, dtype=np.int64)
    seg.buf[: data.nbytes] = data.tobytes()
    registry.register("r", key, 0, 65536)
    follower = Regions(registry.directory)
    view = follower.view("sparse_values", "r", data.nbytes, 0, np.dtype("<i8"), (4096,))
    mapping = follower._maps[follower.table["r"].serial].mm
    registry.unregister("r")
    follower.refresh()
    assert follower._maps == {}
    assert np.array_equal(view, data)  # still mapped: the view holds the mmap
    with pytest.raises(BufferError):
        mapping.close()  # Python's mmap refuses to unmap under a view
    del view
    mapping.close()  # no views left


# ---------------------------------------------------------------- codec, every transport


def _arrays(model, batch: int = 3, rng: int = 1) -> dict[str, np.ndarray]:
    return sample_batch(model, batch, rng=rng).as_arrays()


def _place(seg, arrays: dict[str, np.ndarray], start: int = 0) -> dict[str, tuple[int, int]]:
    """Copy ``arrays`` into the segment, 64-byte aligned; name -> (offset, byte_size)."""
    where, pos = {}, start
    for name, arr in arrays.items():
        seg.buf[pos : pos + arr.nbytes] = arr.tobytes()
        where[name] = (pos - start, arr.nbytes)
        pos += (arr.nbytes + 63) // 64 * 64
    return where


@pytest.fixture(scope="module")
def small_model():
    model = models.first_dlrm()
    cfg = quick_config(model, scale=1e-4, workers=2).models[0]
    return cfg, build_worker_model(cfg)


def test_codec_reads_http_json_binary_and_grpc_inputs_from_regions(registry, segment, small_model):
    key, seg = segment
    arrays = _arrays(small_model[1])
    where = _place(seg, arrays)
    registry.register("in", key, 0, 65536)
    shm = {n: {"shared_memory_region": "in", "shared_memory_offset": o, "shared_memory_byte_size": b}
           for n, (o, b) in where.items()}
    # HTTP JSON: dense inline as data, the ids in shared memory
    head = {"inputs": [{"name": n, "datatype": DATATYPES[a.dtype], "shape": list(a.shape),
                        **({"data": a.reshape(-1).tolist()} if n == INPUT_DENSE else {"parameters": shm[n]})}
                       for n, a in arrays.items()]}
    _, got = codec.parse_http_infer(json.dumps(head).encode(), None, regions=registry)
    for n in arrays:
        assert np.array_equal(got[n], arrays[n])
    # HTTP binary extension: dense in the body, the rest from the region
    dense = arrays[INPUT_DENSE]
    head["inputs"][0] = {"name": INPUT_DENSE, "datatype": "FP32", "shape": list(dense.shape),
                         "parameters": {"binary_data_size": dense.nbytes}}
    body = json.dumps(head).encode()
    _, got = codec.parse_http_infer(body + dense.tobytes(), str(len(body)), regions=registry)
    assert np.array_equal(got[INPUT_VALUES], arrays[INPUT_VALUES])
    # both data and a region: refused
    head["inputs"][1]["data"] = [1]
    body = json.dumps(head).encode()
    _invalid(codec.parse_http_infer, body + dense.tobytes(), str(len(body)), field=INPUT_VALUES, match="one way")
    # gRPC: raw contents for the inputs not in shared memory, in input order
    request = service_pb2.ModelInferRequest(model_name="m")
    for n, a in arrays.items():
        t = request.inputs.add(name=n, datatype=DATATYPES[a.dtype], shape=list(a.shape))
        if n == INPUT_LENGTHS:
            request.raw_input_contents.append(a.tobytes())
        else:
            o, b = where[n]
            t.parameters["shared_memory_region"].string_param = "in"
            t.parameters["shared_memory_byte_size"].int64_param = b
            t.parameters["shared_memory_offset"].int64_param = o
    got = codec.parse_grpc_infer(request, regions=registry)
    for n in arrays:
        assert np.array_equal(got[n], arrays[n])
    # a path without a registry says so
    _invalid(codec.parse_grpc_infer, request, match="reads no shared memory")
    request.raw_input_contents.append(b"x")
    _invalid(codec.parse_grpc_infer, request, None, registry, field="raw_input_contents",
             match="2 raw buffers for 1 inputs not in shared memory")


def test_http_response_writes_scores_to_the_output_region(registry, segment):
    key, seg = segment
    registry.register("out", key, 0, 4096)
    request = {"outputs": [{"name": OUTPUT_SCORES, "parameters": {"shared_memory_region": "out",
                                                                  "shared_memory_byte_size": 24,
                                                                  "binary_data": False}}], "id": "7"}
    scores = np.array([[0.25], [0.5], [0.75]], np.float32)
    body, headers = codec.http_infer_response("m", request, scores, regions=registry)
    answer = json.loads(body)
    assert answer["outputs"] == [{"name": OUTPUT_SCORES, "datatype": "FP32", "shape": [3, 1]}]
    assert answer["id"] == "7" and headers["Content-Type"] == "application/json"
    assert np.array_equal(np.frombuffer(seg.buf, np.float32, 3), scores.reshape(-1))


# ---------------------------------------------------------------- a 2-worker node, tritonclient


@pytest.fixture(scope="module")
def node(small_model):
    cfg, _ = small_model
    config = node_config(cfg.model, scale=cfg.scale, workers=2)
    with started(config) as server:
        ports = server.ports
        yield server, ports


def _region(name: str, size: int):
    return tshm.create_shared_memory_region(name, "/" + _key(), size)


def _http_shm_inputs(arrays, region: str, where):
    inputs = []
    for n, a in arrays.items():
        x = thttp.InferInput(n, list(a.shape), DATATYPES[a.dtype])
        x.set_shared_memory(region, where[n][1], offset=where[n][0])
        inputs.append(x)
    return inputs


def test_http_inputs_and_output_through_shared_memory_equal_inline(node, small_model):
    """tritonclient.http: register, infer with every input from one region and the scores into another, over
    fresh connections (either worker may answer, right after the register call); status; unregister."""
    server, ports = node
    model = small_model[1]
    client = http.triton(ports.http)
    name = server.config.models[0].name
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    handles = []
    try:
        for i in range(6):  # a register, then at once an infer on a new connection (any worker), each time
            arrays = _arrays(model, batch=2 + i, rng=i)
            inline = client.infer(name, codec.triton_inputs(thttp, arrays)).as_numpy(OUTPUT_SCORES)
            size = sum(a.nbytes + 64 for a in arrays.values())
            handle = _region(f"in{i}", size)
            out = _region(f"out{i}", 4096)
            handles += [handle, out]
            seg = handle._mpsm_handle
            where = _place(seg, arrays)
            client.register_system_shared_memory(f"in{i}", handle._shm_key, size)
            client.register_system_shared_memory(f"out{i}", out._shm_key, 4096)
            fresh = http.triton(ports.http)
            requested = thttp.InferRequestedOutput(OUTPUT_SCORES)
            requested.set_shared_memory(f"out{i}", 4096)
            result = fresh.infer(name, _http_shm_inputs(arrays, f"in{i}", where), outputs=[requested])
            shape = result.get_output(OUTPUT_SCORES)["shape"]
            got = tshm.get_contents_as_numpy(out, np.float32, shape)
            same_scores(got, inline)
            same_scores(  # scores in the body this time
                fresh.infer(name, _http_shm_inputs(arrays, f"in{i}", where)).as_numpy(OUTPUT_SCORES), inline)
            fresh.close()
        assert server.core.shm._maps == {}  # the workers read and wrote the regions, not the supervisor
        keys = [h._shm_key.lstrip("/") for h in handles]
        assert all(any(k in m for m in _worker_maps(server)) for k in keys)
        status = client.get_system_shared_memory_status()
        assert {s["name"] for s in status} == {f"{p}{i}" for p in ("in", "out") for i in range(6)}
        assert client.get_system_shared_memory_status("in0") == [
            {"name": "in0", "key": handles[0]._shm_key, "offset": 0, "byte_size": status[0]["byte_size"]}]
        client.unregister_system_shared_memory("in0")
        with pytest.raises(InferenceServerException, match="'in0' is not a registered"):
            client.infer(name, _http_shm_inputs(_arrays(model, 2, 0), "in0", _place(handles[0]._mpsm_handle,
                                                                                   _arrays(model, 2, 0))))
        client.unregister_system_shared_memory()
        assert client.get_system_shared_memory_status() == []
        deadline = time.monotonic() + 60  # each worker lets its mappings go at its next heartbeat (0.25 s)
        while any(k in m for m in _worker_maps(server) for k in keys) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [line for m in _worker_maps(server) for line in m.splitlines() if any(k in line for k in keys)]
        assert not left, (left, keys)
    finally:
        client.unregister_system_shared_memory()
        for h in handles:
            tshm.destroy_shared_memory_region(h)
        client.close()


def _worker_maps(server) -> list[str]:
    """``/proc/PID/maps`` of each of the node's model workers."""
    pids = [w.pid for rt in server.core.models.values() for w in rt.pools["model"].workers]
    assert len(pids) == 2
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/maps") as f:
            out.append(f.read())
    return out


def test_grpc_inputs_and_output_through_shared_memory_equal_inline(node, small_model):
    server, ports = node
    model = small_model[1]
    client = grpc_client.triton(ports.grpc)
    name = server.config.models[0].name
    arrays = _arrays(model, batch=4, rng=5)
    inline = client.infer(name, codec.triton_inputs(tgrpc, arrays)).as_numpy(OUTPUT_SCORES)
    size = sum(a.nbytes + 64 for a in arrays.values())
    handle, out = _region("gin", size), _region("gout", 4096)
    try:
        where = _place(handle._mpsm_handle, arrays)
        client.register_system_shared_memory("gin", handle._shm_key, size)
        client.register_system_shared_memory("gout", out._shm_key, 4096)
        with pytest.raises(InferenceServerException, match="already registered"):
            client.register_system_shared_memory("gin", handle._shm_key, size)
        inputs = []
        for n, a in arrays.items():
            x = tgrpc.InferInput(n, list(a.shape), DATATYPES[a.dtype])
            if n == INPUT_DENSE:  # mixed: one input inline (raw contents), the others from the region
                x.set_data_from_numpy(a)
            else:
                x.set_shared_memory("gin", where[n][1], offset=where[n][0])
            inputs.append(x)
        requested = tgrpc.InferRequestedOutput(OUTPUT_SCORES)
        requested.set_shared_memory("gout", 4096)
        for _ in range(4):  # both workers
            result = client.infer(name, inputs, outputs=[requested])
            shape = list(result.get_output(OUTPUT_SCORES).shape)
            same_scores(tshm.get_contents_as_numpy(out, np.float32, shape), inline)
            same_scores(client.infer(name, inputs).as_numpy(OUTPUT_SCORES), inline)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status["gin"] == {"name": "gin", "key": handle._shm_key, "byte_size": str(size)}  # proto3 JSON
        client.unregister_system_shared_memory("gin")
        with pytest.raises(InferenceServerException) as info:
            client.infer(name, inputs)
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "'gin' is not a registered" in str(info.value)
        with pytest.raises(InferenceServerException, match="not supported"):
            client.get_cuda_shared_memory_status()
    finally:
        client.unregister_system_shared_memory()
        tshm.destroy_shared_memory_region(handle)
        tshm.destroy_shared_memory_region(out)
        client.close()


def test_bad_region_answers_400_and_cuda_501(node):
    server, ports = node
    name = server.config.models[0].name
    body = {"inputs": [{"name": n, "datatype": d, "shape": s,
                        "parameters": {"shared_memory_region": "missing", "shared_memory_byte_size": b}}
                       for n, d, s, b in ((INPUT_DENSE, "FP32", [1, 1], 4), (INPUT_VALUES, "INT64", [0], 0),
                                          (INPUT_LENGTHS, "INT32", [1, 1], 4))]}
    status, answer = http.post_json(ports.http, f"/v2/models/{name}/infer", body, timeout_s=60).status_and_json()
    assert status == 400 and "'missing' is not a registered" in answer["error"], answer
    region = {"key": "/" + _key(), "byte_size": 8}
    status, answer = http.post_json(ports.http, "/v2/systemsharedmemory/region/x/register", region,
                                    timeout_s=60).status_and_json()
    assert status == 400 and "unable to open" in answer["error"]
    status, answer = http.post_json(ports.http, "/v2/cudasharedmemory/region/x/register", {},
                                    timeout_s=60).status_and_json()
    assert status == 501 and "not supported" in answer["error"]


def test_server_front_end_with_a_token(small_model, start_node):
    """``front_end: server``: the supervisor decodes every query (it maps the regions itself) and, on a node with a
    control token, registration needs it (HTTP header, gRPC metadata)."""
    cfg, model = small_model
    config = node_config(cfg.model, scale=cfg.scale, workers=1)
    config.front_end, config.control_token = "server", "s3cret"
    server = start_node(config)
    ports = server.ports
    arrays = _arrays(model, batch=3, rng=2)
    size = sum(a.nbytes + 64 for a in arrays.values())
    handle = _region("t", size)
    over_http, over_grpc = http.triton(ports.http), grpc_client.triton(ports.grpc)
    auth = {"authorization": "Bearer s3cret"}
    try:
        where = _place(handle._mpsm_handle, arrays)
        with pytest.raises(InferenceServerException, match="needs 'Bearer <token>'"):
            over_http.register_system_shared_memory("t", handle._shm_key, size)
        with pytest.raises(InferenceServerException) as info:
            over_grpc.register_system_shared_memory("t", handle._shm_key, size)
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        over_grpc.register_system_shared_memory("t", handle._shm_key, size, headers=auth)
        assert over_http.get_system_shared_memory_status(headers=auth)[0]["name"] == "t"
        inline = over_http.infer(cfg.name, codec.triton_inputs(thttp, arrays)).as_numpy(OUTPUT_SCORES)
        got = over_http.infer(cfg.name, _http_shm_inputs(arrays, "t", where)).as_numpy(OUTPUT_SCORES)
        same_scores(got, inline)
        inputs = [tgrpc.InferInput(n, list(a.shape), DATATYPES[a.dtype]).set_shared_memory("t", where[n][1],
                                                                                         offset=where[n][0])
                  for n, a in arrays.items()]
        same_scores(over_grpc.infer(cfg.name, inputs).as_numpy(OUTPUT_SCORES), inline)
        assert list(server.core.shm._maps)  # mapped here: this process decoded the queries
        over_http.unregister_system_shared_memory(headers=auth)
    finally:
        over_http.close()
        over_grpc.close()
        tshm.destroy_shared_memory_region(handle)


def test_load_generator_sends_pooled_queries_through_regions(node, small_model):
    """``SharedMemoryHttpTarget`` (``http+shm://``): the pool written once and registered one region per query;
    every answer equals the inline ``HttpTarget``'s; closing unregisters the regions and removes the object."""
    server, ports = node
    cfg = small_model[0]
    pool = RequestPool.from_mix(get_model(cfg.model), cfg.scale, pool=4)
    url = f"http://127.0.0.1:{ports.http}"
    inline = HttpTarget(url, server.config.models[0].name)
    shared = make_target(f"http+shm://127.0.0.1:{ports.http}", server.config.models[0].name)
    assert isinstance(shared, SharedMemoryHttpTarget)

    async def run() -> str:
        await inline.prepare(pool)
        await shared.prepare(pool)
        try:
            assert len(server.core.shm.status()) == len(pool)
            for i in range(len(pool)):
                want = (await inline.infer_outputs(i))[OUTPUT_SCORES]
                same_scores((await shared.infer_outputs(i))[OUTPUT_SCORES], want)
                await shared.infer(i)  # the shape check of a load run
            return shared._segment.name
        finally:
            await inline.close()
            await shared.close()

    key = asyncio.run(run())
    assert server.core.shm.status() == []
    assert not os.path.exists(f"/dev/shm/{key}")
