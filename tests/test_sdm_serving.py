"""The node server serves a model whose user tables live on SSD files (SDM) with the DRAM model's scores."""

from __future__ import annotations

import numpy as np
import torch

from recserve.serving import NodeServer, config_from_dict
from recserve.specs import get_model
from recserve.zoo import build, sample_batch


def test_node_server_serves_a_tiered_model_with_dram_scores(tmp_path):
    import tritonclient.http as httpclient

    scale = 2e-5
    config = config_from_dict({"models": [{
        "model": "sdm-m1", "scale": scale, "workers": 1, "max_batch_size": 64,
        "options": {"tier": {"dir": str(tmp_path), "tables": "user", "cache_mb": 1}}}]})
    reference = build(get_model("sdm-m1"), scale=scale)
    batch = sample_batch(reference, 8, rng=3)
    with torch.no_grad():
        expected = reference(batch).numpy()
    server = NodeServer(config)
    ports = server.start()
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{ports.http}")
        inputs = []
        for name, array in batch.as_arrays().items():
            dtype = {np.float32: "FP32", np.int64: "INT64", np.int32: "INT32"}[array.dtype.type]
            tensor = httpclient.InferInput(name, list(array.shape), dtype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        scores = client.infer("sdm-m1", inputs).as_numpy("scores")
    finally:
        server.stop()
    np.testing.assert_array_equal(scores, expected)
    assert any(tmp_path.iterdir()), "the tier wrote its table files"
