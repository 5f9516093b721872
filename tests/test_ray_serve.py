"""ElasticRec on Ray Serve: sharded scores equal the monolithic model's.  Slow (starts Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recserve.deploy.sharding import access_counts, even_layout
from recserve.specs import SLA, ModelSpec, TableSpec
from recserve.zoo import build, sample_batch

pytestmark = pytest.mark.slow


def test_ray_sharded_scores_equal_monolithic():
    ray_serve = pytest.importorskip("recserve.deploy.ray_serve")
    pytest.importorskip("ray")
    spec = ModelSpec(name="tiny", family="dlrm", dense_in=8, bottom_mlp=(16,), top_mlp=(8, 1), interaction="dot",
                     tables=tuple(TableSpec(f"t{i}", 100_000, 16, pooling=8) for i in range(2)), sla=SLA(400.0))
    model = build(spec, scale=0.01, seed=0)
    layout = even_layout(model, access_counts(model, [sample_batch(model, 32, rng=i) for i in range(10)]), 2,
                         scale=0.01)
    ray_serve.start_ray(num_cpus=2)
    try:
        handle = ray_serve.deploy(layout, autoscale=False)
        for seed in range(3):
            batch = sample_batch(model, 16, rng=100 + seed)
            with torch.no_grad():
                expected = model(batch).numpy()
            np.testing.assert_allclose(handle.infer.remote(batch.as_arrays()).result(), expected, atol=1e-6)
        assert set(ray_serve.replica_counts()) == {"dense", *(f"shard-{n}" for n in layout.shard_names())}
    finally:
        ray_serve.shutdown()
