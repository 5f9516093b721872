"""The node server serves a model whose user tables live on SSD files (SDM) with the DRAM model's scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.embedding import row_index, uring
from recserve.serving import config_from_dict
from recserve.specs import get_model
from recserve.zoo import build, sample_batch
from tests.support import http
from tests.support.nodes import generous, started
from tests.support.oip_inputs import http_inputs

pytestmark = pytest.mark.integration  # starts nodes, processes or servers


@pytest.fixture(params=["auto", "threads", "probe-crashed"])
def engine(request, monkeypatch):
    """``auto`` serves with io_uring where it works; ``probe-crashed`` is a host where the probe dies (issue #13):
    the verdict travels to the worker processes, which serve with the thread pool."""
    uring.reset_probe()
    if request.param == "probe-crashed":
        monkeypatch.setattr(uring, "PROBE_CODE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
        assert not uring.probe()[0]
    yield request.param
    uring.reset_probe()


def test_node_server_serves_a_tiered_model_with_dram_scores(tmp_path, engine):
    scale = 2e-5
    # with "threads" the worker builds the model itself (tables not shared): its row cache's index then follows the
    # verdict the node hands it (``probe_verdicts``), as a worker's io_uring engine always does
    config = config_from_dict({"models": [generous({
        "model": "sdm-m1", "scale": scale, "workers": 1, "max_batch_size": 64, "share_tables": engine != "threads",
        "options": {"tier": {"dir": str(tmp_path), "tables": "user", "cache_mb": 1,
                             "engine": "threads" if engine == "threads" else "auto"}}})]})
    reference = build(get_model("sdm-m1"), scale=scale)
    batch = sample_batch(reference, 8, rng=3)
    with torch.no_grad():
        expected = reference(batch).numpy()
    with started(config) as server:
        ports = server.ports
        scores = http.triton(ports.http).infer("sdm-m1", http_inputs(batch)).as_numpy("scores")
        tier_io = http.get_json(ports.http, "/control/models/sdm-m1")["tier_io"]
    np.testing.assert_array_equal(scores, expected)
    assert any(tmp_path.iterdir()), "the tier wrote its table files"
    assert tier_io and all(t["why"] for t in tier_io), "the node says which I/O engine each tiered table uses"
    # and which key index its row cache has: the native one wherever this host's probe passes
    assert {t["cache_index"] for t in tier_io} == {"native" if row_index.available()[0] else "dict"}
    engines = {t["engine"] for t in tier_io}
    if engine == "auto":
        assert engines == {"io_uring" if uring.probe()[0] else "threads"}
    else:
        assert engines == {"threads"}
    if engine == "probe-crashed":
        assert all("SIGILL" in t["why"] for t in tier_io)
