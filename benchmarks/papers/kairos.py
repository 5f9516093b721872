"""Claims-table rows of Kairos (Li et al.): the chosen pool vs the best homogeneous one (§8.1), Kairos+'s share of
the space and the Oracle gap (§8.3-8.4), Ribbon (§8.2) and online latency learning (§5.1), on the authors' EC2
latency tables, each with the paper's latency spread (§5.1) as the inputs column."""

from __future__ import annotations

import numpy as np

from benchmarks.bench_papers import Row, judge, worst
from recserve.profiles import ProfileSet

# Kairos §5.1 (Remarks): "the end-to-end latency has a very low variance (< 0.5% of mean)": the paper's own input
# for service-time spread, read as a coefficient of variation; the means stay the artifact's.
PAPER_LATENCY_CV = 0.005
KAIROS_SPREADS = {"artifact": None, "paper": PAPER_LATENCY_CV}
KAIROS_ARTIFACT_NOTE = ("the latency means are the authors' own artifact data in both columns; this column replaces "
                        "the artifact's measured spread by the paper's premise (SD 0.5% of the mean, §5.1 Remarks)")


def _kairos_homogeneous(profiles: ProfileSet, pools: dict, latency_cv: float | None) -> dict[str, dict]:
    """Per model: Kairos' simulated allowable QPS on its one-shot pool and the best homogeneous pool's (scaled to
    the whole budget), plus the homogeneous pool's Oracle (§7) rate: the queueing cost where dispatch has no choice."""
    from recserve.sim.dispatch_eval import DispatchEvaluation, config_to_pool, homogeneous_pool

    meta = profiles.meta
    out = {}
    for model, p in pools.items():
        qos = meta["qos_p99_ms"][model]
        ev = DispatchEvaluation(profiles, model, qos, queries=10000, log=None, latency_cv=latency_cv)
        pool = config_to_pool(p["config"])
        homo, scale = homogeneous_pool(profiles, model, meta["prices_usd_per_hr"], meta["budget_usd_per_hr"], qos,
                                       meta["max_instances"])
        k = ev.evaluate(pool, ["kairos"])["kairos"].max_qps
        h = ev.evaluate(homo, ["kairos"])["kairos"].max_qps
        out[model.removeprefix("kairos-")] = {
            "pool": p["config"], "kairos_qps": k, "homogeneous_pool": f"{homo[0]} x {len(homo)}",
            "homogeneous_qps_scaled": h * scale, "gain": k / (h * scale) if h > 0 else float("nan"),
            "homogeneous_vs_its_oracle": h / ev.oracle(homo), "upper_bound_gain": p["gain"]}
    return out


def _gain_verdict(d: dict[str, dict]) -> str:
    gains = [v["gain"] for v in d.values()]
    return worst(judge(min(gains) - 1, 0.25), judge(max(gains) - 1, 1.0))


def _gains_text(d: dict[str, dict]) -> str:
    """The gains, and which end of the claim (floor 1.25x, top 2x) RULE does not call yes."""
    lo, hi = min(d, key=lambda m: d[m]["gain"]), max(d, key=lambda m: d[m]["gain"])
    misses = [f"{m} {d[m]['gain']:.2f}x vs {claim}" for m, effect, claim in ((lo, 0.25, "> 1.25x"), (hi, 1.0, "2x"))
              if judge(d[m]["gain"] - 1, effect) != "yes"]
    return ", ".join(f"{m} {v['gain']:.2f}x" for m, v in d.items()) + (f" (off: {'; '.join(misses)})" if misses else "")


def row_kairos() -> list[Row]:
    """Kairos §8.1 / Fig. 7: *allowable throughput* (the max Poisson load at which the p99 meets QoS, simulated)
    of Kairos on its one-shot pool vs the best homogeneous pool (the base type, as many as the budget buys, QPS
    scaled up to the whole budget; Kairos' own slack wasted), with the artifact's latency spread and the paper's."""
    from benchmarks.common.scenarios import scenario_kairos
    from recserve.planners.kairos import load_kairos_reference
    from recserve.reference import reference_path
    from recserve.sim.latency import ServiceModel

    ref = reference_path("kairos_aws_latency.json")
    if not ref.exists():
        return [Row("Kairos: pool vs homogeneous", "~2x", "reference data missing", "n/a", str(ref),
                    cite="§8.1, Fig. 7")]
    profiles = load_kairos_reference(ref)
    pools = scenario_kairos(ref)
    res = {label: _kairos_homogeneous(profiles, pools, cv) for label, cv in KAIROS_SPREADS.items()}
    art, pap = res["artifact"], res["paper"]
    below = [m for m, v in art.items() if v["gain"] <= 1.25]
    pool_txt = "; ".join(f"{m}: " + "+".join(f"{t.split('.')[0]}x{n}" for t, n in d["pool"].items() if n)
                         + f" {d['kairos_qps']:.0f} vs {d['homogeneous_pool']} {d['homogeneous_qps_scaled']:.0f} QPS"
                         for m, d in art.items())
    mt = ServiceModel.from_profiles(profiles, "kairos-mtwnd")
    cv = np.sqrt(np.expm1(mt.sigma ** 2))  # SD / mean of the simulated service times (lognormal)
    spread = {t: {"p99_over_mean": float(np.median(mt.p99[i] / mt.mean[i])), "sd_over_mean": float(np.median(cv[i]))}
              for i, t in enumerate(mt.types)}
    widest = max(v["sd_over_mean"] for v in spread.values())
    tail = ", ".join(f"{t.split('.')[0]} {v['sd_over_mean']:.3f} ({v['p99_over_mean']:.2f})"
                     for t, v in spread.items())
    return [Row("Kairos: allowable QPS of the chosen pool vs the best homogeneous pool (same budget, same QoS)",
                "more than 1.25x in all cases, up to 2x (RM2)", _gains_text(art), _gain_verdict(art),
                (f"{', '.join(below)} at or under the paper's 1.25x floor: its one-shot pool holds a t3.xlarge, whose "
                 f"latency spread in the authors' artifact data (SD / mean and in brackets p99 / mean, median over "
                 f"batches, mtwnd: {tail}) reaches {widest / PAPER_LATENCY_CV:.0f}x the paper's premise of a variance "
                 "under 0.5% of the mean (§5.1 Remarks); with that premise "
                 f"(paper column) mtwnd reaches {pap['mtwnd']['gain']:.2f}x; " if below else "")
                + "the setup is the paper's (§7-8.1): base type g4dn.xlarge (the only type meeting QoS for every "
                "size), as many as $2.5/hr buys (4), QPS scaled to the whole budget, Kairos' slack wasted; Kairos' "
                "pool from Eq. 9-15 and the §5.2 similarity rule (aux QoS limits on mean latency, as the artifact's "
                f"allocator_profile.json); simulated Kairos dispatch (online predictor) on each pool: {pool_txt}; "
                "the Eq. 9-15 upper bounds gave " + ", ".join(f"{m} {d['upper_bound_gain']:.2f}x"
                                                              for m, d in art.items()),
                {"gain": {m: v["gain"] for m, v in art.items()}, "detail": art, "paper_spread": pap,
                 "spread_mtwnd": spread},
                cite="§8.1, Fig. 7",
                setup="the bundled EC2 latency tables (kairos_aws_latency.json), $2.5/hr, each model's QoS p99, "
                      "10,000 production-mix queries, Poisson arrivals, max load by bisection (p99 <= QoS)",
                paper_inputs=f"{_gains_text(pap)}: {_gain_verdict(pap)} by RULE; " + KAIROS_ARTIFACT_NOTE)
            ] + _kairos_plus_rows(profiles, res)


def bound_verdict(value: float, bound: float) -> str:
    """A claim stated as a bound ("less than 1%", "within 15%"): yes when ``value`` meets it, else RULE's level
    reading (yes within 10 points, else no)."""
    return "yes" if value <= bound else judge(value, bound, level=True)


def _kairos_plus(profiles: ProfileSet, latency_cv: float | None) -> dict[str, dict]:
    """Per model: Kairos' one-shot pool and Kairos+'s (Alg. 1) with their simulated allowable QPS, Kairos+'s number of
    evaluations, and the paper's Oracle (§7): the sorted-sequence rate of the best pool under the budget."""
    from recserve.planners.kairos import plan_pool
    from recserve.sim.cluster import pool_text
    from recserve.sim.dispatch_eval import DispatchEvaluation, config_to_pool, oracle_best_pool

    meta = profiles.meta
    evs: dict[str, DispatchEvaluation] = {}

    def evaluate(model: str, config: dict[str, int]) -> float:
        if model not in evs:
            evs[model] = DispatchEvaluation(profiles, model, meta["qos_p99_ms"][model], queries=10000, log=None,
                                            latency_cv=latency_cv)
        pool = config_to_pool(config)
        return evs[model].evaluate(pool, ["kairos"])["kairos"].max_qps if pool else 0.0

    plan = plan_pool(profiles, sorted(meta["qos_p99_ms"]), meta["budget_usd_per_hr"], meta["prices_usd_per_hr"],
                     meta["qos_p99_ms"], meta["max_instances"], evaluate=evaluate)
    out = {}
    for p in plan.pools:
        ev, kp = evs[p.model], p.details["kairos_plus"]
        best_pool, oracle = oracle_best_pool(ev, meta["prices_usd_per_hr"], meta["max_instances"],
                                             meta["budget_usd_per_hr"])
        out[p.model.removeprefix("kairos-")] = {
            "evaluations": kp["evaluations"], "configurations": p.details["configurations"],
            "kairos_qps": p.evaluated_qps, "kairos_plus_qps": kp["qps"], "kairos_config": p.config,
            "kairos_plus_config": kp["config"], "oracle_qps": oracle, "oracle_pool": pool_text(best_pool),
            "oracle_on_own_pool": {"kairos": ev.oracle(config_to_pool(p.config)),
                                   "kairos+": ev.oracle(config_to_pool(kp["config"]))},
            "gap": {"kairos": 1 - p.evaluated_qps / oracle, "kairos+": 1 - kp["qps"] / oracle}}
    return out


def _gap_text(d: dict[str, dict]) -> str:
    over = [m for m, v in d.items() if max(v["gap"].values()) > 0.15]
    return (", ".join(f"{m} {100 * v['gap']['kairos']:.1f}% / {100 * v['gap']['kairos+']:.1f}%" for m, v in d.items())
            + " below the Oracle" + (f" (over 15%: {', '.join(over)})" if over else ""))


T3_LOSS = (": the loss is the t3's tail, against the paper's premise of a latency variance under 0.5% of the mean "
           "(§5.1 Remarks).  The cost is mostly the heterogeneity coefficient C_j (Def. 1, at the largest query): the "
           "t3 never serves it, so online its latency is the line extrapolated from small batches through the t3's "
           "noisy samples (C_t3 0.13-0.24 vs 0.17 from the tables); with table C_j the loss falls to ~5%, and with "
           "the paper's variance it vanishes (docs/decisions/2026-11-28-kairos-online-learning.md); most violations "
           "are the t3's")


def _t3_note(art: dict[str, dict]) -> str:
    """Which models' Kairos pools hold a t3.xlarge, whose latency tail costs online dispatch (the predictor row)."""
    with_t3 = [m for m, v in art.items() if v["kairos_config"].get("t3.xlarge")]
    return (f"{', '.join(with_t3)}'s Kairos pool holds the t3 whose tail costs online dispatch (see the predictor "
            "row); " if with_t3 else "")


def _kairos_plus_rows(profiles: ProfileSet, homogeneous: dict[str, dict[str, dict]]) -> list[Row]:
    """Kairos §8.3 (Fig. 9): Kairos+ evaluates under 1% of the configuration space online; §8.4: Kairos and Kairos+
    are within 15% of the Oracle.  Each evaluation is the simulated allowable QPS of Kairos' dispatch on that pool;
    the Oracle is the paper's (§7): all queries known and sorted, no waiting, the best pool under the budget."""
    res = {label: _kairos_plus(profiles, cv) for label, cv in KAIROS_SPREADS.items()}
    art, pap = res["artifact"], res["paper"]
    frac = {m: v["evaluations"] / v["configurations"] for m, v in art.items()}
    frac_pap = {m: v["evaluations"] / v["configurations"] for m, v in pap.items()}
    worst_gap = {label: max(max(v["gap"].values()) for v in d.values()) for label, d in res.items()}
    queueing = {label: {m: 1 - v["homogeneous_vs_its_oracle"] for m, v in d.items()}
                for label, d in homogeneous.items()}
    setup = ("the bundled EC2 latency tables, $2.5/hr, each model's QoS p99; the configuration space is every pool "
             "under the budget (instance caps as the reference); an evaluation = simulated allowable QPS of Kairos' "
             "dispatch on the pool (10,000 production-mix queries, Poisson, bisection)")

    def evals_text(d: dict[str, dict]) -> str:
        return ", ".join(f"{m} {v['evaluations']}/{v['configurations']} "
                         f"({100 * v['evaluations'] / v['configurations']:.2f}%)" for m, v in d.items())

    return [Row("Kairos+: share of the configuration space evaluated online to reach its best pool",
                "< 1% (all models)", evals_text(art), bound_verdict(max(frac.values()), 0.01),
                "Alg. 1: configurations in upper-bound order, each evaluated pool prunes those whose Eq. 9-15 bound "
                "is below the best QPS so far and its own sub-configurations; a bound: yes when met, else RULE's "
                "level reading" + (f" (over it: {', '.join(m for m, f in frac.items() if f >= 0.01)})"
                                   if max(frac.values()) >= 0.01 else ""),
                {"fraction": frac, "detail": art, "paper_spread": pap}, cite="§8.3, Fig. 9", setup=setup,
                paper_inputs=f"{evals_text(pap)}: {bound_verdict(max(frac_pap.values()), 0.01)} by RULE; "
                + KAIROS_ARTIFACT_NOTE),
            Row("Kairos / Kairos+ allowable QPS vs the Oracle (§7: all queries known in advance, best pool)",
                "within 15%", _gap_text(art), bound_verdict(worst_gap["artifact"], 0.15),
                "the paper's Oracle (§7 ORCL): the query sequence sorted by size, a base instance always takes the "
                "next largest query, an auxiliary one the next smallest it serves within QoS, no waiting, "
                "throughput = queries / makespan, the largest over every pool under the budget ("
                + ", ".join(f"{m} {v['oracle_pool']} {v['oracle_qps']:.0f} QPS" for m, v in art.items())
                + "); Kairos and Kairos+ by simulated allowable QPS (Poisson, p99 <= QoS), as the paper measures "
                "them: the Oracle knows the arrivals and never queues, so it bounds every dispatcher (§8.5: the "
                "upper bound, itself above any dispatcher's allowable QPS by Def. 2, is 'lower than but close to "
                "the Oracle'); even the homogeneous g4dn pool, where dispatch has no choice, runs "
                + ", ".join(f"{m} {100 * q:.0f}%" for m, q in queueing["artifact"].items())
                + " below its own Oracle rate (Poisson queueing at the p99); " + _t3_note(art)
                + "against the Oracle on each one's own pool instead (not the paper's): " + ", ".join(
                    f"{m} {100 * (1 - v['kairos_qps'] / v['oracle_on_own_pool']['kairos']):.1f}%"
                    for m, v in art.items()) + " for Kairos; a bound: yes when met, else RULE's level reading",
                {"gap": {m: v["gap"] for m, v in art.items()}, "detail": art, "paper_spread": pap,
                 "homogeneous_queueing_cost": queueing},
                cite="§8.4 (text beside Fig. 11), Oracle as defined in §7", setup=setup,
                paper_inputs=_gap_text(pap) + f": {bound_verdict(worst_gap['paper'], 0.15)} by RULE "
                "(homogeneous pool vs its Oracle: " + ", ".join(f"{m} {100 * q:.0f}%"
                                                                for m, q in queueing["paper"].items())
                + "); " + KAIROS_ARTIFACT_NOTE)]


def row_kairos_ribbon() -> list[Row]:
    """Kairos §8.2 / Fig. 8: Kairos on its one-shot pool vs Ribbon on the pool Ribbon's own Bayesian optimisation
    finds (every pool under the budget, each evaluated by FCFS's simulated allowable QPS; the search's cost
    ignored, as the paper does), both by simulated allowable QPS."""
    from benchmarks.common.scenarios import scenario_kairos
    from recserve.planners.kairos import load_kairos_reference
    from recserve.reference import reference_path
    from recserve.sim.cluster import pool_text
    from recserve.sim.dispatch_eval import DispatchEvaluation, config_to_pool, ribbon_best_pool

    ref = reference_path("kairos_aws_latency.json")
    profiles = load_kairos_reference(ref)
    meta = profiles.meta
    ratios, detail = {}, {}
    for model, p in scenario_kairos(ref).items():
        ev = DispatchEvaluation(profiles, model, meta["qos_p99_ms"][model], queries=10000, log=None)
        pool = config_to_pool(p["config"])
        k = ev.evaluate(pool, ["kairos", "ribbon"])
        rpool, r, search = ribbon_best_pool(ev, meta["prices_usd_per_hr"], meta["max_instances"],
                                            meta["budget_usd_per_hr"])
        short = model.removeprefix("kairos-")
        ratios[short] = k["kairos"].max_qps / r if r > 0 else float("nan")
        detail[short] = {"kairos_pool": pool_text(pool), "kairos_qps": k["kairos"].max_qps,
                         "ribbon_on_kairos_pool_qps": k["ribbon"].max_qps, "ribbon_pool": pool_text(rpool),
                         "ribbon_qps": r, "ribbon_evaluations": search["evaluations"],
                         "search_space": search["candidates"]}
    verdict = worst(*(judge(g - 1, 0.5) for g in ratios.values()))
    return [Row("Kairos vs Ribbon (FCFS on the pool its Bayesian optimisation picks), allowable QPS",
                "around 1.5x for all models",
                ", ".join(f"{m} {g:.2f}x" for m, g in ratios.items()), verdict,
                "Ribbon's pools: " + "; ".join(f"{m} {d['ribbon_pool']} {d['ribbon_qps']:.0f} QPS after "
                                              f"{d['ribbon_evaluations']}/{d['search_space']} evaluations"
                                              for m, d in detail.items())
                + "; on Kairos' own pool FCFS gets only " + ", ".join(
                    f"{m} {d['ribbon_on_kairos_pool_qps']:.0f}" for m, d in detail.items())
                + " QPS (large queries sent to CPU instances that cannot meet QoS), which is why Ribbon picks its own",
                {"ratio": ratios, "detail": detail}, cite="§8.2, Fig. 8 (Ribbon as described in §7)",
                setup="the bundled EC2 latency tables, $2.5/hr, each model's QoS p99, 10,000 production-mix queries, "
                      "Poisson, max load by bisection; Ribbon = FCFS dispatch + GP/EI (Matern 5/2, xi 0.1, 2 random "
                      "starts, at most 200 steps, no convergence stop before 5% of the space) over every pool "
                      "under the budget",
                paper_inputs="the EC2 latencies are the authors' own artifact data: this column is the recserve one")]


def row_kairos_predictor() -> list[Row]:
    """Why online latency learning costs Kairos throughput on mtwnd's pool: max load with the predictor learned
    from zero vs seeded with the latency tables, and where the QoS violations happen."""
    from collections import Counter

    from benchmarks.common.scenarios import scenario_kairos
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
    t3 = s.type_index("t3.xlarge") if "t3.xlarge" in pool else None
    tail = ""
    if t3 is not None:
        b = int(np.searchsorted(s.batches, 200))
        tail = f"t3 at batch 200: mean {s.mean[t3][b]:.1f} ms, p99 {s.p99[t3][b]:.1f} ms vs QoS {qos:g} ms; "
    loss = 1 - out["online"]["max_qps"] / out["seeded"]["max_qps"]
    v_on, v_se = out["online"]["violations_at_750_qps"], out["seeded"]["violations_at_750_qps"]
    # every other model's pool, and each type's tail spread: the paper's premise is a latency variance under 0.5%
    # of the mean (§5.1 "Remarks"), i.e. p99 / mean near 1
    others: dict[str, dict] = {}
    for name, p in scenario_kairos(ref).items():
        if name == model:
            continue
        q, pl = profiles.meta["qos_p99_ms"][name], config_to_pool(p["config"])
        got = {}
        for mode, seeded in (("online", False), ("seeded", True)):
            e = DispatchEvaluation(profiles, name, q, queries=10000, seed_predictor=seeded, log=None)
            got[mode] = e.max_load(pl, lambda e=e, pl=pl: e.policy("kairos", pl), 300.0)[0]
        sv = e.service
        got["p99_over_mean"] = {t: float(np.median(sv.p99[sv.type_index(t)] / sv.mean[sv.type_index(t)]))
                                for t in dict.fromkeys(pl)}
        others[name] = got
    spread = {t: float(np.median(s.p99[s.type_index(t)] / s.mean[s.type_index(t)])) for t in dict.fromkeys(pool)}
    out["other_pools"] = others
    out["p99_over_mean"] = spread
    others_txt = ", ".join(f"{n.removeprefix('kairos-')} {100 * (1 - g['online'] / g['seeded']):+.0f}%"
                           for n, g in others.items())
    widest = max(max(g["p99_over_mean"].values()) for g in others.values()) if others else float("nan")
    worst_other = max((100 * abs(1 - g["online"] / g["seeded"]) for g in others.values()), default=float("nan"))
    return [Row("Kairos: online latency learning vs a tables-seeded predictor (mtwnd's pool in detail)",
                "online learning, no profiling (Sec. 5.1)",
                f"{out['online']['max_qps']:.0f} vs {out['seeded']['max_qps']:.0f} QPS ({100 * loss:.0f}% lost); "
                f"violations at 750 QPS online {v_on}, seeded {v_se}; lost on the other pools (no t3): {others_txt}",
                "n/a",
                tail + "p99 / mean (median over batches) on mtwnd's pool: "
                + ", ".join(f"{t} {v:.2f}" for t, v in spread.items())
                + f", at most {widest:.2f} on the other pools, where online learning costs at most {worst_other:.0f}% "
                "(noise of the max-load search is a few %)" + (T3_LOSS if t3 is not None else
                "; no planned pool holds the t3, whose tail (p99 / mean "
                f"{np.median(s.p99[s.type_index('t3.xlarge')] / s.mean[s.type_index('t3.xlarge')]):.2f} on mtwnd in "
                "the artifact's data) is what cost online learning when one did "
                "(docs/decisions/2026-11-28-kairos-online-learning.md)")
                + "; the paper reports its results with online learning and no separate cost, so there is no "
                "number to judge",
                out, cite="§5.1 (Remarks)",
                setup="each model's planned pool, 10,000 production-mix queries, max load by bisection; the predictor "
                      "learned from zero (online, min 3 samples per bucket) vs seeded with the latency tables",
                paper_inputs="n/a")]


