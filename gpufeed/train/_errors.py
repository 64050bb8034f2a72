"""The training loop's user-facing error (the CLI prints it as one line, exit status 2)."""

from __future__ import annotations

__all__ = ["TrainError"]


class TrainError(RuntimeError):
    """A run cannot start or continue as asked (the message says why and what to do)."""
