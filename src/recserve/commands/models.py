"""``recserve models list|show|servers``: the catalogue at full size and at a live scale;
``recserve models list|load|unload --server URL``: a running node's model repository.

``--file PATH`` reads a user's YAML catalogue instead of (``list``, ``servers``) or on top of (``show``)
the bundled one, so a malformed or invalid file is reported as one clear error line.
"""

from __future__ import annotations

import argparse
import json
import sys

from recserve.commands._plan_common import positive
from recserve.errors import SpecError
from recserve.specs import (
    ModelSpec,
    ServerType,
    catalogue_models,
    catalogue_servers,
    get_model,
    load_models,
    load_servers,
    to_dict,
)

# Models whose dense layers hold more parameters than this are not instantiated to count FLOPs
# (sdm-m3's 6000-wide MLPs over 2700 concatenated tables would need ~13 GB); they get an estimate.
MAX_BUILD_DENSE_PARAMS = 200_000_000


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


def rough_dense_params(spec: ModelSpec) -> int:
    """Weights of the bottom and top MLPs (and towers) of a concat/dot model: a size guard and estimate."""
    bottom_out = spec.bottom_mlp[-1] if spec.bottom_mlp else spec.dense_in
    n = len(spec.tables) + 1
    if spec.interaction == "dot":
        top_in = bottom_out + n * (n - 1) // 2
    else:
        top_in = bottom_out + sum(t.dim for t in spec.tables)
    total, width = 0, spec.dense_in
    for w in spec.bottom_mlp:
        total, width = total + width * w, w
    width = top_in
    for w in spec.top_mlp:
        total, width = total + width * w, w
    for _ in range(spec.towers if spec.tower_mlp else 0):
        tw = width
        for w in spec.tower_mlp:
            total, tw = total + tw * w, w
    return total


def flops_per_item(spec: ModelSpec) -> tuple[int | None, str]:
    """(FLOPs, how) — counted on the built zoo model, estimated if too big, None if the zoo lacks the family."""
    if spec.dense_flops:
        return int(spec.dense_flops), "counted"  # on the program a repository model was derived from
    rough = rough_dense_params(spec)
    if rough > MAX_BUILD_DENSE_PARAMS:
        return 2 * rough, "estimated"
    from recserve.zoo.flops import dense_flops_per_item

    try:
        return dense_flops_per_item(spec), "counted"
    except SpecError:
        return None, "n/a"  # family not implemented by the zoo yet


def _flops_cell(spec: ModelSpec) -> str:
    flops, how = flops_per_item(spec)
    if flops is None:
        return "n/a"
    return f"{'~' if how == 'estimated' else ''}{flops / 1e6:,.2f}"


def _row(spec: ModelSpec, scale: float) -> list[str]:
    return [
        spec.name,
        spec.family,
        str(len(spec.tables)),
        _gb(spec.embedding_bytes),
        f"{spec.scaled_embedding_bytes(scale) / 1e6:,.1f}",
        _flops_cell(spec),
        f"{spec.gather_bytes_per_item / 1e3:,.1f}",
        f"p{spec.sla.percentile:g}<{spec.sla.target_ms:g}ms",
    ]


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _check_scale(scale: float) -> None:
    if not 0 < scale <= 1:
        raise SpecError(f"--scale must be in (0, 1], got {scale}")


def cmd_list(args: argparse.Namespace) -> int:
    if args.server:
        return _server_index(args.server)
    _check_scale(args.scale)
    models = load_models(args.file) if args.file else catalogue_models()
    header = ["model", "family", "tables", "full GB", f"MB@{args.scale:g}", "MFLOP/item", "KB gathered/item", "SLA"]
    _print_table(header, [_row(spec, args.scale) for spec in models.values()])
    print("MFLOP/item: counted on the zoo model; ~ = estimated (too large to build here); "
          "n/a = family not in the zoo yet", file=sys.stderr)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    _check_scale(args.scale)
    spec = get_model(args.name, extra=load_models(args.file) if args.file else None)
    flops, how = flops_per_item(spec)
    data = to_dict(spec)
    data["derived"] = {
        "embedding_gb_full": spec.embedding_bytes / 1e9,
        f"embedding_mb_at_scale_{args.scale:g}": spec.scaled_embedding_bytes(args.scale) / 1e6,
        "flops_per_item": flops,
        "flops_per_item_how": how,
        "gather_bytes_per_item": spec.gather_bytes_per_item,
        "lookups_per_item": spec.lookups_per_item,
    }
    print(json.dumps(data, indent=2))
    return 0


def _server_row(s: ServerType) -> list[str]:
    accel = f"{s.accelerator} {s.accel_tflops:g}TF/{s.accel_mem_gb:g}GB" if s.accelerator else "-"
    ssd = f"{s.ssd.kind} {s.ssd.iops / 1e6:g}MIOPS {s.ssd.read_latency_us:g}us" if s.ssd else "-"
    return [
        s.name, str(s.cores), f"{s.freq_ghz:g}", f"{s.llc_mb:g}/{s.llc_ways}", f"{s.mem_gb:g}", f"{s.mem_bw_gbs:g}",
        f"{s.peak_gflops:,.0f}", "yes" if s.nmp else "-", accel[:34], ssd,
        "-" if s.price_per_hr is None else f"{s.price_per_hr:g}",
        "-" if s.power_w is None else f"{s.power_w:g}", str(len(s.assumptions)),
    ]


def cmd_servers(args: argparse.Namespace) -> int:
    servers = load_servers(args.file) if args.file else catalogue_servers()
    if args.name:
        if args.name not in servers:
            raise SpecError(f"unknown server type {args.name!r}; known: {', '.join(sorted(servers))}")
        print(json.dumps(to_dict(servers[args.name]), indent=2))
        return 0
    header = ["server", "cores", "GHz", "LLC MB/ways", "mem GB", "mem GB/s", "GFLOPS", "NMP", "accelerator",
              "SSD", "$/hr", "power W", "assumptions"]
    _print_table(header, [_server_row(s) for s in servers.values()])
    return 0


def _server_index(url: str) -> int:
    from recserve.serving.node.control_client import ControlClient

    rows = [[e.get("name", ""), e.get("version", ""), e.get("state", ""), e.get("reason", "")]
            for e in ControlClient.from_url(url).repository_index()]
    _print_table(["model", "version", "state", "reason"], rows)
    return 0


def cmd_load(args: argparse.Namespace) -> int:
    from recserve.serving.node.control_client import ControlClient

    client = ControlClient.from_url(args.server)
    client.load_model(args.name)
    serving = [e for e in client.repository_index() if e.get("name") == args.name and e.get("state") == "READY"]
    print(f"loaded {args.name}: version(s) {', '.join(e['version'] for e in serving)} serving")
    return 0


def cmd_unload(args: argparse.Namespace) -> int:
    from recserve.serving.node.control_client import ControlClient

    ControlClient.from_url(args.server).unload_model(args.name)
    print(f"unloaded {args.name}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="catalogue models and server types; a node's repository (load/unload/list)")
    msub = p.add_subparsers(dest="models_cmd", metavar="ACTION", required=True)
    lp = msub.add_parser("list", help="one line per catalogue model, or per model of a running node (--server)")
    lp.add_argument("--scale", type=positive, default=1e-3, help="live table-row scale for the MB column")
    lp.add_argument("--file", help="a YAML catalogue of models to list instead of the bundled one")
    lp.add_argument("--server", help="list a running node's model repository instead (http://HOST:PORT)")
    lp.set_defaults(func=cmd_list)
    for action, func, what in (("load", cmd_load, "load (or reload: a new version swaps in) a repository model"),
                               ("unload", cmd_unload, "unload every version of a model")):
        ap = msub.add_parser(action, help=f"{what} on a running node")
        ap.add_argument("name", help="the model's name in the node's repository")
        ap.add_argument("--server", required=True,
                        help="the node's HTTP address, http://HOST:PORT (a node with a control token: set "
                             "RECSERVE_CONTROL_TOKEN)")
        ap.set_defaults(func=func)
    sp = msub.add_parser("show", help="full spec of one model as JSON")
    sp.add_argument("name", help="a catalogue model name or a repository model's path, REPO/<model>")
    sp.add_argument("--scale", type=positive, default=1e-3,
                    help="live table-row scale for the derived embedding MB (default %(default)s)")
    sp.add_argument("--file", help="a YAML catalogue of models searched on top of the bundled one")
    sp.set_defaults(func=cmd_show)
    vp = msub.add_parser("servers", help="one line per server type, or one as JSON")
    vp.add_argument("name", nargs="?", help="print this server type as JSON (default: the table of all)")
    vp.add_argument("--file", help="a YAML catalogue of server types instead of the bundled one")
    vp.set_defaults(func=cmd_servers)
