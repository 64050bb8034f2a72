"""First-party modules parsed once per test session, for the checks that read the code with :mod:`ast`.

The layer, shape, size-parsing, task-switch and source-switch checks (test_layers.py, test_shape.py,
test_size.py, test_task_heads.py, test_clip_sources.py) each read every module of gpufeed/,
pipelines/, models/ and server/; parsing was most of their time. No source changes during a
session, and the checks only walk a tree, never change it, so one tree per file serves them all.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path


def parsed_file(path: Path) -> ast.Module:
    """``path``'s source parsed: the session's one tree of that file (walk it, do not change it)."""
    return _parsed(Path(path).resolve())


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))
