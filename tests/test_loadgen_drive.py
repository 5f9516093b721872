"""The load generator's hot loop (``loadgen.drive``) records each query of its schedule by how it ended: answered,
refused by the server (with the server's reason), failed on the client, timed out, or dropped at the in-flight cap.

A fake target answers by query index; nothing here asserts a latency (the host is shared), only which queries got
one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from recserve.measure.loadgen import Drive, _Progress, drive, refusal_reason
from recserve.measure.targets import RequestFailed

REFUSED = '{"error": "model \'m\' is overloaded: 12 queries queued at this worker (limit 8); retry"}'
KINDS = [None, "http_503", "connect", "timeout", "exception_ValueError", "dropped", "dropped"]


class ByIndex:
    """Query ``i`` ends the ``i``-th way of ``KINDS``; a query past them never answers (the in-flight cap drops it)."""

    name = "by-index"

    async def infer(self, i: int) -> None:
        if i == 1:
            raise RequestFailed("http_503", REFUSED)
        if i == 2:
            raise RequestFailed("connect", "refused")
        if i == 3:
            await asyncio.Event().wait()  # never answers: the client's time out
        if i == 4:
            raise ValueError("a client-side bug")


@pytest.mark.parametrize("spin_s", [0.0, 0.001])
def test_drive_records_each_query_by_how_it_ended(spin_s):
    times = np.zeros(len(KINDS))  # all due at once: the loop sends them without yielding, so the cap drops the last
    snapshots: list = []

    async def go() -> Drive:
        return await drive(ByIndex(), times, np.arange(len(KINDS)), max_inflight=5, timeout_s=0.2,
                           progress=_Progress(False, "test"), spin_s=spin_s, snapshots=snapshots)

    result = asyncio.run(asyncio.wait_for(go(), 60))
    assert result.kinds == KINDS
    assert result.reasons == [None, refusal_reason(REFUSED), None, None, None, None, None]
    assert [bool(np.isfinite(x)) for x in result.latency_ms] == [True] + [False] * 6
    assert [bool(np.isfinite(x)) for x in result.refused_ms] == [False, True, True, False, False, False, False]
    assert result.lag_ms.shape == (7,) and np.isfinite(result.lag_ms).all()
    assert result.last_s > 0 and result.cpu_s >= 0 and result.loop_cpu_s >= 0

    idx, seen = snapshots[0]()  # after the run: every query sent has an outcome
    assert idx.tolist() == list(range(7))
    assert seen.kinds == result.kinds and seen.reasons == result.reasons
    np.testing.assert_array_equal(seen.latency_ms, result.latency_ms)
    np.testing.assert_array_equal(seen.refused_ms, result.refused_ms)
    np.testing.assert_array_equal(seen.lag_ms, result.lag_ms)
