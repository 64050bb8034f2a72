"""Subcommands of the ``gpufeed`` CLI, one module per group; see :mod:`gpufeed.cli`."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

__all__ = ["lazy"]


def lazy(target: str) -> Callable[[argparse.Namespace], int]:
    """A handler that imports ``"module:function"`` only when its command runs (``--help`` stays fast)."""
    module, _, name = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), name)(args)

    return run
