"""Perfmodel accuracy on this host (held-out error), Kairos EC2 check, and Hercules search cost.

1. Times zoo models in-process (one thread) at two table scales (LLC-resident and DRAM-bound),
   fits the calibration constants on half of the models and reports the median absolute
   percentage error of per-call latency on the other half (held-out models), and on held-out
   batch sizes.
2. Predicts the Kairos artifact latencies (reference/kairos_aws_latency.json) of its five models on
   its four EC2 types with the host-fitted constants — nothing is fitted to the Kairos data — and
   reports per-model Spearman rank correlation of the four types and the median error.
3. Runs Hercules' gradient search, DeepRecSys and exhaustive search on the perfmodel for every
   catalogue model on four server types and counts evaluations.

    .venv/bin/python benchmarks/bench_perfmodel.py [--quick]

Writes results/perfmodel.json, results/this-host-hostbench.json and results/calibration.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from recserve.errors import SpecError
from recserve.perfmodel import Allocation, PerfModel, SizeMix, load_calibration
from recserve.perfmodel.evaluator import perfmodel_evaluator
from recserve.perfmodel.fit import errors, fit, points_from_profiles
from recserve.perfmodel.hostbench import calibration_host, measure_host, measure_stream_gbs, measured_constants
from recserve.planners.hercules.search import deeprecsys, exhaustive, search
from recserve.profiles import ProfileSet
from recserve.reference import reference_path
from recserve.specs import catalogue_models, catalogue_servers, get_server

RESULTS = Path("results")
BATCHES = (1, 8, 32, 128, 512)
FIT_BATCHES = (1, 32, 512)
SMALL_BYTES, LARGE_BYTES = 8e6, 200e6
KAIROS = {"ncf": "kairos-ncf", "rm2": "kairos-rm2", "wnd": "kairos-wnd", "mtwnd": "kairos-mtwnd",
          "dien": "kairos-dien"}
SEARCH_SERVERS = ("hera-xeon", "hercules-t1", "hercules-t7", "c5n.2xlarge")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def buildable(spec) -> bool:
    """The zoo builds the family and its dense part is small enough to instantiate here."""
    from recserve.perfmodel.cost import model_cost
    from recserve.zoo import FAMILY_CLASSES

    return spec.family in FAMILY_CLASSES and model_cost(spec).source == "zoo"


def measure_table_sizes(models: list, budget_s: float) -> ProfileSet:
    """latency_vs_batch of every model with small (in-cache) and large (DRAM) tables, tagged ``tables``."""
    stream_gbs = measure_stream_gbs()  # once, not per measure_host call
    measured: ProfileSet | None = None
    for m in models:  # both table sizes of a model back to back: they share the host's mood
        for tag, target in (("small", SMALL_BYTES), ("large", LARGE_BYTES)):
            scale = float(min(1.0, max(1e-7, target / m.embedding_bytes)))
            ps = measure_host([m], BATCHES, scale, threads=1, budget_s=budget_s, progress=log, stream_gbs=stream_gbs)
            for t in ps:
                t.conditions["tables"] = tag
            if measured is None:
                measured = ps
            else:
                specs = {**measured.meta["specs"], **ps.meta["specs"]}
                measured = measured.merge(ps)
                measured.meta["specs"] = specs
    assert measured is not None
    return measured


def host_accuracy(quick: bool, reuse: Path | None = None) -> dict:
    models = [m for m in catalogue_models().values() if buildable(m)]
    if quick:
        models = models[::3]
    if reuse:
        measured = ProfileSet.load(reuse)
        models = [m for m in models if m.name in measured.models()]
    else:
        measured = measure_table_sizes(models, budget_s=0.15 if quick else 0.3)
    if "stream_gbs_per_core" not in measured.meta:  # files written before it was recorded
        measured.meta["stream_gbs_per_core"] = measure_stream_gbs()
    RESULTS.mkdir(exist_ok=True)
    measured.save(RESULTS / "this-host-hostbench.json")
    host = calibration_host()
    # alternate within each family so every family is fitted and every family has held-out models
    ordered = [m.name for m in sorted(models, key=lambda m: (m.family, m.name))]
    fit_models, held_models = sorted(ordered[0::2]), sorted(ordered[1::2])
    base = load_calibration().with_values(**measured_constants(measured))
    pts_fit = points_from_profiles(measured, host, fit_models)
    pts_held = points_from_profiles(measured, host, held_models)
    t0 = time.time()
    cal = fit(pts_fit, base, label=f"this-host, models {fit_models}")
    fit_s = time.time() - t0
    err_fit, err_held = errors(cal, pts_fit), errors(cal, pts_held)
    # batch hold-out: fit on FIT_BATCHES of every model, evaluate the other batch sizes
    pts_all = pts_fit + pts_held
    train = [p for p in pts_all if p.batch in FIT_BATCHES]
    test = [p for p in pts_all if p.batch not in FIT_BATCHES]
    cal_b = fit(train, base)
    err_batch = errors(cal_b, test)
    final = fit(pts_all, base, label="this-host, all measured models (bench_perfmodel)")
    final = final.with_values(fit_error={"heldout_models_median_ape": float(np.median(err_held)),
                                         "heldout_batches_median_ape": float(np.median(err_batch))})
    final.save(RESULTS / "calibration.json")
    per_model = {}
    for p, e in zip(pts_held, err_held, strict=True):
        per_model.setdefault(p.spec.name, []).append(float(e))
    return {
        "fit_models": fit_models,
        "heldout_models": held_models,
        "points_fit": len(pts_fit),
        "points_heldout": len(pts_held),
        "fit_seconds": fit_s,
        "median_ape_fit": float(np.median(err_fit)),
        "median_ape_heldout_models": float(np.median(err_held)),
        "p90_ape_heldout_models": float(np.percentile(err_held, 90)),
        "median_ape_heldout_batches": float(np.median(err_batch)),
        "heldout_per_model_median_ape": {k: float(np.median(v)) for k, v in per_model.items()},
        "calibration": final.to_dict(),
    }


# How the Kairos artifact ran each query (DeepRecSys' harness, github.com/harvard-acc/DeepRecSys, which Kairos'
# latencies come from): one inference engine whose Caffe2 net runs with the harness defaults inter_op_workers=1,
# fc_workers=1, sls_workers=1 and net type "simple" (utils/utils.py) -- one thread on one vCPU, not the whole
# instance; and the measured latency is "execution plus loading time", where loading is ``FeedBlob(np.array(
# S_indices[i]))`` per table in ``run()`` with the ids held as Python lists (data_generator/dlrm_data_caffe2.py
# builds them with ``.tolist()``) -- the perfmodel's ``feed="pylist"``.
KAIROS_ALLOC = Allocation(workers=1, cores_per_worker=1, feed="pylist")


def _median_by(rows: list[tuple], key) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r[-1])
    return {k: float(np.median(v)) for k, v in sorted(groups.items())}


def kairos_check(cal_path: Path, alloc: Allocation = KAIROS_ALLOC) -> dict:
    ref = json.loads(reference_path("kairos_aws_latency.json").read_text())
    pm = PerfModel(cal_path if cal_path.exists() else None)
    servers = catalogue_servers()
    out: dict = {"fitted_to_kairos": False, "allocation": str(alloc), "models": {}}
    all_err = []
    rows: list[tuple] = []  # (model, instance, batch, signed error %, abs error %)
    for short, name in KAIROS.items():
        try:
            spec = catalogue_models()[name]
        except KeyError:
            continue
        preds, meas, errs = {}, {}, []
        for inst, data in ref["instances"].items():
            if inst not in servers or short not in data:
                continue
            server = servers[inst]
            pts = sorted((int(b), v["mean"]) for b, v in data[short].items())
            pb = [pm.call_ms(spec, server, b, alloc) for b, _ in pts]
            mb = [m for _, m in pts]
            e = np.abs(np.array(pb) - mb) / np.array(mb) * 100
            errs += list(e)
            rows += [(short, inst, b, (p - m) / m * 100, float(a)) for (b, m), p, a in zip(pts, pb, e, strict=True)]
            preds[inst], meas[inst] = float(np.mean(pb)), float(np.mean(mb))
        insts = sorted(preds)
        rho = spearmanr([preds[i] for i in insts], [meas[i] for i in insts]).statistic if len(insts) > 2 else None
        all_err += errs
        out["models"][short] = {
            "spearman_rank_of_instances": None if rho is None else float(rho),
            "median_ape": float(np.median(errs)) if errs else None,
            "pred_mean_ms": preds,
            "measured_mean_ms": meas,
            "rank_pred": sorted(insts, key=preds.get),
            "rank_measured": sorted(insts, key=meas.get),
        }
    rhos = [m["spearman_rank_of_instances"] for m in out["models"].values()
            if m["spearman_rank_of_instances"] is not None]
    out["mean_spearman"] = float(np.mean(rhos)) if rhos else None
    out["median_ape_all"] = float(np.median(all_err)) if all_err else None
    out["median_ape_by_instance"] = _median_by(rows, lambda r: r[1])
    lo = lambda b: (b - 1) // 200 * 200  # noqa: E731  (batch buckets 1-200, 201-400, ...)
    out["median_ape_by_batch"] = _median_by(rows, lambda r: f"{lo(r[2]) + 1}-{lo(r[2]) + 200}")
    signed = [(r[0], r[1], r[2], r[3]) for r in rows]  # median signed error: + over-, - under-prediction
    out["median_signed_error_by_instance"] = _median_by(signed, lambda r: r[1])
    out["median_signed_error_by_model"] = _median_by(signed, lambda r: r[0])
    return out


def print_kairos(k: dict) -> None:
    for short, m in k["models"].items():
        print(f"kairos {short:6s}: spearman {m['spearman_rank_of_instances']:+.2f}  median APE {m['median_ape']:.0f}%  "
              f"(signed {k['median_signed_error_by_model'][short]:+.0f}%)  pred rank {m['rank_pred']}  "
              f"measured rank {m['rank_measured']}")
    for inst, e in k["median_ape_by_instance"].items():
        print(f"kairos {inst:12s}: median APE {e:.0f}% (signed {k['median_signed_error_by_instance'][inst]:+.0f}%)")
    print("kairos by batch: " + ", ".join(f"{b} {e:.0f}%" for b, e in k["median_ape_by_batch"].items()))
    print(f"kairos overall: mean spearman {k['mean_spearman']:+.2f}, median APE {k['median_ape_all']:.0f}% "
          "(nothing fitted to Kairos data)")


def search_cost(cal_path: Path, quick: bool) -> dict:
    pm = PerfModel(cal_path if cal_path.exists() else None)
    mix = SizeMix.of(None)
    rows = []
    servers = SEARCH_SERVERS[-2:] if quick else SEARCH_SERVERS
    for spec in catalogue_models().values():
        for sname in servers:
            try:
                server = get_server(sname)
            except SpecError:
                continue
            ev = perfmodel_evaluator(spec, server, pm, mix)
            ex = exhaustive(server, ev)
            hs = search(server, ev)
            dr = deeprecsys(server, ev)
            rows.append({"model": spec.name, "server": sname, "exhaustive_qps": ex.best_qps,
                         "exhaustive_evals": ex.evaluations, "hercules_qps": hs.best_qps,
                         "hercules_evals": hs.evaluations, "deeprecsys_qps": dr.best_qps,
                         "hercules_best": hs.best.label() if hs.best else None,
                         "exhaustive_best": ex.best.label() if ex.best else None})
            log(f"search {spec.name} on {sname}: exhaustive {ex.best_qps:.1f} ({ex.evaluations} evals), "
                f"hercules {hs.best_qps:.1f} ({hs.evaluations}), deeprecsys {dr.best_qps:.1f}")
    feasible = [r for r in rows if r["exhaustive_qps"] > 0]
    ratio = [r["hercules_qps"] / r["exhaustive_qps"] for r in feasible]
    frac = [r["hercules_evals"] / r["exhaustive_evals"] for r in rows]
    gain = [r["hercules_qps"] / r["deeprecsys_qps"] for r in feasible if r["deeprecsys_qps"] > 0]
    return {"pairs": len(rows), "feasible_pairs": len(feasible),
            "min_ratio_to_exhaustive": min(ratio) if ratio else None,
            "pairs_within_3pct": sum(x >= 0.97 for x in ratio),
            "max_eval_fraction": max(frac) if frac else None, "mean_eval_fraction": float(np.mean(frac)),
            "median_gain_over_deeprecsys": float(np.median(gain)) if gain else None,
            "max_gain_over_deeprecsys": max(gain) if gain else None, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer models and servers")
    ap.add_argument("--skip-measure", action="store_true", help="reuse results/calibration.json")
    ap.add_argument("--reuse-measured", metavar="FILE", help="fit on this earlier hostbench file instead of timing")
    ap.add_argument("--kairos-only", action="store_true", help="only the Kairos EC2 check with the bundled constants")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.kairos_only:
        print_kairos(kairos_check(Path("/nonexistent")))
        return 0
    out: dict = {}
    if not args.skip_measure:
        out["host_accuracy"] = host_accuracy(args.quick, Path(args.reuse_measured) if args.reuse_measured else None)
        h = out["host_accuracy"]
        print(f"held-out models: median APE {h['median_ape_heldout_models']:.1f}% "
              f"(p90 {h['p90_ape_heldout_models']:.1f}%, {h['points_heldout']} points; fit set "
              f"{h['median_ape_fit']:.1f}%); held-out batches: {h['median_ape_heldout_batches']:.1f}%")
    cal_path = RESULTS / "calibration.json"
    out["kairos"] = kairos_check(cal_path)
    print_kairos(out["kairos"])
    out["search"] = search_cost(cal_path, args.quick)
    s = out["search"]
    print(f"search: {s['pairs']} pairs ({s['feasible_pairs']} feasible); hercules/exhaustive min "
          f"{s['min_ratio_to_exhaustive']:.3f}, within 3% on {s['pairs_within_3pct']}/{s['feasible_pairs']}; "
          f"evaluations max {s['max_eval_fraction']:.2f} mean {s['mean_eval_fraction']:.2f} of exhaustive; "
          f"gain over DeepRecSys median {s['median_gain_over_deeprecsys']:.2f}x "
          f"max {s['max_gain_over_deeprecsys']:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "perfmodel.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'perfmodel.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
