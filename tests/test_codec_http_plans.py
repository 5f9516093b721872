"""The worker's HTTP fast path (issue #14): a request whose JSON header bytes were seen before is read without JSON
(``codec.HttpPlans``, ``codec.parse_raw``).  Every answer and every refusal must equal what the whole decode gives."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from recserve.serving.wire import codec
from recserve.serving.wire.codec import PLAN_KEY_BYTES, PLANS, HttpPlans
from recserve.serving.wire.errors import InferError
from tests.support.oip_inputs import small_query as query


def body_of(arrays: dict[str, np.ndarray], request_id: str | None = None, outputs: list | None = None,
            json_inputs: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """A binary-extension request body and its Inference-Header-Content-Length, as tritonclient sends them."""
    inputs, binary = [], b""
    for name, array in arrays.items():
        entry = {"name": name, "shape": list(array.shape), "datatype": codec.DATATYPES[array.dtype]}
        if name in json_inputs:
            entry["data"] = array.reshape(-1).tolist()
        else:
            entry["parameters"] = {"binary_data_size": array.nbytes}
            binary += array.tobytes()
        inputs.append(entry)
    header: dict = {"inputs": inputs, "outputs": outputs if outputs is not None else
                    [{"name": "scores", "parameters": {"binary_data": True}}]}
    if request_id is not None:
        header["id"] = request_id
    head = json.dumps(header).encode()
    return head + binary, str(len(head))


def verdict(parse, body: bytes | bytearray, header_length: str | None):
    try:
        request, arrays = parse(body, header_length)
    except InferError as exc:
        return ("refused", exc.code, exc.field, str(exc))
    return request, {n: (a.dtype, a.tolist()) for n, a in arrays.items()}


@pytest.mark.parametrize("lengths_dtype", [np.int32, np.int64])
def test_a_planned_request_reads_the_same_arrays_as_the_whole_decode(lengths_dtype):
    plans = HttpPlans()
    first, length = body_of(query(lengths_dtype=lengths_dtype))
    plans.parse(first, length)
    assert len(plans._plans) == 1
    for seed in range(3):  # other values, the same header: read by the plan, as views of the body
        body, length2 = body_of(query(lengths_dtype=lengths_dtype, seed=seed))
        assert length2 == length and body[: int(length)] == first[: int(length)]
        buffer = bytearray(body)
        request, fast = plans.parse(buffer, length)
        whole_request, whole = codec.parse_http_infer(bytes(body), length)
        assert request == whole_request and list(fast) == list(whole)
        assert all(fast[n].dtype == whole[n].dtype and np.array_equal(fast[n], whole[n]) for n in whole)
        assert all(np.shares_memory(fast[n], np.frombuffer(buffer, np.uint8)) for n in fast)


def bad_bodies() -> dict[str, tuple[bytes, str]]:
    """Requests with a planned header whose binary part or values are wrong in every way the plan must notice."""
    good, length = body_of(query())
    nan = query()
    nan["dense"][0, 0] = np.nan
    too_far = query()
    too_far["sparse_lengths"][0, 0] = 4  # lengths sum past the ids
    negative = query()
    negative["sparse_lengths"][1, 0] = -1
    return {"short": (good[:-8], length), "long": (good + b"\0" * 8, length),
            "header only": (good[: int(length)], length),
            "nan": body_of(nan), "lengths past the ids": body_of(too_far), "negative length": body_of(negative),
            "header length past the body": (good, str(len(good) + 1)), "header length not a number": (good, "x"),
            "no header length": (good, None)}


@pytest.mark.parametrize("case", sorted(bad_bodies()))
def test_a_request_the_plan_cannot_read_gets_the_whole_decodes_verdict(case):
    plans = HttpPlans()
    plans.parse(*body_of(query()))
    body, length = bad_bodies()[case]
    expected = verdict(codec.parse_http_infer, body, length)
    assert verdict(plans.parse, body, length) == expected
    assert verdict(plans.parse, bytearray(body), length) == expected  # and again, as a worker's buffer
    if case in ("nan", "lengths past the ids", "negative length"):
        assert expected[0] == "refused"


def test_no_plan_where_more_than_the_tensors_bytes_could_change_the_verdict():
    base = codec.parse_http_infer(*body_of(query()))[0]
    assert codec.http_raw_plan(base) is not None
    shm_output = [{"name": "scores", "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}]
    for params in ({"shared_memory_region": "r", "shared_memory_byte_size": 16}, {"binary_data_size": 16, "x": 1}):
        request = copy.deepcopy(base)
        request["inputs"][0]["parameters"] = params
        assert codec.http_raw_plan(request) is None
    assert codec.http_raw_plan({**base, "outputs": shm_output}) is None
    plans = HttpPlans()
    json_data = body_of(query(), json_inputs=("dense",))
    assert codec.http_raw_plan(plans.parse(*json_data)[0]) is None
    assert not plans._plans


def test_a_request_id_is_part_of_the_header_and_of_the_answer():
    plans = HttpPlans()
    for request_id in ("a", "b", "a"):
        request, _ = plans.parse(*body_of(query(), request_id=request_id))
        assert request["id"] == request_id
    assert len(plans._plans) == 2


def test_a_header_too_long_to_remember_is_read_whole_every_time():
    plans = HttpPlans()
    for request_id in ("x" * PLAN_KEY_BYTES, "x" * (PLAN_KEY_BYTES - 1000)):
        body, length = body_of(query(), request_id=request_id)
        assert plans.parse(body, length)[0]["id"] == request_id
        assert plans.parse(body, length)[0]["id"] == request_id
    assert len(plans._plans) == 1  # the shorter one


def test_the_plans_stay_bounded():
    plans = HttpPlans()
    for k in range(PLANS + 5):  # a client whose ids change on every call
        plans.parse(*body_of(query(), request_id=str(k)))
    assert 0 < len(plans._plans) <= PLANS


def model_path(rows: tuple[int, ...] = (10, 10), seq_lens: dict[int, int] | None = None, dense_in: int = 4):
    """The worker's decode → validate path for a two-table model of ``small_query``'s layout."""
    from recserve.serving.wire.model_info import ModelInfo
    from recserve.serving.worker.model_path import ModelPath

    info = ModelInfo(dense_in=dense_in, rows=rows, seq_lens=seq_lens or {}, towers=1)
    return ModelPath("m", info, 64, lambda query: None, codec.MAX_JSON_BYTES)


def path_verdict(path, body: bytes, length: str):
    try:
        _, query, items = path.decode(bytearray(body), length)
    except InferError as exc:
        return ("refused", exc.code, exc.field, str(exc))
    return items, [(a.dtype, a.tolist()) for a in query]


@pytest.mark.parametrize("model", ["rows", "sequence", "dense"])
def test_a_planned_request_whose_shapes_passed_gets_the_whole_checks_verdict(model):
    """Once a plan's dtypes and shapes are accepted only values are checked: every request still gets the verdict
    of a path that never saw the plan (ids past a table's rows, a sequence table's bag, a dense width)."""
    kwargs = {"rows": {"rows": (5, 10)}, "sequence": {"seq_lens": {1: 1}}, "dense": {"dense_in": 3}}[model]
    warm = model_path(**kwargs)
    for seed in range(6):
        body, length = body_of(query(seed=seed))
        warm_verdict = path_verdict(warm, body, length)
        assert warm_verdict == path_verdict(model_path(**kwargs), body, length)
        if model == "rows" and seed == 0:
            good = query(seed=seed)
            good["sparse_values"][:] = np.minimum(good["sparse_values"], 4)
            assert path_verdict(warm, *body_of(good))[0] == 1  # the plan's shapes accepted, values in range
    refusals = [path_verdict(warm, *body_of(query(seed=seed)))[0] for seed in range(6)]
    if model == "rows":
        assert "refused" in refusals and 1 in refusals  # some ids reach past table 0's 5 rows, some do not
    else:
        assert all(r == "refused" for r in refusals)  # a shape (or sequence bag) this model never accepts
