"""Subcommands of the ``gpufeed`` CLI, one module per group; see :mod:`gpufeed.cli`.

A group's module (``bench.py``, ``data.py`` ...) is imported for every ``gpufeed`` call, to register
its arguments, so it imports no library that loads torch, DALI or onnxruntime: each subcommand names
its handler as a ``"module:function"`` string (``set_defaults(func="gpufeed.commands._bench_handlers:loader")``),
and :func:`resolve_handler` imports that module only when the subcommand runs. The handler modules
(``_<group>_handlers.py``) import what they run at module level. ``gpufeed --help`` and a mistyped
option answer in a fraction of a second.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

# Re-exported: the CLI and the command groups check extras through this package.
from gpufeed.core import MissingExtraError, missing_from_extra, require_extra, require_stack

__all__ = ["Handler", "MissingExtraError", "missing_from_extra", "require_extra", "require_stack", "resolve_handler"]

Handler = Callable[[argparse.Namespace], int]


def resolve_handler(handler: str | Handler) -> Handler:
    """The function a subcommand runs: ``handler`` itself, or the one a ``"module:function"`` string names.

    Args:
        handler: A callable, or ``"gpufeed.commands._x_handlers:function"``; the module is imported now.

    Raises:
        ValueError: ``handler`` is a string without ``:`` or naming no function of its module.
    """
    if callable(handler):
        return handler
    module, sep, name = handler.partition(":")
    function = getattr(importlib.import_module(module), name, None) if sep else None
    if not callable(function):
        raise ValueError(f"handler {handler!r}: expected 'module:function' naming a function of the module")
    return function
