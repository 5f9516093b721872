"""SDM placement planner and ``recserve plan tier``."""

from __future__ import annotations

import json

import pytest

from recserve.cli import main
from recserve.errors import InfeasibleError
from recserve.planners.plan import Plan
from recserve.planners.sdm import CACHE_OVERHEAD_PER_SLOT, TierPlan, bandwidth_need, plan_tier
from recserve.specs import SLA, ModelSpec, ServerType, SSDSpec, TableSpec


def spec() -> ModelSpec:
    tables = (
        TableSpec("u_big", 40_000_000, 64, pooling=40, side="user"),
        TableSpec("u_small", 1_000_000, 64, pooling=10, side="user"),
        TableSpec("i0", 5_000_000, 64, pooling=5, side="item"),
    )
    return ModelSpec("tier-test", "dlrm", 16, tables, "concat", SLA(50.0), bottom_mlp=(64,), top_mlp=(1,),
                     bytes_per_elem=1)


SERVER = ServerType("box", cores=16, mem_gb=64, mem_bw_gbs=100,
                    ssd=SSDSpec(iops=1_000_000, read_latency_us=80, capacity_gb=1000))


def test_eq2_item_tables_need_batch_times_more_bandwidth():
    s = spec()
    assert bandwidth_need(s, s.tables[0], qps=100, item_batch=50) == 100 * 1 * 40 * 64
    assert bandwidth_need(s, s.tables[2], qps=100, item_batch=50) == 100 * 50 * 5 * 64


@pytest.mark.parametrize("policy", ["sm-cache", "fixed-fm", "per-table-cache"])
def test_dram_budget_always_respected(policy):
    for dram in (0.5, 1.0, 2.0):
        plan = plan_tier(spec(), dram, 500, policy=policy, server=SERVER, item_batch=50)
        s = plan.summary
        assert s["fm_direct_gb"] + s["cache_gb"] <= dram + 1e-9
        fm = sum(t.bytes for t in plan.tables if t.tier == "FM") / 1e9
        assert fm == pytest.approx(s["fm_direct_gb"])


def test_iops_equation_and_cache_effect():
    small = plan_tier(spec(), 0.5, 200, server=SERVER, item_batch=50)
    big = plan_tier(spec(), 2.0, 200, server=SERVER, item_batch=50)
    lookups = 200 * (40 + 10)  # user batch 1: QPS × Σ pooling over SM tables
    assert small.summary["iops_no_cache"] == lookups
    for plan in (small, big):
        expect = sum(200 * t_spec.pooling * (1 - t.hit_rate)
                     for t, t_spec in zip(plan.tables, spec().tables, strict=True) if t.tier == "SM")
        assert plan.summary["required_iops"] == pytest.approx(expect)
    assert big.summary["hit_rate"] > small.summary["hit_rate"]
    assert big.summary["required_iops"] < small.summary["required_iops"]


def test_hit_rate_follows_locality_model():
    # cache holding exactly the hot 10 % of the one SM table → hit rate = locality P
    tables = (TableSpec("u", 10_000_000, 100, pooling=10, side="user"), TableSpec("i", 1000, 100, side="item"))
    s = ModelSpec("one", "dlrm", 4, tables, "concat", SLA(10.0), top_mlp=(1,), bytes_per_elem=1)
    item_gb = 1000 * 100 / 1e9
    cache_gb = 1_000_000 * (100 + CACHE_OVERHEAD_PER_SLOT) / 1e9
    plan = plan_tier(s, item_gb + cache_gb, 10, locality_user=0.8, server=SERVER)
    assert plan.tables[0].hit_rate == pytest.approx(0.8, rel=1e-6)


def test_infeasible_when_fm_tables_exceed_budget():
    with pytest.raises(InfeasibleError, match="more than"):
        plan_tier(spec(), 0.1, 100, server=SERVER)


def test_ssd_overload_is_reported_infeasible():
    plan = plan_tier(spec(), 0.4, 100_000, server=SERVER, item_batch=50)
    assert plan.summary["ssd_utilisation"] > 1 and not plan.summary["feasible"]


def test_per_table_cache_disables_cold_tables():
    tables = (TableSpec("hot", 1_000_000, 64, pooling=20, side="user"),
              TableSpec("cold", 1_000_000_000, 64, pooling=1, side="user"),
              TableSpec("i", 1000, 64, side="item"))
    s = ModelSpec("mix", "dlrm", 4, tables, "concat", SLA(10.0), top_mlp=(1,), bytes_per_elem=1)
    plan = plan_tier(s, 0.15, 100, policy="per-table-cache", server=SERVER)
    by = {t.table: t for t in plan.tables}
    assert by["hot"].cache and not by["cold"].cache and by["cold"].hit_rate == 0.0


def test_plan_tier_cli_json_roundtrip(capsys, tmp_path):
    out = tmp_path / "tier.json"
    rc = main(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "120", "--batch", "50",
               "--json", "--out", str(out)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "tier" and data["summary"]["required_iops"] > 0
    assert set(data["baselines"]) == {"sdm/fixed-fm", "sdm/per-table-cache"}
    loaded = Plan.load(out)
    assert isinstance(loaded, TierPlan) and len(loaded.tables) == 91


def test_plan_tier_cli_table_and_errors(capsys):
    assert main(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "64", "--qps", "120"]) == 0
    assert "required_iops" in capsys.readouterr().out
    assert main(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "1", "--qps", "120"]) == 3
    assert "more than" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--sm-sides", "foo"], "argument --sm-sides: must be user, item or user,item, got 'foo'"),
    (["--sm-sides", "user,foo"], "argument --sm-sides: must be user, item or user,item, got 'user,foo'"),
    (["--locality-user", "0"], "argument --locality-user: must be a finite number in [0.1, 1], got '0'"),
    (["--locality-item", "0.05"], "argument --locality-item: must be a finite number in [0.1, 1], got '0.05'"),
])
def test_plan_tier_cli_refuses_unknown_sides_and_localities_below_uniform(capsys, args, message):
    assert main(["plan", "tier", "--model", "sdm-m1", "--dram-gb", "48", "--qps", "120", *args]) == 2
    assert capsys.readouterr().err.strip() == f"recserve plan tier: error: {message}"


def test_plan_tier_checks_sides_and_locality_bounds():
    from recserve.errors import SpecError

    with pytest.raises(SpecError, match=r"sm_sides must be user and/or item, got \['user', 'foo'\]"):
        plan_tier(spec(), 10, 100, sm_sides=("user", "foo"))
    with pytest.raises(SpecError, match=r"locality_user must be in \[0.1, 1\]"):
        plan_tier(spec(), 10, 100, locality_user=0.0)
    assert plan_tier(spec(), 10, 100, sm_sides=("user", "item"), locality_user=0.1).tables


# ------------------------------------------------------------------ Eq. 5-7 and simulated hit rates


def test_fleet_eq5_to_7_hosts_and_power():
    from recserve.planners.sdm import fleet

    big = ServerType("big", cores=40, mem_gb=256, mem_bw_gbs=256, power_w=500)
    small = ServerType("small", cores=20, mem_gb=64, mem_bw_gbs=128, power_w=200)
    # SDM Table 8's shape: half the QPS per host at 0.4 of the power -> 20% less fleet power
    a, b = fleet("L", big, 288_000, 240), fleet("SS", small, 288_000, 120)
    assert (a.hosts, b.hosts) == (1200, 2400)
    assert 1 - b.power_w / a.power_w == pytest.approx(0.2)
    assert fleet("L", big, 1001, 1000).hosts == 2
    with pytest.raises(InfeasibleError):
        fleet("none", big, 10, 0.0)


def test_simulated_hit_replaces_ideal_fill_and_sets_iops():  # 2 GB: under the 2.9 GB of tables, so a tier
    ideal = plan_tier(spec(), 2, 1000, item_batch=50, server=SERVER)
    low = plan_tier(spec(), 2, 1000, item_batch=50, server=SERVER, simulated_hit=0.2)
    high = plan_tier(spec(), 2, 1000, item_batch=50, server=SERVER, simulated_hit=0.9)
    assert low.summary["hit_rate"] == pytest.approx(0.2)
    assert high.summary["required_iops"] == pytest.approx(low.summary["required_iops"] * 0.1 / 0.8)
    assert ideal.inputs["simulated_hit"] is None and high.inputs["simulated_hit"] == 0.9


def test_sdm_host_qps_grows_with_hit_rate_and_is_capped_by_compute():
    from recserve.planners.sdm import sdm_host_qps

    server = ServerType("box", cores=16, mem_gb=64, mem_bw_gbs=100, power_w=200.0,
                        ssd=SSDSpec(iops=200_000, read_latency_us=80, capacity_gb=1000))
    q_low, why_low = sdm_host_qps(spec(), server, 2, 50, simulated_hit=0.2)
    q_high, _ = sdm_host_qps(spec(), server, 2, 50, simulated_hit=0.99)
    assert 0 < q_low < q_high
    assert "SSD" in why_low
    s = plan_tier(spec(), 2, q_low, item_batch=50, server=server, simulated_hit=0.2).summary
    assert s["ssd_utilisation"] < 1


def test_a_budget_that_holds_every_table_puts_none_on_ssd():
    plan = plan_tier(spec(), 3.0, 1000, item_batch=50, server=SERVER)  # the tables are 2.94 GB
    assert {p.tier for p in plan.tables} == {"FM"} and plan.summary["required_iops"] == 0
    assert plan.summary["sm_tables"] == 0 and plan.summary["dram_saved_gb"] == 0
    assert any("holds all 2.94 GB of tables: every table stays in DRAM" in note for note in plan.notes)
    assert {p.tier for p in plan_tier(spec(), 2.9, 1000, item_batch=50, server=SERVER).tables} == {"FM", "SM"}
