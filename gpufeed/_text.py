"""Plain-text tables for reports printed to a terminal (benchmarks, training summaries, checks).

The bottom layer: anything in gpufeed may import it, and it imports nothing of gpufeed's.
"""

from __future__ import annotations

__all__ = ["format_table"]


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
