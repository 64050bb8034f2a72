"""Plain-text tables for reports printed to a terminal (benchmarks, training summaries, checks), bounded quotes,
and size limits as people write them.

The bottom layer: anything in gpufeed may import it, and it imports nothing of gpufeed's.
"""

from __future__ import annotations

import math
import reprlib

__all__ = ["QUOTE_CHARS", "format_table", "parse_limit_mb", "quoted"]

# How much of a value an error message quotes: enough to recognise a typo, never a file's worth.
QUOTE_CHARS = 40


def _repr_engine() -> reprlib.Repr:
    engine = reprlib.Repr()  # bounded at every level: a billion-element list shows its first few
    engine.maxlevel, engine.maxlist, engine.maxdict, engine.maxtuple, engine.maxset = 2, 4, 4, 4, 4
    engine.maxstring, engine.maxlong, engine.maxother = QUOTE_CHARS, QUOTE_CHARS, QUOTE_CHARS
    return engine


_REPR = _repr_engine()


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters (``...`` marks the cut).

    Short values read exactly as ``repr`` writes them (``'abc'``, ``[1, 2]``); a long string, a deep
    or long list, an integer of a million digits cost at most ``limit`` characters and a walk of a
    few elements, however large the value (a YAML alias bomb's billion leaves are never visited).
    """
    try:
        text = _REPR.repr(value)
    except ValueError:  # an integer beyond Python's digit limit for str()
        text = f"<{type(value).__name__} too long to print>"
    return text if len(text) <= limit else f"{text[: max(limit - 3, 1)]}..."


def format_table(headers: list[str], rows: list[list]) -> str:
    """A table with a dashed rule under the headers, columns two spaces apart.

    A column whose cells are all numbers is right-aligned, any other left-aligned; floats are
    printed with one decimal and thousands separators.

    Args:
        headers: One title per column.
        rows: One list per row, as many cells as ``headers``; cells are numbers or anything ``str``
            can print.

    Returns:
        The table, lines joined by newlines, without a trailing newline.
    """
    cells = [[str(h) for h in headers]] + [
        [f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    lines = [
        "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_limit_mb(text: str) -> float:
    """A size limit in MB (10^6 bytes) as written on a command line or in the environment.

    A number >= 0, or ``none`` for no limit (``math.inf``).

    Raises:
        ValueError: Anything else (the message names the value and what is allowed).
    """
    if text.strip().lower() == "none":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0 or math.isinf(value):
        raise ValueError(f"{quoted(text)} is not a size limit; allowed: a number of MB >= 0, or none (no limit)")
    return value
