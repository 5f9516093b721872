"""Every relative link in README.md and the docs resolves to a file or folder of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target "title")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)  # code blocks hold commands, not links


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[str]:
    targets = LINK.findall(FENCE.sub("", text))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def broken_links(doc: Path) -> list[str]:
    return [target for target in relative_links(doc.read_text(encoding="utf-8"))
            if not (doc.parent / target.split("#", 1)[0]).exists()]


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert broken_links(doc) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("x")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](there.md) [ok too](there.md#part) [web](https://example.com) [anchor](#top)\n"
                   "![img](missing.png) [gone](nowhere/file.md)\n```\n[in code](not/a/link.md)\n```\n")
    assert broken_links(doc) == ["missing.png", "nowhere/file.md"]
