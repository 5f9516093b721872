"""bench_papers' verdict rule: one rule for every row (direction = same sign and a third of the paper's effect;
yes = direction and within 10 points; levels have no direction), and the tally counts only the papers' claims."""

from __future__ import annotations

import math

from benchmarks.bench_papers import Row, counts, judge, worst


def test_effects_are_judged_by_sign_a_third_and_ten_points() -> None:
    assert judge(0.231, 0.26) == "yes"                 # 23.1% saved vs 26%
    assert judge(0.10, 0.26) == "direction"            # same sign, at least a third, 16 points off
    assert judge(0.05, 0.26) == "no"                   # under a third of the effect
    assert judge(-0.05, 0.26) == "no"                  # the wrong sign
    assert judge(0.003, 0.0775) == "no"                # within 10 points but not a third: never yes
    assert judge(0.46, 0.373) == "yes" and judge(0.53, 0.373) == "direction"
    assert judge(1.26 - 1, 9.0 - 1) == "no"            # ratios as r - 1: 1.26x against 9x
    assert judge(2.15 - 1, 2.0 - 1) == "direction"     # 0.15x over: not within 10 points
    assert judge(float("nan"), 0.2) == "n/a" and judge(None, 0.2) == "n/a"


def test_levels_have_no_direction_and_rows_take_their_worst_model() -> None:
    assert judge(0.588, 0.96, level=True) == "no"       # a 58.8% hit rate is no "direction" of >96%
    assert judge(0.90, 0.96, level=True) == "yes"
    assert worst("yes", "direction", "n/a") == "direction"
    assert worst("yes", "no") == "no" and worst("n/a", "n/a") == "n/a"


def test_the_tally_leaves_out_rows_that_are_not_claims() -> None:
    rows = [Row("a", "", "", "yes"), Row("b", "", "", "no"), Row("c", "", "", "n/a"),
            Row("sensitivity", "", "", "n/a", counted=False), Row("target", "", "", "yes", counted=False)]
    assert counts(rows) == {"yes": 1, "direction": 0, "no": 1, "n/a": 1}
    assert math.isclose(sum(counts(rows).values()), 3)
