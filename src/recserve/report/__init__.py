"""One self-contained HTML page from saved results (demo runs, ``bench``, ``profile``, ``plan``, ``simulate``).

Figures are embedded as base64 PNG so the page can be mailed or archived as one file.  A result JSON is rendered
by the renderer of its ``kind``: the demo's registered in :data:`RENDERERS`, bench results and profile sets laid
out by :mod:`recserve.report.results`; any other result shows every field it holds (nested mappings flattened,
lists of records as tables, :mod:`recserve.report.structure`) plus every PNG it names, so no result is silently
dropped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from recserve.errors import RecserveError
from recserve.jsonio import read_json
from recserve.report.html import STYLE, esc, fmt, image, is_png, page, table
from recserve.report.results import BODIES, is_profile_set, profile_set
from recserve.report.structure import render_value

__all__ = ["FIELDS", "RENDERERS", "STYLE", "esc", "fmt", "generic_section", "image", "page", "register",
           "report_from_files", "table"]

JSON_TYPES = {dict: "mapping", list: "list", str: "string", bool: "true/false", int: "number", float: "number"}


def _pngs(data: Any, base: Path) -> list[Path]:
    """The PNG files a result names: only real PNGs in its own folder or below (not ``../`` or elsewhere)."""
    found: list[Path] = []
    if isinstance(data, dict):
        for value in data.values():
            found += _pngs(value, base)
    elif isinstance(data, list):
        for value in data:
            found += _pngs(value, base)
    elif isinstance(data, str) and data.endswith(".png"):
        path = (base / data).resolve()  # an absolute name stays as it is
        if path.is_relative_to(base.resolve()) and is_png(path):
            found.append(path)
    return found


def _figures(title: str, data: dict[str, Any], base: Path) -> list[str]:
    """The PNGs a result names, and the one beside it with its file's stem (``bench --plot``'s usual place)."""
    named = list(dict.fromkeys(_pngs(data, base)))
    sibling = (base / f"{Path(title).stem}.png").resolve()
    if is_png(sibling) and sibling not in named:
        named.append(sibling)
    return [image(p) for p in named]


def _body(data: dict[str, Any]) -> str:
    """The tables of one result: its kind's layout, a profile set's tables, or every field structurally."""
    kind = data.get("kind")
    if isinstance(kind, str) and kind in BODIES:
        return BODIES[kind](data)
    if is_profile_set(data):
        return profile_set(data)
    return render_value(data)


def generic_section(title: str, data: dict[str, Any], base: Path) -> str:
    """A result without a registered renderer: its measured content as tables and the figures it names."""
    kind = data.get("kind")
    heading = f"{title} ({kind})" if isinstance(kind, str) and kind else title
    return "\n".join([f"<h2>{esc(heading)}</h2>", _body(data), *_figures(title, data, base)])


def _json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def check_fields(path: Path, data: dict[str, Any]) -> None:
    """A result of a known kind has the top-level fields its renderer reads, of the right JSON type: else one
    error naming the file and the field (a renderer would fail with a traceback)."""
    kind = data.get("kind")
    if "kind" in data and not isinstance(kind, str):
        raise RecserveError(f"{path}: field 'kind' must be a string, not a {_json_type(kind)}")
    for name, wanted in FIELDS.get(kind, {}).items():
        if name not in data:
            raise RecserveError(f"{path}: a {kind} result needs field {name!r}")
        if not isinstance(data[name], wanted) or isinstance(data[name], bool) and wanted is not bool:
            raise RecserveError(f"{path}: field {name!r} of a {kind} result must be a {JSON_TYPES[wanted]}, "
                                f"not a {_json_type(data[name])}")


def _section(path: Path, data: dict[str, Any]) -> str:
    """One result's section; a malformed record deeper inside is one error naming the file, not a traceback."""
    check_fields(path, data)
    kind = data.get("kind")
    try:
        render = RENDERERS.get(kind)
        return render(data, path.parent) if render is not None else generic_section(path.name, data, path.parent)
    except KeyError as exc:
        raise RecserveError(f"{path}: a record of this {kind or 'result'} lacks field {exc.args[0]!r}") from exc
    except (TypeError, ValueError, AttributeError, IndexError) as exc:
        raise RecserveError(f"{path}: a field of this {kind or 'result'} has the wrong type or value ({exc})") from exc


def report_from_files(paths: list[str | Path], title: str = "recserve report") -> str:
    sections = []
    for p in paths:
        path = Path(p)
        data = read_json(path, what="result file")  # missing or not JSON: one clear error
        if isinstance(data, dict):
            sections.append(_section(path, data))
        else:
            sections.append(f"<h2>{esc(path.name)}</h2><pre>{esc(json.dumps(data, indent=1)[:5000])}</pre>")
    return page(title, sections, f"from {len(paths)} result file(s)")


RENDERERS: dict[str, Any] = {}
"""Renderers of whole sections by result kind, ``(data, folder) -> html`` (the demo's register here)."""
FIELDS: dict[str, dict[str, type]] = {
    "load_run": {"latency_ms": dict, "errors": dict}, "max_load": {"probes": list}, "sweep": {"probes": list},
    "offload_threshold": {"results": list},
}
"""The top-level fields, and their JSON types, each known kind's renderer reads."""


def register(kind: str, render: Any, **fields: type) -> None:
    """Render results of ``kind`` with ``render``; ``fields``: the top-level fields it needs and their types."""
    RENDERERS[kind] = render
    FIELDS[kind] = fields
