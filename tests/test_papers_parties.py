"""The Hera-vs-PARTIES rows' rules (benchmarks/papers/parties.py): the steady-load SLA test, the bisection, the EMU
gains and Fig. 14's qualitative verdict, on stubs."""

from __future__ import annotations

import pytest

from benchmarks.papers.parties import (
    emu_gains,
    fig12_verdict,
    fig14_verdict,
    max_passing,
    phase_shares,
    steady_ok,
)


def _window(over: int, samples: int = 100, other_over: int = 0) -> dict:
    return {"models": {"x": {"over_sla": over, "samples": samples, "tail_over_sla": 0.0},
                       "y": {"over_sla": other_over, "samples": samples, "tail_over_sla": 0.0}}}


def test_steady_ok_pools_each_models_queries_after_the_warmup() -> None:
    warm = [_window(100)] * 3  # a violating warm-up does not count
    assert steady_ok(warm + [_window(5)] * 4, warmup=3)           # exactly 5% of x's queries over: p95 within SLA
    assert not steady_ok(warm + [_window(6)] * 4, warmup=3)       # 6%: over
    assert steady_ok(warm + [_window(20)] + [_window(0)] * 3, warmup=3)  # one bad window among good ones: 5% pooled
    assert not steady_ok(warm + [_window(0, other_over=10)] * 4, warmup=3)  # the other model over: fails
    assert not steady_ok(warm, warmup=3)                           # nothing measured


def test_max_passing_bisects_to_the_threshold_and_returns_lo_when_nothing_passes() -> None:
    calls: list[float] = []

    def below(t: float):
        def passes(y: float) -> bool:
            calls.append(y)
            return y <= t
        return passes

    assert max_passing(below(0.3), steps=5) == pytest.approx(9 / 32)  # largest multiple of 1/32 at or under 0.3
    assert max_passing(below(1.0), steps=5) == pytest.approx(31 / 32)
    calls.clear()
    assert max_passing(below(0.01), steps=5) == 0.0
    assert calls == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32]  # from the middle down to the resolution


def test_emu_gains_are_relative_per_point_and_in_points() -> None:
    hera = {"ncf": {0.4: 0.4, 1.0: 0.0}}
    parties = {"ncf": {0.4: 0.2, 1.0: 0.0}}
    g = emu_gains(hera, parties)
    assert g["mean_rel"] == pytest.approx((0.8 / 0.6 - 1) / 2)
    assert g["max_rel"] == pytest.approx(0.8 / 0.6 - 1)
    assert g["mean_points"] == pytest.approx(0.1) and g["max_points"] == pytest.approx(0.2)


def test_fig14_verdict() -> None:
    assert fig14_verdict(0.02, 0.5) == "yes"
    assert fig14_verdict(0.3, 0.5) == "direction"
    assert fig14_verdict(0.5, 0.5) == "no" and fig14_verdict(0.0, 0.0) == "no"


def test_fig12_is_judged_only_where_both_controllers_meet_the_sla_at_half_the_points() -> None:
    assert fig12_verdict("direction", 28, {"hera": 9, "parties": 14}) == "direction"
    assert fig12_verdict("yes", 28, {"hera": 0, "parties": 15}) == "no"  # PARTIES met it at 13 of 28
    assert fig12_verdict("direction", 28, {"hera": 20, "parties": 28}) == "no"


def test_phase_shares_split_the_run_in_thirds_by_window_end() -> None:
    def window(t: float, tail: float) -> dict:
        return {"t_s": t, "models": {"x": {"tail_over_sla": 0.5}, "y": {"tail_over_sla": tail}}}

    # 12 s in 1-s windows ending at 1..12: to T1 (4 s] holds windows 1-4, T1-T2 5-8, after T2 9-12
    tails = [0.5, 0.5, 2.0, 2.0] + [2.0] * 4 + [0.5] * 3 + [1.01]
    shares = phase_shares([window(t + 1.0, x) for t, x in enumerate(tails)], 12.0)
    assert shares == {"to T1": 0.5, "T1-T2": 1.0, "after T2": 0.25}
    assert all(v != v for v in phase_shares([], 12.0).values())  # nothing measured: nan, not 0
