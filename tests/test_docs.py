"""The documentation site: it builds strictly, its API reference holds every exported name with a
docstring, and its pages keep their headings apart.

The site is the one ``make test`` has just built (``GPUFEED_DOCS_SITE``), or, when this module
runs alone, a strict build made here. Broken links and anchors, pages left out of the navigation
and API pages that cannot be generated fail that build (``mkdocs.yml``'s ``validation``); what a
build does not check is checked here against what it wrote: its ``objects.inv``, the Sphinx
inventory mkdocstrings writes of every object the reference documents.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import griffe
import pytest
from markdown.extensions.toc import slugify

# A mkdocs build (when make test has not made one) and griffe both start child processes (git).
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# The public packages, each with one API page (docs/api/<leaf>.md), -> the folder of its __init__.py.
PACKAGES = {
    "gpufeed.pipelines": "pipelines",
    "gpufeed.models": "models",
    "gpufeed.train": "gpufeed/train",
    "gpufeed.server": "server",
    "gpufeed.obs": "gpufeed/obs",
    "gpufeed.reliability": "gpufeed/reliability",
    "gpufeed.synth": "gpufeed/synth",
    "gpufeed.stack": "gpufeed/stack",
    "gpufeed.doctor": "gpufeed/doctor",
    "gpufeed.predict": "gpufeed/predict",
}


def _load_hook(name: str):
    """A module of docs/ (the build's hook or griffe extension), loaded as the build loads it."""
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def public_names(package: str) -> list[str]:
    """The ``__all__`` of a package's ``__init__.py``, read without importing it."""
    init = ROOT / PACKAGES[package] / "__init__.py"
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            return [elt.value for elt in node.value.elts]
    return []


def read_inventory(path: Path) -> dict[str, str]:
    """A Sphinx ``objects.inv`` (version 2) as object name -> page URI."""
    data = path.read_bytes()
    header = data.split(b"\n", 4)
    assert header[0] == b"# Sphinx inventory version 2", f"{path}: not a version 2 inventory: {header[0]!r}"
    entries = {}
    for line in zlib.decompress(header[4]).decode().splitlines():
        # name domain:role priority uri display name
        match = re.match(r"(\S+)\s+(\S+):(\S+)\s+(-?\d+)\s+(\S+)\s+(.*)", line)
        if match:
            uri = match.group(5)
            entries[match.group(1)] = uri[:-1] + match.group(1) if uri.endswith("$") else uri
    return entries


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The built site: the one ``make test`` just built, else a strict build into a temporary folder."""
    given = os.environ.get("GPUFEED_DOCS_SITE")
    if given:
        site = Path(given)
        if not site.is_absolute():
            site = ROOT / site
        assert (site / "objects.inv").is_file(), f"GPUFEED_DOCS_SITE={given} holds no built site (no objects.inv)"
        return site
    site = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return site


@pytest.fixture(scope="module")
def griffe_packages() -> dict[str, griffe.Module]:
    """Every public package as griffe reads it for the reference: from the hook's tree, with its extension."""
    tree = _load_hook("hooks").write_source_tree()
    extensions = griffe.load_extensions(_load_hook("griffe_lazy_exports").LazyExports())
    loader = griffe.GriffeLoader(search_paths=[str(tree)], extensions=extensions, docstring_parser="google")
    packages = {name: loader.load(name) for name in PACKAGES}
    loader.resolve_aliases(external=False)
    return packages


def test_the_hook_places_every_setup_py_root_under_gpufeed():
    hooks = _load_hook("hooks")
    roots = hooks.package_roots()
    assert roots["gpufeed.pipelines"] == "pipelines" and roots["gpufeed"] == "gpufeed"
    tree = hooks.write_source_tree()
    for name, folder in roots.items():
        placed = tree.joinpath(*name.split("."), "__init__.py").resolve()
        assert placed == (ROOT / folder / "__init__.py").resolve(), f"{name} should read {folder}/, reads {placed}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_package_has_an_api_page_and_a_line_per_name_in_the_overview(package):
    leaf = package.split(".")[1]
    page = (DOCS / "api" / f"{leaf}.md").read_text()
    assert f"::: {package}" in page, f"docs/api/{leaf}.md does not generate the reference of {package}"
    overview = (DOCS / "api" / "index.md").read_text()
    missing = [n for n in public_names(package) if f"][{package}.{n}]" not in overview]
    assert not missing, f"names of {package} without a linked line in docs/api/index.md: {missing}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_exported_name_is_in_the_built_api_reference(site, package):
    names = public_names(package)
    assert names, f"{PACKAGES[package]}/__init__.py has an __all__"
    inventory = read_inventory(site / "objects.inv")
    leaf = package.split(".")[1]
    missing = [n for n in names if f"{package}.{n}" not in inventory]
    assert not missing, f"exported by {package} but not in the built API reference: {missing}"
    elsewhere = {
        n: inventory[f"{package}.{n}"] for n in names if not inventory[f"{package}.{n}"].startswith(f"api/{leaf}/")
    }
    assert not elsewhere, f"documented on another page than api/{leaf}/: {elsewhere}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_exported_name_has_a_docstring(griffe_packages, package):
    module = griffe_packages[package]
    undocumented = []
    for name in public_names(package):
        assert name in module.members, f"{package} exports {name!r}, which griffe cannot find in its source"
        obj = module.members[name]
        target = obj.final_target if isinstance(obj, griffe.Alias) else obj
        if target.docstring is None or not target.docstring.value.strip():
            undocumented.append(f"{name} ({target.path})")
    assert not undocumented, f"exported by {package} without a docstring: {undocumented}"


def _headings(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # no '#' lines of code blocks
    return [m.group(2) for m in re.finditer(r"^(#{1,6}) (.+)$", text, re.M)]


@pytest.mark.parametrize("page", sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")))
def test_headings_are_unique_per_page(page):
    # The anchor Python-Markdown gives a heading: its text without markup, slugified.
    anchors = [
        slugify(re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", h), "-") for h in _headings((DOCS / page).read_text())
    ]
    repeated = sorted(a for a, n in Counter(anchors).items() if n > 1)
    assert not repeated, f"docs/{page}: headings sharing an anchor: {repeated}"
    assert anchors, f"docs/{page} has no heading"


def test_every_page_is_built(site):
    pages = sorted(p.relative_to(DOCS).with_suffix("") for p in DOCS.rglob("*.md"))
    missing = []
    for page in pages:
        out = site / page.parent / "index.html" if page.name == "index" else site / page / "index.html"
        if not out.is_file():
            missing.append(str(page))
    assert not missing, f"pages under docs/ with no page in the built site: {missing}"


def test_table_pipes_escaped_for_github_render_plainly_in_the_site(site):
    hooks = _load_hook("hooks")
    row = r"| `obs targets\|verify` | a \| b |"
    assert hooks.unescape_table_code_pipes(row) == r"| `obs targets|verify` | a \| b |"
    in_table_code = re.compile(r"<td[^>]*>(?:(?!</td>).)*?<code>[^<]*\\\|", re.S)
    shown = [p.relative_to(site).as_posix() for p in site.rglob("*.html") if in_table_code.search(p.read_text())]
    assert not shown, f"built pages showing a backslash before a pipe in a table's code: {shown}"


def test_the_api_pages_show_names_not_sphinx_roles(site):
    roles = _load_hook("griffe_sphinx_roles")
    assert roles.plain_roles("see :class:`Batcher` and :func:`~gpufeed.models.load_model`") == (
        "see `Batcher` and `load_model`"
    )
    shown = {
        p.relative_to(site).as_posix(): sorted(
            set(re.findall(r":(?:class|func|meth|mod|data|attr|exc):", p.read_text()))
        )
        for p in (site / "api").rglob("*.html")
    }
    assert not {page: found for page, found in shown.items() if found}, f"role syntax in the built reference: {shown}"


def _parser_commands() -> set[tuple[str, ...]]:
    """Every command and subcommand the CLI's parser has, e.g. ("bench", "train")."""
    import argparse

    from gpufeed.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield (*path, name)
                    yield from walk(sub, (*path, name))

    return set(walk(build_parser(), ()))


def _documented_commands(text: str) -> set[tuple[str, ...]]:
    """The commands a page names in code spans, ``gpufeed bench soak|overload`` counting as both."""
    found = set()
    for span in re.findall(r"`(gpufeed [^`]+)`", text):
        words = []
        for word in span.replace("\\|", "|").split()[1:]:
            if not re.fullmatch(r"[a-z][a-z0-9-]*(\|[a-z][a-z0-9-]*)*", word):
                break
            words.append(word.split("|"))
        paths = [()]
        for alternatives in words:
            paths = [(*p, w) for p in paths for w in alternatives]
            found.update(paths)
    return found


def test_every_command_of_the_cli_is_on_the_command_line_page():
    documented = _documented_commands((DOCS / "cli.md").read_text())
    missing = sorted(" ".join(c) for c in _parser_commands() - documented)
    assert not missing, f"commands of `gpufeed` that docs/cli.md does not name: {missing}"
