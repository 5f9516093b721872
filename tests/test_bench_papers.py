"""bench_papers' verdict rule: one rule for every row (direction = same sign and a third of the paper's effect;
yes = direction and within 10 points; levels have no direction), and the tally counts only the papers' claims."""

from __future__ import annotations

import math

import pytest

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


def test_hera_paper_inputs_pass_through_the_printed_points() -> None:
    """The "paper's inputs" column of the Hera rows: LLC curves through Fig. 7's printed points, DLRM(D) +4% from 12
    to 16 workers at Table II's 128 GB/s (§V-B), which makes it low-scalability as in the paper."""
    from dataclasses import replace

    from benchmarks.papers.hera import HERA_PAPER_LLC, _paper_input_hera_profiles
    from recserve.planners.hera import all_curves
    from recserve.profiles import ProfileSet
    from recserve.specs import get_server
    from tests.support.planner_fixtures import hera_like_profiles

    server = get_server("hera-xeon")
    base, _ = hera_like_profiles(replace(server, mem_gb=192.0))
    profiles = ProfileSet([replace(t, model="hera-" + t.model, server=server.name) for t in base])
    models = sorted({t.model for t in profiles})
    curves = {c.name: c for c in all_curves(_paper_input_hera_profiles(profiles, server), models, server)}
    for model, (ways, kept) in HERA_PAPER_LLC.items():
        assert curves[model].ways_ratio[ways] == pytest.approx(kept)
        assert curves[model].ways_ratio[server.llc_ways] == pytest.approx(1.0)
    d = curves["hera-dlrm-d"]
    assert d.qps[16] == pytest.approx(1.04 * d.qps[12]) and not d.high
    assert d.membw[12] == pytest.approx(server.mem_bw_gbs)


def test_kairos_rows_name_the_models_that_miss_the_claim() -> None:
    """§8.1 (> 1.25x, up to 2x) and §8.4 (within 15% of the Oracle): each column says which model misses which end."""
    from benchmarks.papers.kairos import _gain_verdict, _gains_text, _gap_text

    gains = {"mtwnd": {"gain": 1.34}, "rm2": {"gain": 2.12}, "wnd": {"gain": 1.37}}
    assert _gains_text(gains).endswith("(off: rm2 2.12x vs 2x)") and _gain_verdict(gains) == "direction"
    gains["mtwnd"]["gain"] = 0.99
    assert "mtwnd 0.99x vs > 1.25x" in _gains_text(gains) and _gain_verdict(gains) == "no"
    gaps = {"dien": {"gap": {"kairos": 0.188, "kairos+": 0.188}}, "mtwnd": {"gap": {"kairos": 0.19, "kairos+": 0.14}},
            "rm2": {"gap": {"kairos": 0.125, "kairos+": 0.125}}}
    assert _gap_text(gaps).endswith("below the Oracle (over 15%: dien, mtwnd)")
    del gaps["dien"], gaps["mtwnd"]
    assert _gap_text(gaps) == "rm2 12.5% / 12.5% below the Oracle"


@pytest.mark.integration  # a section twice, one in a spawned process: seconds of work
@pytest.mark.timeout(900)  # minutes of work on a busy host: room past the default 300 s
def test_sections_run_in_processes_give_the_rows_run_here() -> None:
    from benchmarks.bench_papers import run_sections

    here, _ = run_sections(["sdm"], False, 1)
    apart, seconds = run_sections(["sdm"], False, 2)
    assert [r.claim for r in apart] == [r.claim for r in here] and apart == here and seconds["sdm"] > 0


def test_the_verdicts_are_tallied_and_drawn_by_the_paper_each_claim_names(tmp_path) -> None:
    from dataclasses import asdict

    from benchmarks.bench_papers import by_paper, plot_verdicts

    rows = [asdict(r) for r in (Row("Hera: servers", "", "", "yes"), Row("Hera (measured LLC): EMU", "", "", "no"),
                                Row("Kairos+: share", "", "", "direction"), Row("SDM M3", "", "", "n/a"),
                                Row("ElasticRec: at 10k QPS", "", "", "yes", counted=False),
                                Row("perfmodel on a host", "", "", "yes", counted=False))]
    tally = by_paper(rows)
    assert tally["Hera"] == {"yes": 1, "no": 1} and tally["Kairos"] == {"direction": 1}
    assert tally["SDM"] == {"n/a": 1} and not tally["ElasticRec"] and not tally["Hercules"]
    pytest.importorskip("matplotlib")
    png = plot_verdicts(rows, str(tmp_path / "verdicts.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
