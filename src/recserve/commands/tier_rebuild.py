"""``recserve tier rebuild``: check every SSD table file a node config uses and rewrite the bad ones from DRAM.

Example::

    recserve tier rebuild --config node-sdm.yaml            # every model with a ``tier:`` section
    recserve tier rebuild --config node-sdm.yaml --model m1

A table file is rebuilt when it is missing, truncated, corrupt (header, footer or any block checksum), or was
written from other weights (a file swapped in under the same name).  The DRAM copy is the model the config
describes (catalogue spec, scale, seed; a repository model's own weights, its newest selected version), built here
exactly as a worker builds it; files that pass are kept.
"""

from __future__ import annotations

import argparse

from recserve.errors import RecserveError


def cmd_rebuild(args: argparse.Namespace) -> int:
    from recserve.embedding.tiered import TieredTable, tier_from_config
    from recserve.serving.node.config import load_config
    from recserve.serving.worker.main import dram_model

    config = load_config(args.config)
    served = list(config.models) + _repository_models(config.repository)
    chosen = [m for m in served if (m.options or {}).get("tier") and args.model in (None, m.name)]
    if not chosen:
        raise RecserveError(f"{args.config}: no served model with a 'tier:' section"
                            + (f" named {args.model!r} (--model)" if args.model else ": nothing to rebuild"))
    for cfg in chosen:
        model = dram_model(cfg)
        resources = tier_from_config(model, cfg.options["tier"], f"model {cfg.name!r} tier", rebuild=True)
        tables = [t for t in model.tables if isinstance(t, TieredTable)]
        for t in tables:
            t.close()
        written = resources.rebuilt
        names = ", ".join(written[:4]) + (f", ... ({len(written) - 4} more)" if len(written) > 4 else "")
        print(f"{cfg.name}: {len(tables)} table file(s) in {cfg.options['tier']['dir']}: {len(tables) - len(written)} "
              f"valid, {len(written)} (re)written from DRAM" + (f": {names}" if written else ""))
        if written:
            print(f"note: a node serving {cfg.name} reads the rewritten files once its workers are replaced "
                  f"(`POST /control/models/{cfg.name}/workers` with {{\"workers\": N, \"replace\": true}}, N its "
                  "count; or a restart)")
    return 0


def _repository_models(root: str | None) -> list:
    """The newest selected version of each model of the config's repository (``tiering:`` in its config.yaml)."""
    if not root:
        return []
    from recserve.serving.node.repository import Repository

    repo = Repository(root)
    return [repo.model_config(name, repo.selected_versions(name)[-1]) for name in repo.names()]


def register(actions: argparse._SubParsersAction) -> None:
    p = actions.add_parser("rebuild", help="rewrite missing or corrupt SSD table files from the DRAM weights",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="the node config YAML that serves the tiered model(s)")
    p.add_argument("--model", help="only this served model (default: every model with a tier)")
    p.set_defaults(func=cmd_rebuild)
