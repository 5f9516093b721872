"""Where the bundled reference data lives (see ``recserve/data/README.md``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from recserve.errors import RecserveError


def reference_path(name: str) -> Path:
    """Path of a bundled reference file, e.g. ``kairos_aws_latency.json``."""
    path = Path(str(resources.files("recserve") / "data" / name))
    if not path.exists():
        raise RecserveError(f"no bundled reference file {name!r} (looked in {path.parent})")
    return path


BUNDLED = {"kairos": "kairos_aws_latency.json"}


def resolve_reference(arg: str) -> Path:
    """A ``--reference`` argument: a file path, or ``kairos`` for the bundled Kairos AWS latencies."""
    if arg in BUNDLED:
        return reference_path(BUNDLED[arg])
    path = Path(arg)
    if not path.exists():
        raise RecserveError(f"{arg}: no such reference file (or use the bundled one: --reference kairos)")
    return path
