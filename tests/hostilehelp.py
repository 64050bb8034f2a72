"""Hostile files for the tests of issue #32: alias bombs, pixel bombs (real and header-only), secrets.

Every file here is small on disk: a real 30000 x 30000 PNG bomb is 2.6 MB (its deflate blocks of
zero rows repeat, so it is written in a tenth of a second), a header-only one under 100 bytes.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SECRET = "gpufeed-test-secret-7f3a9c"  # written into files outside a project; must never be printed


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png(width: int, height: int, bits: int, colour: int, idat: bytes) -> bytes:
    header = struct.pack(">IIBBBBB", width, height, bits, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def bomb_png(width: int, height: int, *, bits: int = 8, colour: int = 2, rows_per_block: int = 64) -> bytes:
    """A whole, valid PNG of ``width`` x ``height`` zero pixels (RGB, or grayscale with ``colour=0``).

    Its zlib stream is one raw-deflate block of ``rows_per_block`` zero rows, ended by a full flush
    (so it refers to nothing before it) and repeated, then the rest and the Adler-32 of the zeros:
    decoders inflate all of it, and decoding it allocates every pixel.
    """
    channels = {0: 1, 2: 3}[colour]
    row = bytes(1 + width * channels * bits // 8)  # filter byte 0, then zeros
    whole, rest = divmod(height, rows_per_block)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(row * rows_per_block) + deflate.flush(zlib.Z_FULL_FLUSH)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = deflate.compress(row * rest) + deflate.flush(zlib.Z_FINISH)
    adler = ((len(row) * height % 65521) << 16) | 1  # Adler-32 of all-zero data: a stays 1, b counts bytes
    return _png(width, height, bits, colour, b"\x78\xda" + block * whole + tail + struct.pack(">I", adler))


def header_png(width: int, height: int, *, bits: int = 8, colour: int = 2) -> bytes:
    """A tiny PNG whose header declares ``width`` x ``height``: every chunk whole (right lengths and
    CRCs, so structure checks pass), its data a few bytes. Only the header's size can refuse it."""
    return _png(width, height, bits, colour, zlib.compress(bytes(64)))


def billion_laughs(levels: int = 9, width: int = 9, key: str = "project: {class_names: *%s}") -> str:
    """The 369-byte "billion laughs" YAML (9 levels of 9 aliases: 387 million strings when expanded)."""
    lol = ",".join(['"lol"'] * width)
    lines = [f"a: &a [{lol}]"]
    names = "abcdefghijklmnopqrstuvwxyz"
    for level in range(1, levels):
        lines.append(f"{names[level]}: &{names[level]} [{','.join(['*' + names[level - 1]] * width)}]")
    lines.append(key % names[levels - 1])
    return "\n".join(lines) + "\n"


def secret_file(path: Path) -> Path:
    """A file of "secrets" (as a ``.env`` or ``/proc/self/environ`` would hold), shaped a little like CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"API_TOKEN={SECRET},x\n0,{SECRET}\n", encoding="utf-8")
    return path
