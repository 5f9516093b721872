"""Claims-table rows of Software Defined Memory (Ardestani et al.): the row cache's hit rate and the fleet power
of M1 on HW-SS + SDM against HW-L (§5.1, Table 8), M2 against a scale-out baseline (§5.2, Table 9), and M3's
multi-tenancy (§5.3, Table 11)."""

from __future__ import annotations

import math

from benchmarks.bench_papers import Row, judge


def row_sdm() -> list[Row]:
    from recserve.embedding.row_index import slot_overhead_bytes
    from recserve.planners.sdm import dram_host_qps, fleet, plan_tier, sdm_host_qps
    from recserve.sim.cache import simulate_tier_hits
    from recserve.specs import get_model, get_server

    spec, hw_ss, hw_l = get_model("sdm-m1"), get_server("sdm-hw-ss"), get_server("sdm-hw-l")
    embed_gb, item_batch, qps = hw_ss.mem_gb - 16, 50, 120.0  # 16 of the 64 GB for the OS and the dense part
    ideal = plan_tier(spec, embed_gb, qps, item_batch=item_batch, server=hw_ss)
    sm = [i for i, t in enumerate(spec.tables) if t.side == "user"]
    sim = simulate_tier_hits(spec, sm, ideal.summary["cache_gb"] * 1e9, item_batch=item_batch, queries=600,
                             pooled_bytes=0.05 * ideal.summary["cache_gb"] * 1e9)
    hit = sim.hit_rate
    total = 240.0 * 1200  # Table 8's fleet load (HW-L: 240 QPS x 1200 hosts), the paper's setup
    q_l, why_l = dram_host_qps(spec, hw_l, item_batch)
    base = fleet("HW-L", hw_l, total, q_l, why_l)
    out = {}
    for label, h in (("simulated", hit), ("paper_hit", 0.96)):
        q, why = sdm_host_qps(spec, hw_ss, embed_gb, item_batch, simulated_hit=h)
        opt = fleet("HW-SS+SDM", hw_ss, total, q, why)
        out[label] = {"saving": 1 - opt.power_w / base.power_w, "qps_per_host": q, "limit": why,
                      "hosts": opt.hosts}
    sim_saving, paper_saving = out["simulated"]["saving"], out["paper_hit"]["saving"]
    q_ss = out["paper_hit"]["qps_per_host"]
    setup = ("M1 (Table 6) on HW-SS (Table 7), 48 of 64 GB for embeddings, user tables on the SSD behind the row "
             "cache, 50 items per query, 120 QPS; index traces Zipf with locality P = 0.9 (ElasticRec's definition: "
             f"the hottest 10% of rows take 90%), recserve's RowCache (CLOCK, {slot_overhead_bytes('clock'):.0f} B per "
             "slot beside a 51 B row with its native key index)")
    return [Row("SDM: row-cache hit rate in steady state (M1 user tables on HW-SS)", "> 96%",
                f"simulated trace {100 * hit:.1f}% (ideal fill {100 * ideal.summary['hit_rate']:.1f}%; pooled cache "
                f"{100 * sim.pooled_hit_rate:.1f}%)", judge(hit, 0.96, level=True),
                f"a level (no direction): {100 * hit:.1f}% is {100 * (0.96 - hit):.0f} points under the paper; the "
                "locality is an input the paper does not print (Fig. 4: CDFs of production user/item features, "
                "power-law, higher seen from one host with user-sticky routing, Fig. 4c), so P = 0.9 is borrowed "
                f"from ElasticRec; clock cache of {ideal.summary['cache_gb']:.1f} GB = "
                f"{sim.slots / sim.scale / 1e6:.0f}M slots; random bags never repeat, so the pooled cache (paper: "
                "~5%) stays near 0", {"ideal": ideal.summary["hit_rate"], "simulated": hit,
                                      "pooled": sim.pooled_hit_rate},
                cite="§5.1 (text beside Table 8); §4.2, Fig. 4", setup=setup,
                paper_inputs="n/a: the paper prints no locality figure (Fig. 4's CDFs have no values in the text) "
                             "and no cache overhead per row"),
            Row("SDM Eq. 5-7: fleet power, M1 on HW-SS+SDM vs HW-L", "20% saved",
                f"{100 * sim_saving:+.0f}% saved at the simulated hit rate ({out['simulated']['limit']}, "
                f"{out['simulated']['qps_per_host']:,.0f} QPS/host)", judge(sim_saving, 0.20),
                f"at the simulated hit rate the SSD's IOPS cap HW-SS; HW-L {q_l:,.0f} QPS/host and HW-SS "
                f"{q_ss:,.0f} at 96% (perfmodel, compute-bound, half the cores: the QPS ratio "
                f"{q_ss / q_l:.3f} is modelled, the paper's is 120/240 = 0.5)",
                {"fleet": out, "hw_l_qps": q_l}, cite="§5.1, Table 8",
                setup=setup + f"; fleet at Table 8's load ({total:,.0f} QPS), hosts x host power (catalogue: HW-L "
                f"{hw_l.power_w:g} W, HW-SS {hw_ss.power_w:g} W)",
                paper_inputs=f"{100 * paper_saving:+.1f}% saved at the paper's observed 96% hit rate: this follows "
                "from Table 8's inputs - the host power ratio 0.4 is the catalogue's input (HW-SS 200 W = 0.4 x "
                "HW-L's assumed 500 W), not modelled, and wherever the SSD is not the limit the saving is "
                f"1 - 0.4 / {q_ss / q_l:.3f} = {100 * (1 - 0.4 / (q_ss / q_l)):.1f}% before hosts are rounded up; "
                f"verdict {judge(paper_saving, 0.20)} by construction, not an independent check")] + _sdm_m2_m3_rows()


def _sdm_m2_m3_rows() -> list[Row]:
    """SDM §5.2 (Table 9): M2 on accelerator hosts, the 100 GB of user tables either scaled out to HW-S hosts'
    DRAM or on the host's own Optane SSD behind a DRAM row cache (HW-AO + SDM); §5.3 (Table 11): M3 multi-tenancy."""
    from dataclasses import replace

    from recserve.perfmodel import PerfModel
    from recserve.planners.sdm import sdm_host_qps
    from recserve.specs import get_model, get_server

    spec, ao, hw_s = get_model("sdm-m2"), get_server("sdm-hw-ao"), get_server("sdm-hw-s")
    cal = PerfModel().cal
    item_batch, total = 150, 450.0 * 1500  # Table 9's fleet load (HW-AN: 450 QPS x 1500 hosts)
    user = [t for t in spec.tables if t.side == "user"]
    user_gb = sum(t.bytes(spec.bytes_per_elem) for t in user) / 1e9
    dram_gb = ao.mem_gb - 16 + sum(t.bytes(spec.bytes_per_elem) for t in spec.tables
                                   if t.side == "item") / 1e9  # the item tables sit in the accelerator's memory
    # host DRAM + accelerator memory hold the resident tables (the perfmodel counts all of them in host memory)
    q, limit = sdm_host_qps(spec, replace(ao, mem_gb=ao.mem_gb + ao.accel_mem_gb), dram_gb, item_batch)
    # scale-out: the accelerator hosts run the same model with user rows served from HW-S DRAM (no SSD cap), so they
    # serve the compute-bound rate; HW-S hosts: one full copy of the user tables per group (capacity), as many groups
    # as the fleet's user-row gathers need (bytes/s at the HW-S's gather rate: cores x per-core DRAM gather rate,
    # capped by its usable bandwidth); each query gathers each user table once (one user per query)
    hosts = math.ceil(total / q - 1e-9) if q > 0 else 0
    per_query = sum(t.pooling * t.row_bytes(spec.bytes_per_elem) for t in user)
    s_gbs = min(hw_s.cores * cal.dram_gbs_per_core, hw_s.mem_bw_gbs * cal.membw_eff)
    group = math.ceil(user_gb / (hw_s.mem_gb * cal.mem_usable_frac - 16))
    s_hosts = group * max(1, math.ceil(total * per_query / 1e9 / s_gbs / group))
    scale_out = hosts * ao.power_w + s_hosts * hw_s.power_w
    sdm = hosts * ao.power_w
    saving = 1 - sdm / scale_out if scale_out > 0 else float("nan")
    paper_in = 1 - 1.0 / (1.0 + 0.25 / 5)  # Table 9: same QPS per host; one HW-S (0.25 power) per 5 HW-AN (§5.2)
    m3_paper = 1 - (1.01 / 0.90) / (1.0 / 0.63)  # Table 11: fleet power = host power / utilisation
    return [Row("SDM M2: HW-AO + SDM vs HW-AN + scale-out (user tables on HW-S hosts), fleet power", "5% saved",
                f"{100 * saving:+.1f}% saved ({hosts:,} accelerator hosts at {q:,.0f} QPS ({limit}); scale-out adds "
                f"{s_hosts} HW-S)", judge(saving, 0.05),
                f"the HW-S count is modelled: {user_gb:.0f} GB of user tables need {group} HW-S per copy, and the "
                f"fleet's user gathers ({per_query / 1e3:.0f} KB per query, one user per query) need "
                f"{total * per_query / 1e9:,.0f} GB/s against {s_gbs:.0f} GB/s per HW-S, so {s_hosts} HW-S serve "
                f"{hosts:,} accelerator hosts where the paper has one per 5 (§5.2: 300 per 1500; the paper gives no "
                "reason: replication, network, RPC fan-out are not modelled here); the Optane SSD does not limit "
                "the host (Table 9: 450 = 450 QPS), so the saving is the HW-S hosts' share",
                {"qps_per_host": q, "limit": limit, "hosts": hosts, "hw_s_hosts": s_hosts, "saving": saving},
                cite="§5.2, Table 9",
                setup=f"M2 (Table 6) at Table 9's fleet load ({total:,.0f} QPS), {item_batch} items per query; HW-AO: "
                      "item tables + dense on the accelerator, user tables on Optane behind the host DRAM row cache "
                      f"({ao.mem_gb - 16:g} GB); host QPS by `planners.sdm.sdm_host_qps` (perfmodel, SSD Eq. 3-4, 8); "
                      f"powers from the catalogue (HW-AN/AO {ao.power_w:g} W, HW-S {hw_s.power_w:g} W = 0.25 x, "
                      "Table 9's ratio)",
                paper_inputs=f"{100 * paper_in:+.1f}% saved with the paper's inputs (equal QPS per host, one HW-S of "
                "0.25 power per 5 HW-AN): Table 9's arithmetic, reproduced by construction"),
            Row("SDM M3: multi-tenancy with SDM (HW-FAO + SDM) vs HW-FA, fleet power", "29% saved", "not modelled",
                "n/a",
                "the saving comes from host utilisation with multi-tenancy (0.63 -> 0.90: experimental models' loads "
                "and the DRAM capacity that bounds co-location), which the paper estimates and recserve does not "
                "model for M3 (a future model: Table 10 and Table 6 describe it differently)",
                {"paper_inputs": m3_paper},
                cite="§5.3, Tables 10-11",
                setup="M3 (Table 6) on a future accelerator host with / without 9 Optane SSDs",
                paper_inputs=f"{100 * m3_paper:+.1f}% saved from Table 11's own inputs (power 1.01 at utilisation 0.90 "
                "vs 1.0 at 0.63): the paper's roofline arithmetic")]
