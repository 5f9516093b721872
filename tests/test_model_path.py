"""A worker's model pass (``ModelPath.compute``): scores checked on every pass, and a fused pass that fails run
again query by query, so one client's query never fails or corrupts another's answer."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from recserve.serving.wire.errors import InferError
from recserve.serving.wire.model_info import ModelInfo
from recserve.serving.worker.model_path import ModelPath

POISON = 666.0


def query(items: int, first: float = 0.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense = np.full((items, 2), 0.5, dtype=np.float32)
    dense[0, 0] = first
    return dense, np.zeros(items, dtype=np.int64), np.ones((1, items), dtype=np.int32)


def path(fault: str) -> ModelPath:
    """A one-table model whose scores are ``dense.sum(1)`` as ``[B, 1]``, but ``fault`` on a batch holding
    ``POISON``: raises, returns NaN, the wrong shape or the wrong dtype."""
    def run(q: tuple) -> np.ndarray:
        dense = q[0]
        scores = dense.sum(axis=1, keepdims=True).astype(np.float32)
        if not (dense == POISON).any():
            return scores
        if fault == "raise":
            raise RuntimeError("model refuses 666")
        if fault == "nan":
            return np.where(dense[:, :1] == POISON, np.nan, scores).astype(np.float32)
        if fault == "shape":
            return scores[:1]
        if fault == "dtype":
            return scores.astype(np.int64)
        raise AssertionError(fault)

    return ModelPath("m", ModelInfo(dense_in=2, rows=(10,), seq_lens={}, towers=1), 64, run, 1 << 20)


@pytest.mark.parametrize("fault", ["raise", "nan", "shape", "dtype"])
def test_a_query_that_breaks_a_fused_pass_fails_alone(fault):
    answers = path(fault).compute([query(2), query(3, POISON), query(1)])
    assert isinstance(answers[1], InferError)
    assert answers[1].code == "internal"
    for answer, items in ((answers[0], 2), (answers[2], 1)):
        assert isinstance(answer, np.ndarray) and answer.dtype == np.float32
        np.testing.assert_array_equal(answer, np.full((items, 1), 1.0, dtype=np.float32))


@pytest.mark.parametrize(("fault", "said"), [("shape", "returned scores [1, 1] for 3 item(s), expected [3, 1]"),
                                             ("dtype", "int64 scores, expected FP32"),
                                             ("nan", "non-finite")])
def test_a_lone_query_whose_scores_break_the_contract_is_refused_naming_it(fault, said):
    with pytest.raises(InferError, match=re.escape(said)):
        path(fault).compute([query(3, POISON)])


def test_scores_of_half_precision_are_widened_and_others_pass_unchanged():
    half = ModelPath("m", ModelInfo(dense_in=2, rows=(10,), seq_lens={}, towers=1), 64,
                     lambda q: np.ones((q[0].shape[0], 1), dtype=np.float16), 1 << 20)
    (scores,) = half.compute([query(2)])
    assert scores.dtype == np.float32 and scores.shape == (2, 1)
    answers = path("raise").compute([query(2), query(1)])
    assert [a.shape for a in answers] == [(2, 1), (1, 1)]


def test_queries_the_model_failed_are_logged_at_most_once_a_period_with_a_count(caplog):
    from recserve.serving.worker.failure_log import MODEL_FAILURE_LOG_S, ModelFailures

    failures = ModelFailures("m", "2")
    with caplog.at_level("WARNING", logger="recserve.serving"):
        for _ in range(5):
            failures.failed("RuntimeError: model refuses 666\n  traceback")
    assert [r.getMessage() for r in caplog.records] == [
        "model m version 2: 1 query failed in the model since the last report; the latest: RuntimeError: model "
        "refuses 666"]
    assert failures.count == 4
    failures.said -= MODEL_FAILURE_LOG_S
    with caplog.at_level("WARNING", logger="recserve.serving"):
        failures.failed("scores: the model produced non-finite scores")
    assert "5 queries failed" in caplog.records[-1].getMessage()


def test_a_workers_log_lines_carry_the_time_level_and_worker():
    """A worker (a forkserver child, no logging set up) writes its warnings as the server's lines read."""
    script = ("import logging, types\n"
              "from recserve.serving.worker.main import log_to_stderr\n"
              "args = types.SimpleNamespace(model_config=types.SimpleNamespace(name='m'), version='2', stage='model', "
              "worker_id=3)\n"
              "log_to_stderr(args)\n"
              "logging.getLogger('recserve.serving').warning('scores: non-finite')\n"
              "logging.getLogger('recserve.serving').info('not shown')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} recserve\.serving WARNING \[m v2 model worker 3\] "
                        r"scores: non-finite\n", done.stderr), done.stderr
