"""``recserve report``: one HTML page from saved JSON results of bench, plan, simulate and demo."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_report(args: argparse.Namespace) -> int:
    import recserve.demo  # noqa: F401 - registers the demo renderers
    from recserve.report import report_from_files

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_from_files(args.results, args.title))
    print(out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="an HTML report from saved JSON results (bench, plan, simulate, demo)")
    r.add_argument("results", nargs="+", help="result JSON files")
    r.add_argument("--out", default="out/report.html",
                   help="HTML file to write, its folder created if missing (default %(default)s)")
    r.add_argument("--title", default="recserve report", help="the page's title (default %(default)s)")
    r.set_defaults(func=cmd_report)
