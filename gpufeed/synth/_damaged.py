"""Damaged images, made on purpose: what a decoder, ``gpufeed check`` and the server must refuse.

The one generator of broken JPEG and PNG files for the malformed-request corpus
(:mod:`gpufeed.reliability._corpus_images`), ``gpufeed bench images`` and the tests. Each function
takes valid bytes (see :mod:`gpufeed.synth._photos`) and breaks one thing, so the failure is known:

* :func:`declare_size`: the header declares other dimensions (a decompression bomb's header, or 0).
* :func:`png_declaring`: a tiny PNG declaring any size, built from nothing.
* :func:`png_with_damaged_data`: garbage compressed data with correct CRCs, so every header check
  passes and only a real decode fails.
* :func:`jpeg_without_segment`: a JPEG lacking one marker segment (quantisation or Huffman tables).
* :func:`png_chunk` and :func:`png_chunks`: write and list PNG chunks, to build other damage.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "declare_size",
    "jpeg_without_segment",
    "png_chunk",
    "png_chunks",
    "png_declaring",
    "png_with_damaged_data",
]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, payload: bytes, crc: int | None = None) -> bytes:
    """One PNG chunk: length, type, payload, CRC (``crc`` given: that value instead of the right one)."""
    crc = zlib.crc32(kind + payload) if crc is None else crc
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc & 0xFFFFFFFF)


def png_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """The chunks of a PNG as ``(type, offset of the chunk, payload length)``."""
    pos, out = len(PNG_SIGNATURE), []
    while pos + 8 <= len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        out.append((data[pos + 4 : pos + 8], pos, length))
        pos += 12 + length
    return out


def png_declaring(width: int, height: int) -> bytes:
    """A tiny, valid-looking RGB PNG whose header declares ``width x height`` (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        PNG_SIGNATURE
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def declare_size(data: bytes, width: int, height: int) -> bytes:
    """A JPEG or PNG with its header rewritten to declare ``width x height``, the data unchanged.

    A PNG's IHDR CRC is recomputed, so only the declared size is wrong.

    Raises:
        ValueError: ``data`` is a JPEG without a baseline or progressive frame header.
    """
    out = bytearray(data)
    if data.startswith(PNG_SIGNATURE):
        out[16:24] = struct.pack(">II", width, height)
        out[29:33] = struct.pack(">I", zlib.crc32(bytes(out[12:29])))
        return bytes(out)
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        at = out.find(marker)
        if at >= 0:
            out[at + 5 : at + 9] = struct.pack(">HH", height, width)
            return bytes(out)
    raise ValueError("not a PNG, and no JPEG frame header (SOF0 or SOF2) to rewrite")


def png_with_damaged_data(png: bytes) -> bytes:
    """A PNG whose IDAT data is garbage but whose CRCs are right: it passes every header check and
    fails only a real decode (what DALI meets inside a batch)."""
    data = bytearray(png)
    at = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[at - 4 : at])
    start = at + 4
    for k in range(start + 10, start + min(length, 60)):
        data[k] ^= 0x5A
    crc = zlib.crc32(bytes(data[at : start + length])) & 0xFFFFFFFF
    data[start + length : start + length + 4] = struct.pack(">I", crc)
    return bytes(data)


def jpeg_without_segment(jpeg: bytes, marker: int) -> bytes:
    """``jpeg`` without its header segments of type ``marker`` (``0xDB`` quantisation, ``0xC4`` Huffman tables)."""
    pos, out = 2, bytearray(jpeg[:2])
    while pos < len(jpeg) and jpeg[pos] == 0xFF and jpeg[pos + 1] != 0xDA:
        (length,) = struct.unpack(">H", jpeg[pos + 2 : pos + 4])
        if jpeg[pos + 1] != marker:
            out += jpeg[pos : pos + 2 + length]
        pos += 2 + length
    return bytes(out + jpeg[pos:])
