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
