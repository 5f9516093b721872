"""benchmarks/bench_thread_interference.py's pieces: N co-runners started and stopped around the middle leg, the
op-parallel speed-up restoring the thread count, the perfmodel's side of both, and the count lists."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from benchmarks import bench_thread_interference as bench
from recserve.measure.interference import CallTimer
from recserve.perfmodel import PerfModel
from recserve.perfmodel.cost import scaled_spec
from recserve.perfmodel.hostbench import calibration_host
from recserve.specs import get_model

SCALE = 1e-4  # a few hundred KB of tables: the pieces, not the host, are under test


def test_counts_take_all_drop_what_the_host_lacks_and_refuse_zero():
    assert bench.counts("1,all,3", 2, 1) == [1, 2]
    assert bench.counts("", 16, 1) == []
    assert bench.counts("2,2,1", 16, 1) == [1, 2]
    with pytest.raises(SystemExit, match="at least 1"):
        bench.counts("0,1", 16, 1)


@pytest.mark.integration
def test_co_runners_run_during_the_middle_leg_and_are_gone_after():
    before, during, after, duty = bench.corunner_slowdown(bench.GemmTimer(), 0.05, corunners=2)
    assert min(before, during, after) > 0
    assert 0 < duty <= 1  # the co-runners spent part of the leg in calls
    assert not mp.active_children()


@pytest.mark.integration
def test_op_speedups_time_each_count_and_restore_one_thread():
    timer = CallTimer(get_model(bench.MODEL), SCALE, 32)
    speedups = bench.op_speedups(timer, [2], 0.05)
    assert set(speedups) == {2} and speedups[2] > 0
    assert torch.get_num_threads() == 1


def test_the_modelled_speedup_is_one_on_one_core_and_grows_under_amdahl():
    pm, host = PerfModel(), calibration_host()
    spec = scaled_spec(get_model(bench.MODEL), SCALE)
    assert bench.modelled_op_speedup(pm, spec, host, 256, 1) == pytest.approx(1.0)
    two, four = (bench.modelled_op_speedup(pm, spec, host, 256, c) for c in (2, 4))
    assert 1.0 < two < four < 4.0
