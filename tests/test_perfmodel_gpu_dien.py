"""The GPU path charges a kernel launch per operator the *device* runs: DIEN's interest-extractor ``nn.GRU`` is one
cuDNN call on a CUDA device (ATen's ``use_cudnn`` branch), not the ~14 ATen operators per time step it decomposes
into on the CPU, which is where the perfmodel counts operators."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from recserve.perfmodel import PerfModel
from recserve.perfmodel.cost import model_cost
from recserve.perfmodel.model import Allocation
from recserve.specs import ServerType, get_model, get_server

MEASURED = Path(__file__).resolve().parent.parent / "docs" / "measured" / "h100-2026-11-22" / "bench_gpu_run1.json"
# the machine of that run, as benchmarks/bench_gpu_perfmodel.py describes it (NVIDIA's H100 SXM5 data sheet)
H100 = ServerType(name="test-h100", cores=16, mem_gb=128, mem_bw_gbs=100.0, freq_ghz=2.0, flops_per_cycle=32,
                  accelerator="H100", accel_tflops=67.0, accel_mem_gb=80, accel_mem_bw_gbs=3350.0, pcie_gbs=64.0)


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's hook
        self.n += 1
        return func(*args, **(kwargs or {}))


def _cpu_gru_ops(dim: int, hidden: int, steps: int) -> int:
    gru, ops = nn.GRU(dim, hidden, batch_first=True).eval(), _Ops()
    with torch.no_grad(), ops:
        gru(torch.randn(4, steps, dim))
    return ops.n


@pytest.mark.parametrize("name", ["hercules-dien", "hera-dien"])
def test_gru_counts_as_device_calls(name: str) -> None:
    spec = get_model(name)
    cost = model_cost(spec)
    steps = spec.sequence_tables[0].pooling
    per_cpu = _cpu_gru_ops(spec.sequence_tables[0].dim, spec.gru_hidden, steps)
    assert per_cpu > 10 * steps  # the CPU decomposition: a dozen-odd operators per step
    # on the device the extractor GRU is one cuDNN call (about one native launch per step); the rest is unchanged
    assert cost.dense_ops - cost.device_dense_ops == pytest.approx(per_cpu - steps, abs=2)


def test_models_without_rnn_modules_unchanged() -> None:
    for name in ("hercules-din", "hercules-rmc1", "hera-ncf"):
        cost = model_cost(get_model(name))
        assert cost.device_dense_ops == cost.dense_ops


def test_dien_gpu_launch_term_uses_device_ops() -> None:
    spec, server = get_model("hercules-dien"), get_server("hercules-t7")
    cost, pm = model_cost(spec), PerfModel()
    no_launch = PerfModel(dataclasses.replace(pm.cal, gpu_launch_us=0.0))
    alloc = Allocation(accelerator=True)
    launch_ms = pm.call_ms(spec, server, 16, alloc) - no_launch.call_ms(spec, server, 16, alloc)
    kernels = cost.device_dense_launches + cost.device_sparse_launches
    assert launch_ms == pytest.approx(pm.cal.gpu_launch_us * 1e-3 * kernels)
    assert kernels < cost.device_dense_ops + cost.sparse_ops  # the AUGRU's per-step views launch nothing


def test_dien_gpu_latency_against_h100() -> None:
    """hera-dien measured on an H100 (per-table GPU path): the prediction stays within 1.5x at batch >= 1024 (it was
    2.0x / 1.8x when every CPU-dispatched GRU operator counted as a kernel launch)."""
    data = json.loads(MEASURED.read_text())
    rows = next(p["rows"] for p in data["in_process"] if p["model"] == "hera-dien")
    pm, spec = PerfModel(), get_model("hera-dien")
    for row in rows:
        if row["batch"] >= 1024:
            ratio = pm.call_ms(spec, H100, row["batch"], Allocation(accelerator=True)) / row["gpu_tables_ms"]
            assert 1 / 1.5 < ratio < 1.5, (row["batch"], ratio)
