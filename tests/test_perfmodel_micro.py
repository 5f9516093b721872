"""Microbenchmark-only calibration (perfmodel/microbench.py)."""

from __future__ import annotations

import pytest

from recserve.perfmodel import load_calibration
from recserve.perfmodel.microbench import (
    calibration_from_micro,
    fit_gemm,
    framework_overheads,
    gemm_plateau,
    transfer_calibration,
)


def test_fit_gemm_recovers_the_saturating_curve():
    ce, bh = 0.8, 12.0
    eff = {r: ce * r / (r + bh) for r in (1, 4, 16, 64, 256, 1024)}
    got_ce, got_bh = fit_gemm(eff)
    assert got_ce == pytest.approx(ce, rel=1e-6) and got_bh == pytest.approx(bh, rel=1e-6)


def test_calibration_from_micro_sets_every_host_constant_and_nothing_else():
    base = load_calibration()
    micro = {"host": "h", "seconds": 3.0, "gemm_eff": {"1": 0.1, "16": 0.5, "256": 0.9, "1024": 0.95},
             "per_op_us": 2.0, "per_module_us": 3.0, "lookup_ns": 4.0, "llc_gbs_per_core": 50.0,
             "dram_gbs_per_core": 9.0, "stream_gbs_per_core": 11.0, "act_gbs_per_core": 22.0}
    cal = calibration_from_micro(micro, base)
    assert (cal.per_op_us, cal.per_module_us, cal.lookup_ns) == (2.0, 3.0, 4.0)
    assert (cal.llc_gbs_per_core, cal.dram_gbs_per_core, cal.stream_gbs_per_core, cal.act_gbs_per_core) == (
        50.0, 9.0, 11.0, 22.0)
    assert 0.7 < cal.compute_eff < 1.2 and cal.batch_half > 0
    assert cal.membw_eff == base.membw_eff and cal.gpu_launch_us == base.gpu_launch_us  # not host-measurable here
    assert "no model timed" in cal.fitted_on


def test_framework_overheads_are_measured_positive():
    op, module = framework_overheads()
    assert 0 < op < 1000 and 0 < module < 1000


def test_transfer_scales_compute_efficiency_by_the_hosts_gemm_plateaus():
    base = load_calibration().with_values(compute_eff=1.5, lookup_ns=7.0)
    source = {"gemm_eff": {"1": 0.5, "64": 2.2, "256": 2.4, "1024": 2.2}}  # plateau: mean of rows >= 256 = 2.3
    target = {"gemm_eff": {"1": 0.5, "64": 2.1, "256": 1.9, "1024": 1.8}}  # 1.85
    assert gemm_plateau(source) == pytest.approx(2.3) and gemm_plateau(target) == pytest.approx(1.85)
    cal = transfer_calibration(base, [(source, 120)], target, label="moved")
    assert cal.compute_eff == pytest.approx(1.5 * 1.85 / 2.3)
    assert cal.lookup_ns == 7.0 and cal.fitted_on == "moved"  # only compute moves with the host
    # several source hosts: geometric mean of their plateaus, weighted by the points each gave
    two = transfer_calibration(base, [(source, 100), (target, 300)], target)
    assert two.compute_eff == pytest.approx(1.5 * 1.85 / (2.3 ** 0.25 * 1.85 ** 0.75))


def test_fault_rate_is_the_target_hosts_measurement_when_it_has_one():
    base = load_calibration().with_values(fault_gbs_per_core=1.8)
    plain = {"gemm_eff": {"256": 2.0, "1024": 2.0}}
    measured = {**plain, "fault_gbs_per_core": 3.5}
    assert transfer_calibration(base, [(plain, 10)], measured).fault_gbs_per_core == 3.5
    assert transfer_calibration(base, [(measured, 10)], plain).fault_gbs_per_core == 1.8  # recorded without it
    micro = {"host": "h", "seconds": 1.0, "gemm_eff": {"4": 0.5, "16": 1.0, "256": 2.0}, "per_op_us": 2.0,
             "per_module_us": 3.0, "lookup_ns": 4.0, "llc_gbs_per_core": 50.0, "dram_gbs_per_core": 9.0,
             "stream_gbs_per_core": 11.0, "act_gbs_per_core": 22.0, "fault_gbs_per_core": 2.5}
    assert calibration_from_micro(micro, base).fault_gbs_per_core == 2.5


def test_feed_costs_are_the_target_hosts_measurement_when_it_has_them():
    base = load_calibration().with_values(feed_pyint_ns=28.0, feed_ref_ghz=2.45)
    plain = {"gemm_eff": {"256": 2.0}}
    measured = {**plain, "feed_pyint_ns": 19.0, "feed_npscalar_ns": 30.0, "feed_call_us": 0.2, "freq_ghz": 3.1}
    moved = transfer_calibration(base, [(plain, 10)], measured)
    assert (moved.feed_pyint_ns, moved.feed_npscalar_ns, moved.feed_call_us, moved.feed_ref_ghz) == (19.0, 30.0, 0.2,
                                                                                                    3.1)
    assert transfer_calibration(base, [(measured, 10)], plain).feed_pyint_ns == 28.0  # recorded without them


def test_overheads_follow_the_in_model_microbenchmark_only_when_every_host_has_it():
    base = load_calibration().with_values(fixed_ms=0.01, per_op_us=1.0, per_module_us=20.0, lookup_ns=5.0)
    src = {"gemm_eff": {"256": 2.0}, "model_module_us": 22.0}
    tgt = {"gemm_eff": {"256": 2.0}, "model_module_us": 11.0}
    moved = transfer_calibration(base, [(src, 10)], tgt)
    assert (moved.fixed_ms, moved.per_op_us, moved.per_module_us) == pytest.approx((0.005, 0.5, 10.0))
    assert moved.lookup_ns == 5.0
    old = {"gemm_eff": {"256": 2.0}}  # recorded before the microbenchmark existed
    assert transfer_calibration(base, [(old, 10)], tgt).per_module_us == 20.0
    assert transfer_calibration(base, [(src, 10)], old).per_module_us == 20.0


def test_in_model_framework_time_is_measured_positive():
    from recserve.perfmodel.microbench import model_module_us

    assert 0 < model_module_us() < 1000
