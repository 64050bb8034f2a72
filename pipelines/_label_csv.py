"""Per-frame label CSVs, read within a budget set by the video they label.

A label file is ``frame,<behaviour>,...`` (or DeepEthogram's unnamed ``,<behaviour>,...``), then
one row of 0/1 per frame. Its size is known before a byte of its body is read: a row is the frame
number and one short field per column, so a file for ``N`` frames and ``K`` columns cannot be
larger than the header plus ``N`` rows of :func:`row_bytes_limit` bytes. A larger file is refused
from its size alone, unread (a 10-million-row CSV beside a 40-frame video costs a ``stat``, not
37 s and 2 GB), and the body is streamed into a uint8 matrix, stopping at the first row past
``N``; the memory is the matrix's.

Messages name the file, the line and the rule, and quote no more of the file than a cell cut
to a few dozen characters, after the header has shown the file is a label CSV; a file that is
not one (a secret named as a label file) is described by its shape, never quoted.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from gpufeed.core import ObjectPath, data_path, file_size, open_binary, quoted

__all__ = ["LABEL_HEADER_MAX_BYTES", "read_label_csv", "row_bytes_limit"]

LABEL_HEADER_MAX_BYTES = 64 * 1024  # a thousand class names of 60 characters
_HEADER_RULE = "the header must be 'frame,<behaviour>,...' (or DeepEthogram's ',<behaviour>,...')"


def row_bytes_limit(columns: int) -> int:
    """The most bytes a label row of ``columns`` label columns may take.

    The frame number (up to 20 digits), then per column a separator and a 0/1 with room for
    spaces and ``1.0``-style writing (4 bytes), and a CR LF line end.
    """
    return 24 + 4 * columns


def _header(fh, path: Path | ObjectPath) -> tuple[tuple[str, ...], int]:
    line = fh.readline(LABEL_HEADER_MAX_BYTES + 1)
    if len(line) > LABEL_HEADER_MAX_BYTES:
        raise ValueError(
            f"label file {path}: the first line is longer than {LABEL_HEADER_MAX_BYTES:,} bytes; {_HEADER_RULE}"
        )
    try:
        text = line.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the header
    except UnicodeDecodeError as err:
        raise ValueError(
            f"label file {path} is not UTF-8 text: byte 0x{line[err.start]:02x} at offset {err.start} of line 1"
        ) from None
    cells = next(csv.reader([text.rstrip("\r\n")]), [])
    # A file that is not a label CSV is described by its shape, never quoted (it may be anything).
    if len(cells) < 2 or cells[0].strip() not in ("frame", ""):
        shape = "an empty first line" if not cells else f"a first line of {len(cells)} column(s)"
        first = "" if len(cells) < 2 else " whose first column is not 'frame' or empty"
        raise ValueError(f"label file {path}: {_HEADER_RULE}, got {shape}{first}")
    names = tuple(c.strip() for c in cells[1:])
    _refuse_repeated_names(names, path)
    return names, len(line)


def _refuse_repeated_names(names: tuple[str, ...], path: Path | ObjectPath) -> None:
    """Refuse a behaviour named by two columns, from the header alone (no row is read).

    Two columns of one name cannot be told apart where a name picks a column (the other videos'
    columns, predictions.csv's header). Columns are numbered as a spreadsheet shows them, the
    frame column being column 1.
    """
    seen: dict[str, int] = {}
    for column, name in enumerate(names, start=2):
        if name in seen:
            raise ValueError(
                f"label file {path}: column {quoted(name)} is named twice (columns {seen[name]} and {column}); "
                "each behaviour needs its own name"
            )
        seen[name] = column


def _check_size(path: Path | ObjectPath, size: int, header_bytes: int, columns: int, max_rows: int) -> None:
    limit = header_bytes + max_rows * row_bytes_limit(columns)
    if size > limit:
        raise ValueError(
            f"label file {path} is {size:,} bytes, more than {max_rows:,} rows of {columns} label(s) can take "
            f"({limit:,} bytes): it cannot label the video's {max_rows:,} frames; refused unread"
        )


def _row(cells: list[str], i: int, columns: int, path: Path | ObjectPath) -> list[int]:
    line = i + 2
    if len(cells) != columns + 1:
        raise ValueError(f"label file {path}:{line}: expected {columns + 1} columns, got {len(cells)}")
    if cells[0].strip() != str(i):
        raise ValueError(
            f"label file {path}:{line}: frame column says {quoted(cells[0])}, expected {i} (rows in order)"
        )
    try:
        values = [int(v) for v in cells[1:]]
    except ValueError:
        raise ValueError(f"label file {path}:{line}: labels must be 0 or 1, got {quoted(cells[1:])}") from None
    if any(v not in (0, 1) for v in values):
        raise ValueError(f"label file {path}:{line}: labels must be 0 or 1, got {quoted(values)}")
    return values


def read_label_csv(path: str | Path | ObjectPath, max_rows: int | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Read a per-frame label CSV: header ``frame,<behaviour>...``, one 0/1 row per frame.

    Args:
        max_rows: The video's frame count, when known: a file larger than that many rows can be
            is refused unread, and reading stops after ``max_rows + 1`` rows (so a longer file
            returns ``max_rows + 1`` rows: the caller's "more rows than frames").

    Returns:
        (behaviour names, (rows, K) uint8 multi-hot matrix).

    Raises:
        ValueError: Naming the file, the line and what is wrong.
    """
    path = data_path(path)
    try:
        with open_binary(path) as fh:
            names, header_bytes = _header(fh, path)
            if max_rows is not None:
                _check_size(path, file_size(path), header_bytes, len(names), max_rows)
            return names, _body(fh, path, len(names), max_rows)
    except OSError as err:
        raise ValueError(f"label file {path} cannot be read: {err.strerror or err}") from None


def _body(fh, path: Path | ObjectPath, columns: int, max_rows: int | None) -> np.ndarray:
    values = bytearray()
    rows = 0
    text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
    try:
        for cells in csv.reader(text):
            if not cells:
                continue
            if max_rows is not None and rows > max_rows:
                break
            values.extend(_row(cells, rows, columns, path))
            rows += 1
    except UnicodeDecodeError as err:
        raise ValueError(f"label file {path} is not UTF-8 text after line 1 ({err.reason})") from None
    except csv.Error as err:
        raise ValueError(f"label file {path}: not CSV near row {rows + 2}: {quoted(str(err), 80)}") from None
    finally:
        text.detach()  # the caller's with-block closes the file
    return np.frombuffer(bytes(values), dtype=np.uint8).reshape(rows, columns).copy()
