"""Reading the files users hand to recserve (specs, profiles, plans, calibrations) with one clear error."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError


def read_text(path: str | Path, error: type[RecserveError] = RecserveError) -> str:
    """A user's text file, or ``error`` saying in one line why it cannot be read (missing, a directory, not UTF-8)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, not a file")
    try:
        return path.read_text()
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_json(path: str | Path, error: type[RecserveError] = RecserveError, what: str = "file",
              hint: str = "") -> Any:
    """The parsed contents of ``path``; a missing file or invalid JSON raises ``error`` naming the path."""
    path = Path(path)
    if not path.exists():
        raise error(f"{path}: no such {what}" + (f" ({hint})" if hint else ""))
    try:
        return json.loads(read_text(path, error), object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from exc
    except ValueError as exc:  # a key given twice
        raise error(f"{path}: not valid JSON ({exc})") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (the last would silently win)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"duplicate key {key!r}")
        found[key] = value
    return found


PLAN_COMMANDS = {
    "fleet": "`recserve deploy local|k8s|ray --plan` or `recserve verify --plan`",
    "colocate": "`recserve deploy k8s|ray --plan`",
    "pool": "`recserve deploy k8s|ray --plan`",
    "provision": "`recserve deploy k8s|ray --plan`",
    "shard": "`recserve deploy k8s|ray --plan`",
    "tier": "`recserve deploy k8s --plan` (or name it as a node config model's options.tier.plan)",
}
"""Each registered plan kind and the commands whose ``--plan`` takes it (kept here, not read from the planners'
registry, as this layer imports no planner; tests/test_cli_help.py checks the two agree)."""


def refuse_plan(path: str | Path, what: str, error: type[RecserveError] = RecserveError) -> None:
    """Raise ``error`` when ``path`` holds a recserve plan (a mapping whose ``kind`` is a plan kind): a plan handed
    to a command that reads ``what`` would otherwise fail on the first field it does not know.  A file that is
    missing or does not parse passes: the command's own reader reports it."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())  # JSON parses as YAML
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    kind = data.get("kind") if isinstance(data, dict) else None
    if isinstance(kind, str) and kind in PLAN_COMMANDS:
        raise error(f"{path} is a {kind} plan (kind {kind!r}), not {what}; give it to {PLAN_COMMANDS[kind]}")


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all: a run stopped mid-write leaves the old file (or none), never
    a half-written one a later command would read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_output(path: str | Path, inputs: dict[str, str], error: type[RecserveError] = RecserveError,
                 flag: str = "") -> None:
    """Before a command's work: refuse an output (given as ``flag``) that would replace one of its ``inputs`` (flag
    -> path) or that cannot be written, rather than find out after the work (or overwrite the spec it was planned
    from)."""
    named = f"{flag} {path}" if flag else str(path)
    out = Path(path).resolve()
    for given_flag, given in inputs.items():
        if Path(given).resolve() == out:
            raise error(f"{named}: is also the command's {given_flag} input; write the output to another file")
    if out.is_dir():
        return  # a command's output folder
    ancestor = next(p for p in out.parents if p.exists())
    try:  # a file made where the output's folder is (or will be made): what the write will need
        if not ancestor.is_dir():
            raise NotADirectoryError(f"{ancestor} is a file")
        with tempfile.TemporaryFile(dir=out.parent if out.parent.exists() else ancestor):
            pass
    except OSError:
        raise error(f"{named}: cannot be written: {ancestor} is not a writable directory") from None
