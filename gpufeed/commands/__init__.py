"""Subcommands of the ``gpufeed`` CLI, one module per group; see :mod:`gpufeed.cli`.

A group's module is imported for every ``gpufeed`` call, to register its arguments, so it imports
gpufeed's libraries (torch, DALI, the server) only inside its handlers or through :func:`lazy`:
``gpufeed --help`` and a mistyped option answer in a fraction of a second.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

# Re-exported: the CLI and the command groups check extras through this package.
from gpufeed._extras import MissingExtraError, missing_from_extra, require_extra

__all__ = ["MissingExtraError", "lazy", "missing_from_extra", "require_extra"]


def lazy(target: str, extra: str | None = None) -> Callable[[argparse.Namespace], int]:
    """A handler that imports ``"module:function"`` only when its command runs (``--help`` stays fast).

    Args:
        target: ``"module:function"`` taking the parsed arguments.
        extra: The gpufeed extra the command needs (see :func:`require_extra`), checked first.
    """
    module, _, name = target.partition(":")

    def run(args: argparse.Namespace) -> int:
        if extra:
            words = ["gpufeed", args.command, getattr(args, args.command, None)]
            require_extra(extra, " ".join(w for w in words if isinstance(w, str)))
        return getattr(importlib.import_module(module), name)(args)

    return run
