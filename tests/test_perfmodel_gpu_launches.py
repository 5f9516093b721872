"""The GPU path's host time: one launch per kernel the device runs (an operator writing a tensor of its own; views
launch none; an RNN module one per step), plus the framework's per-operator and per-module time as on a CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from recserve.perfmodel import PerfModel
from recserve.perfmodel.cost import _forward_profile, analytic_launches, model_cost
from recserve.perfmodel.model import Allocation
from recserve.specs import ServerType, get_model

H100 = ServerType(name="test-h100", cores=16, mem_gb=128, mem_bw_gbs=100.0, freq_ghz=2.0, flops_per_cycle=32,
                  accelerator="H100", accel_tflops=67.0, accel_mem_gb=80, accel_mem_bw_gbs=3350.0, pcie_gbs=64.0)


class _Query:
    def __init__(self, b: int) -> None:
        self.dense = torch.randn(b, 8)


class _Toy(nn.Module):
    """A zoo-shaped module: ``sparse`` and ``dense`` halves whose kernels are known by construction."""

    def __init__(self, views: int, rnn_steps: int = 0) -> None:
        super().__init__()
        self.views, self.steps = views, rnn_steps
        self.linear = nn.Linear(8, 8)
        self.rnn = nn.GRU(8, 8, batch_first=True) if rnn_steps else None

    def sparse(self, query: _Query) -> list[torch.Tensor]:
        return [query.dense * 2.0]  # one kernel

    def dense(self, dense: torch.Tensor, pooled: list[torch.Tensor]) -> torch.Tensor:
        x = pooled[0]
        for _ in range(self.views):  # views: a tensor header each, no kernel
            x = x.view(-1, 8).unsqueeze(0).squeeze(0)
        y = self.linear(x)  # addmm: one kernel (the weight's transpose is a view)
        if self.rnn is not None:
            y = y + self.rnn(x.unsqueeze(1).expand(-1, self.steps, -1).contiguous())[1][0]
        return torch.sigmoid(y)

    def forward(self, q: _Query) -> torch.Tensor:
        return self.dense(q.dense, self.sparse(q))


@pytest.fixture
def toy_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("recserve.zoo.sample_batch", lambda _model, b: _Query(b))


@pytest.mark.usefixtures("toy_batches")
def test_views_launch_no_kernel() -> None:
    _, few = _forward_profile(_Toy(views=0))
    _, many = _forward_profile(_Toy(views=20))
    assert few == many  # 60 more operators dispatched, not one more kernel
    assert few[0] == 1


@pytest.mark.usefixtures("toy_batches")
def test_rnn_module_counts_one_launch_per_step() -> None:
    _, short = _forward_profile(_Toy(views=0, rnn_steps=5))
    _, long = _forward_profile(_Toy(views=0, rnn_steps=25))
    assert long[1] - short[1] == 20  # cuDNN's call: a launch per step, whatever the CPU decomposition dispatches


def test_zoo_models_launch_fewer_kernels_than_they_dispatch() -> None:
    for name in ("hera-dien", "hera-ncf", "hercules-rmc2"):
        cost = model_cost(get_model(name))
        assert 0 < cost.device_sparse_launches < cost.sparse_ops
        assert 0 < cost.device_dense_launches < cost.device_dense_ops


def test_dien_scripted_augru_is_counted_per_step() -> None:
    """DIEN's AUGRU is a scripted loop of ATen operators on the device too: its kernels grow with the history."""
    spec = get_model("hera-dien")
    longer = dataclasses.replace(spec, tables=tuple(
        dataclasses.replace(t, pooling=2 * t.pooling) if t.kind == "sequence" else t for t in spec.tables))
    model_cost.cache_clear()
    try:
        grown = model_cost(longer).device_dense_launches - model_cost(spec).device_dense_launches
    finally:
        model_cost.cache_clear()
    steps = spec.sequence_tables[0].pooling
    assert 10 * steps <= grown <= 14 * steps  # ~11 AUGRU kernels + 1 cuDNN launch per added step


def test_analytic_launches_follow_the_layout() -> None:
    spec = get_model("hera-dien")
    sparse, dense = analytic_launches(spec)
    assert sparse == len(spec.tables) + 3
    assert dense > 12 * spec.sequence_tables[0].pooling


def test_accelerator_host_time_is_framework_plus_kernels() -> None:
    """Framework constants move the GPU prediction by the framework's share (the same per-op/per-module time a CPU
    call pays); ``gpu_launch_us`` by the kernel count."""
    spec, alloc, pm = get_model("hera-ncf"), Allocation(accelerator=True), PerfModel()
    cost = model_cost(spec)
    bare = PerfModel(dataclasses.replace(pm.cal, per_op_us=0.0, per_module_us=0.0, gpu_launch_us=0.0))
    base = bare.call_ms(spec, H100, 64, alloc)
    framework = pm.call_ms(spec, H100, 64, alloc) - PerfModel(
        dataclasses.replace(pm.cal, per_op_us=0.0, per_module_us=0.0)).call_ms(spec, H100, 64, alloc)
    expected = (pm.cal.per_op_us * (cost.device_dense_ops + cost.sparse_ops)
                + pm.cal.per_module_us * (cost.dense_modules + cost.sparse_modules)) * 1e-3
    assert framework == pytest.approx(expected)
    one_us = PerfModel(dataclasses.replace(bare.cal, gpu_launch_us=1.0)).call_ms(spec, H100, 64, alloc)
    assert one_us - base == pytest.approx((cost.device_dense_launches + cost.device_sparse_launches) * 1e-3)


def test_pipeline_leaves_sparse_kernels_on_the_host() -> None:
    spec, pm = get_model("hera-dlrm-a"), PerfModel()
    cost = model_cost(spec)
    assert pm.times.launch_ms(cost, with_sparse=False) < pm.times.launch_ms(cost)
    no_sparse = (pm.cal.per_op_us * cost.device_dense_ops + pm.cal.per_module_us * cost.dense_modules
                 + pm.cal.gpu_launch_us * cost.device_dense_launches) * 1e-3
    assert pm.times.launch_ms(cost, with_sparse=False) == pytest.approx(no_sparse)
