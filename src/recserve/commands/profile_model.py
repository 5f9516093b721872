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


def _ms(value: float | None) -> str:
    return f"{value:8.2f} ms" if value is not None else f"{'—':>8s} ms"


def cmd_profile_model(args: argparse.Namespace) -> int:
    specs = _pick(args.models, catalogue_models(), get_model, "models")
    servers = _pick(args.servers, catalogue_servers(), get_server, "servers")
    profiles = model_profiles(specs, servers, args.calibration, tables=args.tables,
                              extra=None if args.no_efficiency else efficiency_tables, progress=progress)
    if args.interference:
        profiles = _measured_ways(profiles, specs, servers, args.interference)
    stated = {server.name: list(server.assumptions) for server in servers if server.assumptions}
    if stated:  # e.g. this-host's power and memory bandwidth: estimates, said so in the file and here
        profiles.meta["server_assumptions"] = stated
        for name, lines in stated.items():
            for line in lines:
                progress(f"assumption ({name}): {line}")
    profiles.save(args.out)
    for spec in specs:
        for server in servers:
            eff = profiles.find(spec.name, server.name, "efficiency")
            lat = profiles.find(spec.name, server.name, "latency_vs_batch")[0]
            at = {int(r[0]): r[1] for r in lat.rows}
            best = f"{eff[0].rows[0][0]:10.1f} QPS at {eff[0].rows[0][1]:6.0f} W" if eff and eff[0].rows else "   —"
            print(f"{spec.name:18s} {server.name:14s} latency b=64 {_ms(at.get(64))}  b=512 {_ms(at.get(512))}  "
                  f"best {best}")
    progress(f"wrote {len(profiles)} modelled tables to {args.out}")
    return 0


def _measured_ways(profiles, specs: list, servers: list, path: str):
    """Replace the modelled ``maxload_vs_ways`` tables of every measured model by ones built from its measured
    LLC sensitivity (``recserve profile interference``), on every server type with LLC ways."""
    from recserve.perfmodel.interference import fit_interference, with_measured_ways
    from recserve.profiles import ProfileSet

    measured = ProfileSet.load(path)
    have = {t.model for t in measured.find(kind="slowdown_vs_llc_occupied")}
    fits = {s.name: fit_interference(measured, s.name) for s in specs if s.name in have}
    if not fits:
        raise RecserveError(f"{path}: no measured LLC sensitivity for any of {[s.name for s in specs]} (`recserve "
                            "profile interference --models ... --out FILE` measures it)")
    for server in servers:
        if server.llc_ways > 0:
            profiles = with_measured_ways(profiles, server.name, fits, server.llc_mb, server.llc_ways)
    progress(f"maxload_vs_ways from measured LLC sensitivity for {sorted(fits)}")
    return profiles


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("model", help="model Profile tables for server types we cannot run (perfmodel)")
    p.add_argument("--models", required=True, help="comma-separated catalogue models, or 'all'")
    p.add_argument("--servers", required=True, help="comma-separated server types, or 'all'")
    p.add_argument("--calibration", metavar="FILE", help="calibration JSON (default: bundled constants)")
    p.add_argument("--tables", choices=("shared", "copied"), default="shared",
                   help="workers share one copy of the tables (threads) or each holds a copy (processes)")
    p.add_argument("--no-efficiency", action="store_true", help="skip the Hercules search for efficiency tuples")
    p.add_argument("--interference", metavar="FILE",
                   help="measured interference (`recserve profile interference`): Hera's ways tables from it")
    p.add_argument("--out", default="profiles/modelled.json", help="output ProfileSet JSON")
    p.set_defaults(func=cmd_profile_model)
