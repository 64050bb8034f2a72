"""A real decode of an image file, strict enough to see what a lenient decoder hides.

Structure (:mod:`gpufeed.pipelines._image_facts`) catches files cut short without their end
marker, bad CRCs and pixel bombs. What it cannot see is damage inside the compressed data, above
all a JPEG cut in half with an ``FFD9`` appended: libjpeg only *warns* ("Corrupt JPEG data:
premature end of data segment"), fills the rest grey, and Pillow and DALI return the image. So:

* **JPEG** is decoded by libjpeg-turbo through ``simplejpeg`` with ``strict=True``, which turns
  every libjpeg warning (premature end of data, bad Huffman code, extraneous bytes where the
  data was damaged) into an error. It decodes at 1/8 scale: every coefficient is still entropy
  decoded (where damage shows), the inverse DCT and colour conversion shrink to almost nothing
  (measured 20-30% cheaper than a full decode, see ``docs/images.md``).
* **PNG** is decoded fully by Pillow, which refuses an incomplete zlib stream.

Used by ``gpufeed check`` for every file, and by the loaders to re-check the files of a batch
DALI failed on. Never used per request by the server (see :mod:`gpufeed.server._preprocess`).
"""

from __future__ import annotations

import io
from pathlib import Path

import simplejpeg
from PIL import Image

from gpufeed.core import ObjectPath, is_outage, read_bytes, split_member
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, ImageFacts, read_image_facts

__all__ = ["decode_problem", "find_bad_files"]

# The pixel limit is enforced from the header before any decode (ImageFacts.refusal); Pillow's own
# global limit would disagree with data.max_image_pixels, so it is switched off.
Image.MAX_IMAGE_PIXELS = None


def _decode_jpeg(data: bytes) -> None:
    _height, _width, colourspace, _sub = simplejpeg.decode_jpeg_header(data)
    target = {"Gray": "GRAY", "CMYK": "CMYK", "YCCK": "CMYK"}.get(colourspace, "RGB")
    simplejpeg.decode_jpeg(data, colorspace=target, strict=True, min_height=1, min_width=1, min_factor=8)


def _decode_png(data: bytes) -> None:
    with Image.open(io.BytesIO(data)) as img:
        img.load()


def _read(source: str | Path | ObjectPath) -> bytes | str:
    """The file's bytes (a shard member's: its range of the tar), or why they cannot be read."""
    try:
        return read_bytes(source)
    except OSError as err:
        if is_outage(err):  # the store or the machine, not the file: never recorded as a bad file
            raise
        return f"unreadable: {err.strerror or err}"


def decode_problem(
    source: str | Path | ObjectPath | bytes,
    facts: ImageFacts | None = None,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    key: str = "data.max_image_pixels",
) -> str | None:
    """Why ``source`` (a path, a shard member or the bytes) cannot be used, after its structure and a strict decode.

    A file over ``max_pixels`` (by its header) is refused without decoding.

    Returns:
        ``None`` when the file is fine, else the reason in words.
    """
    if facts is None and isinstance(source, str) and split_member(source) is not None:
        # A shard member: one ranged read of its tar serves both the structure walk and the decode.
        read = _read(source)
        if isinstance(read, str):
            return read
        source = read
    facts = facts or read_image_facts(source)
    refused = facts.refusal(max_pixels, key)
    if refused:
        return refused[1]
    data = source if isinstance(source, bytes) else _read(source)
    if isinstance(data, str):
        return data
    try:
        if facts.format == "JPEG":
            _decode_jpeg(data)
        else:
            _decode_png(data)
    except Exception as err:  # the decoders raise ValueError, OSError, SyntaxError ... for damaged data
        message = " ".join(str(err).split()) or type(err).__name__
        return f"cannot be decoded: damaged {facts.format} data ({message})"
    return None


def find_bad_files(
    paths: list[str], max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS, key: str = "data.max_image_pixels"
) -> list[tuple[str, str]]:
    """:func:`decode_problem` for each path (once each); ``(path, reason)`` for those that fail."""
    bad = []
    for path in dict.fromkeys(paths):
        why = decode_problem(path, max_pixels=max_pixels, key=key)
        if why:
            bad.append((path, why))
    return bad
