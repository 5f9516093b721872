"""A user's own model for the live fleet check: a small DLRM (the train_and_serve example's architecture, untrained
weights) written into a model repository, so that a fleet spec can name it by path (``REPO/ctr``).

    python examples/fleet_live/make_repo_model.py --repo out/fleet-live/repo     # writes out/fleet-live/repo/ctr/1/
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from recserve.specs import model_from_dict
from recserve.zoo import FAMILY_CLASSES
from recserve.zoo.artifacts import write_version

SPEC = dict(family="dlrm", dense_in=8, bottom_mlp=[32, 8], top_mlp=[64, 32, 1], interaction="dot",
            sla=dict(target_ms=20, percentile=95),
            tables=[dict(name="user", rows=200_000, dim=8, side="user"),
                    dict(name="item", rows=200_000, dim=8),
                    dict(name="category", rows=50, dim=8),
                    dict(name="history", rows=200_000, dim=8, pooling=3, side="user")])


def make(repo: str | Path, name: str = "ctr", seed: int = 0) -> Path:
    """Write ``REPO/<name>/1/`` (safetensors + spec.yaml); returns the model's path (its name in a fleet spec)."""
    torch.manual_seed(seed)
    spec = model_from_dict(name, SPEC)
    model = FAMILY_CLASSES[spec.family](spec, tuple(t.rows for t in spec.tables))
    write_version(model, Path(repo) / name, 1, "safetensors")
    return Path(repo) / name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", default="out/fleet-live/repo", help="model repository to write into")
    parser.add_argument("--name", default="ctr")
    args = parser.parse_args(argv)
    print(make(args.repo, args.name))


if __name__ == "__main__":
    main()
