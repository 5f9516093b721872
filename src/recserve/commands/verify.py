"""``recserve verify``: a deployed fleet plan measured against its own prediction.

Example::

    recserve plan fleet --spec fleet.yaml --out fleet.json
    recserve deploy local --plan fleet.json --dir out/fleet-local &          # writes out/fleet-local/endpoints.json
    recserve verify --plan fleet.json --target out/fleet-local/endpoints.json --max-load --out verify.json
    recserve verify --plan fleet.json --target out/fleet-local/endpoints.json --max-load --replan --new-plan fleet2.json

Replays the planned traffic mix (each model's peak QPS times the share of its planned servers that is deployed,
times ``--load``) against the endpoints, every model at once, open loop, for ``--seconds``; prints each model's
latency at its SLA percentile (failures count as infinitely slow), share of queries within the SLA, errors and
throughput.  ``--max-load`` also searches each model's max load at its SLA (one model at a time) and prints it
beside the plan's capacity for what is deployed, with the relative error.  ``--replan`` (implies ``--max-load``)
plans again from the plan's own inputs when a model's measured max load differs from the prediction by more than
``--threshold``: every capacity option of that model is scaled by measured / predicted (a measured correction,
kept in the new plan's summary), and what changed is printed.  A model for which no load met its SLA is left as
planned (a measurement of 0 is no correction).

Exit status 1 when a model misses its SLA under the planned mix, or when the replan cannot serve every peak; 0
otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recserve.commands._plan_common import number, progress


def run(args: argparse.Namespace) -> int:
    from recserve.deploy.fleet_verify import load_targets, verify_table
    from recserve.deploy.local_fleet import load_fleet_plan
    from recserve.jsonio import write_text_atomic

    plan = load_fleet_plan(args.plan)
    deployed = load_targets(plan, args.target, args.scale)
    for m, d in deployed.items():
        progress(f"{m}: {' '.join(d.urls)}; {d.basis} (x{d.fraction:.3g} of the plan's capacity)")
    checks = _measure(args, plan, deployed)
    print(verify_table(checks, args.load))
    _explain_unanswered(checks, deployed)
    held = all(c.sla_held for c in checks.values())
    print(f"SLA held under the planned mix: {sum(c.sla_held for c in checks.values())}/{len(checks)} models")
    out: dict = {"plan": str(args.plan), "target": args.target, "load": args.load, "seconds": args.seconds,
                 "models": {m: c.to_dict() for m, c in checks.items()}, "sla_held": held}
    if args.replan and not _replan(args, plan, checks, out):
        held = False
    if args.out:
        write_text_atomic(args.out, json.dumps(out, indent=1))
        progress(f"wrote {args.out}")
    return 0 if held else 1


def _measure(args: argparse.Namespace, plan: Any, deployed: dict[str, Any]) -> dict[str, Any]:
    """The planned mix replayed against the deployment, every model at once; with ``--max-load`` (or
    ``--replan``) each model's max load searched too, one at a time."""
    from recserve.deploy.fleet_verify import measure_max_loads, replay_mix

    checks = replay_mix(plan, deployed, load=args.load, seconds=args.seconds, seed=args.seed, log=progress)
    if args.max_load or args.replan:
        measure_max_loads(checks, deployed, probe_s=args.probe_seconds, max_probes=args.max_probes,
                          seed=args.seed + 100, repeats=args.repeats, log=progress)
    return checks


def _explain_unanswered(checks: dict[str, Any], deployed: dict[str, Any]) -> None:
    """A model none of whose queries was answered with scores: what failed, not only that it did."""
    for m, c in checks.items():
        if c.ok == 0 and c.errors:
            errors = ", ".join(f"{kind}={n}" for kind, n in c.errors.items())
            urls = " ".join(deployed[m].urls)
            answered = any(kind.startswith("http_") or kind == "timeout" for kind in c.errors)
            print(f"{m}: no query was answered with scores ({errors}): " + (
                f"the deployment at {urls} answers, with errors or not in time: overloaded or hung? Its node logs "
                "say which" if answered else f"is the deployment up at {urls}?"), file=sys.stderr)


def _replan(args: argparse.Namespace, plan: Any, checks: dict[str, Any], out: dict) -> bool:
    """``--replan``: the plan's capacities refit where measured and predicted max loads disagree beyond
    ``--threshold``, and a new plan made and written where some do.  False where the new plan cannot serve every
    peak."""
    from recserve.planners.fleet import refit_corrections

    measured = {m: c.max_load_qps for m, c in checks.items() if c.max_load_qps}
    for m, c in checks.items():
        if c.max_load_qps == 0:  # no load met the SLA: a ratio of 0 would price the model out of every server
            print(f"replan: {m} is left as planned: no load met its SLA here ({c.max_load_reason}); check the "
                  "deployment and this host's load, then verify again")
    predicted = {m: c.predicted_qps for m, c in checks.items()}
    corrections, off = refit_corrections(plan, measured, predicted, args.threshold)
    out["disagree"] = off
    if not off:
        print(f"replan: every model's measured max load is within {100 * args.threshold:g}% of the plan's; "
              "plan kept")
        return True
    print("replan: " + ", ".join(f"{m} measured/predicted {r:.3f}" for m, r in off.items())
          + f" (beyond {100 * args.threshold:g}%); planning again with capacities corrected")
    return _write_new_plan(args, plan, corrections, out)


def _write_new_plan(args: argparse.Namespace, plan: Any, corrections: dict[str, float], out: dict) -> bool:
    """The plan made again with ``corrections``, saved (``--new-plan``, default PLAN-replanned.json) and what changed
    printed; False where it cannot serve every peak."""
    from recserve.planners.fleet import plan_changes, replan

    new = replan(plan, corrections, progress=progress)
    path = Path(args.new_plan or Path(args.plan).with_name(Path(args.plan).stem + "-replanned.json"))
    new.save(path)
    changes = plan_changes(plan, new)
    print("what changed:\n" + "\n".join(f"  {c}" for c in changes))
    print(f"wrote {path}")
    out.update(corrections=corrections, new_plan=str(path), changes=changes, new_plan_feasible=new.feasible)
    if not new.feasible:
        short = [n for n in new.notes if n.startswith("short of peak")] or ["see its notes"]
        print(f"replan: the new plan does NOT serve every peak with the measured capacities ({short[0]})",
              file=sys.stderr)
    return new.feasible


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="replay a fleet plan's traffic mix against its deployment and compare with "
                                      "the plan", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, metavar="JSON", help="`recserve plan fleet --out` file")
    p.add_argument("--target", required=True, metavar="URL|JSON",
                   help="http://HOST:PORT serving every model, or the endpoints.json `recserve deploy local` writes")
    p.add_argument("--load", type=number(0, 100, low_open=True), default=1.0,
                   help="multiple of each model's planned peak share to offer (default 1.0)")
    p.add_argument("--seconds", type=number(0, 3600, low_open=True), default=10.0,
                   help="how long to replay the mix (default 10)")
    p.add_argument("--max-load", action="store_true", help="also search each model's max load at its SLA")
    p.add_argument("--probe-seconds", type=number(0, 600, low_open=True), default=3.0,
                   help="each max-load probe's duration (default 3)")
    p.add_argument("--max-probes", type=number(2, 100, integer=True), default=10,
                   help="probes of one max-load search before it settles on the best rate that held (default 10)")
    p.add_argument("--repeats", type=number(1, 20, integer=True), default=1,
                   help="max-load searches per model; the median is kept (default 1)")
    p.add_argument("--replan", action="store_true",
                   help="plan again with measured capacities where they disagree by more than --threshold")
    p.add_argument("--threshold", type=number(0, 10), default=0.2,
                   help="relative max-load disagreement that triggers a replan (default 0.2)")
    p.add_argument("--new-plan", metavar="JSON", help="where --replan writes (default PLAN-replanned.json)")
    p.add_argument("--scale", type=number(0, 1, low_open=True),
                   help="table-row scale of the deployed models (default: from the node configs, else 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="arrival and query seed")
    p.add_argument("--out", metavar="JSON", help="write the measurements (and any replan) as JSON")
    p.set_defaults(func=run)
