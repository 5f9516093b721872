"""Reading JSON files users hand to recserve (profiles, plans, calibrations) with one clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError


def read_json(path: str | Path, error: type[RecserveError] = RecserveError, what: str = "file",
              hint: str = "") -> Any:
    """The parsed contents of ``path``; a missing file or invalid JSON raises ``error`` naming the path."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {what}" + (f" ({hint})" if hint else ""))
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from exc
