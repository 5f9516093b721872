"""A worker's verdict on a query before its tensors are read (``worker/early_refusal.py``): from the binary
extension's JSON header, and from a plain-JSON request's skeleton."""

from __future__ import annotations

import json
import time

import numpy as np

from recserve.serving.wire.codec import request_timeout_s
from recserve.serving.worker.admission import AdmissionQueue
from recserve.serving.worker.early_refusal import EarlyRefusal
from recserve.serving.worker.limits import PlaneLimits


def plain_json(rows: int, timeout_us: int | None = None) -> bytes:
    """A plain-JSON infer request of ``rows`` dense rows of 13 features (no sparse inputs: the verdict reads only
    the dense shape and the timeout)."""
    request = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [rows, 13],
                           "data": np.linspace(0, 1, rows * 13).tolist()}]}
    if timeout_us is not None:
        request["parameters"] = {"timeout": timeout_us}
    return json.dumps(request).encode()


def header(rows: int) -> bytes:
    return json.dumps({"inputs": [{"name": "dense", "datatype": "FP32", "shape": [rows, 13]}]}).encode()


def one_queued(limit: int = 1) -> AdmissionQueue:
    """An admission queue holding ``limit`` queries: full by count."""
    admission = AdmissionQueue("m", PlaneLimits(queue_limit=limit), lambda *failed: None)
    for _ in range(limit):
        admission.push(lambda *answer: None, time.perf_counter(), time.perf_counter() + 1.0, (), 1, 0.0)
    return admission


def test_an_idle_worker_reads_every_query_whole():
    early = EarlyRefusal(AdmissionQueue("m", PlaneLimits(queue_limit=1), lambda *failed: None), lambda: None)
    assert early.from_json(plain_json(512)) is None
    assert early.from_header(header(512)) is None
    assert early.from_json(b"not json at all") is None  # not even looked at: the decode answers it


def test_a_busy_worker_refuses_from_the_skeleton_or_header_what_it_cannot_admit():
    early = EarlyRefusal(one_queued(), lambda: None)
    for verdict in (early.from_json(plain_json(512)), early.from_header(header(512))):
        assert verdict is not None and verdict.code == "unavailable" and "retry later" in str(verdict)


def test_what_the_skeleton_cannot_tell_is_left_to_the_full_decode():
    early = EarlyRefusal(one_queued(), lambda: None)
    assert early.from_json(b'{"inputs": [{"name": "dense", "shape": "nonsense", "data": [1, 2]}]}') is None
    assert early.from_json(b'{"inputs": [{"name": "other", "shape": [2, 1], "data": [1, 2]}]}') is None
    assert early.from_json(b'{"inputs": [') is None
    assert early.from_header(b"{") is None


def test_the_accelerator_answers_for_the_queries_it_takes():
    class Offload:
        def takes(self, items: int) -> bool:
            return items >= 256

        def behind(self, deadline: float):
            return None

    offload = Offload()
    early = EarlyRefusal(one_queued(), lambda: offload)
    assert early.from_json(plain_json(512)) is None  # the accelerator's, and it keeps up
    assert early.from_json(plain_json(8)) is not None  # this worker's full queue


def test_the_clients_timeout_is_read_in_microseconds():
    assert request_timeout_s({"parameters": {"timeout": 250_000}}) == 0.25
    assert request_timeout_s({}) is None
