"""Live resource management under a fluctuating load: Hera RMU vs PARTIES-style vs static.

The demo's live deployment (node server A co-locating a memory-bound and a compute-bound DLRM;
the first also on node B behind the Kairos router) is driven three times with the same
diurnal-shaped Poisson load, once per controller; printed: the fraction of monitoring windows in
which a model's p95 exceeded its SLA.  Capacity tables come from a quick `recserve profile host`
of this machine (reused from --profiles when given).

    .venv/bin/python benchmarks/bench_rmu_live.py --seconds 60
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recserve.cli import main as cli
from recserve.demo import LIVE_MODELS, DemoRun, run_live


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results/rmu_live")
    parser.add_argument("--profiles", default=None, help="a this-host ProfileSet to reuse (default: profile now)")
    parser.add_argument("--scale", type=float, default=1e-3)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each compressed day")
    parser.add_argument("--window-s", type=float, default=3.0)
    parser.add_argument("--controllers", default="hera,parties,static")
    parser.add_argument("--no-router", action="store_true", help="send the first model straight to node A")
    args = parser.parse_args()
    run = DemoRun(Path(args.out))
    measured = run.path("profiles/this-host.json")
    if args.profiles:
        measured.parent.mkdir(parents=True, exist_ok=True)
        measured.write_text(Path(args.profiles).read_text())
    elif cli(["profile", "host", "--models", ",".join(LIVE_MODELS), "--scale", str(args.scale), "--via",
              "inprocess", "--quick", "--batches", "1,16,64,256,1024", "--workers", "1,2", "--out",
              str(measured)]) != 0:
        return 1
    results = {}
    for name in args.controllers.split(","):
        print(f"== {name}", file=sys.stderr)
        data = run_live(run, args.scale, args.seconds, args.window_s, controller_name=name,
                        use_router=not args.no_router)
        results[name] = {"violation_fraction": data["violation_fraction"], "decisions": len(data["decisions"]),
                         "errors": sum(w["errors"] for w in data["windows"]),
                         "controller_errors": data["controller_errors"][:3]}
        if data["controller_errors"]:
            print(f"  {name} controller errors: {data['controller_errors'][:3]}", file=sys.stderr)
        run.path(f"live_{name}.json").write_text(json.dumps(data, indent=1))
    print(f"fraction of {args.window_s:g}-s windows with p95 over the SLA ({args.seconds:g}-s compressed day)")
    for name, r in results.items():
        v = ", ".join(f"{m} {100 * f:.0f}%" for m, f in r["violation_fraction"].items())
        print(f"  {name:8s} {v}   decisions {r['decisions']}, errors {r['errors']}")
    Path("results").mkdir(exist_ok=True)
    Path("results/rmu_live.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
