"""The supervisor's query dispatcher (``serving/node/dispatch.py``) without processes: sub-batches go one per idle
worker and come back in query order, a pipeline's sparse result feeds its dense stage, a worker's death and a
queued query's deadline are answered."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from recserve.serving import build_worker_model, quick_config
from recserve.serving.node.dispatch import QueryDispatcher
from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.launch import WorkerSettings
from recserve.serving.node.metrics import ModelMetrics
from recserve.serving.node.runtime import model_info
from recserve.serving.wire.errors import InferError
from recserve.zoo import sample_batch


class Posted:
    def __init__(self) -> None:
        self.messages: list = []

    def post(self, msg, fd=None) -> None:
        self.messages.append(msg)


class FakePool:
    """A stage's workers, ready and idle; ``pump`` feeds them as ``pool.WorkerPool.pump`` does."""

    def __init__(self, stage: str, workers: int, dispatch_ref: list, loop: asyncio.AbstractEventLoop) -> None:
        self.stage, self.restarting, self._ref = stage, 0, dispatch_ref
        self.workers = [self._worker(i, loop) for i in range(workers)]

    def _worker(self, i: int, loop: asyncio.AbstractEventLoop) -> WorkerHandle:
        ready = loop.create_future()
        ready.set_result(100 + i)
        handle = WorkerHandle(i, self.stage, [], 1, None, None, ready, loop.create_future(), np.zeros(0, np.uint8))
        handle.outbox = Posted()  # type: ignore[assignment]
        return handle

    def pump(self) -> None:
        self._ref[0].feed(self)

    def held(self) -> list:
        return [w for w in self.workers if w.current is not None]


def dispatcher(mode: str, sub_batch: int, stages: dict[str, int]):
    loop = asyncio.new_event_loop()
    cfg = quick_config("hercules-rmc1", scale=1e-4, mode=mode, sub_batch=sub_batch).models[0]
    ref: list = []
    pools = {stage: FakePool(stage, n, ref, loop) for stage, n in stages.items()}
    ref.append(QueryDispatcher(cfg, model_info(cfg), ModelMetrics(), WorkerSettings("1", True, sub_batch),
                               pools))  # type: ignore[arg-type]
    arrays = sample_batch(build_worker_model(cfg), 10, rng=3).as_arrays()
    return loop, ref[0], pools, arrays


def reply(d: QueryDispatcher, pool: FakePool, worker: WorkerHandle, result) -> None:
    item_id = worker.outbox.messages[-1][0]  # type: ignore[union-attr]
    d.on_reply(pool, worker, (item_id, True, result, 0.001))  # type: ignore[arg-type]


def test_sub_batches_go_one_per_idle_worker_and_come_back_in_query_order():
    loop, d, pools, arrays = dispatcher("model", 4, {"model": 2})
    pool = pools["model"]

    async def run():
        task = asyncio.ensure_future(d.infer(arrays, timeout_s=30))
        await asyncio.sleep(0)
        assert [len(w.outbox.messages) for w in pool.workers] == [1, 1]  # 10 items: parts of 4, 4, 2
        assert len(d.queues["model"]) == 1  # the third waits for a free worker
        second, first = pool.workers[1], pool.workers[0]
        reply(d, pool, second, np.full((4, 1), 2.0, np.float32))  # out of order: the second part first
        assert len(second.outbox.messages) == 2 and not d.queues["model"]  # it took the third part
        reply(d, pool, second, np.full((2, 1), 3.0, np.float32))
        reply(d, pool, first, np.full((4, 1), 1.0, np.float32))
        return await task

    scores = loop.run_until_complete(run())
    assert scores[:, 0].tolist() == [1.0] * 4 + [2.0] * 4 + [3.0] * 2
    assert d.in_flight == 0 and d.metrics.successes == 1 and d.metrics.executions == 3
    loop.close()


def test_a_pipeline_sparse_result_becomes_the_dense_stages_part():
    loop, d, pools, arrays = dispatcher("pipeline", 0, {"sparse": 1, "dense": 1})

    async def run():
        task = asyncio.ensure_future(d.infer(arrays, timeout_s=30))
        await asyncio.sleep(0)
        sparse, dense = pools["sparse"].workers[0], pools["dense"].workers[0]
        embeddings = [np.ones((10, 4), np.float32)]
        reply(d, pools["sparse"], sparse, embeddings)
        item_id, payload, descriptors = dense.outbox.messages[-1]
        assert descriptors is None and payload[1] is embeddings  # (dense inputs, the sparse stage's output)
        assert np.array_equal(payload[0], arrays["dense"])
        reply(d, pools["dense"], dense, np.zeros((10, 1), np.float32))
        return await task

    assert loop.run_until_complete(run()).shape == (10, 1)
    loop.close()


def test_a_dead_workers_query_is_answered_and_a_late_queued_one_is_shed():
    loop, d, pools, arrays = dispatcher("model", 0, {"model": 1})
    pool = pools["model"]

    async def run():
        held = asyncio.ensure_future(d.infer(arrays, timeout_s=30))
        queued = asyncio.ensure_future(d.infer(arrays, timeout_s=0.05))
        await asyncio.sleep(0.2)
        with pytest.raises(InferError, match="still queued"):
            await queued
        worker = pool.workers[0]
        d.fail_current(worker, -9)
        with pytest.raises(InferError, match=r"died \(killed by SIGKILL \(signal 9\)\) while computing"):
            await held
        worker.current = None
        pool.pump()  # the shed query's part is skipped, not sent to the worker
        assert len(worker.outbox.messages) == 1 and not d.queues["model"]

    loop.run_until_complete(run())
    loop.close()


def test_abandon_answers_queued_and_running_queries_and_counts_them():
    loop, d, pools, arrays = dispatcher("model", 0, {"model": 1})

    async def run():
        tasks = [asyncio.ensure_future(d.infer(arrays, timeout_s=30)) for _ in range(3)]
        await asyncio.sleep(0)
        assert d.abandon("stopping") == 3
        for task in tasks:
            with pytest.raises(InferError, match="stopping"):
                await task

    loop.run_until_complete(run())
    loop.close()


def test_the_inbox_routes_worker_records_into_the_models_metrics():
    from recserve.serving.node.inbox import PipeInbox

    metrics = ModelMetrics()
    inbox = PipeInbox("m", metrics, SimpleNamespace(on_handoff=None), None, lambda *a: False)  # type: ignore[arg-type]
    handle = SimpleNamespace(queries_done=0)
    inbox.on_message(None, handle, ("stats", [("done", 8, 0.01, 0.002, 0.005, 1), ("sibling", "forwarded"),
                                              ("sibling", "copied"), ("refused", "too_large"),
                                              ("error", "deadline", 0.02)]))  # type: ignore[arg-type]
    assert handle.queries_done == 1  # the queries this worker computed (worker_detail)
    assert inbox.siblings == {"forwarded": 1, "returned": 0, "copied": 1}
    assert (metrics.requests, metrics.successes, metrics.items) == (2, 1, 8)
    assert metrics.errors == {"deadline": 1} and metrics.refusals == {"too_large": 1}
