"""MkDocs hook: the source tree the API reference is read from, every package under its installed name.

setup.py installs ``pipelines/`` as ``gpufeed.pipelines``, ``models/`` as ``gpufeed.models`` and
``server/`` as ``gpufeed.server`` (its ``ROOTS``). griffe, which mkdocstrings uses to read the
docstrings, finds a package's submodules by walking its folder, so it would look for
``gpufeed/pipelines/`` and find nothing; an editable install does not help, since griffe reads
setuptools' editable finder only for the folders of the top-level names. So before every build
this hook writes ``.cache/docs-src/gpufeed/``: a folder of relative symbolic links, one per entry
of ``gpufeed/`` plus one per other root, under the name the wheel gives it. griffe reads the
source without importing it, so building the docs needs neither DALI nor torch nor a GPU.

``tests/test_docs.py`` reads the same tree (:func:`write_source_tree`) to check the docstrings.

The pages are written to read on GitHub too, which needs a pipe inside a table's code span
escaped (``\\|``); Python-Markdown keeps code spans whole and would show the backslash, so
:func:`on_page_markdown` drops it there.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".cache" / "docs-src"


def package_roots(setup_py: Path = ROOT / "setup.py") -> dict[str, str]:
    """setup.py's ``ROOTS`` (installed package name -> source folder), read without running setup()."""
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ROOTS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{setup_py} has no ROOTS mapping of installed package names to folders")


def write_source_tree(tree: Path = TREE) -> Path:
    """Lays out ``tree/gpufeed/`` as the installed package looks and returns ``tree``.

    The tree is rebuilt from scratch each time, so a folder added to or removed from a root shows
    up at the next build. Links are relative, so the checkout can move.
    """
    roots = package_roots()
    top = roots.pop("gpufeed")
    package = tree / "gpufeed"
    if tree.exists():
        shutil.rmtree(tree)
    package.mkdir(parents=True)
    # One link per entry of gpufeed/, rather than one for the folder: the other roots go inside it.
    for entry in sorted((ROOT / top).iterdir()):
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(os.path.relpath(entry, package))
    for name, folder in roots.items():
        parent, _, leaf = name.rpartition(".")
        if parent != "gpufeed":
            raise RuntimeError(f"setup.py's ROOTS maps {name!r}: this hook only places roots directly under gpufeed")
        if (package / leaf).exists():
            raise RuntimeError(f"gpufeed/{leaf} exists and would hide the {folder}/ root installed as {name}")
        (package / leaf).symlink_to(os.path.relpath(ROOT / folder, package))
    return tree


# Before mkdocstrings' own on_config (priority 0), which sets up the Python handler and drops the
# search paths that do not exist yet.
@event_priority(100)
def on_config(config, **kwargs):
    """Before each build (``mkdocs serve`` rebuilds too): a fresh tree for griffe."""
    write_source_tree()
    return config


_CODE_SPAN = re.compile(r"`[^`\n]*`")


def unescape_table_code_pipes(markdown: str) -> str:
    """``\\|`` inside code spans of table rows becomes ``|``; everything else is left as written."""
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|") and "\\|" in line:
            lines[i] = _CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, **kwargs) -> str:
    """Each page's Markdown before it is rendered: GitHub's table escapes undone for Python-Markdown."""
    return unescape_table_code_pipes(markdown)
