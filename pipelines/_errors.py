"""Errors raised by gpufeed's data pipelines. Every message names the file and what is wrong."""

from __future__ import annotations

__all__ = ["BAD_FILE_HINT", "BadSampleError", "DatasetError"]

# What to do about bad files, appended to the errors that name them.
BAD_FILE_HINT = (
    "Run 'gpufeed check' for the full list; then leave them out with loader.quarantine_file "
    "('gpufeed check --quarantine' writes one), or set loader.on_bad_sample: skip."
)


class DatasetError(ValueError):
    """The dataset is missing, empty or cannot be indexed (the message says which and where)."""


class BadSampleError(RuntimeError):
    """A sample failed to decode inside a pipeline.

    Attributes:
        problems: ``(path, reason)`` for each file found to be bad.
    """

    def __init__(self, problems: list[tuple[str, str]], detail: str = "") -> None:
        self.problems = problems
        listed = "; ".join(f"{path}: {reason}" for path, reason in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"bad sample in the pipeline: {listed}{more}. {BAD_FILE_HINT}{detail}")
