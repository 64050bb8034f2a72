"""The README's structure: every heading has its own anchor, every in-page link finds one, and the
Python API section has a line for every public name.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

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


def _public_names(init: Path) -> list[str]:
    """The ``__all__`` of a package's ``__init__.py``, read without importing it."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return [elt.value for elt in node.value.elts]
    return []


def _python_api_section() -> str:
    text = README.read_text()
    start = text.index("\n## Python API\n")
    return text[start : text.index("\n## ", start + 1)]


@pytest.mark.parametrize(
    "package", ["pipelines", "models", "server", "gpufeed/train", "gpufeed/obs", "gpufeed/reliability", "gpufeed/synth"]
)
def test_every_public_name_is_in_the_python_api_section(package):
    section = _python_api_section()
    names = _public_names(README.parent / package / "__init__.py")
    assert names, f"{package}/__init__.py has an __all__"
    missing = [n for n in names if not re.search(rf"^- `{n}[(.`]", section, re.M)]
    assert not missing, f"public names without a line in the README's Python API section: {missing}"
