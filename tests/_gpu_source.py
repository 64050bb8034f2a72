"""The GPU tests' source as the collection-time checks read it (``_gpu_checks.py``): names, calls, scopes.

A test module is parsed once (:class:`Module`: its imports, wherever they sit, its module-level
functions and constants); :func:`reachable` gives the code a test runs that can be read without
running it: its body, the module helpers and test-support functions (this folder's modules) it
calls, and the fixtures it asks for, in its module or in ``conftest.py``, each followed in turn.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).parent
_ALIASES = {"np": "numpy", "mp": "multiprocessing"}


@dataclass
class Module:
    """What the checks need of one parsed file."""

    path: Path
    tree: ast.Module
    lines: list[str]
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    constants: dict[str, ast.expr] = field(default_factory=dict)

    @classmethod
    def parse(cls, source: str, path: Path) -> Module:
        tree = ast.parse(source)
        module = cls(path, tree, source.splitlines())
        for node in ast.walk(tree):  # imports anywhere: tests import inside their bodies too
            module.imports.update(_imports_of(node))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                module.functions[node.name] = node  # type: ignore[assignment]  # async defs read alike
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                module.constants[node.targets[0].id] = node.value
        return module


def _imports_of(node: ast.AST) -> dict[str, str]:
    if isinstance(node, ast.Import):
        return {(a.asname or a.name.split(".")[0]): (a.name if a.asname else a.name.split(".")[0]) for a in node.names}
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return {(a.asname or a.name): f"{node.module}.{a.name}" for a in node.names}
    return {}


@functools.cache
def _support_module(name: str) -> Module | None:
    """A test-support module of this folder (``_serving``, ``videohelp``, ``conftest``), parsed once."""
    path = TESTS / f"{name}.py"
    if not path.is_file():
        return None
    return Module.parse(path.read_text(encoding="utf-8"), path)


def dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def qualified(module: Module, node: ast.expr) -> str | None:
    """The dotted name a call's function refers to, through the module's imports (``np`` is numpy)."""
    name = dotted(node)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    target = module.imports.get(head, _ALIASES.get(head, head))
    return f"{target}.{rest}" if rest else target


@dataclass
class Scope:
    """One function whose code the checks read, and the module it is in."""

    module: Module
    function: ast.FunctionDef

    def nodes(self) -> Iterator[ast.AST]:
        yield from ast.walk(self.function)


def reachable(module: Module, test: ast.FunctionDef, limit: int = 40) -> list[Scope]:
    """The test, the module helpers and test-support functions it calls, and the fixtures it asks for."""
    conftest = _support_module("conftest")
    seen: set[tuple[str, str]] = set()
    out: list[Scope] = []
    queue = [Scope(module, test)]
    while queue and len(out) < limit:
        scope = queue.pop(0)
        key = (str(scope.module.path), scope.function.name)
        if key in seen:
            continue
        seen.add(key)
        out.append(scope)
        fixtures = [a.arg for a in scope.function.args.args]
        for name in fixtures:
            for owner in (scope.module, conftest):
                if owner is not None and name in owner.functions and is_fixture(owner.functions[name]):
                    queue.append(Scope(owner, owner.functions[name]))
                    break
        for node in scope.nodes():
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if name in scope.module.functions:
                    queue.append(Scope(scope.module, scope.module.functions[name]))
                    continue
                target = scope.module.imports.get(name, "")
                support = _support_module(target.rpartition(".")[0]) if "." in target else None
                if support is not None and target.rpartition(".")[2] in support.functions:
                    queue.append(Scope(support, support.functions[target.rpartition(".")[2]]))
    return out


def is_fixture(function: ast.FunctionDef) -> bool:
    for decorator in function.decorator_list:
        node = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (dotted(node) or "").endswith("fixture"):
            return True
    return False
