"""Does the perfmodel transfer to a host it was not fitted on?  Microbenchmark calibration vs recorded model timings.

1. Model timings of this host (every buildable catalogue model, or every ``--every``-th, at an LLC-resident and a
   DRAM-bound table size, batches 1..512, one thread) — recorded with ``--record NAME`` under
   ``src/recserve/data/hosts/NAME.json`` together with this host's microbenchmarks, so other hosts can be judged
   against it later (leave-one-host-out).
2. Calibrations judged on every recorded host: the bundled constants; the microbenchmark-only constants of that
   host (no model timed); and, with two or more hosts recorded, constants fitted on the *other* hosts' timings, their
   compute efficiency carried over by the hosts' GEMM microbenchmarks (``microbench.transfer_calibration``; the
   unscaled fit is printed too).
3. The Kairos EC2 latencies (no microbenchmarks exist for those instances: spec-derived, bundled constants).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_transfer.py [--reuse results/hostbench.json] [--record NAME]

Prints median/p90 absolute percentage error per calibration and host and writes results/transfer.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from recserve.perfmodel import load_calibration  # noqa: E402
from recserve.perfmodel.fit import errors, fit, points_from_profiles  # noqa: E402
from recserve.perfmodel.hostbench import calibration_host  # noqa: E402
from recserve.perfmodel.microbench import (  # noqa: E402
    calibration_from_micro,
    measure_micro,
    transfer_calibration,
)
from recserve.profiles import ProfileSet  # noqa: E402
from recserve.specs import catalogue_models, server_from_dict, to_dict  # noqa: E402

RESULTS = Path("results")
HOSTS = Path(__file__).resolve().parent.parent / "src" / "recserve" / "data" / "hosts"


HARDWARE = ("cores", "freq_ghz", "flops_per_cycle", "llc_mb", "llc_ways", "mem_gb")


def same_host(a: ProfileSet, b: ProfileSet) -> bool:
    """Timings from one machine (a host's recording and this run on it): same hostname *and* same hardware facts
    (hostnames alone are not enough: containers are often all called ``vm``; whole ServerType dicts too much:
    their notes and assumed fields change between versions)."""
    facts = [{k: p.meta.get("host", {}).get(k) for k in HARDWARE} for p in (a, b)]
    return a.meta.get("hostname") == b.meta.get("hostname") and facts[0] == facts[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def record_timings(every: int) -> ProfileSet:
    from bench_perfmodel import buildable, measure_table_sizes

    models = [m for m in catalogue_models().values() if buildable(m)][::every]
    return measure_table_sizes(models, budget_s=0.2)


def judge(cal, timings: ProfileSet, host) -> dict:
    pts = points_from_profiles(timings, host)
    err = np.asarray(errors(cal, pts))
    per_model: dict[str, list[float]] = {}
    for p, e in zip(pts, err, strict=True):
        per_model.setdefault(p.spec.name, []).append(float(e))
    return {"points": len(pts), "median_ape": float(np.median(err)), "p90_ape": float(np.percentile(err, 90)),
            "per_model_median_ape": {k: float(np.median(v)) for k, v in per_model.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reuse", help="model timings of this host from an earlier run")
    parser.add_argument("--every", type=int, default=2, help="time every N-th buildable catalogue model")
    parser.add_argument("--record", metavar="NAME", help="also save this host's timings + microbenchmarks as data")
    parser.add_argument("--out", default=str(RESULTS / "transfer.json"))
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    host = calibration_host()
    log("microbenchmarks on this host")
    micro = measure_micro(host, progress=log)
    timings = ProfileSet.load(args.reuse) if args.reuse else record_timings(args.every)
    timings.meta["micro"] = micro
    timings.meta["host"] = to_dict(host)
    timings.meta["hostname"] = socket.gethostname()
    timings.save(RESULTS / "hostbench.json")
    if args.record:
        HOSTS.mkdir(parents=True, exist_ok=True)
        timings.save(HOSTS / f"{args.record}.json")
        log(f"recorded {HOSTS / (args.record + '.json')}")
    hosts = {} if args.record else {"this host (now)": timings}
    for path in sorted(HOSTS.glob("*.json")) if HOSTS.exists() else []:
        hosts[f"recorded {path.stem}"] = ProfileSet.load(path)
    bundled = load_calibration()
    out: dict = {"hosts": {}}
    for name, ps in hosts.items():
        h = server_from_dict("this-host", ps.meta["host"]) if "host" in ps.meta else host
        res = {"bundled constants (fitted on the dev host)": judge(bundled, ps, h)}
        if "micro" in ps.meta:
            res["microbenchmarks of that host only"] = judge(calibration_from_micro(ps.meta["micro"], bundled), ps, h)
        others = [q for n, q in hosts.items() if n != name and not same_host(q, ps)]
        if others:
            per_host = [points_from_profiles(q, server_from_dict("this-host", q.meta["host"]) if "host" in q.meta
                                             else host) for q in others]
            fitted = fit([p for pts in per_host for p in pts], bundled)
            if "micro" in ps.meta and all("micro" in q.meta for q in others):
                # compute efficiency carried over by the hosts' GEMM microbenchmarks (microbench.transfer_calibration)
                res["fitted on the other hosts"] = judge(transfer_calibration(
                    fitted, [(q.meta["micro"], len(pts)) for q, pts in zip(others, per_host, strict=True)],
                    ps.meta["micro"]), ps, h)
                res["fitted on the other hosts, compute not rescaled"] = judge(fitted, ps, h)
            else:
                res["fitted on the other hosts"] = judge(fitted, ps, h)
        out["hosts"][name] = res
    from bench_perfmodel import kairos_check

    micro_cal = RESULTS / "calibration_micro.json"
    calibration_from_micro(micro, bundled).save(micro_cal)
    out["kairos"] = {"bundled": kairos_check(Path("/nonexistent")), "micro (this host)": kairos_check(micro_cal)}
    for name, res in out["hosts"].items():
        for how, r in res.items():
            print(f"{name:28s} {how:50s} median {r['median_ape']:5.1f}%  p90 {r['p90_ape']:5.1f}%  "
                  f"({r['points']} calls)")
    for how, k in out["kairos"].items():
        print(f"Kairos EC2 ({how}): median {k['median_ape_all']:.0f}%, mean Spearman {k['mean_spearman']:.2f}")
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
