"""Any JSON value as tables: the fallback that keeps every field of a result on the page.

A mapping's scalars (nested mappings flattened to dotted names, lists of scalars joined) form one field/value
table; each list of mappings or of lists becomes a table of its own.  Nothing is left out, so a result kind with
no dedicated renderer still shows all it measured.
"""

from __future__ import annotations

import json
from typing import Any

from recserve.report.html import esc, table

Scalar = str | int | float | bool | None


def is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _joined(values: list[Any]) -> str:
    return ", ".join("null" if v is None else str(v) for v in values)


class Flattened:
    """One mapping split into dotted scalar fields and named tables (lists of rows)."""

    def __init__(self, data: dict[str, Any], prefix: str = "") -> None:
        self.fields: dict[str, Any] = {}
        self.tables: list[tuple[str, list[dict[str, Any]]]] = []
        self._add(data, prefix)

    def _add(self, data: dict[str, Any], prefix: str) -> None:
        for key, value in data.items():
            name = f"{prefix}{key}"
            if is_scalar(value):
                self.fields[name] = value
            elif isinstance(value, dict):
                self._add(value, f"{name}.")
            elif all(is_scalar(v) for v in value):
                self.fields[name] = _joined(value)
            elif all(isinstance(v, dict) for v in value):
                self.tables.append((name, [row_of(v) for v in value]))
            elif all(isinstance(v, list) for v in value):
                self.tables.append((name, [{str(i): cell(c) for i, c in enumerate(v)} for v in value]))
            else:
                self.fields[name] = json.dumps(value)


def cell(value: Any) -> Any:
    """A table cell: scalars as they are, lists of scalars joined, anything else as compact JSON."""
    if is_scalar(value):
        return value
    if isinstance(value, list) and all(is_scalar(v) for v in value):
        return _joined(value)
    return json.dumps(value)


def row_of(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A mapping as one table row: nested mappings flattened to dotted columns."""
    row: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            row.update(row_of(value, f"{prefix}{key}."))
        else:
            row[f"{prefix}{key}"] = cell(value)
    return row


def columns_of(rows: list[dict[str, Any]]) -> list[str]:
    """Every column any row has, in first-seen order."""
    return list(dict.fromkeys(c for r in rows for c in r))


def render_value(data: Any, heading: str = "h3") -> str:
    """``data`` (any JSON value) as HTML tables, every leaf shown."""
    if isinstance(data, dict):
        flat = Flattened(data)
        parts = [table([{"field": k, "value": v} for k, v in flat.fields.items()], ["field", "value"])
                 if flat.fields else ""]
        for name, rows in flat.tables:
            parts.append(f"<{heading}>{esc(name)}</{heading}>" + table(rows, columns_of(rows)))
        return "".join(parts)
    return render_value({"value": data}, heading)
