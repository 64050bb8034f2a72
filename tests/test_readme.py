"""The README's structure: every heading has its own anchor and every in-page link finds one."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings() -> list[str]:
    text = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.M | re.S)  # no '#' lines of code blocks
    return [m.group(2) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.M)]


def test_headings_are_unique():
    repeated = sorted(h for h, n in Counter(_anchor(h) for h in _headings()).items() if n > 1)
    assert not repeated, f"headings sharing an anchor: {repeated}"


def test_in_page_links_point_at_headings():
    anchors = {_anchor(h) for h in _headings()}
    links = set(re.findall(r"\]\(#([^)]+)\)", README.read_text()))
    assert links, "the README links within itself"
    assert links <= anchors, f"links to missing headings: {sorted(links - anchors)}"
