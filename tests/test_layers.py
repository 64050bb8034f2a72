"""The package layers point one way, and no first-party modules import each other in a circle.

Every first-party module is parsed with :mod:`ast` (nothing is imported), and every import is
collected: at module level and inside functions, absolute and relative (``from . import x``),
``importlib.import_module("literal")``, and a string that names a first-party module, alone or as
``"module:function"`` (the CLI imports its command modules and handlers by such names). Two rules:

* **Layers**: a module may import its own layer and the layers below it, never one above. Bottom to
  top: core (``gpufeed/_*.py``, ``config``, ``device``, ``synth``) < ``pipelines``, ``models`` <
  ``train`` < ``server`` < ``bench``, ``obs``, ``reliability``, ``doctor``, ``predict`` < ``demo`` <
  ``commands``, ``cli``.
* **No cycles**: no modules import each other in a circle, within a package (``gpufeed.train``)
  or across packages, counting imports inside functions, which only defer a circle rather than
  remove it.
* **Deferred imports say why**: a first-party import inside a function (``import gpufeed...``,
  ``from gpufeed... import``, ``from . import``) needs a comment starting ``# Deferred`` that gives
  the reason (a heavy dependency ``gpufeed --help`` or a worker process must not load, an optional
  extra, a known exception): on the import's own line, or in the comment block right above it or
  above the run of imports it belongs to (blank lines between imports allowed); or, for a module
  whose functions all defer for one reason, one module-level comment line starting
  ``# Deferred imports:``. Every other first-party import sits at module level.

* **Packages meet at their faces**: a module imports another package's names from that package's
  ``__init__`` (``from gpufeed.pipelines import EpochLoader``), never from its private ``_*`` modules,
  so a package can rearrange its insides without touching its neighbours. A package is ``gpufeed.X``
  (``gpufeed.core`` for the ground floor; a top-level module such as ``gpufeed.cli`` is its own).
  The few deliberate exceptions are listed in :data:`PRIVATE_EXCEPTIONS` with their reason.

A short list of known exceptions (:data:`KNOWN_EXCEPTIONS`), each with its reason, is exempt.

A failure names the importing module, its line and the imported module (or the circle's modules,
or the file and line of an unexplained deferred import).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from _sources import parsed_file

ROOT = Path(__file__).resolve().parents[1]

# Source folder -> the package name it installs as (setup.py's ROOTS).
SOURCE_ROOTS = {
    "gpufeed": "gpufeed",
    "pipelines": "gpufeed.pipelines",
    "models": "gpufeed.models",
    "server": "gpufeed.server",
}

# Bottom to top. A module's layer is that of the longest prefix listed; ``gpufeed`` itself (the
# package ``__init__`` and its private ``_*`` modules) is the core.
LAYERS: list[tuple[str, list[str]]] = [
    ("core", ["gpufeed", "gpufeed.config", "gpufeed.device", "gpufeed.synth"]),
    ("pipelines/models", ["gpufeed.pipelines", "gpufeed.models"]),
    ("train", ["gpufeed.train"]),
    ("server", ["gpufeed.server"]),
    (
        "bench/obs/reliability/doctor/predict",
        ["gpufeed.bench", "gpufeed.obs", "gpufeed.reliability", "gpufeed.doctor", "gpufeed.predict"],
    ),
    ("demo", ["gpufeed.demo"]),
    ("commands/cli", ["gpufeed.commands", "gpufeed.cli", "gpufeed.__main__"]),
]

# Known exceptions, (importer, imported) -> why: each import is exempt from both checks. The test
# prints them so they stay visible, and fails when one no longer exists, so the list only shrinks.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("gpufeed.reliability._common", "gpufeed.cli"): (
        "the bad-data and disk runs call `gpufeed ...` in this process, to report the exit status and "
        "error line a user sees; a subprocess per call would change the seconds they report. It closes the "
        "circle cli -> commands.reliability -> commands._reliability_handlers (named as its handlers) -> "
        "reliability -> cli, deferred until run_cli is called"
    ),
}


# Cross-package imports of private modules, (importer, imported) -> why. Issue #33 allows at most 5.
PRIVATE_EXCEPTIONS: dict[tuple[str, str], str] = {}
MAX_PRIVATE_EXCEPTIONS = 5


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a first-party module."""

    importer: str
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.target}"


def _module_files() -> dict[str, Path]:
    """Every first-party module by its installed name (``pipelines/_dataset.py`` is ``gpufeed.pipelines._dataset``)."""
    modules = {}
    for folder, package in SOURCE_ROOTS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _module_files()


def parsed(module: str) -> ast.Module:
    """``module``'s source parsed: the session's one tree of it (``_sources.py``)."""
    return parsed_file(MODULES[module])


_NAMED_MODULE = re.compile(r"gpufeed(\.\w+)+(:\w+)?")


def _resolve(name: str) -> str | None:
    """The first-party module ``name`` refers to: itself, or the nearest enclosing package known."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _package_of(module: str) -> str:
    """The package a module's relative imports start from (a package's ``__init__`` is its own)."""
    is_package = MODULES[module].name == "__init__.py"
    return module if is_package else module.rpartition(".")[0]


def _absolute(module: str, level: int, name: str | None) -> str:
    base = _package_of(module)
    for _ in range(level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{name}" if name else base


def imports_of(module: str, tree: ast.AST | None = None) -> list[Import]:
    """Every first-party import in ``module``, at any depth of its source, resolved to module names."""
    tree = tree if tree is not None else parsed(module)
    found: dict[Import, None] = {}  # ordered, and one edge per line however many names it imports

    def add(line: int, name: str) -> None:
        target = _resolve(name)
        if target is not None and target != module:
            found[Import(module, line, target)] = None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module) if node.level else (node.module or "")
            for alias in node.names:
                # ``from pkg import sub`` imports the submodule when there is one, else a name of pkg.
                full = f"{base}.{alias.name}"
                add(node.lineno, full if full in MODULES else base)
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                name = first.value
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    name = _absolute(module, level, name.lstrip(".") or None)
                add(node.lineno, name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAMED_MODULE.fullmatch(node.value):
            name = node.value.partition(":")[0]
            # A whole module's name only (not a logger's), and not the module's own package, which
            # a package-data lookup names (resources.files("gpufeed.obs")) once it is imported.
            if name in MODULES and not module.startswith(name + "."):
                add(node.lineno, name)
    return list(found)


def _is_import_module(func: ast.expr) -> bool:
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module" and isinstance(func.value, ast.Name) and func.value.id == "importlib"
    return isinstance(func, ast.Name) and func.id == "import_module"


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the layer ``module`` belongs to (longest matching prefix)."""
    best, best_len = 0, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def upward_imports(edges: list[Import]) -> list[Import]:
    """The imports that point to a higher layer and are not in :data:`KNOWN_EXCEPTIONS`."""
    return [
        e for e in edges if layer_of(e.target) > layer_of(e.importer) and (e.importer, e.target) not in KNOWN_EXCEPTIONS
    ]


def package_of_module(module: str) -> str:
    """The package a module belongs to for the faces rule: ``gpufeed.X`` (``gpufeed.cli`` is its own)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def is_private(module: str) -> bool:
    """Whether ``module`` lies behind its package's face (a ``_*`` part below ``gpufeed.X``)."""
    return any(part.startswith("_") for part in module.split(".")[2:])


def private_crossings(edges: list[Import]) -> list[Import]:
    """The imports that reach into another package's private modules, less :data:`PRIVATE_EXCEPTIONS`."""
    return [
        e
        for e in edges
        if package_of_module(e.importer) != package_of_module(e.target)
        and is_private(e.target)
        and (e.importer, e.target) not in PRIVATE_EXCEPTIONS
    ]


def cycles(edges: list[Import]) -> list[list[Import]]:
    """One import circle per strongly connected set of modules, as its edges."""
    graph: dict[str, list[Import]] = {}
    for e in edges:
        graph.setdefault(e.importer, []).append(e)
    # Tarjan's algorithm, iterative so a deep package does not hit the recursion limit.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            out = graph.get(node, [])
            if i < len(out):
                work.append((node, i + 1))
                nxt = out[i].target
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return [_circle(graph, set(c)) for c in components]


def _circle(graph: dict[str, list[Import]], members: set[str]) -> list[Import]:
    """A shortest circle through the first member of a strongly connected set, as its import edges."""
    start = min(members)
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for e in graph.get(node, []):
            if e.target == start:
                return paths[node] + [e]
            if e.target in members and e.target not in paths:
                paths[e.target] = paths[node] + [e]
                queue.append(e.target)
    raise AssertionError(f"no circle through {start}")  # pragma: no cover - a component has one


def all_imports() -> list[Import]:
    return list(_all_imports())


@functools.cache
def _all_imports() -> tuple[Import, ...]:
    """Every module's imports, collected once per session (five checks read them; a copy each)."""
    return tuple(e for module in sorted(MODULES) for e in imports_of(module))


DEFERRED_NOTE = "# Deferred"
MODULE_DEFERRED_NOTE = "# Deferred imports:"


@dataclass(frozen=True)
class Deferred:
    """A first-party import statement inside a function."""

    module: str
    line: int
    function: str
    target: str

    def __str__(self) -> str:
        return f"{MODULES[self.module].relative_to(ROOT)}:{self.line} imports {self.target} inside {self.function}()"


def deferred_imports(module: str, tree: ast.AST) -> list[tuple[Deferred, ast.stmt]]:
    """Every first-party import statement inside a function of ``module`` (nested functions included), once."""
    found: dict[int, tuple[Deferred, ast.stmt]] = {}
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [_absolute(module, node.level, node.module) if node.level else (node.module or "")]
            else:
                continue
            targets = [t for t in map(_resolve, names) if t is not None]
            if targets:  # met once per enclosing function, outermost first: the innermost one is kept
                found[id(node)] = (Deferred(module, node.lineno, func.name, targets[0]), node)
    return sorted(found.values(), key=lambda pair: pair[0].line)


def unexplained_deferrals(module: str, source: str, tree: ast.AST | None = None) -> list[Deferred]:
    """The deferred first-party imports of ``module`` with no ``# Deferred`` comment (see the module docs).

    ``tree`` is ``source`` parsed, when the caller has it already.
    """
    lines = source.splitlines()
    if any(line.startswith(MODULE_DEFERRED_NOTE) for line in lines):
        return []
    tree = tree if tree is not None else ast.parse(source)
    import_lines = {
        n
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for n in range(node.lineno, node.end_lineno + 1)
    }
    bad = []
    for deferred, node in deferred_imports(module, tree):
        own = lines[node.lineno - 1 : node.end_lineno]
        if any(DEFERRED_NOTE in line for line in own):
            continue
        above = node.lineno - 1  # 1-based number of the line above
        while above >= 1 and (above in import_lines or not lines[above - 1].strip()):
            above -= 1
        block = []
        while above >= 1 and lines[above - 1].lstrip().startswith("#"):
            block.append(lines[above - 1].strip())
            above -= 1
        if not any(line.startswith(DEFERRED_NOTE) for line in block):
            bad.append(deferred)
    return bad


def test_every_module_has_a_layer_and_parses():
    assert "gpufeed.train._loop" in MODULES and "gpufeed.pipelines" in MODULES
    assert layer_of("gpufeed.core._text") == 0 and layer_of("gpufeed.synth._images") == 0
    assert layer_of("gpufeed.server._app") > layer_of("gpufeed.train._loop") > layer_of("gpufeed.models._io")
    assert all_imports()


def test_known_exceptions_still_exist():
    edges = {(e.importer, e.target) for e in all_imports()}
    for (importer, target), why in sorted(KNOWN_EXCEPTIONS.items()):
        print(f"known exception: {importer} -> {target}: {why}")
    stale = sorted(set(KNOWN_EXCEPTIONS) - edges)
    assert not stale, f"known exceptions that no longer exist, to remove from the list: {stale}"


def test_no_import_points_up_the_layers():
    bad = upward_imports(all_imports())
    assert not bad, "imports that point up the layers:\n" + "\n".join(
        f"  {e} ({LAYERS[layer_of(e.importer)][0]} -> {LAYERS[layer_of(e.target)][0]})" for e in bad
    )


def test_packages_meet_at_their_faces():
    edges = all_imports()
    for (importer, target), why in sorted(PRIVATE_EXCEPTIONS.items()):
        print(f"private import across packages: {importer} -> {target}: {why}")
    crossing = [
        e for e in edges if package_of_module(e.importer) != package_of_module(e.target) and is_private(e.target)
    ]
    print(len(crossing), f"cross-package imports of private modules (at most {MAX_PRIVATE_EXCEPTIONS}, each listed)")
    assert len(PRIVATE_EXCEPTIONS) <= MAX_PRIVATE_EXCEPTIONS
    stale = sorted(set(PRIVATE_EXCEPTIONS) - {(e.importer, e.target) for e in edges})
    assert not stale, f"listed private imports that no longer exist, to remove from PRIVATE_EXCEPTIONS: {stale}"
    bad = private_crossings(edges)
    assert not bad, "imports of another package's private modules (import the name from the package's face):\n" + (
        "\n".join(f"  {e}" for e in bad)
    )


def test_no_import_cycles():
    found = cycles([e for e in all_imports() if (e.importer, e.target) not in KNOWN_EXCEPTIONS])
    assert not found, "import cycles:\n" + "\n".join("  " + " -> ".join(str(e) for e in circle) for circle in found)


def test_every_deferred_import_says_why():
    """A first-party import inside a function has a ``# Deferred`` comment saying why (see the module docs)."""
    sources = {module: path.read_text(encoding="utf-8") for module, path in sorted(MODULES.items())}
    print(sum(len(deferred_imports(m, parsed(m))) for m in sources), "deferred first-party imports")
    bad = [d for module, text in sources.items() for d in unexplained_deferrals(module, text, parsed(module))]
    assert not bad, (
        "first-party imports inside functions with no '# Deferred: <why>' comment (move them to module level, "
        "or say why they wait):\n" + "\n".join(f"  {d}" for d in bad)
    )


# The checks themselves: each catches what it is there to catch.


def _edges_of(module: str, source: str) -> list[Import]:
    return imports_of(module, ast.parse(source))


@pytest.mark.parametrize(
    "source",
    [
        "from gpufeed.server import Server\n",
        "def f():\n    from gpufeed.server._app import build\n",
        "import gpufeed.server._app\n",
        "import importlib\nimportlib.import_module('gpufeed.server')\n",
        "HANDLER = 'gpufeed.server._app:build'\n",
    ],
)
def test_an_upward_import_is_caught(source):
    bad = upward_imports(_edges_of("gpufeed.train._loop", source))
    assert [(e.importer, e.target.split(".")[1]) for e in bad] == [("gpufeed.train._loop", "server")]


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("from gpufeed.pipelines._epochs import EpochLoader\n", True),
        ("def f():\n    from gpufeed.core._files import write_json\n", True),
        ("from gpufeed.core import _s3\n", True),
        ("from gpufeed.pipelines import EpochLoader\n", False),
        ("from gpufeed.core import write_json\n", False),
        ("from gpufeed.train._step import Stepper\n", False),  # its own package
    ],
)
def test_a_private_import_across_packages_is_caught(source, caught):
    bad = private_crossings(_edges_of("gpufeed.train._loop", source))
    assert bool(bad) == caught, bad


def test_a_relative_import_is_resolved():
    edges = _edges_of("gpufeed.train._loop", "from . import _session\nfrom ..bench import _common\n")
    assert [e.target for e in edges] == ["gpufeed.train._session", "gpufeed.bench._common"]
    assert [e.target for e in upward_imports(edges)] == ["gpufeed.bench._common"]


def test_a_cycle_is_caught():
    edges = [
        *_edges_of("gpufeed.train._loop", "from gpufeed.train._step import x\n"),
        *_edges_of("gpufeed.train._step", "def f():\n    from gpufeed.train import _loop\n"),
    ]
    (circle,) = cycles(edges)
    assert [(e.importer, e.line, e.target) for e in circle] == [
        ("gpufeed.train._loop", 1, "gpufeed.train._step"),
        ("gpufeed.train._step", 2, "gpufeed.train._loop"),
    ]


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    from gpufeed.pipelines import ImageLoader\n",
        "def f():\n    import gpufeed.pipelines\n",
        "def f():\n    from . import session\n",
        # A comment that does not say it is a deferral, or one cut off from the import by code.
        "def f():\n    # the loader\n    from gpufeed.pipelines import ImageLoader\n",
        "def f():\n    # Deferred: DALI.\n    x = 1\n    from gpufeed.pipelines import ImageLoader\n",
        "class C:\n    def m(self):\n        def g():\n            from gpufeed.models import ModelSpec\n",
    ],
)
def test_an_unexplained_deferred_import_is_caught(source):
    (bad,) = unexplained_deferrals("gpufeed.train._loop", source)
    assert str(bad).startswith(f"gpufeed/train/_loop.py:{bad.line} imports gpufeed.")
    assert bad.function == ("g" if "def g" in source else "f")


@pytest.mark.parametrize(
    "source",
    [
        "def f():\n    from gpufeed.pipelines import ImageLoader  # Deferred: loads DALI.\n",
        "def f():\n    # Deferred: loads DALI.\n    from gpufeed.pipelines import ImageLoader\n",
        "def f():\n    # Deferred: these load torch\n    # and DALI.\n    import torch\n\n"
        "    from gpufeed.models import ModelSpec\n    from gpufeed.pipelines import ImageLoader\n",
        "# Deferred imports: every handler loads torch.\n\n\ndef f():\n    from gpufeed.pipelines import ImageLoader\n",
        "def f():\n    import json\n",  # not first-party
        "from gpufeed.pipelines import ImageLoader\n",  # module level
    ],
)
def test_an_explained_deferred_import_passes(source):
    assert unexplained_deferrals("gpufeed.train._loop", source) == []
