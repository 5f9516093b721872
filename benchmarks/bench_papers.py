"""The papers' headline results, regenerated from recserve's planners, perfmodel and simulator.

Every run recomputes the ``recserve`` column from the code (the perfmodel profiles of Hera and Hercules
are cached under ``results/`` because modelling them takes minutes: ``--fresh`` redoes them); the only
numbers written here are the papers' own, as the reference column.  A row is *reproduced* when its
direction matches the paper and, where the setup matches, it lies within 10 points (or 10 % of the
ratio) of the paper; every other row says why not.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_papers.py [--only hera,elasticrec] [--out results/papers.json]

Prints a markdown table (claim | paper | recserve | reproduced? | reason for any gap) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from recserve.profiles import ProfileSet

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path("results")


@dataclass
class Row:
    claim: str
    paper: str
    recserve: str
    reproduced: str          # "yes" | "direction" | "no" | "n/a"
    reason: str = ""
    numbers: dict = field(default_factory=dict)


def within(value: float, paper: float, points: float = 0.10) -> bool:
    """Same sign and within ``points`` (absolute, for fractions) of the paper."""
    return np.sign(value) == np.sign(paper) and abs(value - paper) <= points


def verdict(direction: bool, close: bool) -> str:
    return "yes" if direction and close else ("direction" if direction else "no")


# ----------------------------------------------------------------------------------------- Hera


MEASURED_INTERFERENCE = "interference_dev_host.json"  # bundled: `recserve profile interference` on the dev host
# every bundled measurement of LLC sensitivity, by host (the label of its Hera rows)
MEASURED_LLC = {"measured LLC": MEASURED_INTERFERENCE, "measured LLC, Zen 1 VM (8 MB)": "interference_zen1_vm.json"}


def _hera_outcome(profiles, server, models) -> dict:
    from recserve.planners.hera import affinity_matrix, all_curves, plan_colocation, targets_at_load

    curves = all_curves(profiles, models, server)
    aff = affinity_matrix(curves, server)["affinity"]
    pairs = aff[np.triu_indices(len(models), 1)]
    savings, emu_gain = {}, {}
    for level in (1, 2, 4, 8):
        plan = plan_colocation(profiles, server, targets_at_load(curves, level), seeds=5)
        drs = plan.baselines["deeprecsys"]
        savings[level] = 1 - plan.summary["servers"] / drs["servers"]
        emu_gain[level] = plan.summary["mean_emu"] / drs["mean_emu"] - 1
    keep_1way = {c.name: float(c.ways_ratio[1]) for c in curves}
    return {"pairs": pairs, "matrix": aff, "savings": savings, "emu_gain": emu_gain, "keep_at_1_way": keep_1way,
            "low": sorted(c.name for c in curves if not c.high)}


def _measured_hera_profiles(profiles, server, models, name: str = MEASURED_INTERFERENCE):
    from recserve.perfmodel.interference import fit_interference, with_measured_ways
    from recserve.reference import reference_path

    try:
        measured = ProfileSet.load(reference_path(name))
    except Exception:  # noqa: BLE001 - no bundled measurement: the modelled row stands alone
        return None
    have = {t.model for t in measured.find(kind="slowdown_vs_llc_occupied")}
    fits = {m: fit_interference(measured, m) for m in models if m in have}
    return with_measured_ways(profiles, server.name, fits, server.llc_mb, server.llc_ways) if fits else None


def row_hera_measured_pairs() -> list[Row]:
    """Measured co-location on the dev host (Hera Fig. 10b's measure): each pair's QPS kept, mean of the two."""
    from recserve.reference import reference_path

    try:
        measured = ProfileSet.load(reference_path(MEASURED_INTERFERENCE))
    except Exception:  # noqa: BLE001
        return []
    slow = {(t.model, t.conditions["with"]): float(t.rows[0][2]) for t in measured.find(kind="colocated_slowdown")}
    kept = {tuple(sorted(p)): (1 / slow[p] + 1 / slow[p[::-1]]) / 2 for p in slow if p[::-1] in slow}
    if not kept:
        return []
    short = {m: m.removeprefix("hera-") for pair in kept for m in pair}
    txt = ", ".join(f"{short[a]}+{short[b]} {v:.2f}" for (a, b), v in sorted(kept.items()))
    return [Row(f"Hera: measured QPS kept when co-located, {len(kept)} pairs (dev host, 1 worker each)",
                "Fig. 10b: pairs differ", txt, "n/a",
                "two single-worker models on two cores of a shared host; no LLC partitioning; "
                "noise of a few % (see the load average in the data file)", {"kept": {f"{a}+{b}": v for (a, b), v
                                                                                       in kept.items()}})]


def row_hera(fresh: bool) -> list[Row]:
    from bench_planners import HERA_MODELS, cached_profiles

    from recserve.specs import get_server

    server = get_server("hera-xeon")
    path = RESULTS / "profiles_hera.json"
    if fresh and path.exists():
        path.unlink()
    profiles = cached_profiles(path, HERA_MODELS, [server.name], tables="copied", efficiency=False)
    variants = {"perfmodel LLC": _hera_outcome(profiles, server, HERA_MODELS)}
    for label, name in MEASURED_LLC.items():
        measured = _measured_hera_profiles(profiles, server, HERA_MODELS, name)
        if measured is not None:
            variants[label] = _hera_outcome(measured, server, HERA_MODELS)
    rows = row_hera_measured_pairs()
    if rows:  # does Alg. 1's estimate rank the measured pairs right?
        from scipy.stats import spearmanr

        kept = rows[0].numbers["kept"]
        idx = {m: i for i, m in enumerate(HERA_MODELS)}
        for label, o in variants.items():
            est = [float(o["matrix"][idx[a], idx[b]]) for a, b in (k.split("+") for k in kept)]
            rho = spearmanr(est, list(kept.values())).statistic if len(kept) > 2 else float("nan")
            rows[0].numbers[f"spearman_vs_alg1_{label}"] = float(rho)
            rows[0].reason += f"; Spearman vs Alg. 1's estimate ({label}): {rho:+.2f}"
    for label, o in variants.items():
        pairs, savings, emu_gain = o["pairs"], o["savings"], o["emu_gain"]
        best = max(savings.values())
        mean_gain = float(np.mean(list(emu_gain.values())))
        servers_txt = " / ".join(f"{-100 * v:+.1f}%" for v in savings.values())
        keep = ", ".join(f"{m.removeprefix('hera-')} {v:.2f}" for m, v in o["keep_at_1_way"].items())
        reason = (f"{label}: QPS kept at 1 of 11 ways: {keep}; low-scalability {o['low']} (paper: DLRM(B) and "
                  "DLRM(D); DLRM(D) stays high here because the per-core DRAM rate, fitted on the dev host, keeps 16 "
                  "workers under hera-xeon's bandwidth, so every pair's CoAff_DRAM is 1); "
                  + ("flat LLC curves leave Alg. 1 nothing to rank" if label == "perfmodel LLC" else
                     f"slowdowns measured ({MEASURED_LLC[label]}) on a shared 2-core host with scaled tables "
                     "(<= 128 MB), mapped to hera-xeon by share of the LLC per worker: 16 copied workers already "
                     "hold under 1.4 MB each with all 11 ways, past where the measured curve flattens, so fewer "
                     "ways cost little"))
        rows += [
            Row(f"Hera ({label}): servers vs DeepRecSys (levels 1/2/4/8)", "-26%", servers_txt,
                verdict(best > 0, within(-best, -0.26)), reason,
                {"server_saving": savings, "emu_gain": emu_gain, "low_scalability": o["low"],
                 "keep_at_1_way": o["keep_at_1_way"]}),
            Row(f"Hera ({label}): EMU vs DeepRecSys", "+37.3%", f"{100 * mean_gain:+.1f}% (mean of levels)",
                verdict(mean_gain > 0, within(mean_gain, 0.373)), reason, {"emu_gain": emu_gain}),
            Row(f"Hera ({label}): spread of co-location affinity (28 pairs)",
                "pairs differ (Fig. 10a; EMU of random pairs < 100%)",
                f"min {pairs.min():.4f}, p25 {np.percentile(pairs, 25):.4f}, median {np.median(pairs):.4f}, "
                f"max {pairs.max():.4f}", "yes" if pairs.max() - pairs.min() > 0.3 else "no",
                "spread under 0.3" if pairs.max() - pairs.min() <= 0.3 else "",
                {"affinity_pairs": pairs.tolist()}),
        ]
    return rows


# ------------------------------------------------------------------------------------- Hercules


def row_hercules_provision(fresh: bool) -> list[Row]:
    from bench_planners import HERCULES_AVAILABLE, HERCULES_MODELS, cached_profiles

    from recserve.planners.hercules.provision import diurnal_trace, plan_provision

    path = RESULTS / "profiles_hercules.json"
    if fresh and path.exists():
        path.unlink()
    profiles = cached_profiles(path, HERCULES_MODELS, list(HERCULES_AVAILABLE))
    peaks = {"hercules-rmc1": 70000.0, "hercules-rmc2": 1800.0, "hercules-rmc3": 40000.0,
             "hercules-mtwnd": 25000.0, "hercules-din": 20000.0, "hercules-dien": 10000.0}
    from recserve.planners.hercules.provision import alpha_from_history

    hours, loads = diurnal_trace(peaks, steps=24)
    alpha = alpha_from_history({w: list(v) + [v[0]] for w, v in loads.items()})  # §IV-C: from the day's growth
    plan = plan_provision(profiles, HERCULES_AVAILABLE, loads, hours, alpha=alpha)
    greedy = plan.baselines["greedy"]
    cap, power = greedy["hercules_server_saving_peak"], greedy["hercules_power_saving_peak"]
    best = {}
    for w, per in plan.inputs["efficiency"].items():
        ranked = sorted(per, key=lambda h: -per[h]["qps"] / per[h]["power_w"])
        best[w.removeprefix("hercules-")] = ranked[0].removeprefix("hercules-") if ranked else "-"
    types = list(best.values())
    contended = sorted({t for t in types if types.count(t) > 1})
    shared = (f"contended: {', '.join(f'{t} by ' + '+'.join(w for w, b in best.items() if b == t) for t in contended)}"
              if contended else "no two workloads prefer the same type")
    return [Row("Hercules: capacity / peak power vs greedy", "-47.7% / -23.7%",
                f"{-100 * cap:+.1f}% / {-100 * power:+.1f}% (alpha {alpha:.3f} from the load history)",
                verdict(cap > 0 and power > 0, within(cap, 0.477) and within(power, 0.237)),
                f"perfmodel efficiency matrix, best QPS/W type per workload {best} ({shared}); greedy's turn order "
                "costs little when few workloads contend for a type; the ILP minimises provisioned power, not "
                "servers (the Day-X mix and the paper's measured matrix are not available)",
                {"greedy": greedy, "hercules": plan.summary, "best_type": best})]


def row_hercules_search() -> list[Row]:
    from recserve.perfmodel import PerfModel, SizeMix
    from recserve.perfmodel.evaluator import perfmodel_evaluator
    from recserve.planners.hercules.search import baymax, deeprecsys, search
    from recserve.specs import get_model, get_server

    pm, mix = PerfModel(), SizeMix.of(None)
    gains: dict[str, dict[str, float]] = {"cpu": {}, "gpu": {}}
    for kind, sname in (("cpu", "hercules-t1"), ("gpu", "hercules-t7")):
        server = get_server(sname)
        for m in ("hercules-rmc1", "hercules-rmc2", "hercules-rmc3"):
            ev = perfmodel_evaluator(get_model(m), server, pm, mix)
            hs, dr = search(server, ev), (deeprecsys(server, ev) if kind == "cpu" else baymax(server, ev))
            gains[kind][m] = hs.best_qps / dr.best_qps if dr.best_qps > 0 else float("inf")
    cpu, gpu = list(gains["cpu"].values()), list(gains["gpu"].values())
    ok_cpu = min(cpu) >= 1.8 * 0.9
    finite = [g for g in gpu if np.isfinite(g)]
    gpu_txt = (f"{min(finite):.1f}-{max(finite):.1f}x" if finite else "-") + (
        f" ({len(gpu) - len(finite)} with a baseline meeting no SLA)" if len(finite) < len(gpu) else "")
    return [Row("Hercules search vs DeepRecSys (CPU, RMC1-3) / vs Baymax (GPU)", "1.8-2.6x / up to 9x",
                f"{min(cpu):.2f}-{max(cpu):.2f}x / {gpu_txt}",
                verdict(min(cpu) > 1.0 and min(gpu) > 1.0, ok_cpu and max(gpu) <= 9 * 1.1),
                "CPU: the perfmodel has no operator idling or co-runner interference for the search to exploit; "
                "GPU: Baymax-style baseline (model-based threads co-located on the device, thread count and batch "
                "hill-climbed) under the same device-thread cap as the search",
                {"gain": gains})]


# ----------------------------------------------------------------------------------- ElasticRec


def row_elasticrec() -> list[Row]:
    from recserve.planners.elasticrec import (
        MEASURED_REPLICA_BYTES,
        PAPER_NODE_SOCKETS,
        PAPER_RPC_MS,
        cost_model_from_perfmodel,
        evaluate_plan,
        modelwise_replicas_implied,
        plan_shards,
    )
    from recserve.planners.replicas import sla_bounded_qps
    from recserve.sim.shards import simulate_plan_latency
    from recserve.specs import get_model, get_server

    # ElasticRec §V-A: Xeon Gold 6242 nodes (= hera-xeon's socket), two sockets per node; §V-C: a query is a batch
    # of 32 items, SLA 400 ms p95 (the catalogue's); §VI-B: ElasticRec's communication adds 31 ms on average.
    server = get_server("hera-xeon")
    paper = {"elasticrec-rm1": 2.2, "elasticrec-rm2": 2.6, "elasticrec-rm3": 8.1}
    out: dict[float, dict[str, dict]] = {}
    for qps in (100.0, 10_000.0):
        out[qps] = {}
        for name in paper:
            spec = get_model(name)
            cost = cost_model_from_perfmodel(spec, server, 32, min_mem_bytes=MEASURED_REPLICA_BYTES)
            plan = plan_shards(spec, qps, cost, batch=32, locality=0.9, locality_model="zipf", paper_dp_rule=True,
                               rpc_ms=PAPER_RPC_MS)
            ev = evaluate_plan(plan, spec, cost, server, locality=0.9, locality_model="zipf", rpc_ms=PAPER_RPC_MS,
                               sockets=PAPER_NODE_SOCKETS)
            sim = simulate_plan_latency(plan, spec, cost, rpc_ms=PAPER_RPC_MS)  # a minute of load
            model_qps = cost.model_qps(sum(32 * t.pooling for t in spec.tables))
            out[qps][name] = {"saving": plan.saving, "modelwise_replicas": plan.modelwise_replicas,
                              "modelwise_replicas_paper_at_least": modelwise_replicas_implied(paper[name], spec, cost),
                              "modelwise_replica_qps_max": float(sla_bounded_qps(model_qps, spec.sla.target_ms,
                                                                                 spec.sla.percentile)),
                              "shards_first_table": plan.tables[0].num_shards,
                              "replicas_first_table": plan.tables[0].replicas, **ev.to_dict(),
                              "p95_ms_simulated": sim.sharded_ms, "p95_ms_modelwise_simulated": sim.modelwise_ms,
                              "sla_ok_simulated": sim.within(spec.sla.target_ms)}
    at100, at10k = out[100.0], out[10_000.0]

    def fmt(d: dict, key: str) -> str:
        return " / ".join(f"{v[key]:.2f}x" for v in d.values())

    def joined(d: dict, key: str, form: str = "{}") -> str:
        return "/".join(form.format(v[key]) for v in d.values())

    mw10k = [v["modelwise_replicas"] for v in at10k.values()]
    setup = ("Table II models, 32-item queries, 400 ms p95, Zipf with P=0.9, 30 MiB per replica (measured), "
             f"{PAPER_RPC_MS:g} ms RPC (§VI-B), DP at the paper's 1000 QPS constant (raised per table to twice an "
             "unsplit replica's rate where one replica takes 1000: the paper's 'replicas larger than 1'), perfmodel "
             "one-core rates on hera-xeon")
    implied = joined(at100, "modelwise_replicas_paper_at_least")
    gap = (f"the paper's own savings imply its model-wise baseline ran at least {implied} replicas at 100 QPS "
           "(ElasticRec holds every row once, so a saving s needs s copies), i.e. <= "
           + "/".join(f"{100 / v['modelwise_replicas_paper_at_least']:.0f}" for v in at100.values())
           + " QPS per replica; a modelled one-core replica takes "
           f"{joined(at100, 'modelwise_replica_qps_max', '{:.0f}')} QPS within the SLA, so "
           f"{joined(at100, 'modelwise_replicas')} replica(s) serve 100 QPS and there is nothing to save.  Model, "
           "query size, SLA and CPU are the paper's; its text states no per-replica QPS or container CPU (Fig. 5/9 "
           "only), so the gap is its measured per-query cost, which recserve does not scale to")
    close = all(abs(at100[m]["saving"] - p) <= 0.1 * p for m, p in paper.items())
    sla = all(v["sla_ok"] and v["sla_ok_simulated"] for d in out.values() for v in d.values())

    def sla_text(runs: dict) -> str:
        worst = max((v for d in runs.values() for v in d.values()), key=lambda v: v["p95_ms_simulated"])
        mw = max(v["p95_ms_modelwise_simulated"] for d in runs.values() for v in d.values())
        est = max(v["p95_ms"] for d in runs.values() for v in d.values())
        return (f"{'yes' if sla else 'no'}: worst simulated p95 {worst['p95_ms_simulated']:.0f} ms (M/M/1 estimate "
                f"{est:.0f} ms), model-wise {mw:.0f} ms")
    return [
        Row("ElasticRec: memory vs model-wise (RM1/2/3, 100 QPS)", "2.2x / 2.6x / 8.1x", fmt(at100, "saving"),
            verdict(min(v["saving"] for v in at100.values()) > 1.0, close),
            f"{setup}: {gap}", {"at_100_qps": at100}),
        Row("ElasticRec: memory vs model-wise at 10k QPS (sensitivity: model-wise needs "
            f"{'/'.join(map(str, mw10k))} replicas)", "grows with model-wise replicas (Fig. 12-13)",
            fmt(at10k, "saving"), "direction" if min(v["saving"] for v in at10k.values()) > 1 else "no",
            "not the paper's load: shows the saving once model-wise must replicate", {"at_10k_qps": at10k}),
        Row("ElasticRec: memory utility (mean over shards of table 1 vs model-wise, 100 QPS / 10k QPS)", "8.1x",
            f"{fmt(at100, 'utility_gain')}; {fmt(at10k, 'utility_gain')}",
            verdict(min(v["utility_gain"] for d in out.values() for v in d.values()) > 1.0, False),
            f"the DP splits table 1 into {'/'.join(str(v['shards_first_table']) for v in at100.values())} shards "
            "(paper: 4/3/3); a table left whole keeps model-wise utility (RM3: 32 gathers per item, so a shard's "
            "time is mostly its fixed per-call cost and splitting buys no rate)", {}),
        Row("ElasticRec: servers (deployment cost) vs model-wise (100 QPS / 10k QPS)", "1.67/1.67/2.0x (cost 1.6x)",
            f"{fmt(at100, 'server_saving')}; {fmt(at10k, 'server_saving')}",
            verdict(min(v["server_saving"] for v in at10k.values()) > 1.0, False),
            f"first-fit packing by cores (one-core rates, 0.1-core steps) and memory on the paper's nodes, "
            f"{PAPER_NODE_SOCKETS} x hera-xeon = {PAPER_NODE_SOCKETS * server.cores} cores / "
            f"{PAPER_NODE_SOCKETS * server.mem_gb:g} GB (§V-A); one node holds every replica at 100 QPS (the paper's "
            "1.67x-2.0x needs model-wise on >= 2 nodes)", {}),
        Row("ElasticRec: p95 within SLA (400 ms) for every plan above, model-wise baseline too",
            "yes (+31 ms RPC, 8% of SLA)", sla_text(out), "yes" if sla else "no",
            "replicas sized to QPSmax in the SLA budget (dense shard 65% of the SLA, as the paper's HPA target; "
            f"gathers and the paper's {PAPER_RPC_MS:g} ms RPC the rest; model-wise the whole SLA); checked by "
            "replaying a minute of Poisson "
            "queries through every replica queue (fork to all shards, join, dense), not by the sizing formula",
            {}),
    ]


# ------------------------------------------------------------------------------------------ SDM


def row_sdm() -> list[Row]:
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
    return [Row("SDM: row-cache hit rate (M1 user tables on HW-SS, 48 GB for embeddings)", ">96%",
                f"ideal fill {100 * ideal.summary['hit_rate']:.1f}%; simulated trace {100 * hit:.1f}% "
                f"(pooled cache {100 * sim.pooled_hit_rate:.1f}%)",
                verdict(hit > 0.5, hit >= 0.96 - 0.10),
                f"Zipf traces with P=0.9 (clock cache of {ideal.summary['cache_gb']:.1f} GB = "
                f"{sim.slots / sim.scale / 1e6:.0f}M slots, 121 B overhead per 51 B row); the paper's host sees "
                "production traces with user-sticky routing (Fig. 4c: higher locality); random bags never repeat, "
                "so the pooled cache (paper: ~5%) stays near 0", {"ideal": ideal.summary["hit_rate"],
                                                                  "simulated": hit, "pooled": sim.pooled_hit_rate}),
            Row("SDM Eq. 5-7: fleet power, M1 on HW-SS+SDM vs HW-L", "20% saved (M1); 5-29% overall",
                f"{100 * sim_saving:+.0f}% saved at the simulated hit rate ({out['simulated']['limit']}); "
                f"{100 * paper_saving:+.0f}% at the paper's observed 96%",
                verdict(sim_saving > 0, within(sim_saving, 0.20)),
                f"HW-L {q_l:,.0f} QPS/host and HW-SS {out['paper_hit']['qps_per_host']:,.0f} (perfmodel, "
                "compute-bound, half the cores); at the simulated hit rate the SSD's IOPS cap the host; M2/M3 "
                "(accelerator hosts) not modelled", {"fleet": out, "hw_l_qps": q_l})]


# --------------------------------------------------------------------------------------- Kairos


def row_kairos() -> list[Row]:
    from bench_planners import scenario_kairos

    from recserve.reference import reference_path

    ref = reference_path("kairos_aws_latency.json")
    if not ref.exists():
        return [Row("Kairos: pool vs homogeneous", "~2x", "reference data missing", "n/a", str(ref))]
    pools = scenario_kairos(ref)
    gains = {m: p["gain"] for m, p in pools.items()}
    txt = ", ".join(f"{m.removeprefix('kairos-')} {g:.2f}x" for m, g in gains.items())
    return [Row("Kairos: upper-bound QPS of the chosen pool vs homogeneous (same budget)", "~2x (1.3-2.6x)", txt,
                verdict(min(gains.values()) >= 1.0, float(np.median(list(gains.values()))) >= 1.3),
                "mtwnd's best pool is all-t3 (homogeneous) under the reference latencies", {"gain": gains})]


def row_kairos_predictor() -> list[Row]:
    """Why online latency learning costs Kairos throughput on mtwnd's pool: max load with the predictor learned
    from zero vs seeded with the latency tables, and where the QoS violations happen."""
    from collections import Counter

    from bench_planners import scenario_kairos

    from recserve.planners.kairos import load_kairos_reference
    from recserve.reference import reference_path
    from recserve.sim.cluster import ClusterSim
    from recserve.sim.dispatch_eval import DispatchEvaluation, config_to_pool

    ref = reference_path("kairos_aws_latency.json")
    profiles = load_kairos_reference(ref)
    model = "kairos-mtwnd"
    qos = profiles.meta["qos_p99_ms"][model]
    pool = config_to_pool(scenario_kairos(ref)[model]["config"])
    out: dict[str, dict] = {}
    for mode, seeded in (("online", False), ("seeded", True)):
        ev = DispatchEvaluation(profiles, model, qos, queries=10000, seed_predictor=seeded, log=None)
        qps, _ = ev.max_load(pool, lambda ev=ev: ev.policy("kairos", pool), 300.0)
        policy = ev.policy("kairos", pool)
        violations: Counter = Counter()
        learn = policy.on_complete

        def on_complete(now, q, inst, svc, learn=learn, violations=violations):
            if now - q.arrival > qos:
                violations[inst.type_name] += 1
            learn(now, q, inst, svc)

        policy.on_complete = on_complete
        res = ClusterSim(ev.service, pool, qos, 99.0).run(policy, ev.stream, qps=750.0, abort_on_violation=False)
        out[mode] = {"max_qps": qps, "violations_at_750_qps": dict(violations), "served": res.served_by_type}
    s = ev.service
    t3 = s.type_index("t3.xlarge") if "t3.xlarge" in s.types else None
    tail = ""
    if t3 is not None:
        b = int(np.searchsorted(s.batches, 200))
        tail = f"t3 at batch 200: mean {s.mean[t3][b]:.1f} ms, p99 {s.p99[t3][b]:.1f} ms vs QoS {qos:g} ms; "
    loss = 1 - out["online"]["max_qps"] / out["seeded"]["max_qps"]
    v_on, v_se = out["online"]["violations_at_750_qps"], out["seeded"]["violations_at_750_qps"]
    return [Row("Kairos on mtwnd's pool: online latency learning vs tables-seeded predictor",
                "online learning, no profiling (Sec. 5.1)",
                f"{out['online']['max_qps']:.0f} vs {out['seeded']['max_qps']:.0f} QPS ({100 * loss:.0f}% lost); "
                f"violations at 750 QPS online {v_on}, seeded {v_se}", "n/a",
                tail + "Kairos compares *mean* predictions with 0.98 x QoS, so the single t3 (right-skewed burstable "
                "tail) takes queries whose mean fits and whose tail does not, seeded or not; online, a t3 bucket "
                "switches to the mean of its first 3 draws (~15% noise at this spread): the under-estimated buckets "
                "near the limit admit queries that then violate, the over-estimated ones cost little, so the noise "
                "is one-sided in effect; most violations are the t3's",
                out)]


# ------------------------------------------------------------------------------------ perfmodel


def row_perfmodel() -> list[Row]:
    from bench_perfmodel import kairos_check

    k = kairos_check(Path("/nonexistent"))  # bundled constants: nothing fitted to the Kairos data
    med, rho = k["median_ape_all"], k["mean_spearman"]
    return [Row("perfmodel on the Kairos EC2 latencies (not fitted to them)", "target: median <= 35%, Spearman >= 0.9",
                f"median {med:.0f}%, mean Spearman {rho:.2f}", "yes" if med <= 35 and rho >= 0.9 else "no",
                ("ranks right (t3's sustained cpu_share 0.4); " if rho >= 0.9 else "ranks wrong; ")
                + "the artifact's stack is modelled (one Caffe2 thread, ids fed from Python lists: feed='pylist'); "
                "left: the dev-VM compute constants over-predict large GEMMs (WnD, MT-WnD ~1.6x, also on the dev VM "
                "itself) and t3 throttles less than its 0.4 baseline in the data (bench_perfmodel.py --kairos-only)",
                {"kairos": {m: {"spearman": v["spearman_rank_of_instances"], "median_ape": v["median_ape"]}
                            for m, v in k["models"].items()}}),
            row_perfmodel_unseen_host()]


def row_perfmodel_unseen_host() -> Row:
    """Issue #18's transfer bar: each recorded host judged with what ``recserve profile calibrate --micro`` gives there
    (its microbenchmarks; constants fitted on the *other* recorded hosts' model timings)."""
    from bench_transfer import judge

    from recserve.perfmodel import load_calibration
    from recserve.perfmodel.hosts import Machine, calibration_for_host, recorded_hosts
    from recserve.perfmodel.microbench import calibration_from_micro
    from recserve.specs import server_from_dict

    recorded, base = recorded_hosts(), load_calibration()
    carried, own = {}, {}
    for name, rec in recorded.items():
        host = server_from_dict("this-host", rec.meta["host"])
        moved = calibration_for_host(rec.meta["micro"], Machine.of(rec), base, recorded)
        if moved is not None:
            carried[name] = judge(moved.calibration, rec, host)["median_ape"]
        own[name] = judge(calibration_from_micro(rec.meta["micro"], base), rec, host)["median_ape"]
    txt = " / ".join(f"{n} {v:.1f}%" for n, v in carried.items())
    worst = max(carried.values(), default=float("inf"))
    return Row(f"perfmodel on a host not used for fitting ({len(carried)} recorded hosts, leave-one-host-out, "
               "`profile calibrate --micro`)", "target: median <= 20% (goal 15%)",
               txt or "fewer than two hosts recorded",
               "yes" if worst <= 20 else "no",
               "microbenchmark-only constants: " + " / ".join(f"{n} {v:.1f}%" for n, v in own.items())
               + "; left: dense-heavy models over-predicted on the Zen 1 VM (its GEMM plateau), DRAM-bound gathers "
               "under-predicted there (gather rates are not carried)", {"carried": carried, "micro_only": own})


SECTIONS: dict[str, Callable[..., list[Row]]] = {
    "hera": row_hera,
    "hercules_provision": row_hercules_provision,
    "hercules_search": row_hercules_search,
    "elasticrec": row_elasticrec,
    "sdm": row_sdm,
    "kairos": row_kairos,
    "kairos_predictor": row_kairos_predictor,
    "perfmodel": row_perfmodel,
}
NEEDS_FRESH = {"hera", "hercules_provision"}


def markdown(rows: list[Row]) -> str:
    lines = ["| claim | paper | recserve | reproduced? | reason for any gap |", "|---|---|---|---|---|"]
    lines += [f"| {r.claim} | {r.paper} | {r.recserve} | {r.reproduced} | {r.reason if r.reproduced != 'yes' else ''} |"
              for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help=f"comma-separated sections of {','.join(SECTIONS)}")
    parser.add_argument("--fresh", action="store_true", help="re-model the cached Hera/Hercules profiles")
    parser.add_argument("--out", default=str(RESULTS / "papers.json"))
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    chosen = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    rows: list[Row] = []
    timings = {}
    for name in chosen:
        start = time.perf_counter()
        print(f"[{name}] ...", file=sys.stderr, flush=True)
        fn = SECTIONS[name]
        rows += fn(args.fresh) if name in NEEDS_FRESH else fn()
        timings[name] = time.perf_counter() - start
        print(f"[{name}] {timings[name]:.1f} s", file=sys.stderr, flush=True)
    print(markdown(rows))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": [asdict(r) for r in rows], "seconds": timings}, indent=1, default=float))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
