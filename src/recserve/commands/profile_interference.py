"""``recserve profile interference``: measure co-location interference on this host (no resctrl needed).

Runs each model alone and beside a co-runner on another core: a process occupying a known number of MB of
the LLC, a memory-streaming process, and each other model; plus a table-size sweep across the LLC.  Writes
a ProfileSet of slowdown tables (see ``recserve.measure.interference``) and prints them.

    recserve profile interference --models hera-ncf,hera-dlrm-a --seconds 1 --out profiles/interference.json
"""

from __future__ import annotations

import argparse

from recserve.commands._plan_common import check_half_memory, count, names, number, number_list, positive, progress
from recserve.errors import RecserveError
from recserve.specs import get_model

MAX_SECONDS = 60.0


multiples = number_list(0, low_open=True)
"""``--occupy`` / ``--table-sweep``: comma-separated finite numbers > 0 ('' = none)."""


def cmd_profile_interference(args: argparse.Namespace) -> int:
    from recserve.hostinfo import this_host
    from recserve.measure.interference import measure_interference, summary_lines

    specs = [get_model(m) for m in names(args.models, "models")]
    if not specs:
        raise RecserveError("--models needs at least one catalogue model")
    llc_mb = args.llc_mb or this_host()["llc_mb"]
    fractions, sweep = args.occupy, args.table_sweep
    if fractions:  # the co-runner's buffers (a table sweep is held to the model's own tables)
        check_half_memory(max(fractions) * llc_mb, f"--occupy {max(fractions):g} x the {llc_mb:g} MB LLC")
    profiles = measure_interference(specs, max_table_mb=args.max_table_mb, batch=args.batch, seconds=args.seconds,
                                    llc_mb=llc_mb, occupy_fractions=fractions, table_sweep=sweep,
                                    pairs=not args.no_pairs, progress=progress)
    profiles.save(args.out)
    for line in summary_lines(profiles):
        print(line)
    progress(f"wrote {args.out}")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("interference", help="measure co-location slowdowns on this host (LLC, bandwidth, pairs)",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated catalogue model names")
    p.add_argument("--max-table-mb", type=positive, default=128.0, help="shrink each model's tables to at most this")
    p.add_argument("--batch", type=count, default=64, help="items per query")
    p.add_argument("--seconds", type=number(0, MAX_SECONDS, low_open=True), default=1.0,
                   help=f"timing per run (each condition runs 3), at most {MAX_SECONDS:g}")
    p.add_argument("--llc-mb", type=positive, default=None, help="LLC size (default: detected)")
    p.add_argument("--occupy", type=multiples, default="0.25,0.5,1,2",
                   help="co-runner buffer sizes as fractions of the LLC")
    p.add_argument("--table-sweep", type=multiples, default="0.25,1,4",
                   help="table sizes as multiples of the LLC ('' = none)")
    p.add_argument("--no-pairs", action="store_true", help="skip model-with-model runs")
    p.add_argument("--out", default="interference.json", help="Profile JSON to write (default %(default)s)")
    p.set_defaults(func=cmd_profile_interference)
