"""One self-contained HTML page from saved results (demo runs, ``bench``, ``plan``, ``simulate``).

Figures are embedded as base64 PNG so the page can be mailed or archived as one file.  A result
JSON is rendered by a renderer chosen from its keys; anything unknown still shows as a table of
its scalar fields plus every PNG it names, so no result is silently dropped.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from recserve.jsonio import read_json

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3} td.num{text-align:right}
.ok{color:#18794e;font-weight:600} .bad{color:#c4291c;font-weight:600} .muted{color:#777}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
"""


def esc(value: Any) -> str:
    return html.escape(str(value))


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _cell(value: Any) -> str:
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    return f"<td class=num>{esc(fmt(value))}</td>" if numeric else f"<td>{esc(fmt(value))}</td>"


def table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    if not rows:
        return "<p class=muted>(no rows)</p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(r.get(c, "")) for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def image(path: str | Path, alt: str = "") -> str:
    path = Path(path)
    if not path.exists():
        return f"<p class=muted>(figure {esc(path.name)} missing)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{esc(alt or path.stem)}" src="data:image/png;base64,{data}">'


def _scalars(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"field": k, "value": v} for k, v in data.items() if isinstance(v, str | int | float | bool)]


def _pngs(data: Any, base: Path) -> list[Path]:
    found: list[Path] = []
    if isinstance(data, dict):
        for value in data.values():
            found += _pngs(value, base)
    elif isinstance(data, list):
        for value in data:
            found += _pngs(value, base)
    elif isinstance(data, str) and data.endswith(".png"):
        path = Path(data) if Path(data).is_absolute() else base / data
        if path.exists():
            found.append(path)
    return found


def generic_section(title: str, data: dict[str, Any], base: Path) -> str:
    """A result we have no dedicated renderer for: its scalar fields and the figures it names."""
    parts = [f"<h2>{esc(title)}</h2>", table(_scalars(data), ["field", "value"])]
    parts += [image(p) for p in dict.fromkeys(_pngs(data, base))]
    sibling = base / f"{Path(title).stem}.png"
    if sibling.exists() and sibling not in _pngs(data, base):
        parts.append(image(sibling))
    return "\n".join(parts)


def page(title: str, sections: Iterable[str], subtitle: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{esc(title)}</h1><p class=muted>{esc(subtitle)}</p>{''.join(sections)}</body></html>")


def report_from_files(paths: list[str | Path], title: str = "recserve report") -> str:
    sections = []
    for p in paths:
        path = Path(p)
        data = read_json(path, what="result file")  # missing or not JSON: one clear error
        render = RENDERERS.get(data.get("kind", "")) if isinstance(data, dict) else None
        if render is not None:
            sections.append(render(data, path.parent))
        elif isinstance(data, dict):
            sections.append(generic_section(path.name, data, path.parent))
        else:
            sections.append(f"<h2>{esc(path.name)}</h2><pre>{esc(json.dumps(data, indent=1)[:5000])}</pre>")
    return page(title, sections, f"from {len(paths)} result file(s)")


RENDERERS: dict[str, Any] = {}
