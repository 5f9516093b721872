"""The load generator measures itself (send lag, CPU) and spreads a schedule over processes exactly.

Counts only, never speeds: the host is shared, so nothing here asserts a latency.
"""

from __future__ import annotations

import numpy as np
import pytest

from recserve.errors import RecserveError
from recserve.measure.loadgen import Drive, LoadSession, deal, merge
from recserve.measure.requests import RequestPool
from recserve.measure.sink import SinkServer, fixed_response, free_port
from recserve.measure.targets import HttpTarget, InProcessTarget
from recserve.specs import SLA, ModelSpec, TableSpec

pytestmark = pytest.mark.integration  # starts nodes, processes or servers

pytest.importorskip("aiohttp")


def pool() -> RequestPool:
    spec = ModelSpec(name="tiny", family="dlrm", dense_in=3, interaction="concat", sla=SLA(50.0),
                     tables=(TableSpec("a", 100, 4, pooling=3), TableSpec("b", 50, 4, pooling=1)), top_mlp=(8, 1))
    return RequestPool.from_mix(spec, 1.0, "fixed:1", pool=4)


@pytest.fixture(scope="module")
def sink():
    with SinkServer(procs=1) as url:
        yield url


def _accounted(result) -> None:
    """Every scheduled query is counted exactly once: ok, failed by kind (dropped included)."""
    assert result.measured == result.sent
    assert result.ok + result.failed == result.sent
    assert result.send_lag_ms.size == result.sent


@pytest.mark.parametrize("procs", [1, 2])
def test_sink_run_fills_send_lag_and_cpu(sink, procs):
    with LoadSession(HttpTarget(sink, "tiny", timeout_s=10), pool(), warm=True, procs=procs) as session:
        result = session.run(300.0, None, max_requests=240, seed=3)
    _accounted(result)
    assert result.ok == 240 and result.errors == {}
    assert result.procs == procs
    assert result.send_lag(50) <= result.send_lag(99) <= result.send_lag(100) < 60_000
    assert result.send_lag_ms.min() >= 0
    assert 0 < result.loop_cpu_s <= result.cpu_s + 0.05 and 0 < result.cpu_per_s < 2.0 * procs + 1
    data = result.to_dict()
    assert data["send_lag_ms"]["p99"] == result.send_lag(99) and data["generator"]["procs"] == procs
    assert f"on {procs} process" in result.summary()


def test_two_processes_send_exactly_the_one_process_schedule(sink):
    """Same seed: the dealt schedule's union is the single-process schedule, so counts and mean sizes agree."""
    out = {}
    for procs in (1, 2):
        with LoadSession(HttpTarget(sink, "tiny"), pool(), procs=procs) as session:
            out[procs] = session.run(500.0, 0.5, seed=11, warmup_s=0.1)
    assert out[1].sent == out[2].sent and out[1].measured == out[2].measured
    assert out[1].mean_size == out[2].mean_size
    for result in out.values():
        assert result.ok + result.failed == result.measured


def test_failures_by_kind_merge_from_every_process():
    target = HttpTarget(f"http://127.0.0.1:{free_port()}", "tiny", timeout_s=5)  # nobody listens
    with LoadSession(target, pool(), procs=2) as session:
        result = session.run(200.0, None, max_requests=50, seed=1)
    _accounted(result)
    assert result.ok == 0 and result.errors == {"connection": 50}


def test_merge_undoes_the_deal_exactly():
    times, choice = np.arange(7, dtype=float), np.arange(7) * 10
    parts = deal(times, choice, 3)
    assert [list(c) for _, c in parts] == [[0, 30, 60], [10, 40], [20, 50]]
    drives = [Drive(t * 2, [None if c % 20 else f"k{c}" for c in cs], t + 0.5, float(t[-1]), 1.0, 0.5,
                    reasons=[None if c % 20 else f"r{c}" for c in cs]) for t, cs in parts]
    drives[1].reasons = None  # a part that kept no reasons (none of its queries was refused)
    merged = merge(drives)
    assert merged.reasons == [None if c % 20 or j % 3 == 1 else f"r{c}" for j, c in enumerate(choice)]
    assert list(merged.latency_ms) == list(times * 2) and list(merged.lag_ms) == list(times + 0.5)
    assert merged.kinds == [f"k{c}" if c % 20 == 0 else None for c in choice]
    assert merged.last_s == 6.0 and merged.cpu_s == 3.0 and merged.loop_cpu_s == 1.5


def test_procs_needs_a_network_target():
    with pytest.raises(RecserveError, match="network target"):
        LoadSession(InProcessTarget(workers=1, mode="thread"), pool(), procs=2)
    with pytest.raises(RecserveError):
        LoadSession(HttpTarget("http://127.0.0.1:1", "tiny"), pool(), procs=0)


def test_fixed_response_is_a_valid_binary_infer_answer():
    from recserve.measure.targets import decode_http_response

    head, _, body = fixed_response(3).partition(b"\r\n\r\n")
    length = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    assert decode_http_response(body, length)["scores"].shape == (3, 1)
