"""The control API's schema and access rule (serving/node/control_api.py) and error-body redaction, without a server
(the fuzz suite drives the same code through HTTP)."""

from __future__ import annotations

import pytest

from recserve.errors import SpecError
from recserve.serving.node import control_api
from recserve.serving.wire.errors import InferError, redact_paths


def field_of(fn, *args) -> str:
    with pytest.raises(InferError) as info:
        fn(*args)
    assert info.value.status.http == 400 and str(info.value).startswith(f"{info.value.field}:")
    return info.value.field


@pytest.mark.parametrize(("body", "field"), [
    ({"threads": 1}, "workers"), ({"workers": True}, "workers"), ({"workers": 0}, "workers"),
    ({"workers": 10**6}, "workers"), ({"workers": 1, "threads": True}, "threads"),
    ({"workers": 1, "threads": 10**4}, "threads"), ({"workers": 1, "threads": 1.5}, "threads"),
    ({"workers": 1, "cores": "0"}, "cores"), ({"workers": 1, "cores": [[0], []]}, "cores"),
    ({"workers": 1, "cores": [True]}, "cores"), ({"workers": 1, "stage": "dense"}, "stage"),
    ({"workers": 1, "worker": 2}, "worker"),
])
def test_workers_request_names_the_bad_field(body, field):
    assert field_of(control_api.workers_request, body, ["model"]) == field


@pytest.mark.parametrize("cores", [[[0], []], [[0], 1], [-1], [], [[0], [True]], "0"])
def test_a_bad_cores_shape_is_named_with_both_shapes_it_may_take(cores):
    with pytest.raises(InferError) as info:
        control_api.workers_request({"workers": 1, "cores": cores}, ["model"])
    assert str(info.value).startswith(f"cores: must be {control_api.CORES_SHAPE}, got ")


def test_valid_workers_request_passes_within_the_host_bounds():
    most_workers, most_threads = control_api.worker_limits()
    ask = control_api.workers_request({"workers": most_workers, "threads": most_threads, "cores": [[0]] * 1,
                                       "stage": "model"}, ["model"])
    assert (ask.workers, ask.threads, ask.stage) == (most_workers, most_threads, "model")
    assert control_api.workers_request({"workers": 2, "cores": [0, 1]}, ["model"]).cores == [0, 1]


@pytest.mark.parametrize(("query", "field"), [
    ({"seconds": "nan"}, "seconds"), ({"seconds": "0"}, "seconds"), ({"seconds": "1e9"}, "seconds"),
    ({"percentile": "101"}, "percentile"), ({"percentile": "nan"}, "percentile"), ({"percentile": "0"}, "percentile"),
    ({"seconds": "abc"}, "seconds"), ({"window": "5"}, "window"),
])
def test_window_query_names_the_bad_parameter(query, field):
    assert field_of(control_api.window_query, query, 95.0) == field


def test_window_query_defaults():
    assert control_api.window_query({}, 99.0) == (10.0, 99.0)
    assert control_api.window_query({"seconds": "2.5", "percentile": "100"}, 99.0) == (2.5, 100.0)


def test_sub_batch_and_llc_bodies():
    assert control_api.sub_batch_request({"sub_batch": 0}, 64) == 0
    assert field_of(control_api.sub_batch_request, {"sub_batch": 65}, 64) == "sub_batch"
    assert field_of(control_api.sub_batch_request, {}, 64) == "sub_batch"
    assert field_of(control_api.llc_request, {"ways": "4"}) == "ways"


def test_exposure_needs_a_token_off_loopback():
    assert "loopback clients only" in control_api.check_exposure("127.0.0.1", None)
    assert "loopback clients only" in control_api.check_exposure("::1", None)
    for host in ("0.0.0.0", "10.1.2.3", "example.org"):
        with pytest.raises(SpecError, match="needs a token"):
            control_api.check_exposure(host, None)
    assert "bearer token" in control_api.check_exposure("0.0.0.0", "s3cret")
    assert control_api.authorised("Bearer s3cret", "s3cret") and control_api.authorised(None, None)
    assert not control_api.authorised("Bearer s3cre", "s3cret") and not control_api.authorised(None, "s3cret")


def test_error_bodies_do_not_carry_absolute_paths():
    exc = InferError("internal", "FileNotFoundError: [Errno 2] No such file: '/var/lib/recserve/t0.tbl'")
    assert exc.body()["error"] == "FileNotFoundError: [Errno 2] No such file: '.../t0.tbl'"
    assert redact_paths("see http://host/a/b and ./rel/path") == "see http://host/a/b and ./rel/path"
