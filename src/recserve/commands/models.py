"""``recserve models list|show``: the catalogue at full size and at a live scale."""

from __future__ import annotations

import argparse
import json

from recserve.specs import ModelSpec, catalogue_models, get_model, to_dict


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f}"


def flops_per_item(spec: ModelSpec) -> int:
    from recserve.zoo.flops import dense_flops_per_item

    return dense_flops_per_item(spec)


def _row(spec: ModelSpec, scale: float) -> list[str]:
    return [
        spec.name,
        spec.family,
        str(len(spec.tables)),
        _gb(spec.embedding_bytes),
        f"{spec.scaled_embedding_bytes(scale) / 1e6:,.1f}",
        f"{flops_per_item(spec) / 1e6:,.2f}",
        f"{spec.gather_bytes_per_item / 1e3:,.1f}",
        f"p{spec.sla.percentile:g}<{spec.sla.target_ms:g}ms",
    ]


def cmd_list(args: argparse.Namespace) -> int:
    header = ["model", "family", "tables", "full GB", f"MB@{args.scale:g}", "MFLOP/item", "KB gathered/item", "SLA"]
    rows = [_row(spec, args.scale) for spec in catalogue_models().values()]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    spec = get_model(args.name)
    data = to_dict(spec)
    data["derived"] = {
        "embedding_gb_full": spec.embedding_bytes / 1e9,
        f"embedding_mb_at_scale_{args.scale:g}": spec.scaled_embedding_bytes(args.scale) / 1e6,
        "flops_per_item": flops_per_item(spec),
        "gather_bytes_per_item": spec.gather_bytes_per_item,
        "lookups_per_item": spec.lookups_per_item,
    }
    print(json.dumps(data, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list or show catalogue models")
    msub = p.add_subparsers(dest="models_cmd", metavar="ACTION", required=True)
    lp = msub.add_parser("list", help="one line per catalogue model")
    lp.add_argument("--scale", type=float, default=1e-3, help="live table-row scale for the MB column")
    lp.set_defaults(func=cmd_list)
    sp = msub.add_parser("show", help="full spec of one model as JSON")
    sp.add_argument("name")
    sp.add_argument("--scale", type=float, default=1e-3)
    sp.set_defaults(func=cmd_show)
