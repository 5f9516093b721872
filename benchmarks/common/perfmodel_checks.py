"""Perfmodel checks shared by bench_perfmodel, bench_transfer and bench_papers: which zoo models can be timed here,
timing them at two table sizes, the Kairos EC2 check and the error of a calibration on recorded timings."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from recserve.perfmodel import Allocation, PerfModel
from recserve.perfmodel.fit import errors, points_from_profiles
from recserve.perfmodel.hostbench import measure_host, measure_stream_gbs
from recserve.profiles import ProfileSet
from recserve.reference import reference_path
from recserve.specs import catalogue_models, catalogue_servers

BATCHES = (1, 8, 32, 128, 512)
SMALL_BYTES, LARGE_BYTES = 8e6, 200e6
KAIROS = {"ncf": "kairos-ncf", "rm2": "kairos-rm2", "wnd": "kairos-wnd", "mtwnd": "kairos-mtwnd",
          "dien": "kairos-dien"}


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


def judge(cal, timings: ProfileSet, host) -> dict:
    pts = points_from_profiles(timings, host)
    err = np.asarray(errors(cal, pts))
    per_model: dict[str, list[float]] = {}
    for p, e in zip(pts, err, strict=True):
        per_model.setdefault(p.spec.name, []).append(float(e))
    return {"points": len(pts), "median_ape": float(np.median(err)), "p90_ape": float(np.percentile(err, 90)),
            "per_model_median_ape": {k: float(np.median(v)) for k, v in per_model.items()}}

