"""HTML building blocks of the report page: escaping, number formatting, tables, embedded figures."""

from __future__ import annotations

import base64
import html
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
    """A value as a cell shows it: floats to 4 significant digits (thousands whole), None (JSON null) as a dash."""
    if value is None:
        return "—"
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


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path: Path) -> bool:
    """A regular file that starts as a PNG does: only those are embedded, whatever a result names."""
    try:
        with path.open("rb") as f:
            return path.is_file() and f.read(len(PNG_MAGIC)) == PNG_MAGIC
    except OSError:
        return False


def image(path: str | Path, alt: str = "") -> str:
    path = Path(path)
    if not path.exists():
        return f"<p class=muted>(figure {esc(path.name)} missing)</p>"
    if not is_png(path):
        return f"<p class=muted>(figure {esc(path.name)} is not a PNG file: not embedded)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{esc(alt or path.stem)}" src="data:image/png;base64,{data}">'


def page(title: str, sections: Iterable[str], subtitle: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title><style>{STYLE}</style>"
            f"</head><body><h1>{esc(title)}</h1><p class=muted>{esc(subtitle)}</p>{''.join(sections)}</body></html>")
