"""The supervisor's event loop: asyncio's own whatever policy the embedding process installed."""

from __future__ import annotations

import pytest

from recserve.serving import config_from_dict


@pytest.mark.integration
def test_a_two_model_node_under_uvloops_policy_answers_handed_off_connections():
    """Ray Serve replicas and uvicorn apps install uvloop's policy; a node started there runs its supervisor on
    asyncio's own loop (``supervisor_loop``), where a connection one model's worker accepts for the other model is
    answered (on a uvloop supervisor: some 400 "Invalid method", resets and workers exiting)."""
    import asyncio

    import numpy as np

    from recserve.measure.loadgen import LoadSession
    from recserve.measure.requests import RequestPool
    from recserve.measure.targets import HttpTarget
    from recserve.serving import NodeServer
    from recserve.specs import get_model
    from tests.support.nodes import generous
    from tests.support.scrape import metric_value, scrape

    uvloop = pytest.importorskip("uvloop")
    models = ("hercules-rmc1", "kairos-rm2")
    config = config_from_dict({"host": "127.0.0.1", "http_port": 0, "grpc_port": 0,
                               "models": [generous({"model": m, "scale": 1e-4, "workers": 1}) for m in models]})
    before = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    node = NodeServer(config)
    try:
        ports = node.start()
    finally:
        asyncio.set_event_loop_policy(before)
    try:
        for round_ in range(8):  # fresh connections, alternating models: some land on the other model's worker
            for m in models:
                pool = RequestPool(get_model(m), 1e-4, (16,), seed=round_)
                with LoadSession(HttpTarget(f"http://127.0.0.1:{ports.http}", m, connections=1), pool) as session:
                    assert np.isfinite(session.outputs(0)["scores"]).all()
        assert metric_value(scrape(ports.http), "recserve_worker_restarts_total") in (None, 0.0)
    finally:
        node.stop()
