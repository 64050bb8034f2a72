"""griffe extension: the names a package exports lazily, through a module ``__getattr__`` (PEP 562).

``gpufeed.server`` imports its exports on first use, so that a process importing one light part
of it (the request-parsing workers) does not load torch, DALI and onnxruntime. Its
``__init__.py`` holds them in a literal ``_EXPORTS = {name: "_private_module", ...}``, which its
``__getattr__`` reads. griffe reads source without running it and so sees no such names; this
extension reads the same ``_EXPORTS`` literal and adds each name as an alias of the object in its
private module, as ``from ._private_module import name`` would. The API reference then documents
them like any other export, from the one list the package itself uses.
"""

from __future__ import annotations

import ast
from typing import Any

import griffe


class LazyExports(griffe.Extension):
    """Adds a module's ``_EXPORTS`` names as aliases of their definitions."""

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        """After griffe has read a module: one alias per ``_EXPORTS`` entry it does not define itself."""
        exports = mod.members.get("_EXPORTS")
        if exports is None or not isinstance(exports, griffe.Attribute) or exports.value is None:
            return
        try:
            mapping = ast.literal_eval(str(exports.value))
        except (ValueError, SyntaxError) as exc:
            raise ValueError(f"{mod.path}._EXPORTS must be a literal dict of name -> module: {exc}") from exc
        for name, module in mapping.items():
            if name not in mod.members:
                mod.set_member(name, griffe.Alias(name, f"{mod.path}.{module}.{name}", parent=mod))
