"""The papers' headline results, regenerated from recserve's planners, perfmodel and simulator.

Every run recomputes the ``recserve`` column from the code (the perfmodel profiles of Hera and Hercules
are cached under ``results/`` because modelling them takes minutes, and remodelled when the perfmodel, zoo, catalogue
or search sources change: ``common/scenarios.profiles_key``; ``--fresh`` redoes them anyway); the only
numbers written here are the papers' own, as the reference column, and the inputs the papers print (the
"with the paper's inputs" column, labelled as such).  Every row is judged by one rule (``RULE``, printed
with the table) and the counts are printed at the end.

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_papers [--only hera,elasticrec] [--out results/papers.json]

Prints a markdown table (claim | citation | setup | paper | recserve | verdict | with the paper's inputs | reason),
the rule, the counts, and writes JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness
from recserve.profiles import ProfileSet

RESULTS = Path("results")

RULE = ("direction = the same sign as the paper's effect and at least a third of it; yes = direction and within 10 "
        "points of the paper (percentages: percentage points; a ratio r is read as the effect r - 1, so 10 points = "
        "0.1x); no = otherwise; a level with no baseline (a hit rate, an EMU range) has no "
        "direction: yes within 10 points, else no; n/a = the paper's quantity is not measurable here.  A row over "
        "several models takes its worst model's verdict.  Rows marked 'not counted' are sensitivities or project "
        "targets, not paper claims.")
VERDICTS = ("yes", "direction", "no", "n/a")


@dataclass
class Row:
    claim: str
    paper: str
    recserve: str
    reproduced: str          # the verdict: "yes" | "direction" | "no" | "n/a" (RULE); kept under its old key
    reason: str = ""
    numbers: dict = field(default_factory=dict)
    cite: str = ""           # section / figure / table of the paper
    setup: str = ""
    paper_inputs: str = ""   # the claim recomputed with the inputs the paper prints, or why there is none
    counted: bool = True     # False: a sensitivity or a project target, not one of the papers' claims


def judge(value: float | None, paper: float, level: bool = False) -> str:
    """RULE for one number.  ``value`` and ``paper`` are effects (a saving 0.26, a gain ratio - 1) or, with
    ``level``, levels (a hit rate 0.96)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if level:
        return "yes" if abs(value - paper) <= 0.10 + 1e-12 else "no"
    if not (value != 0 and np.sign(value) == np.sign(paper) and abs(value) >= abs(paper) / 3):
        return "no"
    return "yes" if abs(value - paper) <= 0.10 + 1e-12 else "direction"


def worst(*verdicts: str) -> str:
    """The worst of several verdicts (n/a only when every one is n/a)."""
    judged = [v for v in verdicts if v != "n/a"]
    return min(judged, key=("no", "direction", "yes").index) if judged else "n/a"


def counts(rows: list[Row]) -> dict[str, int]:
    c = Counter(r.reproduced for r in rows if r.counted)
    return {v: c.get(v, 0) for v in VERDICTS}


# ----------------------------------------------------------------------------------------- Hera


MEASURED_INTERFERENCE = "interference_dev_host.json"  # bundled: `recserve profile interference` on the dev host
# every bundled measurement of LLC sensitivity, by host (the label of its Hera rows)
MEASURED_LLC = {"measured LLC": MEASURED_INTERFERENCE, "measured LLC, Zen 1 VM (8 MB)": "interference_zen1_vm.json"}


HERA_LEVELS = (1, 2, 4, 8)


def _hera_outcome(profiles, server, models) -> dict:
    """Hera §VII-C (Fig. 15): every model gets the *same* target QPS (``identical_targets``: level x the median
    isolated max load), servers vs DeepRecSys averaged over the levels; Fig. 11: the EMU of the pairs Hera
    co-locates (DeepRecSys: 100%), averaged over the distinct pairs its plans choose."""
    from recserve.planners.hera import (
        affinity_matrix,
        all_curves,
        identical_targets,
        pair_allocation,
        plan_colocation,
    )

    curves = all_curves(profiles, models, server)
    aff = affinity_matrix(curves, server)["affinity"]
    pairs = aff[np.triu_indices(len(models), 1)]
    savings, vs_random, chosen, all_pair_emu = {}, {}, {}, (None, None)
    for level in HERA_LEVELS:
        plan = plan_colocation(profiles, server, identical_targets(curves, level), seeds=5)
        savings[level] = 1 - plan.summary["servers"] / plan.baselines["deeprecsys"]["servers"]
        vs_random[level] = 1 - plan.summary["servers"] / plan.baselines["random"]["servers"]
        chosen.update({"+".join(m.removeprefix("hera-") for m in sp.models): sp.emu for sp in plan.servers
                       if len(sp.placements) > 1})
        all_pair_emu = (plan.summary["random_pair_emu_min"], plan.summary["random_pair_emu_max"])
    keep_1way = {c.name: float(c.ways_ratio[1]) for c in curves}
    # Fig. 11's other two distributions: Random = every pair of the eight models; Hera(Random) = every pair but the
    # (high, high) ones (the low model first, as Alg. 2 places it); each pair under Hera's node allocation
    every = {}
    for i, a in enumerate(curves):
        for b in curves[i + 1:]:
            lo_first = (b, a) if b.high is False and a.high else (a, b)
            every[(a.name, b.name)] = (pair_allocation(*lo_first, server).emu, a.high and b.high)
    random_emu = float(np.mean([e for e, _ in every.values()]))
    hera_random_emu = float(np.mean([e for e, both_high in every.values() if not both_high]))
    return {"pairs": pairs, "matrix": aff, "savings": savings, "vs_random": vs_random, "chosen_pair_emu": chosen,
            "all_pair_emu": all_pair_emu, "keep_at_1_way": keep_1way, "random_mean_emu": random_emu,
            "hera_random_mean_emu": hera_random_emu,
            "low": sorted(c.name for c in curves if not c.high),
            "target_qps": identical_targets(curves, 1)[models[0]]}


# Inputs the Hera paper prints (read off its text; nothing here is fitted to a result):
# Fig. 7 text: "DLRM(D) is able to achieve 90% of maximum QPS despite having only a single LLC way allocated";
# "DIEN ... more than 80% of maximum QPS while only being allocated with 2 out of the 11 LLC ways (and similarly 2
# ways and 5 ways for WnD and DIN)".  §V-B: DLRM(D)'s "aggregated bandwidth usage saturates beyond 12 workers ...
# only achieving a further 4% throughput enhancements going from 12 to 16 workers"; Table II: 128 GB/s.
HERA_PAPER_LLC = {"hera-dlrm-d": (1, 0.90), "hera-dien": (2, 0.80), "hera-wnd": (2, 0.80), "hera-din": (5, 0.80)}
HERA_PAPER_DLRM_D = {"model": "hera-dlrm-d", "knee_workers": 12, "gain_past_knee": 0.04}
HERA_PAPER_INPUTS = ("the paper's printed inputs replace recserve's: LLC curves of DLRM(D), DIEN, WnD, DIN straight "
                     "through Fig. 7's points (90% at 1 way; 80% at 2, 2, 5 ways) and 100% at 11 ways, extended "
                     "linearly below the point (an assumption: the text gives one point each); DLRM(D)'s QPS +4% "
                     "from 12 to 16 workers and its bandwidth rising to Table II's 128 GB/s at 12 workers (§V-B: "
                     "saturates beyond 12); the other models' curves and every isolated max load stay recserve's")


def _paper_input_hera_profiles(profiles, server):
    """``profiles`` with the Hera inputs the paper prints (``HERA_PAPER_*``) in place of the modelled ones."""
    from recserve.profiles import ProfileTable

    out = ProfileSet(list(profiles), meta={**profiles.meta, "inputs": "Hera paper, Fig. 7 and §V-B text"})
    K = server.llc_ways
    for model, (k0, r0) in HERA_PAPER_LLC.items():
        old = next(t for t in profiles.find(model, server.name, "maxload_vs_ways") if not t.conditions)
        full = old.interp(float(K), "max_qps")
        slope = (1.0 - r0) / (K - k0)
        rows = [[float(k), full * max(0.05, r0 + slope * (k - k0)), 16.0] for k in range(1, K + 1)]
        out.add(ProfileTable(model, server.name, "maxload_vs_ways", ("ways", "max_qps", "workers"), rows,
                             source="reference"))
    d = HERA_PAPER_DLRM_D
    knee, gain = d["knee_workers"], d["gain_past_knee"]
    mw = next(t for t in profiles.find(d["model"], server.name, "maxload_vs_workers") if not t.conditions)
    at_knee = mw.interp(float(knee), "max_qps")
    qps = [[float(w), mw.interp(float(w), "max_qps") if w <= knee else at_knee * (1 + gain * (w - knee) /
                                                                                   (server.cores - knee))]
           for w in range(1, server.cores + 1)]
    out.add(ProfileTable(d["model"], server.name, "maxload_vs_workers", ("workers", "max_qps"), qps,
                         source="reference"))
    out.add(ProfileTable(d["model"], server.name, "membw_vs_workers", ("workers", "gbs"),
                         [[float(w), server.mem_bw_gbs * min(w, knee) / knee] for w in range(1, server.cores + 1)],
                         source="reference"))
    return out


def _emu_vs_others(o: dict) -> tuple[str, str]:
    """Hera's mean chosen-pair EMU over Random's and Hera(Random)'s mean pair EMU (Fig. 11): text and verdict."""
    hera = float(np.mean(list(o["chosen_pair_emu"].values()))) if o["chosen_pair_emu"] else math.nan
    vs_r, vs_hr = hera / o["random_mean_emu"] - 1, hera / o["hera_random_mean_emu"] - 1
    text = (f"{100 * vs_r:+.1f}% / {100 * vs_hr:+.1f}% (Hera {100 * hera:.0f}%, Random "
            f"{100 * o['random_mean_emu']:.0f}%, Hera(Random) {100 * o['hera_random_mean_emu']:.0f}%)")
    return text, worst(judge(vs_r, 0.347), judge(vs_hr, 0.054))


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
                "the paper prints no per-pair number to compare; two single-worker models on two cores of a shared "
                "host; no LLC partitioning; noise of a few % (see the load average in the data file)",
                {"kept": {f"{a}+{b}": v for (a, b), v in kept.items()}}, cite="§VI-B, Fig. 10b",
                setup="measured on the dev host (`recserve profile interference`), one worker per model",
                paper_inputs="n/a: a measurement, no input to substitute")]


def row_hera(fresh: bool) -> list[Row]:
    from benchmarks.common.scenarios import HERA_MODELS, HERA_PROFILES, hera_profiles
    from recserve.specs import get_server

    server = get_server("hera-xeon")
    if fresh:
        (RESULTS / HERA_PROFILES).unlink(missing_ok=True)
    profiles = hera_profiles(RESULTS)
    variants = {"perfmodel LLC": _hera_outcome(profiles, server, HERA_MODELS)}
    for label, name in MEASURED_LLC.items():
        measured = _measured_hera_profiles(profiles, server, HERA_MODELS, name)
        if measured is not None:
            variants[label] = _hera_outcome(measured, server, HERA_MODELS)
    paper_o = _hera_outcome(_paper_input_hera_profiles(profiles, server), server, HERA_MODELS)
    p_saving = float(np.mean(list(paper_o["savings"].values())))
    p_random = float(np.mean(list(paper_o["vs_random"].values())))
    p_emu = float(np.mean(list(paper_o["chosen_pair_emu"].values()))) - 1 if paper_o["chosen_pair_emu"] else math.nan
    p_lo, p_hi = paper_o["all_pair_emu"]
    p_low = ", ".join(m.removeprefix("hera-") for m in paper_o["low"])
    paper_cols = {
        "drs": f"{-100 * p_saving:+.1f}% ({judge(p_saving, 0.26)}; low-scalability: {p_low})",
        "random": f"{-100 * p_random:+.1f}% ({judge(p_random, 0.11)})",
        "emu": f"{100 * p_emu:+.1f}% over {len(paper_o['chosen_pair_emu'])} pairs ({judge(p_emu, 0.373)}: "
               + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(paper_o["chosen_pair_emu"].items())) + ")",
        "emu_others": _emu_vs_others(paper_o)[0] + f" ({_emu_vs_others(paper_o)[1]})",
        "range": f"{100 * p_lo:.0f}% to {100 * p_hi:.0f}% "
                 f"({worst(judge(p_lo, 0.82, level=True), judge(p_hi, 1.47, level=True))})",
    }
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
        pairs, savings, chosen = o["pairs"], o["savings"], o["chosen_pair_emu"]
        mean_saving = float(np.mean(list(savings.values())))
        emu_gain = float(np.mean(list(chosen.values()))) - 1 if chosen else float("nan")
        lo, hi = o["all_pair_emu"]
        servers_txt = " / ".join(f"{-100 * v:+.1f}%" for v in savings.values())
        keep = ", ".join(f"{m.removeprefix('hera-')} {v:.2f}" for m, v in o["keep_at_1_way"].items())
        why = (f"{label}: QPS kept at 1 of 11 ways: {keep}; low-scalability {o['low']} (paper: DLRM(B) and "
               "DLRM(D); DLRM(D) stays high here because the per-core DRAM rate, fitted on the dev host, keeps 16 "
               "workers under hera-xeon's bandwidth, so every pair's CoAff_DRAM is 1); "
               + ("flat LLC curves leave Alg. 1 little to rank" if label == "perfmodel LLC" else
                  f"slowdowns measured ({MEASURED_LLC[label]}) on a shared 2-core host with scaled tables "
                  "(<= 128 MB), mapped to hera-xeon by share of the LLC per worker: 16 copied workers already "
                  "hold under 1.4 MB each with all 11 ways, past where the measured curve flattens, so fewer "
                  "ways cost little"))
        setup = (f"hera-xeon (16 cores, 11 ways), the eight Table I models, perfmodel profiles ({label}); every model "
                 f"the same target QPS = level x the median isolated max load ({o['target_qps']:.0f} QPS at level "
                 f"1), levels {'/'.join(map(str, HERA_LEVELS))}; random baselines: mean of 5 seeds")

        def inputs(key: str, label: str = label) -> str:
            if label != "perfmodel LLC":
                return "as the perfmodel LLC row: the paper's inputs replace the same curves"
            return f"{paper_cols[key]}; {HERA_PAPER_INPUTS}"

        rows += [
            Row(f"Hera ({label}): servers vs DeepRecSys, identical target QPS per model", "-26% (average)",
                f"{-100 * mean_saving:+.1f}% (mean; levels: {servers_txt})", judge(mean_saving, 0.26),
                why + "; DeepRecSys gives each model whole servers, so DLRM(B) (the low-scalability model, "
                "isolated max load far under the common target) takes most of them and Hera pairs it",
                {"server_saving": savings, "low_scalability": o["low"], "keep_at_1_way": o["keep_at_1_way"]},
                cite="§VII-C, Fig. 15", setup=setup, paper_inputs=inputs("drs")),
            Row(f"Hera ({label}): servers vs Random, identical target QPS per model", "-11% (average)",
                f"{-100 * float(np.mean(list(o['vs_random'].values()))):+.1f}% (mean; levels: "
                + " / ".join(f"{-100 * v:+.1f}%" for v in o["vs_random"].values()) + ")",
                judge(float(np.mean(list(o["vs_random"].values()))), 0.11), why, {"vs_random": o["vs_random"]},
                cite="§VII-C, Fig. 15", setup=setup, paper_inputs=inputs("random")),
            Row(f"Hera ({label}): EMU of the co-located pairs vs DeepRecSys (100%)", "+37.3% (average)",
                f"{100 * emu_gain:+.1f}% (mean of {len(chosen)} chosen pairs: "
                + ", ".join(f"{k} {100 * v:.0f}%" for k, v in sorted(chosen.items())) + ")",
                judge(emu_gain, 0.373), why, {"chosen_pair_emu": chosen},
                cite="§VII-A, Fig. 11", setup=setup + "; the pairs Hera's plans co-locate, each counted once",
                paper_inputs=inputs("emu")),
            Row(f"Hera ({label}): EMU of Hera's pairs vs Random / Hera(Random) (mean over their pairs)",
                "+34.7% / +5.4% (average)", _emu_vs_others(o)[0], _emu_vs_others(o)[1],
                why + "; Random's pairs: all 28; Hera(Random)'s: every pair but (high, high); each pair's EMU under "
                "Hera's node allocation, as the paper runs all four selection policies with its resource manager"
                + ("; with one low-scalability model Hera(Random)'s pairs are that model's, the set Hera chooses "
                   "from, so Hera can gain little over it" if len(o["low"]) == 1 else ""),
                {"random_mean_emu": o["random_mean_emu"], "hera_random_mean_emu": o["hera_random_mean_emu"]},
                cite="§VII-A, Fig. 11", setup=setup, paper_inputs=inputs("emu_others")),
            Row(f"Hera ({label}): EMU range over all 28 pairs (Random's pairs)", "82% to 147%",
                f"{100 * lo:.0f}% to {100 * hi:.0f}% (Alg. 1 affinity: min {pairs.min():.3f}, median "
                f"{np.median(pairs):.3f}, max {pairs.max():.3f})",
                worst(judge(lo, 0.82, level=True), judge(hi, 1.47, level=True)),
                why + "; the EMU of a pair under Hera's node allocation, every pair of the eight models",
                {"all_pair_emu": [lo, hi], "affinity_pairs": pairs.tolist()},
                cite="§VII-A, Fig. 11", setup=setup, paper_inputs=inputs("range")),
        ]
    return rows


# ------------------------------------------------------------------------------------- Hercules

def row_hercules_provision(fresh: bool) -> list[Row]:
    from benchmarks.papers.hercules import row_hercules_provision as rows

    return rows(fresh)


def row_hercules_search() -> list[Row]:
    from benchmarks.papers.hercules import row_hercules_search as rows

    return rows()


# ----------------------------------------------------------------------------------- ElasticRec


OWN_RPC_MS = 2.0  # recserve's hop: plan_shards' default (docs/elasticrec.md: ~1.5 ms per gRPC round trip measured on
#                   the dev host); the paper's 31 ms (PAPER_RPC_MS) is its stack's (Kubernetes, Linkerd, C++ gRPC)


ER_BATCH = 32       # ElasticRec §V-C: a query is a batch of 32 items
ER_LOCALITY = 0.9   # Table II: locality P = 0.9 (the hottest 10% of rows take 90% of the gathers)


def elasticrec_plan(server: Any, name: str, qps: float, rpc_ms: float) -> tuple[Any, Any, Any]:
    """(spec, cost, plan) of a Table II model on ``server`` at ``qps``, as every ElasticRec row plans it: perfmodel
    rates, the measured per-replica memory, Zipf locality, the paper's DP rule."""
    from recserve.planners.elasticrec import MEASURED_REPLICA_BYTES, cost_model_from_perfmodel, plan_shards
    from recserve.specs import get_model

    spec = get_model(name)
    cost = cost_model_from_perfmodel(spec, server, ER_BATCH, min_mem_bytes=MEASURED_REPLICA_BYTES)
    plan = plan_shards(spec, qps, cost, batch=ER_BATCH, locality=ER_LOCALITY, locality_model="zipf",
                       paper_dp_rule=True, rpc_ms=rpc_ms)
    return spec, cost, plan


def row_elasticrec() -> list[Row]:
    from recserve.planners.elasticrec import (
        PAPER_NODE_SOCKETS,
        PAPER_RPC_MS,
        evaluate_plan,
        modelwise_qps_max,
        modelwise_replicas_implied,
    )
    from recserve.sim.shards import simulate_plan_latency
    from recserve.specs import get_server

    # ElasticRec §V-A: Xeon Gold 6242 nodes (= hera-xeon's socket), two sockets per node; §V-C: a query is a batch
    # of 32 items, SLA 400 ms p95 (the catalogue's); §VI-B: ElasticRec's communication adds 31 ms on average.
    server = get_server("hera-xeon")
    paper = {"elasticrec-rm1": 2.2, "elasticrec-rm2": 2.6, "elasticrec-rm3": 8.1}
    out: dict[float, dict[str, dict]] = {}
    for qps in (100.0, 10_000.0):
        out[qps] = {}
        for name in paper:
            spec, cost, plan = elasticrec_plan(server, name, qps, PAPER_RPC_MS)
            ev = evaluate_plan(plan, spec, cost, server, locality=ER_LOCALITY, locality_model="zipf",
                               rpc_ms=PAPER_RPC_MS, sockets=PAPER_NODE_SOCKETS)
            sim = simulate_plan_latency(plan, spec, cost, rpc_ms=PAPER_RPC_MS)  # a minute of load
            own = simulate_plan_latency(plan, spec, cost, rpc_ms=OWN_RPC_MS)
            out[qps][name] = {"saving": plan.saving, "modelwise_replicas": plan.modelwise_replicas,
                              "modelwise_replicas_paper_at_least": modelwise_replicas_implied(paper[name], spec, cost),
                              "modelwise_replica_qps_max": modelwise_qps_max(spec, cost, ER_BATCH),
                              "shards_first_table": plan.tables[0].num_shards,
                              "replicas_first_table": plan.tables[0].replicas, **ev.to_dict(),
                              "p95_ms_simulated": sim.sharded_ms, "p95_ms_modelwise_simulated": sim.modelwise_ms,
                              "sla_ok_simulated": sim.within(spec.sla.target_ms),
                              "added_mean_ms": own.added_mean_ms, "added_mean_ms_paper_rpc": sim.added_mean_ms,
                              "sla_ms": spec.sla.target_ms}
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
    sla = all(v["sla_ok"] and v["sla_ok_simulated"] for d in out.values() for v in d.values())
    worst_p95 = max((v for d in out.values() for v in d.values()), key=lambda v: v["p95_ms_simulated"])
    servers_paper = {"elasticrec-rm1": 1.67, "elasticrec-rm2": 1.67, "elasticrec-rm3": 2.0}
    utility = float(np.mean([v["utility_gain"] for v in at100.values()]))
    added = {m: v["added_mean_ms"] / v["sla_ms"] for m, v in at100.items()}
    added_paper_rpc = {m: v["added_mean_ms_paper_rpc"] / v["sla_ms"] for m, v in at100.items()}
    no_input = ("not recomputed: the paper prints no per-replica QPS or container CPU (Fig. 5/9 only), the inputs "
                "that set the model-wise replica count")
    cite = "§VI-B"
    return [
        Row("ElasticRec: memory vs model-wise (RM1/2/3, 100 QPS)", "2.2x / 2.6x / 8.1x", fmt(at100, "saving"),
            worst(*(judge(at100[m]["saving"] - 1, p - 1) for m, p in paper.items())),
            gap, {"at_100_qps": at100}, cite=f"{cite}, Fig. 13", setup=setup, paper_inputs=no_input),
        Row("ElasticRec: memory vs model-wise at 10k QPS (sensitivity, not counted: model-wise needs "
            f"{'/'.join(map(str, mw10k))} replicas)", "grows with model-wise replicas (Fig. 12-13)",
            fmt(at10k, "saving"), "n/a",
            "not a claim of the paper (its load is 100 QPS): shows the saving once model-wise must replicate",
            {"at_10k_qps": at10k}, cite=f"{cite}, Fig. 13 (trend)", setup=setup.replace("100 QPS", "10k QPS"),
            paper_inputs="-", counted=False),
        Row("ElasticRec: memory utility (mean over shards of table 1 vs model-wise, mean of RM1/2/3, 100 QPS)",
            "8.1x (average)", f"{utility:.2f}x (RM1/2/3 {fmt(at100, 'utility_gain')}; at 10k QPS "
            f"{fmt(at10k, 'utility_gain')})", judge(utility - 1, 8.1 - 1),
            f"the DP splits table 1 into {'/'.join(str(v['shards_first_table']) for v in at100.values())} shards "
            "(paper: 4/3/3); a table left whole keeps model-wise utility (RM3: 32 gathers per item, so a shard's "
            "time is mostly its fixed per-call cost and splitting buys no rate)", {}, cite=f"{cite}, Fig. 14",
            setup=setup, paper_inputs=no_input),
        Row("ElasticRec: servers (deployment cost) vs model-wise (RM1/2/3, 100 QPS)", "1.67 / 1.67 / 2.0x",
            f"{fmt(at100, 'server_saving')} (at 10k QPS {fmt(at10k, 'server_saving')})",
            worst(*(judge(at100[m]["server_saving"] - 1, p - 1) for m, p in servers_paper.items())),
            f"first-fit packing by cores (one-core rates, 0.1-core steps) and memory on the paper's nodes, "
            f"{PAPER_NODE_SOCKETS} x hera-xeon = {PAPER_NODE_SOCKETS * server.cores} cores / "
            f"{PAPER_NODE_SOCKETS * server.mem_gb:g} GB (§V-A); one node holds every replica at 100 QPS (the paper's "
            "1.67x-2.0x needs model-wise on >= 2 nodes)", {}, cite=f"{cite}, Fig. 15", setup=setup,
            paper_inputs=no_input),
        Row("ElasticRec: mean latency the sharded path adds over model-wise (RM1/2/3, 100 QPS), share of the SLA",
            "+31 ms (8% of the 400 ms SLA)",
            " / ".join(f"{v['added_mean_ms']:+.1f} ms" for v in at100.values()) + " ("
            + " / ".join(f"{100 * f:+.1f}%" for f in added.values()) + ")",
            worst(*(judge(f, 31.0 / 400.0) for f in added.values())),
            f"simulated fork-join over every shard replica, a {OWN_RPC_MS:g} ms hop (recserve's; the paper's stack "
            "adds Kubernetes and Linkerd), the dense replica, vs the model-wise replica, a minute of Poisson load; "
            "the gap is the hop: recserve's sharded path adds little beyond it (a plan whose model-wise replica is "
            "busier than its shards can even be faster on average; the live sharded path is measured by "
            "bench_elasticrec_live.py); every plan "
            f"meets the SLA ({'yes' if sla else 'no'}: worst simulated p95 {worst_p95['p95_ms_simulated']:.0f} ms, "
            "with the paper's 31 ms)",
            {"added_share_of_sla": added, "added_share_of_sla_paper_rpc": added_paper_rpc, "sla_ok": sla},
            cite=f"{cite}, Fig. 15 text", setup=setup.replace(f"{PAPER_RPC_MS:g} ms RPC (§VI-B)",
                                                              f"{OWN_RPC_MS:g} ms RPC (recserve)"),
            paper_inputs="with the paper's 31 ms hop as an input: "
            + " / ".join(f"{v['added_mean_ms_paper_rpc']:+.1f} ms" for v in at100.values())
            + " (the hop itself is the paper's measurement, so this is by construction)"),
    ]


def row_elasticrec_gpu() -> list[Row]:
    from benchmarks.papers.elasticrec_gpu import rows
    return rows()


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
    q_ss = out["paper_hit"]["qps_per_host"]
    setup = ("M1 (Table 6) on HW-SS (Table 7), 48 of 64 GB for embeddings, user tables on the SSD behind the row "
             "cache, 50 items per query, 120 QPS; index traces Zipf with locality P = 0.9 (ElasticRec's definition: "
             "the hottest 10% of rows take 90%), recserve's RowCache (CLOCK, 121 B per slot beside a 51 B row)")
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


# --------------------------------------------------------------------------------------- Kairos


def row_kairos() -> list[Row]:
    from benchmarks.papers.kairos import row_kairos as rows

    return rows()


def row_kairos_ribbon() -> list[Row]:
    from benchmarks.papers.kairos import row_kairos_ribbon as rows

    return rows()


def row_kairos_predictor() -> list[Row]:
    from benchmarks.papers.kairos import row_kairos_predictor as rows

    return rows()


# ------------------------------------------------------------------------------------ perfmodel


def row_perfmodel() -> list[Row]:
    from benchmarks.common.perfmodel_checks import kairos_check

    k = kairos_check(Path("/nonexistent"))  # bundled constants: nothing fitted to the Kairos data
    med, rho = k["median_ape_all"], k["mean_spearman"]
    return [Row("perfmodel on the Kairos EC2 latencies (not fitted to them)", "target: median <= 35%, Spearman >= 0.9",
                f"median {med:.0f}%, mean Spearman {rho:.2f}", "yes" if med <= 35 and rho >= 0.9 else "no",
                ("ranks right (t3's sustained cpu_share 0.4); " if rho >= 0.9 else "ranks wrong; ")
                + "the artifact's stack is modelled (one Caffe2 thread, ids fed from Python lists: feed='pylist'); "
                "left: the dev-VM compute constants over-predict large GEMMs (WnD, MT-WnD ~1.6x, also on the dev VM "
                "itself) and t3 throttles less than its 0.4 baseline in the data (bench_perfmodel.py --kairos-only)",
                {"kairos": {m: {"spearman": v["spearman_rank_of_instances"], "median_ape": v["median_ape"]}
                            for m, v in k["models"].items()}}, cite="project target (issue #18), Kairos' EC2 data",
                setup="bundled calibration, every Kairos model and instance type", paper_inputs="-", counted=False),
            row_perfmodel_unseen_host()]


def row_perfmodel_unseen_host() -> Row:
    """Issue #18's transfer bar: each recorded host judged with what ``recserve profile calibrate --micro`` gives there
    (its microbenchmarks; constants fitted on the *other* recorded hosts' model timings)."""
    from benchmarks.common.perfmodel_checks import judge
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
               "under-predicted there (gather rates are not carried)", {"carried": carried, "micro_only": own},
               cite="project target (issue #18)", setup="leave-one-host-out over data/hosts/", paper_inputs="-",
               counted=False)


def row_hera_parties() -> list[Row]:
    from benchmarks.papers.parties import rows

    return rows()


SECTIONS: dict[str, Callable[..., list[Row]]] = {
    "hera": row_hera,
    "hera_parties": row_hera_parties,
    "hercules_provision": row_hercules_provision,
    "hercules_search": row_hercules_search,
    "elasticrec": row_elasticrec,
    "elasticrec_gpu": row_elasticrec_gpu,
    "sdm": row_sdm,
    "kairos": row_kairos,
    "kairos_ribbon": row_kairos_ribbon,
    "kairos_predictor": row_kairos_predictor,
    "perfmodel": row_perfmodel,
}
NEEDS_FRESH = {"hera", "hercules_provision"}


def _cell(text: str) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def markdown(rows: list[Row]) -> str:
    lines = ["| claim | citation | setup | paper | recserve | verdict | with the paper's inputs | reason |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {_cell(r.claim)} | {_cell(r.cite)} | {_cell(r.setup)} | {_cell(r.paper)} | {_cell(r.recserve)} | "
              f"{r.reproduced if r.counted else r.reproduced + ' (not counted)'} | {_cell(r.paper_inputs)} | "
              f"{_cell(r.reason)} |" for r in rows]
    return "\n".join(lines)


def summary_lines(rows: list[Row]) -> list[str]:
    c = counts(rows)
    targets = [r for r in rows if not r.counted and r.cite.startswith("project target")]
    met = sum(r.reproduced == "yes" for r in targets)
    return [f"Rule: {RULE}",
            f"Papers' claims ({sum(c.values())} rows): {c['yes']} yes / {c['direction']} direction / {c['no']} no / "
            f"{c['n/a']} n/a",
            f"Not counted: {sum(not r.counted for r in rows)} rows (project targets met: {met} of {len(targets)})"]


def headline(rows: list[Row]) -> list[dict]:
    """The papers' claims by verdict, and the project targets met."""
    c = counts(rows)
    targets = [r for r in rows if not r.counted and r.cite.startswith("project target")]
    return [*(harness.row(f"papers' claims judged {v}", c[v], "claims") for v in VERDICTS),
            harness.row("project targets met", sum(r.reproduced == "yes" for r in targets), "targets", len(targets))]


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
    print()
    print("\n".join(summary_lines(rows)))
    out = harness.write_result(args.out, args, headline(rows), {"rows": [asdict(r) for r in rows], "rule": RULE,
                                                               "counts": counts(rows), "seconds": timings})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
