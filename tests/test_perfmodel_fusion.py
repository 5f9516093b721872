"""Query fusion on accelerators (Hercules §III-B): a free device thread launches every waiting job, up to ``batch``
items, as one call, so per-launch costs (kernel launches, PCIe latency, the framework's per-call time) are shared by
the fused jobs.  Behaviour only: no host speed is asserted."""

from __future__ import annotations

import dataclasses

import numpy as np

from recserve.perfmodel import PerfModel, SizeMix
from recserve.perfmodel.model import Allocation, _RateModel
from recserve.specs import get_model, get_server

PM = PerfModel()
MIX = SizeMix.of(np.full(400, 100))  # every query 100 items: fusion caps at batch / 100 jobs per launch
GPU = get_server("hercules-t7")
SPEC = get_model("hercules-mtwnd")


def _qps(alloc: Allocation, pm: PerfModel = PM) -> float:
    return pm.evaluate(SPEC, GPU, alloc, MIX, with_latency=False).max_qps


def test_fusion_raises_max_load_on_an_accelerator_and_grows_with_the_launch_cap():
    plain = _qps(Allocation(workers=2, batch=1024))
    fused = [_qps(Allocation(workers=2, batch=b, fuse=True)) for b in (100, 200, 400, 1024)]
    assert abs(fused[0] - plain) <= 0.02 * plain  # one job per launch at most: nothing to fuse
    assert fused[-1] > 1.5 * plain
    assert all(b >= a * 0.999 for a, b in zip(fused, fused[1:], strict=False))


def test_fusion_factor_is_one_at_light_load_and_grows_with_load():
    alloc = Allocation(workers=2, batch=1024, fuse=True)
    st = PM._static(SPEC, GPU, alloc)
    rm = _RateModel(PM, SPEC, GPU, alloc, st, MIX)
    f_light, cap, _ = rm._fusion(1.0, 1.0, 2)
    f_mid, _, t_mid = rm._fusion(_qps(alloc) / 2, 1.0, 2)
    f_max, _, t_max = rm._fusion(_qps(alloc), 1.0, 2)
    assert f_light == 1.0 and cap == 1024 / 100
    assert 1.0 < f_mid < f_max <= cap
    assert t_max / f_max < t_mid / f_mid  # per-job device time falls as more jobs share a launch


def test_fusion_gain_comes_from_per_launch_costs():
    """With per-launch costs made larger the gain of fusing grows: what fusion amortises is per launch."""
    costly = PerfModel(dataclasses.replace(PM.cal, gpu_launch_us=PM.cal.gpu_launch_us * 4))

    def gain(pm: PerfModel) -> float:
        return _qps(Allocation(workers=2, batch=1024, fuse=True), pm) / _qps(Allocation(workers=2, batch=1024), pm)

    assert gain(costly) > gain(PM) > 1.0


def test_fusion_is_ignored_without_an_accelerator():
    cpu = get_server("hercules-t1")
    spec = get_model("hercules-rmc1")
    a = PM.evaluate(spec, cpu, Allocation(workers=4, batch=128), MIX, with_latency=False).max_qps
    b = PM.evaluate(spec, cpu, Allocation(workers=4, batch=128, fuse=True), MIX, with_latency=False).max_qps
    assert a == b
