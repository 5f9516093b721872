"""A live settings change (``ModelRuntime.configure``: sub_batch, min_items, the default version, accelerator
sockets) returns once every working worker has applied it, without processes: a late acknowledgement is waited
for, a worker that exits or hangs is not, and a worker that never answers is a 503 after the bound."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.inbox import PipeInbox
from recserve.serving.node.runtime import ModelRuntime
from recserve.serving.wire import pipe
from recserve.serving.wire.errors import InferError


class Acking:
    """A worker's outbox that answers each numbered change after ``delay_s`` (never when None), as the worker's
    pipe reader does, through the supervisor's inbox."""

    def __init__(self, handle: WorkerHandle, delay_s: float | None) -> None:
        self.handle, self.delay_s, self.changes = handle, delay_s, []

    def post(self, msg, fd=None) -> None:
        config = pipe.decode(msg)
        self.changes.append(config.changes)
        if self.delay_s is not None:
            reply = pipe.encode(pipe.Applied(config.seq))
            asyncio.get_running_loop().call_later(self.delay_s, INBOX.on_message, None, self.handle, reply)


INBOX = PipeInbox("m", None, None, None, None)  # type: ignore[arg-type]


def runtime(delays: list[float | None]) -> SimpleNamespace:
    """What ``configure`` reads of a runtime: its model pool's workers, each acknowledging after its delay."""
    loop = asyncio.get_running_loop()
    workers = []
    for i, delay in enumerate(delays):
        ready = loop.create_future()
        ready.set_result(100 + i)
        w = WorkerHandle(i, "model", [], 1, None, None, ready, loop.create_future(), np.zeros(0, np.uint8))
        w.outbox = Acking(w, delay)  # type: ignore[assignment]
        workers.append(w)
    return SimpleNamespace(name="m", accepts_in_workers=True, _config_seq=0,
                           pools={"model": SimpleNamespace(workers=workers)})


def configure(rt: SimpleNamespace, changes: dict, timeout_s: float = 30.0, workers=None):
    return ModelRuntime.configure(rt, changes, timeout_s, workers)  # type: ignore[arg-type]


def test_a_change_returns_once_the_slowest_worker_has_applied_it():
    async def go() -> tuple[float, list[int]]:
        rt = runtime([0.0, 0.3])
        t = asyncio.get_running_loop().time()
        await configure(rt, {"sub_batch": 4})
        return asyncio.get_running_loop().time() - t, [w.config_seq for w in rt.pools["model"].workers]

    waited, seqs = asyncio.run(go())
    assert waited >= 0.3 and seqs == [1, 1]


def test_each_change_waits_for_its_own_number():
    async def go() -> list[list]:
        rt = runtime([0.05, 0.05])
        await configure(rt, {"sub_batch": 4})
        await configure(rt, {"min_items": 8})
        assert [w.config_seq for w in rt.pools["model"].workers] == [2, 2]
        return [w.outbox.changes for w in rt.pools["model"].workers]

    assert asyncio.run(go()) == [[{"sub_batch": 4}, {"min_items": 8}]] * 2


def test_a_worker_that_never_answers_is_a_503_after_the_bound():
    async def go() -> None:
        await configure(runtime([0.0, None]), {"min_items": 8}, timeout_s=0.2)

    with pytest.raises(InferError) as err:
        asyncio.run(go())
    assert err.value.code == "unavailable" and "1 worker(s)" in str(err.value) and "min_items" in str(err.value)


@pytest.mark.parametrize("gone", ["exits", "hangs"])
def test_a_worker_that_exits_or_hangs_meanwhile_is_not_waited_for(gone):
    async def go() -> None:
        rt = runtime([0.0, None])
        silent = rt.pools["model"].workers[1]

        def lose() -> None:
            if gone == "exits":
                silent.exited.set_result(0)
            else:
                silent.hung = True

        asyncio.get_running_loop().call_later(0.1, lose)
        await configure(rt, {"sub_batch": 0}, timeout_s=30.0)

    asyncio.run(asyncio.wait_for(go(), 10))


def test_a_change_for_some_workers_reaches_and_waits_for_those_only():
    """Retirees stop accepting before any of them closes a connection (``set_workers``); the others carry on."""
    async def go() -> list[list]:
        rt = runtime([None, 0.05, 0.05])
        retirees = rt.pools["model"].workers[1:]
        await configure(rt, {"accepting": False}, timeout_s=30.0, workers=retirees)
        return [w.outbox.changes for w in rt.pools["model"].workers]

    assert asyncio.run(go()) == [[], [{"accepting": False}], [{"accepting": False}]]


def test_a_node_whose_workers_take_no_queries_sends_nothing():
    async def go() -> list:
        rt = runtime([None])
        rt.accepts_in_workers = False
        await configure(rt, {"sub_batch": 4}, timeout_s=0.1)
        return rt.pools["model"].workers[0].outbox.changes

    assert asyncio.run(go()) == []


def test_retiring_versions_all_stop_accepting_before_any_is_stopped():
    """A new version loaded (or a model unloaded) retires old versions together: every one of their workers stops
    accepting before any of them closes a connection, so a client moved by GOAWAY reaches a worker that stays."""
    from recserve.serving.node.core import NodeCore

    events: list[tuple[str, int]] = []

    class Version:
        in_flight = 0

        def __init__(self, n: int) -> None:
            self.n = n

        async def stop_accepting(self) -> None:
            await asyncio.sleep(0.02 * self.n)  # the later acknowledgement comes after the other's whole retirement
            events.append(("accepting", self.n))

        async def stop(self) -> None:
            events.append(("stop", self.n))

    versions = [Version(0), Version(1)]
    core = SimpleNamespace(config=SimpleNamespace(drain_timeout_s=1.0), retiring=set(versions))
    core._retire = lambda rt: NodeCore._retire(core, rt)  # type: ignore[arg-type]
    asyncio.run(NodeCore._retire_all(core, versions))  # type: ignore[arg-type]
    assert events[:2] == [("accepting", 0), ("accepting", 1)] and sorted(events[2:]) == [("stop", 0), ("stop", 1)]
    assert core.retiring == set()
