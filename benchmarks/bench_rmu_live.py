"""Live resource management under a fluctuating load: Hera RMU vs PARTIES-style vs static.

The demo's live deployment (node server A co-locating a memory-bound and a compute-bound DLRM, each
starting with one worker on its own core; added workers go round-robin over both cores) is driven
once per controller with the same Poisson load; printed: the fraction of monitoring windows in which
a model's p95 exceeded its SLA.  The default load is Hera's Fig. 14 scenario (gradual rise; at T1
the second model drops; at T2 it spikes while the first drops) as fractions of each model's max load
with two workers on the node.  That max load (and the RMU's curve) is measured on node A just before
the runs (`--capacity live`, 1 and 2 workers, first with the other model idle, then with the other
model at the load it carries during this one's peak; the second sizes the load; a --profiles file only seeds
the search), or read from a capacity profile (`--capacity profile`: --profiles, else `recserve profile
host --via server` now).

    .venv/bin/python -m benchmarks.bench_rmu_live [--seconds 90] [--shape fig14|diurnal] [--router] [--rounds 2]

The controllers run one after another, so a host that drifts (this shared 2-core VM can change speed by 2x within an
hour) favours whichever runs in its faster stretch.  ``--rounds N`` repeats the comparison with the order reversed
every other round (hera, static; static, hera; ...) and prints each round and the mean per controller.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import harness
from recserve.cli import main as cli
from recserve.demo import DemoRun, measured_capacity, run_live


def headline(results: dict) -> list[dict]:
    """Per policy: the share of live windows that violated the SLA, worst model."""
    return [harness.row(f"live windows violating SLA, {name}", 100 * max(r["violation_fraction"].values()), "%")
            for name, r in results.items() if isinstance(r, dict) and "violation_fraction" in r]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/rmu_live")
    parser.add_argument("--profiles", default=None, help="a this-host ProfileSet to reuse (default: profile now)")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--seconds", type=float, default=90.0, help="length of each run")
    parser.add_argument("--shape", default="fig14", choices=("fig14", "diurnal"), help="load over time")
    parser.add_argument("--via", default="server", choices=("server", "inprocess"),
                        help="how the capacity profile is measured")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--controllers", default="hera,parties,static")
    parser.add_argument("--models", default="hera-dlrm-b,elasticrec-rm3",
                        help="the two co-located models (compute-heavy: on 2 cores the HTTP front end and load "
                             "generator take much of a light model's CPU, so workers would barely matter)")
    parser.add_argument("--peaks", default="0.35,0.2,0.8",
                        help="fig14: the first model's plateau, the second's level at T1 and (optional, default 0.6) "
                             "its spike at T2, as fractions of each model's max load alone on the node")
    parser.add_argument("--quick-profile", action="store_true", help="coarse capacity profile (4 short probes)")
    parser.add_argument("--capacity", default="live", choices=("live", "profile"),
                        help="the load's and the RMU's max-load curve: 'live' measures node A now (1 and 2 workers "
                             "per model, the other idle; the profile only seeds the search), 'profile' uses the "
                             "capacity profile as is")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the comparison, reversing the controllers' order every other round (drift)")
    parser.add_argument("--router", action="store_true",
                        help="also put the first model on node B behind the Kairos router (the demo's layout)")
    args = parser.parse_args()
    run = DemoRun(Path(args.out))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    models = tuple(args.models.split(","))
    if len(models) != 2:
        parser.error("--models takes exactly two models")
    measured = run.path("profiles/this-host.json")
    if args.profiles:
        measured.parent.mkdir(parents=True, exist_ok=True)
        measured.write_text(Path(args.profiles).read_text())
    elif args.capacity == "profile" and cli([
            "profile", "host", "--models", ",".join(models), "--scale", str(args.scale), "--via", args.via,
            *(["--quick"] if args.quick_profile else []), "--batches", "1,64,256", "--workers", "1,2,3",
            "--out", str(measured)]) != 0:
        return 1
    capacity = None
    shape_peaks = tuple(float(x) for x in args.peaks.split(","))
    if args.capacity == "live":
        measured = measured_capacity(run, args.scale, models, args.shape, shape_peaks)
        capacity = measured.profiles
        for label, points in (("alone", measured.alone), ("beside its neighbour", measured.beside)):
            print(f"capacity now, {label}: " + "; ".join(
                f"{m} " + " / ".join(f"{q:.0f}" for q in qs.values()) + " qps with " + " / ".join(map(str, qs))
                + " workers" + (f" (neighbour at {measured.neighbour_qps[m]:.0f} qps)" if label != "alone" else "")
                for m, qs in points.items()))
    names = args.controllers.split(",")
    rounds: list[dict[str, dict]] = []
    for k in range(max(1, args.rounds)):
        results = {}
        for name in (names if k % 2 == 0 else names[::-1]):
            print(f"== round {k + 1}: {name}", file=sys.stderr)
            data = run_live(run, args.scale, args.seconds, args.window_s, controller_name=name,
                            use_router=args.router, shape=args.shape, models=models,
                            peaks=shape_peaks, capacity=capacity)
            peaks = data["peak_qps"]
            if args.capacity == "live":
                data.update(measured.to_dict())
            results[name] = {"violation_fraction": data["violation_fraction"], "peak_qps": peaks,
                             "capacity_qps": data["capacity_qps"],
                             "decisions": len(data["decisions"]),
                             "errors": sum(w["errors"] for w in data["windows"]),
                             "controller_errors": data["controller_errors"][:3], "order": k % 2}
            if data["controller_errors"]:
                print(f"  {name} controller errors: {data['controller_errors'][:3]}", file=sys.stderr)
            run.path(f"live_{name}{'' if k == 0 else f'_round{k + 1}'}.json").write_text(json.dumps(data, indent=1))
        rounds.append(results)
        print(f"round {k + 1}: fraction of {args.window_s:g}-s windows with p95 over the SLA ({args.shape} load, "
              f"{args.seconds:g} s; peak offered {', '.join(f'{m} {q:.0f} qps' for m, q in peaks.items())})")
        for name, r in results.items():
            v = ", ".join(f"{m} {100 * f:.0f}%" for m, f in r["violation_fraction"].items())
            print(f"  {name:8s} {v}   decisions {r['decisions']}, errors {r['errors']}")
    mean = {name: {m: sum(r[name]["violation_fraction"][m] for r in rounds) / len(rounds) for m in models}
            for name in names}
    if len(rounds) > 1:
        print(f"mean over {len(rounds)} rounds (order reversed every other round):")
        for name, v in mean.items():
            print(f"  {name:8s} " + ", ".join(f"{m} {100 * f:.0f}%" for m, f in v.items()))
    results = {**rounds[0], "rounds": rounds, "mean_violation_fraction": mean}
    harness.write_result("results/rmu_live.json", args, headline(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
