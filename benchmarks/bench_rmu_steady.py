"""How often a resource manager misses the SLA at a steady load: DLRM(D) beside another Hera model at constant
fractions of their max loads, on the simulated hera-xeon node of the claims table's Hera vs PARTIES rows
(``benchmarks/papers/parties.py``), for longer than those rows' 20 windows.

A controller that keeps probing a smaller allocation misses the SLA each time it tries; over a long steady run those
misses are what its p95 is made of.  Per (pair, loads) it prints the share of windows (after the warm-up) in which a
model had more than 5% of its queries over the SLA, and the share of all queries over the SLA (``--t-monitor``: the
window, 1 s as in the claims table; PARTIES' released loop reads every 0.1 s).  Run it against
another tree's policies for a before/after (``PYTHONPATH=/other/src:.``).

    PYTHONPATH=src:. .venv/bin/python -m benchmarks.bench_rmu_steady [--seconds 200] [--controllers hera,parties]
        [--out results/rmu_steady.json]
"""

from __future__ import annotations

import argparse

from benchmarks import harness
from benchmarks.papers import parties
from recserve.sim.colocate import LoadShape

PAIRS = ("hera-ncf", "hera-dlrm-a", "hera-din", "hera-wnd")
LOADS = ((0.4, 0.3), (0.6, 0.2), (0.6, 0.1))  # (DLRM(D)'s fraction x, the other model's fraction y)


def steady(node: parties.Node, controller: str, other: str, x: float, y: float, seconds: float,
           t_monitor_s: float) -> dict:
    """One run: the windows after the warm-up (``WARMUP_WINDOWS`` of the claims table's 1-s windows, in seconds)."""
    shapes = [LoadShape([(0.0, x), (seconds, x)]), LoadShape([(0.0, y), (seconds, y)])]
    res = node.run([parties.MODEL_X, other], shapes, [controller], seconds, t_monitor_s)
    windows = res["controllers"][controller]["windows"]
    measured = windows[round(parties.WARMUP_WINDOWS * parties.T_MONITOR_S / t_monitor_s):]
    bad = sum(any(v["over_sla"] > parties.MAX_SHARE_OVER * max(1, v["samples"]) for v in w["models"].values())
              for w in measured)
    over = sum(v["over_sla"] for w in measured for v in w["models"].values())
    samples = sum(v["samples"] for w in measured for v in w["models"].values())
    return {"other": other, "x": x, "y": y, "windows": len(measured), "violating_windows": bad,
            "share_over_sla": over / max(1, samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=200.0, help="simulated seconds per run (1-s windows)")
    parser.add_argument("--controllers", default="hera", help="comma-separated, of hera,parties,static")
    parser.add_argument("--t-monitor", type=float, default=parties.T_MONITOR_S,
                        help="seconds per monitoring window (PARTIES' own loop: 0.1)")
    parser.add_argument("--out", default="results/rmu_steady.json")
    args = parser.parse_args()
    from benchmarks.bench_papers import RESULTS
    from benchmarks.common.scenarios import HERA_MODELS, hera_profiles
    from recserve.specs import get_server

    node = parties.Node.on(get_server(parties.SERVER), hera_profiles(RESULTS), HERA_MODELS)
    out = {"seconds": args.seconds, "t_monitor_s": args.t_monitor, "controllers": {},
           "warmup_s": parties.WARMUP_WINDOWS * parties.T_MONITOR_S}
    print(f"{'controller':10} {'other model':12} {'x':>4} {'y':>4} {'violating windows':>18} {'queries over SLA':>17}")
    for controller in args.controllers.split(","):
        runs = [steady(node, controller, other, x, y, args.seconds, args.t_monitor) for other in PAIRS
                for x, y in LOADS]
        for r in runs:
            print(f"{controller:10} {r['other']:12} {r['x']:4.1f} {r['y']:4.1f} "
                  f"{r['violating_windows']:>9} / {r['windows']:<6} {100 * r['share_over_sla']:16.1f}%")
        bad, total = sum(r["violating_windows"] for r in runs), sum(r["windows"] for r in runs)
        met = sum(r["share_over_sla"] <= parties.MAX_SHARE_OVER for r in runs)
        print(f"{controller:10} all: {bad} of {total} windows violating ({100 * bad / total:.1f}%); p95 within the SLA "
              f"in {met} of {len(runs)} runs")
        out["controllers"][controller] = {"runs": runs, "violating_share": bad / total, "p95_met_runs": met}
    headline = [harness.row(f"{c}: windows violating an SLA at a steady load", 100 * v["violating_share"], "%")
                for c, v in out["controllers"].items()]
    print(f"wrote {harness.write_result(args.out, args, headline, out)}")


if __name__ == "__main__":
    main()
