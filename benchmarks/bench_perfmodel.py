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

    .venv/bin/python -m benchmarks.bench_perfmodel [--quick]

Writes results/perfmodel.json, results/this-host-hostbench.json and results/calibration.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from benchmarks.common.perfmodel_checks import buildable, kairos_check, log, measure_table_sizes
from recserve.errors import SpecError
from recserve.perfmodel import PerfModel, SizeMix, load_calibration
from recserve.perfmodel.evaluator import perfmodel_evaluator
from recserve.perfmodel.fit import errors, fit, points_from_profiles
from recserve.perfmodel.hostbench import calibration_host, measure_stream_gbs, measured_constants
from recserve.planners.hercules.search import deeprecsys, exhaustive, search
from recserve.profiles import ProfileSet
from recserve.specs import catalogue_models, get_server

RESULTS = Path("results")
FIT_BATCHES = (1, 32, 512)
SEARCH_SERVERS = ("hera-xeon", "hercules-t1", "hercules-t7", "c5n.2xlarge")


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


def headline(out: dict) -> list[dict]:
    """Held-out error on this host, the Kairos check's ranking, the search's quality and cost."""
    dig, row = harness.dig, harness.row
    return [row("perfmodel median abs. % error, held-out models",
                dig(out, "host_accuracy", "median_ape_heldout_models"), "%"),
            row("perfmodel median abs. % error, held-out batches",
                dig(out, "host_accuracy", "median_ape_heldout_batches"), "%"),
            row("Kairos EC2 instance ranking, mean Spearman (not fitted)", dig(out, "kairos", "mean_spearman"), "",
                1.0),
            row("Hercules search / exhaustive best QPS, worst pair", dig(out, "search", "min_ratio_to_exhaustive"),
                "", 1.0),
            row("Hercules search evaluations / exhaustive, mean", dig(out, "search", "mean_eval_fraction"))]


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
    print(f"wrote {harness.write_result(RESULTS / 'perfmodel.json', args, headline(out), out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
