"""docs/index.md links every page of docs/ and every decision, and each of its links resolves."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_index_links_every_page_and_nothing_missing() -> None:
    index = (DOCS / "index.md").read_text()
    links = set(re.findall(r"\]\(([^)#]+\.md)\)", index))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if p.name != "index.md"}
    assert pages - links == set(), "pages the index does not link"
    assert {link for link in links if not (DOCS / link).is_file()} == set()
