"""Plain-JSON infer requests read without a Python list per number (``codec.json_request``, issue #51): every
request must get exactly the verdict of the whole decode (``json_loads`` then lists): the same arrays (dtype,
shape, bits) or the same refusal, word for word; and what the fast reader cannot be sure of it leaves to the
whole decode."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from recserve.serving.wire import codec, json_numbers
from recserve.serving.wire.codec import http_requests, json_tensors
from recserve.serving.wire.errors import InferError


def enable_readers(monkeypatch) -> None:
    """This process reads arrays with every reader the probe passed; the test is skipped where none did (no
    compiler and no simdjson, or ``$RECSERVE_JSON_READERS`` set empty): then the whole decode serves, as tested
    by the tests that need no reader."""
    readers, why = json_numbers.probe()
    if not readers:
        pytest.skip(f"no JSON number reader: {why}")
    monkeypatch.setattr(json_numbers, "_readers", readers)


@pytest.fixture
def fast(monkeypatch):
    """Every request and every integer array read the fast way, whatever its size."""
    monkeypatch.setattr(http_requests, "JSON_FAST_BYTES", 0)  # where parse_http_infer reads it
    monkeypatch.setattr(json_tensors, "DATA_BYTES", 0)
    enable_readers(monkeypatch)


def query(batch: int = 3, lengths_dtype=np.int32, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, (2, batch)).astype(lengths_dtype)
    ids = rng.integers(-5, 3_000_000, int(lengths.sum()))
    return {"dense": rng.standard_normal((batch, 4)).astype(np.float32), "sparse_values": ids,
            "sparse_lengths": lengths}


def entries(arrays: dict[str, np.ndarray], nested: bool = False, dense_as=None) -> list[dict]:
    out = []
    for name, a in arrays.items():
        data = a.tolist() if nested else a.reshape(-1).tolist()
        if name == "dense" and dense_as is not None:
            data = dense_as(a)
        out.append({"name": name, "shape": list(a.shape), "datatype": codec.DATATYPES[a.dtype], "data": data})
    return out


def body_of(inputs: list[dict], **dumps) -> bytes:
    return json.dumps({"inputs": inputs}, **dumps).encode()


def whole(body: bytes):
    """Today's decode: the request's JSON read whole, its tensors as lists."""
    return verdict(lambda: http_requests._parse_request(http_requests._header(body), memoryview(b""), None))


def verdict(parse):
    try:
        request, arrays = parse()
    except InferError as exc:
        return ("refused", exc.code, exc.field, str(exc))
    inputs = [{k: v for k, v in t.items() if k != "data"} for t in request["inputs"]]
    return ({**request, "inputs": inputs},
            {n: (a.dtype.str, a.shape, a.tobytes()) for n, a in arrays.items()})  # bits: -0.0 is not 0.0


def read_fast(body: bytes):
    return verdict(lambda: codec.parse_http_infer(body, None))


SPELLINGS = {
    "compact": {"separators": (",", ":")},
    "spaced": {},  # json.dumps' default ", " and ": ", as tritonclient sends
    "indented": {"indent": 2},
    "tabs": {"indent": "\t"},
}


@pytest.mark.parametrize("lengths_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_the_fast_reader_reads_the_arrays_of_the_whole_decode(fast, lengths_dtype, nested, spelling):
    body = body_of(entries(query(lengths_dtype=lengths_dtype), nested), **SPELLINGS[spelling])
    expected = whole(body)
    assert expected[0] != "refused"
    assert read_fast(body) == expected
    for buffer in (bytearray(body), memoryview(bytearray(body))):  # as a worker receives it
        assert verdict(lambda b=buffer: codec.parse_http_infer(b, None)) == expected
    request = codec.json_request(body)
    assert request is not None
    # every array was read by simdjson (no Python list), in every spelling
    assert all(isinstance(t["data"], np.ndarray) for t in request["inputs"])


DENSE_SPELLINGS = {
    "ints as floats": lambda a: [float(round(v)) for v in a.reshape(-1).tolist()],
    "ints": lambda a: [round(v) for v in a.reshape(-1).tolist()],
    "negative zero ints": lambda a: [0] * a.size,
    "exponents": lambda a: [v * 1e-7 for v in a.reshape(-1).tolist()],
    "large exponents": lambda a: [v * 1e30 for v in a.reshape(-1).tolist()],
    "float32 shortest": lambda a: [float(str(v)) for v in a.reshape(-1)],
    "mixed ints and floats": lambda a: [round(v) if k % 2 else v for k, v in enumerate(a.reshape(-1).tolist())],
}


@pytest.mark.parametrize("case", sorted(DENSE_SPELLINGS))
def test_dense_features_in_every_spelling_read_alike(fast, case):
    body = body_of(entries(query(batch=5), dense_as=DENSE_SPELLINGS[case]))
    expected = whole(body)
    assert expected[0] != "refused"
    assert read_fast(body) == expected


def texts() -> dict[str, bytes]:
    """Request bodies written by hand, as curl users do: spellings JSON allows that json.dumps never writes."""
    good = ('{"inputs":[{"name":"dense","shape":[1,2],"datatype":"FP32","data":%s},'
            '{"name":"sparse_values","shape":[3],"datatype":"INT64","data":%s},'
            '{"name":"sparse_lengths","shape":[2,1],"datatype":"INT32","data":%s}]}')
    cases = {
        "plain": ("[0.5,-1.5]", "[1,2,3]", "[1,2]"),
        "exponent forms": ("[1E2,-2.5e-3]", "[0,-0,7]", "[[1],[2]]"),
        "plus exponent": ("[1e+2,2.0E+0]", "[1,2,3]", "[[1],[2]]"),
        "space inside brackets": ("[0.5,-1.5]", "[ 1,2,3 ]", "[1,2]"),
        "space before a comma": ("[0.5,-1.5]", "[1 ,2,3]", "[1,2]"),
        "spaces after commas": ("[0.5, -1.5]", "[1, 2, 3]", "[1, 2]"),
        "newlines": ("[0.5,\n-1.5]", "[1,\n2,\n3]", "[\n1,2\n]"),
        "whitespace around data": ("  [0.5,-1.5]  ", "\t[1,2,3]\n", " [1,2] "),
        "nested one deep": ("[[0.5,-1.5]]", "[[1,2,3]]", "[[[1]],[[2]]]"),
        # what is refused, and must be refused alike
        "leading zero": ("[0.5,-1.5]", "[01,2,3]", "[1,2]"),
        "negative leading zero": ("[0.5,-1.5]", "[1,-02,3]", "[1,2]"),
        "plus sign": ("[0.5,-1.5]", "[+1,2,3]", "[1,2]"),
        "two commas": ("[0.5,-1.5]", "[1,,2,3]", "[1,2]"),
        "trailing comma": ("[0.5,-1.5]", "[1,2,3,]", "[1,2]"),
        "leading comma": ("[0.5,-1.5]", "[,1,2,3]", "[1,2]"),
        "minus inside": ("[0.5,-1.5]", "[1,2-3]", "[1,2]"),
        "double minus": ("[0.5,-1.5]", "[1,--2,3]", "[1,2]"),
        "lone minus": ("[0.5,-1.5]", "[1,-,3]", "[1,2]"),
        "space inside a number": ("[0.5,-1.5]", "[1,2 3]", "[1,2]"),
        "ragged": ("[0.5,-1.5]", "[[1,2],[3]]", "[1,2]"),
        "empty list inside": ("[0.5,-1.5]", "[[1,2,3],[]]", "[1,2]"),
        "mixed depth": ("[0.5,-1.5]", "[1,[2,3]]", "[1,2]"),
        "sign before a list": ("[0.5,-1.5]", "[[1],-[2],[3]]", "[1,2]"),
        "nested 32 deep": ("[0.5,-1.5]", "[" * 32 + "1,2,3" + "]" * 32, "[1,2]"),
        "nested 70 deep": ("[0.5,-1.5]", "[" * 70 + "1,2,3" + "]" * 70, "[1,2]"),  # numpy: 64 dimensions at most
        "sign before the lists": ("[0.5,-1.5]", "[-[1,2,3]]", "[1,2]"),
        "unbalanced": ("[0.5,-1.5]", "[[1,2,3]", "[1,2]"),
        "two arrays": ("[0.5,-1.5]", "[1,2],[3]", "[1,2]"),
        "wrong count": ("[0.5,-1.5]", "[1,2,3,4]", "[1,2]"),
        "float id": ("[0.5,-1.5]", "[1,2.0,3]", "[1,2]"),
        "exponent id": ("[0.5,-1.5]", "[1,2e0,3]", "[1,2]"),
        "int64 overflow": ("[0.5,-1.5]", "[1,9223372036854775808,3]", "[1,2]"),
        "uint64 overflow": ("[0.5,-1.5]", "[1,18446744073709551616,3]", "[1,2]"),
        "int64 min": ("[0.5,-1.5]", "[1,-9223372036854775808,3]", "[1,2]"),
        "huge negative": ("[0.5,-1.5]", "[1,-99999999999999999999,3]", "[1,2]"),
        "big but fine": ("[0.5,-1.5]", "[1,999999999999999999,3]", "[1,2]"),
        "int32 overflow": ("[0.5,-1.5]", "[1,2,3]", "[2147483648,2]"),
        "lengths past the ids": ("[0.5,-1.5]", "[1,2,3]", "[2,2]"),
        "negative length": ("[0.5,-1.5]", "[1,2,3]", "[-1,4]"),
        "nan": ("[NaN,-1.5]", "[1,2,3]", "[1,2]"),
        "infinity": ("[Infinity,-1.5]", "[1,2,3]", "[1,2]"),
        "overflowing float": ("[1e39,-1.5]", "[1,2,3]", "[1,2]"),
        "null": ("[0.5,-1.5]", "[1,null,3]", "[1,2]"),
        "booleans": ("[0.5,-1.5]", "[1,true,3]", "[1,2]"),
        "strings": ("[0.5,-1.5]", '["1","2","3"]', "[1,2]"),
        "dot ending": ("[0.5,1.]", "[1,2,3]", "[1,2]"),
        "dot starting": ("[0.5,.5]", "[1,2,3]", "[1,2]"),
        "hex": ("[0.5,-1.5]", "[1,0x2,3]", "[1,2]"),
        "not an array": ("[0.5,-1.5]", "3", "[1,2]"),
        "an object": ("[0.5,-1.5]", '{"a":1}', "[1,2]"),
    }
    return {name: (good % values).encode() for name, values in cases.items()}


@pytest.mark.parametrize("case", sorted(texts()))
def test_hand_written_requests_get_the_whole_decodes_verdict(fast, case):
    body = texts()[case]
    assert read_fast(body) == whole(body)


def test_a_number_past_fp32s_range_is_read_without_a_warning(fast):
    """It becomes inf, which the query's checks refuse; a client must not be able to write to the worker's log."""
    body = texts()["overflowing float"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_fast(body) == whole(body)


@pytest.mark.parametrize("datatype", ["FP64", "INT32", "BYTES", "UINT64", None])
@pytest.mark.parametrize("name", ["dense", "sparse_values"])
def test_a_wrong_datatype_is_refused_in_the_same_words(fast, name, datatype):
    inputs = entries(query())
    for t in inputs:
        if t["name"] == name:
            t["datatype"] = datatype
    body = body_of(inputs)
    expected = whole(body)
    assert expected[0] == "refused" and read_fast(body) == expected


@pytest.mark.parametrize("shape", [[7], [2, 2, 2], [-1], [1, "a"], None, [10**13, 10**13]])
def test_a_wrong_shape_is_refused_in_the_same_words(fast, shape):
    inputs = entries(query())
    inputs[1]["shape"] = shape
    body = body_of(inputs)
    expected = whole(body)
    assert expected[0] == "refused" and read_fast(body) == expected


def mutations(text: bytes, rng: np.random.Generator, n: int) -> list[bytes]:
    """``text`` with one byte inserted, replaced or deleted at a random place, ``n`` times."""
    out = []
    for _ in range(n):
        k = int(rng.integers(1, len(text) - 1))
        byte = bytes([rng.choice(list(b"0123456789-+,.eE []\n\t"))])
        how = rng.integers(3)
        out.append(text[:k] + byte + text[k:] if how == 0 else text[:k] + byte + text[k + 1:] if how == 1
                   else text[:k] + text[k + 1:])
    return out


def test_every_small_corruption_of_a_request_gets_the_whole_decodes_verdict(fast):
    """The fast reader's grammar against orjson's, where the two could part: one byte off, anywhere in the ids."""
    rng = np.random.default_rng(7)
    arrays = query(batch=4)
    arrays["sparse_values"] = rng.integers(-1000, 1000, int(arrays["sparse_lengths"].sum()))
    body = body_of(entries(arrays), separators=(",", ":"))
    start = body.index(b'"sparse_values"')
    start = body.index(b'"data":[', start) + 7
    end = body.index(b"]", start) + 1
    accepted = 0
    for ids in mutations(body[start:end], rng, 400):
        mutated = body[:start] + ids + body[end:]
        expected = whole(mutated)
        accepted += expected[0] != "refused"
        assert read_fast(mutated) == expected, ids
    assert accepted  # some corruptions are still a valid request (a digit changed)


def test_json_tensors_beside_binary_ones_read_alike(fast):
    """A binary-extension request whose ids travel as JSON ``data`` (tritonclient allows it per input)."""
    arrays = query(batch=6)
    inputs = entries(arrays)
    inputs[0].pop("data")
    inputs[0]["parameters"] = {"binary_data_size": arrays["dense"].nbytes}
    head = body_of(inputs)
    body = head + arrays["dense"].tobytes()
    binary = memoryview(body)[len(head):]
    expected = verdict(lambda: http_requests._parse_request(http_requests._header(head), binary, None))
    assert expected[0] != "refused"
    assert verdict(lambda: codec.parse_http_infer(body, str(len(head)))) == expected
    assert isinstance(codec.json_request(head)["inputs"][1]["data"], np.ndarray)


# requests the fast reader and the skeleton must not misread: each spelled from a well-formed one
SPOILED = {
    "escape in a key": lambda text: text.replace('"data"', '"d\\u0061ta"', 1),
    "data in parameters": lambda text: text.replace('{"inputs"', '{"parameters": {"data": [1, 2]}, "inputs"', 1),
    "data given twice": lambda text: text.replace('"data": [', '"data": [5], "data": [', 1),
    "data a number": lambda text: text.replace('"data": [', '"data": 5, "x": [', 1),
    "binary and data": lambda text: text.replace('"data": [', '"parameters": {"binary_data_size": 0}, "data": [', 1),
    "a string named data": lambda text: text.replace('"name": "dense"', '"name": "data"', 1),
    "not JSON": lambda text: text[:-1],
    "no data": lambda text: json.dumps({"inputs": [{"name": "dense", "shape": [1, 4], "datatype": "FP32"}]}),
    "inputs not a list": lambda text: '{"inputs": {"data": [1]}}',
}


@pytest.mark.parametrize("case", ["escape in a key", "data in parameters", "data given twice", "data a number",
                                  "binary and data", "a string named data"])
def test_what_the_fast_reader_cannot_be_sure_of_it_leaves_to_the_whole_decode(fast, case):
    body = SPOILED[case](body_of(entries(query())).decode()).encode()
    if case not in ("a string named data", "binary and data"):  # those two are read fast, and refused alike
        assert codec.json_request(body) is None
    assert read_fast(body) == whole(body)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_a_requests_skeleton_is_the_request_with_empty_data_and_names_its_rows_and_timeout(spelling):
    inputs = entries(query(batch=5))
    text = body_of(inputs, **SPELLINGS[spelling]).decode()
    body = text.replace('{', '{"parameters": {"timeout": 2500}, ', 1).encode()
    expected = json.loads(body)
    for t in expected["inputs"]:
        t["data"] = []
    skeleton = codec.json_skeleton(bytearray(body))  # a worker's receive buffer
    assert skeleton == expected
    assert codec.dense_rows(skeleton) == 5 and codec.timeout_s(skeleton["parameters"]) == pytest.approx(0.0025)


@pytest.mark.parametrize("case", ["escape in a key", "data in parameters", "data given twice", "data a number",
                                  "not JSON", "no data", "inputs not a list"])
def test_a_skeleton_is_none_where_it_might_not_be_what_the_whole_decode_reads(case):
    assert codec.json_skeleton(SPOILED[case](body_of(entries(query())).decode()).encode()) is None


def assert_native_spans(head: bytes, context) -> list | None:
    """The native ``data_spans`` of ``head`` lie where ``json_tensors._data_spans`` finds them (None for a backslash),
    each with its room: its commas and one, as ``room()`` counts them alone; returns them."""
    from recserve.serving.wire import _json_arrays

    want = None if b"\\" in head else json_tensors._data_spans(head)
    got = json_numbers.data_spans(head)
    assert (got if got is None else [(start, end) for start, end, _ in got]) == want, context
    for start, end, room in got or []:
        assert room == _json_arrays.room(head[start:end]) == head[start:end].count(b",") + 1, context
    return got


def test_the_native_data_spans_are_the_python_ones_on_every_text_and_corruption():
    """``json_numbers.data_spans`` (C, on the receive buffer) finds what ``json_tensors._data_spans`` finds, None for
    any backslash: on the hand-written texts and on requests with a structural byte inserted, replaced or cut
    anywhere."""
    if "native" not in json_numbers.probe()[0]:
        pytest.skip("the native reader is not built here")
    rng = np.random.default_rng(11)
    heads = list(texts().values()) + [body_of(entries(query(batch=2)))]
    for head in list(heads):
        for _ in range(150):
            k = int(rng.integers(0, len(head)))
            byte = bytes([rng.choice(list(b'"{}[]:, \\da'))])
            how = rng.integers(3)
            heads.append(head[:k] + byte + head[k:] if how == 0 else head[:k] + byte + head[k + 1:] if how == 1
                         else head[:k])
    for head in heads:
        got = assert_native_spans(head, head)
        assert json_numbers.data_spans(memoryview(bytearray(head))) == got, head


def test_the_native_data_spans_count_long_arrays_at_every_offset_of_a_vector_step():
    """One pass reads each array 16 bytes a step, its comma counters summed every 255 steps: arrays of 1-9,000
    bytes, each with the next quote, brace or backslash at every offset of its last step, count as room() does
    and stop where ``json_tensors._data_spans`` does."""
    if "native" not in json_numbers.probe()[0]:
        pytest.skip("the native reader is not built here")
    rng = np.random.default_rng(12)
    for length in [1, 2, 15, 16, 17, 31, 33, 100, 4079, 4080, 4081, 4097, 8161, 9000]:
        values = b",".join(b"%d" % v for v in rng.integers(0, 10, length))[:length].rstrip(b",") or b"7"
        for tail in [b"]}", b']  , "shape": [1]}', b"] \\ }", b" ,]}", b"],,}"]:
            for pad in range(17):
                head = b'{"inputs": [{"name": "x", "data": [' + b" " * pad + values + tail + b"]}"
                assert_native_spans(head, (length, tail, pad))


@pytest.mark.parametrize("structure, regular", [
    (b"[,,]", True), (b"[[,],[,]]", True), (b"[[[,]],[[,]]]", True), (b"[[,],[,,]]", False), (b"[[,],[]]", False),
    (b"[[,],,]", False), (b"[[,]", False), (b"[[,]]]", False), (b"[]", True), (b"[[],[]]", True)])
def test_a_nested_arrays_structure_is_regular_or_not(structure, regular):
    # "[]" reads as regular here; the empty numbers it leaves are refused by the grammar check after it
    assert json_numbers.regular(structure) is regular


def test_a_large_query_is_read_fast_once_a_reader_is_enabled(monkeypatch):
    enable_readers(monkeypatch)
    arrays = query(batch=256)
    arrays["sparse_values"] = np.random.default_rng(3).integers(0, 3_000_000, 20_000)
    arrays["sparse_lengths"][:] = 0
    arrays["sparse_lengths"][0, :] = 20_000 // 256
    arrays["sparse_lengths"][1, :16] = 1
    body = body_of(entries(arrays))
    assert len(body) >= codec.JSON_FAST_BYTES
    request = codec.json_request(body)
    assert isinstance(request["inputs"][1]["data"], np.ndarray)
    assert read_fast(body) == whole(body)


@pytest.mark.integration
def test_a_node_scores_a_large_plain_json_query_as_its_binary_twin_and_its_worker_lives_on(start_node):
    """A 2.4 MB plain-JSON query (read the fast way) gets the binary query's scores to the bit; several at once,
    back to back, are all answered by the same worker (the supervisor never took it for gone)."""
    from concurrent.futures import ThreadPoolExecutor

    from recserve.serving import build_worker_model
    from recserve.serving.node.control_client import ControlClient
    from recserve.zoo import sample_batch
    from tests.support import http
    from tests.support.nodes import node_config

    config = node_config("elasticrec-rm1", scale=1e-4, workers=1)
    config.max_body_bytes = 16 * 1024 * 1024
    server = start_node(config)
    cfg = server.config.models[0]
    arrays = sample_batch(build_worker_model(cfg), 200, rng=3).as_arrays()
    body = body_of(entries(arrays))
    assert len(body) > 2_000_000 and codec.json_request(body) is not None
    path = f"/v2/models/{cfg.name}/infer"

    def post_plain():
        return http.post(server.ports.http, path, body, headers={"Content-Type": "application/json"}, timeout_s=120)

    reply = post_plain()
    assert reply.status == 200, reply.body[:300]
    scores = reply.scores()
    reply = http.infer(server.ports.http, cfg.name, arrays, timeout_s=120)
    assert reply.status == 200, reply.body[:300]
    twin = reply.scores()
    assert scores.dtype == twin.dtype and scores.tobytes() == twin.tobytes()

    control = ControlClient("127.0.0.1", server.ports.http)
    assert control.get_model(cfg.name)["json_reader"] == "+".join(json_numbers.probe()[0])  # as probed here
    pids = [w["pid"] for w in control.get_model(cfg.name)["stages"]["model"]["worker_detail"]]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda _: post_plain(), range(12)))
    assert [r.status for r in replies] == [200] * 12, [r.body[:200] for r in replies if r.status != 200]
    assert [w["pid"] for w in control.get_model(cfg.name)["stages"]["model"]["worker_detail"]] == pids


@pytest.mark.parametrize("with_readers", [True, False])
def test_json_of_too_many_arrays_or_objects_is_refused_before_orjson_builds_them(monkeypatch, with_readers):
    """Two-byte ``[]`` or ``{}`` become 30-60-byte Python objects: past MAX_JSON_CONTAINERS a request's JSON is refused
    400 before it is parsed, whether its containers sit in a ``data`` array (the fast reader's fallback) or
    anywhere else; within the bound a nested tensor reads as the whole decode reads it."""
    if with_readers:
        enable_readers(monkeypatch)
    else:
        monkeypatch.setattr(json_numbers, "_readers", ())
    n = codec.MAX_JSON_CONTAINERS
    empty_rows = body_of([{"name": "dense", "shape": [n, 0], "datatype": "FP32", "data": [[]] * n}])
    empty_inputs = json.dumps({"inputs": [{}] * n}).encode()
    valid = {"dense": np.full((n, 1), 0.5, np.float32), "sparse_values": np.zeros(0, np.int64),
             "sparse_lengths": np.zeros((2, n), np.int32)}
    regular_rows = body_of(entries(valid, nested=True))  # valid but for the bound; the native reader reads it
    for body in (empty_rows, empty_inputs, regular_rows):
        refused = read_fast(body)
        assert refused[:3] == ("refused", "invalid", "body") and f"over {n};" in refused[3]
        assert refused == whole(body)
    assert codec.json_skeleton(empty_inputs) is None
    arrays = query(batch=2)
    arrays["dense"] = np.random.default_rng(1).standard_normal((n // 4, 2)).astype(np.float32)  # nested: n/4 rows
    arrays["sparse_lengths"] = np.zeros((2, n // 4), np.int32)
    arrays["sparse_values"] = np.zeros(0, np.int64)
    body = body_of(entries(arrays, nested=True))
    assert read_fast(body) == whole(body) and read_fast(body)[0] != "refused"


def test_the_container_bound_counts_every_bracket_and_brace():
    json_tensors.check_containers(b"[{" * (codec.MAX_JSON_CONTAINERS // 2))
    with pytest.raises(InferError, match="over"):
        json_tensors.check_containers(b"[{" * (codec.MAX_JSON_CONTAINERS // 2) + b"[")
