"""The top-level box walk of an MP4/MOV file: truncation and a missing index, found without FFmpeg.

A recording cut short leaves a box that declares more bytes than the file holds, or no ``moov``
box (the index) at all; FFmpeg may still open such a file and fail later, mid-epoch.
"""

from __future__ import annotations

from pathlib import Path

from gpufeed.core import ObjectPath, open_binary

__all__ = ["mp4_box_problem"]

_MP4_FIRST_BOXES = ("ftyp", "moov", "mdat", "free", "skip", "wide", "pnot", "uuid")


def mp4_box_problem(path: Path | ObjectPath, size: int) -> str | None:
    """Walk the top-level boxes of an MP4/MOV: a box running past the end means truncation."""
    offset = 0
    boxes: list[str] = []
    with open_binary(path) as fh:
        while offset < size:
            fh.seek(offset)
            head = fh.read(16)
            if not boxes and (len(head) < 8 or head[4:8].decode("latin-1") not in _MP4_FIRST_BOXES):
                return "not an mp4: the file does not start with an mp4 'ftyp' header"
            if len(head) < 8:
                return f"truncated: {size - offset} stray byte(s) at the end, after the last complete mp4 box"
            length = int.from_bytes(head[:4], "big")
            kind = head[4:8].decode("latin-1")
            if length == 1 and len(head) == 16:
                length = int.from_bytes(head[8:16], "big")
            elif length == 0:
                length = size - offset  # "to the end of the file"
            if length < 8 or not kind.isprintable():
                return None  # not a box structure we understand; FFmpeg has the last word
            if offset + length > size:
                return (
                    f"truncated: mp4 box '{kind}' at byte {offset} declares {length} bytes but the file ends "
                    f"after {size - offset}"
                )
            boxes.append(kind)
            offset += length
    if "moov" not in boxes:
        return "incomplete mp4: no 'moov' box (the index is missing, e.g. an interrupted recording)"
    return None
