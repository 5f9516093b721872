"""``recserve demo``: the whole pipeline on this host — profile, plan, serve, adapt, report."""

from __future__ import annotations

import argparse
from pathlib import Path

from recserve.commands._plan_common import positive


def cmd_demo(args: argparse.Namespace) -> int:
    from recserve.demo import run_demo

    return run_demo(Path(args.out), scale=args.scale, live_seconds=args.live_seconds, window_s=args.window_s,
                    quick=not args.full)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="profile, plan, serve and adapt on this host; write an HTML report",
                       description="The whole pipeline on this host: profile two models, run the planners, serve "
                                   "them live under a compressed day of load with Hera's resource manager against a "
                                   "static split, and write every result and report.html to --out.  Ends by itself "
                                   "(exit status 1 if a step failed); Ctrl-C stops it early.")
    p.add_argument("--out", default="out/demo", help="folder for every result, figure and report.html")
    p.add_argument("--scale", type=positive, default=1e-3, help="table-row scale of the live models")
    p.add_argument("--live-seconds", type=positive, default=90.0, help="length of the compressed day under load")
    p.add_argument("--window-s", type=positive, default=3.0, help="monitoring window of the resource manager")
    p.add_argument("--full", action="store_true", help="full profiling instead of --quick")
    p.set_defaults(func=cmd_demo)
