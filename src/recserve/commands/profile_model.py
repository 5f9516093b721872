"""``recserve profile model``: Profile tables for server types we cannot run, from the calibrated perfmodel.

Example::

    recserve profile model --models hercules-rmc1,kairos-ncf --servers hera-xeon,g4dn.xlarge \\
        --calibration calibration.json --out profiles/modelled.json
"""

from __future__ import annotations

import argparse

from recserve.commands._plan_common import names, progress
from recserve.errors import RecserveError
from recserve.perfmodel import model_profiles
from recserve.planners.hercules.search import efficiency_tables
from recserve.specs import catalogue_models, catalogue_servers, get_model, get_server


def _pick(text: str, catalogue: dict, getter, what: str) -> list:
    chosen = names(text)
    if not chosen:
        raise RecserveError(f"--{what} needs at least one name (or 'all')")
    if chosen == ["all"]:
        return list(catalogue.values())
    return [getter(n) for n in chosen]


def cmd_profile_model(args: argparse.Namespace) -> int:
    specs = _pick(args.models, catalogue_models(), get_model, "models")
    servers = _pick(args.servers, catalogue_servers(), get_server, "servers")
    profiles = model_profiles(specs, servers, args.calibration, tables=args.tables,
                              extra=None if args.no_efficiency else efficiency_tables, progress=progress)
    profiles.save(args.out)
    for spec in specs:
        for server in servers:
            eff = profiles.find(spec.name, server.name, "efficiency")
            lat = profiles.find(spec.name, server.name, "latency_vs_batch")[0]
            at = {int(r[0]): r[1] for r in lat.rows}
            best = f"{eff[0].rows[0][0]:10.1f} QPS at {eff[0].rows[0][1]:6.0f} W" if eff and eff[0].rows else "   —"
            print(f"{spec.name:18s} {server.name:14s} latency b=64 {at.get(64, float('nan')):8.2f} ms  "
                  f"b=512 {at.get(512, float('nan')):8.2f} ms  best {best}")
    progress(f"wrote {len(profiles)} modelled tables to {args.out}")
    return 0


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("model", help="model Profile tables for server types we cannot run (perfmodel)")
    p.add_argument("--models", required=True, help="comma-separated catalogue models, or 'all'")
    p.add_argument("--servers", required=True, help="comma-separated server types, or 'all'")
    p.add_argument("--calibration", metavar="FILE", help="calibration JSON (default: bundled constants)")
    p.add_argument("--tables", choices=("shared", "copied"), default="shared",
                   help="workers share one copy of the tables (threads) or each holds a copy (processes)")
    p.add_argument("--no-efficiency", action="store_true", help="skip the Hercules search for efficiency tuples")
    p.add_argument("--out", default="profiles/modelled.json", help="output ProfileSet JSON")
    p.set_defaults(func=cmd_profile_model)
