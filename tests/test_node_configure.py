"""A live settings change (``live_settings.LiveSettings``: sub_batch, min_items, the default version, accelerator
sockets, a retiree's ``accepting``) returns once every working worker has applied it, without processes: a late
acknowledgement is waited for, a worker that exits or hangs is not, and a worker that never answers is a 503 after
the bound.  Versions retired together all stop accepting before any is stopped."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recserve.serving.node.handle import WorkerHandle
from recserve.serving.node.inbox import PipeInbox
from recserve.serving.node.live_settings import LiveSettings
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


def workers(delays: list[float | None]) -> list[WorkerHandle]:
    """Ready workers, each acknowledging a change after its delay."""
    loop = asyncio.get_running_loop()
    out = []
    for i, delay in enumerate(delays):
        ready = loop.create_future()
        ready.set_result(100 + i)
        w = WorkerHandle(i, "model", [], 1, None, None, ready, loop.create_future(), np.zeros(0, np.uint8))
        w.outbox = Acking(w, delay)  # type: ignore[assignment]
        out.append(w)
    return out


def apply(ws: list[WorkerHandle], changes: dict, timeout_s: float = 30.0, live: LiveSettings | None = None):
    return (live or LiveSettings("m")).apply(ws, changes, timeout_s)


def test_a_change_returns_once_the_slowest_worker_has_applied_it():
    async def go() -> tuple[float, list[int]]:
        ws = workers([0.0, 0.3])
        t = asyncio.get_running_loop().time()
        await apply(ws, {"sub_batch": 4})
        return asyncio.get_running_loop().time() - t, [w.config_seq for w in ws]

    waited, seqs = asyncio.run(go())
    assert waited >= 0.3 and seqs == [1, 1]


def test_each_change_waits_for_its_own_number():
    async def go() -> list[list]:
        ws, live = workers([0.05, 0.05]), LiveSettings("m")
        await apply(ws, {"sub_batch": 4}, live=live)
        await apply(ws, {"min_items": 8}, live=live)
        assert [w.config_seq for w in ws] == [2, 2]
        return [w.outbox.changes for w in ws]

    assert asyncio.run(go()) == [[{"sub_batch": 4}, {"min_items": 8}]] * 2


def test_a_worker_that_never_answers_is_a_503_after_the_bound():
    async def go() -> None:
        await apply(workers([0.0, None]), {"min_items": 8}, timeout_s=0.2)

    with pytest.raises(InferError) as err:
        asyncio.run(go())
    assert err.value.code == "unavailable" and "1 worker(s)" in str(err.value) and "min_items" in str(err.value)


@pytest.mark.parametrize("gone", ["exits", "hangs"])
def test_a_worker_that_exits_or_hangs_meanwhile_is_not_waited_for(gone):
    async def go() -> None:
        ws = workers([0.0, None])
        silent = ws[1]

        def lose() -> None:
            if gone == "exits":
                silent.exited.set_result(0)
            else:
                silent.hung = True

        asyncio.get_running_loop().call_later(0.1, lose)
        await apply(ws, {"sub_batch": 0})

    asyncio.run(asyncio.wait_for(go(), 10))


def test_a_worker_not_ready_yet_is_not_waited_for():
    """It reads the change from its pipe before its first query (the pipe is read in order)."""
    async def go() -> list:
        ws = workers([None])
        ws[0].ready = asyncio.get_running_loop().create_future()
        await apply(ws, {"sub_batch": 4}, timeout_s=0.2)
        return ws[0].outbox.changes

    assert asyncio.run(go()) == [{"sub_batch": 4}]


def test_retiring_versions_all_stop_accepting_before_any_is_stopped():
    """A new version loaded (or a model unloaded) retires old versions together: every one of their workers stops
    accepting before any of them closes a connection, so a client moved by GOAWAY reaches a worker that stays."""
    from recserve.serving.node.model_loader import ModelLoader

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
    loader = ModelLoader(None, {}, {}, lambda cfg: None, lambda: None, None, drain_timeout_s=1.0)
    loader.retiring = set(versions)
    asyncio.run(loader._retire_all(versions))  # type: ignore[arg-type]
    assert events[:2] == [("accepting", 0), ("accepting", 1)] and sorted(events[2:]) == [("stop", 0), ("stop", 1)]
    assert loader.retiring == set()
