"""Subcommands of the ``gpufeed`` CLI, one module per group; see :mod:`gpufeed.cli`.

A group's module is imported for every ``gpufeed`` call, to register its arguments, so it imports
gpufeed's libraries (torch, DALI, the server) only inside its handlers:
``gpufeed --help`` and a mistyped option answer in a fraction of a second.
"""

from __future__ import annotations

# Re-exported: the CLI and the command groups check extras through this package.
from gpufeed.core import MissingExtraError, missing_from_extra, require_extra, require_stack

__all__ = ["MissingExtraError", "missing_from_extra", "require_extra", "require_stack"]
