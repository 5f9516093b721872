"""Claims-table rows of Hercules (Ke et al.): the cluster provisioner against greedy and heterogeneity-oblivious
schedulers (§VI-C, Fig. 17) and the task-scheduling search against DeepRecSys and a Baymax-style baseline (§VI-A,
Fig. 14), on the perfmodel's efficiency tuples."""

from __future__ import annotations

from benchmarks.bench_papers import RESULTS, Row, judge, worst


def row_hercules_provision(fresh: bool) -> list[Row]:
    from benchmarks.common.scenarios import HERCULES_AVAILABLE, HERCULES_MODELS, cached_profiles
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
    setup = ("the six Table I workloads on the ten Table II server types (perfmodel efficiency tuples), a 24-step "
             "diurnal day with assumed peaks, ILP vs greedy (best QPS/W type first)")
    no_inputs = "not recomputed: the paper prints no efficiency matrix or Day-X load (figures only)"
    cap_avg, power_avg = greedy["hercules_server_saving_avg"], greedy["hercules_power_saving_avg"]
    nh = plan.baselines["oblivious"]
    nh_cap = {k: 1 - greedy[f"{k}_servers"] / nh[f"{k}_servers"] for k in ("peak", "avg")}
    nh_power = {k: 1 - greedy[f"{k}_power_w"] / nh[f"{k}_power_w"] for k in ("peak", "avg")}
    extra = [Row("Hercules: capacity / provisioned power vs greedy, day average", "-22.8% / -9.1%",
                 f"{-100 * cap_avg:+.1f}% / {-100 * power_avg:+.1f}%", worst(judge(cap_avg, 0.228),
                                                                         judge(power_avg, 0.091)),
                 "same day and plans as the peak row, averaged over its 24 steps (servers activated, provisioned W)",
                 {"server_saving_avg": cap_avg, "power_saving_avg": power_avg}, cite="§VI-C, Fig. 17",
                 setup=setup, paper_inputs=no_inputs),
             Row("Hercules: greedy vs heterogeneity-oblivious (NH) scheduler, capacity / provisioned power at peak",
                 "-75.8% / -50.8% (average -67.4% / -42.7%)",
                 f"{-100 * nh_cap['peak']:+.1f}% / {-100 * nh_power['peak']:+.1f}% (average "
                 f"{-100 * nh_cap['avg']:+.1f}% / {-100 * nh_power['avg']:+.1f}%)",
                 worst(judge(nh_cap["peak"], 0.758), judge(nh_power["peak"], 0.508)),
                 "NH = `solve_oblivious`: a random available server for each unit of load (types weighted by free "
                 "count, seed 0), greedy = best QPS/W type first (§III-C); the same day and inputs as the rows above; "
                 "judged on the peak numbers, the average printed beside them",
                 {"greedy_vs_nh_server_saving": nh_cap, "greedy_vs_nh_power_saving": nh_power},
                 cite="§VI-C, Fig. 17", setup=setup, paper_inputs=no_inputs)]
    return [Row("Hercules: capacity / peak power vs greedy", "-47.7% / -23.7%",
                f"{-100 * cap:+.1f}% / {-100 * power:+.1f}% (alpha {alpha:.3f} from the load history)",
                worst(judge(cap, 0.477), judge(power, 0.237)),
                f"perfmodel efficiency matrix, best QPS/W type per workload {best} ({shared}); greedy's turn order "
                "costs little when few workloads contend for a type; the ILP minimises provisioned power, not "
                "servers (the Day-X mix and the paper's measured matrix are not available)",
                {"greedy": greedy, "hercules": plan.summary, "best_type": best}, cite="§VI-C, Fig. 17",
                setup=setup, paper_inputs=no_inputs)] + extra


HERCULES_CPU_PAPER = {"hercules-rmc1": 1.82, "hercules-rmc2": 2.39, "hercules-rmc3": 2.64}  # §VI-A, Fig. 14 (T1)
HERCULES_GPU_PAPER = {"hercules-rmc3": 6.71, "hercules-mtwnd": 9.0, "hercules-din": 6.95,    # §VI-A, Fig. 14
                      "hercules-dien": 6.0}                                                  # (CPU+GPU server)


def _corunner_state(pm, spec, server, alloc, result, mix) -> str:
    """What a CPU allocation's co-runners do at its max load: cores busy, DRAM bytes/s against the usable bandwidth,
    the LLC their private data takes, and the share of gathered bytes missing the LLC."""
    from recserve.perfmodel.corunners import displaced_llc_bytes, job_items
    from recserve.perfmodel.cost import model_cost

    taken = displaced_llc_bytes(model_cost(spec), alloc, job_items(alloc, mix)) / 1e6
    usable = server.mem_bw_gbs * pm.cal.membw_eff
    return (f"cores {result.details.get('busy', 0):.0%} busy, DRAM {result.membw_gbs:.1f} of {usable:.1f} GB/s, "
            f"co-runners' data {min(taken, server.llc_mb):.3g} of {server.llc_mb:g} MB LLC, "
            f"LLC miss {result.details.get('llc_miss', 0):.1%}")


HERCULES_LOCALITY = (0.8, 1.0, 1.2)  # assumed Zipf exponents of the ids (the paper prints none): a sensitivity


def _hercules_cpu_with_locality(pm, mix) -> dict[float, dict[str, float]]:
    """Hercules' search over DeepRecSys on T1 with the ids drawn Zipf(s) instead of uniform (``Allocation.zipf_s``)."""
    from recserve.perfmodel.evaluator import PerfModelEvaluator
    from recserve.perfmodel.model import Allocation
    from recserve.planners.hercules.search import deeprecsys, search
    from recserve.specs import get_model, get_server

    server = get_server("hercules-t1")
    out: dict[float, dict[str, float]] = {}
    for z in HERCULES_LOCALITY:
        out[z] = {}
        for m in HERCULES_CPU_PAPER:
            ev = PerfModelEvaluator(get_model(m), server, pm, mix, base=Allocation(zipf_s=z))
            dr = deeprecsys(server, ev)
            out[z][m] = search(server, ev).best_qps / dr.best_qps if dr.best_qps > 0 else float("nan")
    return out


def _device_launches(pm, server, models, mix) -> str:
    """Each model's modelled launch time on ``server``'s device at the mean query and at 1,024 items, beside its
    SLA: what bounds how many queries a fused launch can gather."""
    from recserve.perfmodel.model import Allocation
    from recserve.specs import get_model

    one = Allocation(workers=1, accelerator=True)
    parts = []
    for m in models:
        spec = get_model(m)
        mean, full = (pm.call_ms(spec, server, items, one) for items in (round(mix.mean), 1024))
        parts.append(f"{m.removeprefix('hercules-')} {mean:.1f} / {full:.1f} ms, SLA {spec.sla.target_ms:g} ms")
    return f"{'; '.join(parts)} (mean query {mix.mean:.0f} items)"


def row_hercules_search() -> list[Row]:
    from recserve.perfmodel import PerfModel, SizeMix
    from recserve.perfmodel.evaluator import perfmodel_evaluator
    from recserve.planners.hercules.search import baymax, deeprecsys, search
    from recserve.specs import get_model, get_server

    pm, mix = PerfModel(), SizeMix.of(None)
    gains: dict[str, dict[str, float]] = {"cpu": {}, "gpu": {}}
    best: dict[str, dict[str, str]] = {"cpu": {}, "gpu": {}}
    corunners: dict[str, str] = {}
    for kind, sname, paper in (("cpu", "hercules-t1", HERCULES_CPU_PAPER), ("gpu", "hercules-t7", HERCULES_GPU_PAPER)):
        server = get_server(sname)
        for m in paper:
            ev = perfmodel_evaluator(get_model(m), server, pm, mix)
            hs, dr = search(server, ev), (deeprecsys(server, ev) if kind == "cpu" else baymax(server, ev))
            gains[kind][m] = hs.best_qps / dr.best_qps if dr.best_qps > 0 else float("nan")
            best[kind][m] = f"{hs.best.label() if hs.best else '-'} vs {dr.best.label() if dr.best else '-'}"
            if kind == "cpu" and dr.best is not None:
                corunners[m] = _corunner_state(pm, get_model(m), server, dr.best.allocation(), ev.detail(dr.best), mix)

    local = _hercules_cpu_with_locality(pm, mix)
    launches = _device_launches(pm, get_server("hercules-t7"), HERCULES_GPU_PAPER, mix)

    def txt(kind: str, paper: dict[str, float]) -> str:
        return " / ".join(f"{m.removeprefix('hercules-')} {gains[kind][m]:.2f}x" for m in paper)

    def verdicts(kind: str, paper: dict[str, float]) -> str:
        return worst(*(judge(gains[kind][m] - 1, p - 1) for m, p in paper.items()))

    cpu_why = (
        "the perfmodel charges a thread for its co-runners on the socket (`perfmodel/corunners.py`): their calls' "
        "private data (ids, pooled vectors, dense inputs) takes LLC from the shared hot rows and weights, and every "
        "thread's DRAM bytes/s slow every DRAM byte (checked on this host with 1 vs 2 threads sharing RMC1's tables: "
        "docs/measured/thread-interference-2026-11-28.md).  With recserve's inputs (uniform ids: no hot rows for the "
        "co-runners to evict) the term changes no choice: RMC1/2 gather at DRAM bytes/s that do not depend on how the "
        "load is split into threads, RMC3 is compute-bound, and wider threads lose to op_serial (c cores run "
        "c / (1 + op_serial (c - 1)) times faster); DeepRecSys' batch hill-climb also shrinks the co-runners' data.  "
        "So one single-core thread per core - DeepRecSys' own point - stays the search's optimum.  The paper credits "
        "fewer, wider threads that 'reduce interference' (§III-A: 10x2 beats 20x1 by up to 35%) and the S-D pipeline "
        "(Fig. 5); it prints no locality or per-thread input to recompute them with.  DeepRecSys' point under the "
        "model: " + "; ".join(f"{m.removeprefix('hercules-')}: {v}" for m, v in corunners.items())
        + "; sensitivity (assumed inputs, not counted: the paper prints no locality): with Zipf-distributed ids the "
        "co-runners' data does evict shared hot rows once the threads pass some count (the space is then not convex: "
        "the search climbs from Alg. 1's origin and from every core's thread), and the gains are "
        + "; ".join(f"s = {z:g}: " + " / ".join(f"{m.removeprefix('hercules-')} {g:.2f}x" for m, g in by.items())
                    for z, by in local.items()))
    gpu_why = ("the search fuses queries on the device (§III-B: a free device thread launches every job that arrived "
               "during its last launch, up to the batch size, as one call: `perfmodel.model._RateModel._fusion`, "
               "the fused count the fixed point of arrivals over the model's own launch time) and co-locates threads "
               "or moves gathers to host threads (S-D pipeline); Baymax co-locates without fusion.  Fusion amortises "
               "only per-launch costs (kernel launches, PCIe latency, framework time per call): where host gathers of "
               "tables that do not fit the 16 GB device, or device compute, dominate a launch, fusing gains little; "
               "and a fused query waits for the launch in progress, then rides the next, so where two launches near "
               "the SLA no launch can wait to gather more queries.  One launch on the device (the model, one thread), "
               "at the mean query / at 1,024 items, against the SLA: " + launches)
    setup = "perfmodel evaluator (bundled calibration), Hercules' gradient-guided search (Alg. 1) vs "
    cpu_setup = setup + "DeepRecSys (one single-core thread per core, batch hill-climbed) on hercules-t1"
    gpu_setup = setup + ("a Baymax-style baseline (model-based threads co-located on the device, thread count and "
                         "batch hill-climbed) under the same device-thread cap, on hercules-t7 (V100)")
    none = "not recomputed: the paper prints no per-operator or per-thread input (figures only)"
    return [Row("Hercules search vs DeepRecSys (CPU-only server T1)", "1.82 / 2.39 / 2.64x (RMC1/2/3)",
                txt("cpu", HERCULES_CPU_PAPER), verdicts("cpu", HERCULES_CPU_PAPER),
                cpu_why + "; chosen (search vs baseline): " + "; ".join(
                    f"{m.removeprefix('hercules-')}: {v}" for m, v in best["cpu"].items()),
                {"gain": gains["cpu"], "chosen": best["cpu"], "corunners": corunners,
                 "gain_with_zipf_ids": {str(z): by for z, by in local.items()}}, cite="§VI-A, Fig. 14",
                setup=cpu_setup, paper_inputs=none),
            Row("Hercules search vs Baymax (CPU+GPU server T7)", "6.71 / 9.0 / 6.95 / 6.0x (RMC3/MT-WnD/DIN/DIEN)",
                txt("gpu", HERCULES_GPU_PAPER), verdicts("gpu", HERCULES_GPU_PAPER),
                gpu_why + "; chosen (search vs baseline): " + "; ".join(
                    f"{m.removeprefix('hercules-')}: {v}" for m, v in best["gpu"].items()),
                {"gain": gains["gpu"], "chosen": best["gpu"]}, cite="§VI-A, Fig. 14; §III-B, Fig. 6",
                setup=gpu_setup, paper_inputs=none)]
