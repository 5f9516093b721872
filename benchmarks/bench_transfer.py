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

    PYTHONPATH=src .venv/bin/python -m benchmarks.bench_transfer [--reuse results/hostbench.json] [--record NAME]

Prints median/p90 absolute percentage error per calibration and host and writes results/transfer.json.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from benchmarks import harness
from benchmarks.common.perfmodel_checks import buildable, judge, kairos_check, log, measure_table_sizes
from recserve.perfmodel import load_calibration
from recserve.perfmodel.hostbench import calibration_host
from recserve.perfmodel.hosts import HOSTS_DIR, Machine, calibration_for_host, recorded_hosts
from recserve.perfmodel.microbench import calibration_from_micro, measure_micro
from recserve.profiles import ProfileSet
from recserve.specs import catalogue_models, server_from_dict, to_dict

RESULTS = Path("results")


def record_timings(every: int) -> ProfileSet:
    models = [m for m in catalogue_models().values() if buildable(m)][::every]
    return measure_table_sizes(models, budget_s=0.2)


def headline(out: dict) -> list[dict]:
    """Each calibration's median error on each host (target: 20 %), the Kairos check's (target: 35 %, Spearman 0.9)."""
    rows = [harness.row(f"perfmodel median abs. % error on {host}, {how}", r.get("median_ape"), "%", 20.0)
            for host, res in (out.get("hosts") or {}).items() for how, r in res.items()]
    for how, k in (out.get("kairos") or {}).items():
        rows.append(harness.row(f"Kairos EC2 median abs. % error ({how})", k.get("median_ape_all"), "%", 35.0))
        rows.append(harness.row(f"Kairos EC2 mean Spearman ({how})", k.get("mean_spearman"), "", 0.9))
    return rows


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
        HOSTS_DIR.mkdir(parents=True, exist_ok=True)
        timings.save(HOSTS_DIR / f"{args.record}.json")
        log(f"recorded {HOSTS_DIR / (args.record + '.json')}")
    hosts = {} if args.record else {"this host (now)": timings}
    recorded = recorded_hosts()
    hosts.update({f"recorded {name}": ps for name, ps in recorded.items()})
    bundled = load_calibration()
    out: dict = {"hosts": {}}
    for name, ps in hosts.items():
        h = server_from_dict("this-host", ps.meta["host"]) if "host" in ps.meta else host
        res = {"bundled constants (fitted on the dev host)": judge(bundled, ps, h)}
        if "micro" in ps.meta:
            res["microbenchmarks of that host only (--micro-only)"] = judge(
                calibration_from_micro(ps.meta["micro"], bundled), ps, h)
            # what `recserve profile calibrate --micro` gives on that host: the other recorded hosts' fit, carried
            moved = calibration_for_host(ps.meta["micro"], Machine.of(ps), bundled, recorded)
            if moved is not None:
                res[f"one command (--micro): fitted on {'+'.join(moved.sources)}, carried"] = judge(
                    moved.calibration, ps, h)
                res["fitted on the other hosts, compute not rescaled"] = judge(moved.fitted, ps, h)
        out["hosts"][name] = res
    micro_cal = RESULTS / "calibration_micro.json"
    calibration_from_micro(micro, bundled).save(micro_cal)
    out["kairos"] = {"bundled": kairos_check(Path("/nonexistent")), "micro (this host)": kairos_check(micro_cal)}
    for name, res in out["hosts"].items():
        for how, r in res.items():
            print(f"{name:28s} {how:50s} median {r['median_ape']:5.1f}%  p90 {r['p90_ape']:5.1f}%  "
                  f"({r['points']} calls)")
    for how, k in out["kairos"].items():
        print(f"Kairos EC2 ({how}): median {k['median_ape_all']:.0f}%, mean Spearman {k['mean_spearman']:.2f}")
    harness.write_result(args.out, args, headline(out), out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
