"""What an encoded image is, from its bytes alone: the one answer the index, ``check``, the loaders and the server share.

:func:`read_image_facts` walks a file's structure without decoding a pixel:

* **JPEG**: every marker segment by its length, each scan's entropy-coded data to the next marker,
  up to the end-of-image marker (``FFD9``). The frame header gives the stored size, the first
  ``APP1`` Exif block the orientation. Where the file declares a restart interval, each scan must
  hold every restart marker its size implies, so a file cut short and given a new ``FFD9`` is
  caught without decoding; a sequential file must have a scan for every component.
* **PNG**: every chunk by its length, each chunk's CRC, up to ``IEND``; ``IHDR`` gives the size,
  an ``eXIf`` chunk the orientation.

Bytes after the end marker (a phone's "motion photo" video, padding) are not a problem: every
decoder stops at the end marker. A file cut inside its data, a segment or chunk running past the
end, a bad CRC, or an end marker before any image data is one.

**Orientation.** DALI's decoders apply the EXIF orientation (``adjust_orientation=True``), and
``decoders.image_slice`` takes its window in the coordinates of that *oriented* image (measured
for all eight orientations, JPEG and PNG, on the CPU: ``tests/test_image_facts.py``). So the size
that crop windows are computed on is :attr:`ImageFacts.width` x :attr:`ImageFacts.height`, the
oriented size, everywhere: the dataset index, the train and eval windows and the server.

**Pixel limit.** :meth:`ImageFacts.refusal` adds the decompression-bomb limit (width x height
from the header, so a bomb is refused before anything decodes it); the loaders use
``data.max_image_pixels``, the server ``serve.max_image_pixels``, both
:data:`DEFAULT_MAX_IMAGE_PIXELS` unless set.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, replace
from pathlib import Path

from gpufeed.core import ObjectPath, is_object_url, is_outage, open_binary, read_bytes, split_member
from gpufeed.pipelines._image_walk import DAMAGED, UNSUPPORTED, JpegWalk, walk_png
from gpufeed.pipelines._png_tail import png_resume_point, walk_png_tail

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageFacts",
    "image_format",
    "read_image_facts",
]

# 40 megapixels: a 48 MP phone photo is above it (raise the key), a 7 KB header declaring 65,500 x
# 65,500 (4.3 gigapixels, 16.8 GB to decode) far above. Shared by data.max_image_pixels and
# serve.max_image_pixels so training never accepts what serving refuses.
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Magic numbers of formats people name .jpg or send by mistake: named in the message, not "corrupt".
_OTHER_FORMATS = (
    (0, b"GIF8", "GIF"),
    (0, b"BM", "BMP"),
    (8, b"WEBP", "WebP"),
    (0, b"RIFF", "RIFF"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"\x00\x00\x00\x0cjP", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
    (0, b"%PDF", "PDF"),
    (4, b"ftypheic", "HEIC"),
    (4, b"ftypheix", "HEIC"),
    (4, b"ftypmif1", "HEIF"),
    (4, b"ftypavif", "AVIF"),
    (0, b"\xff\x0a", "JPEG XL"),
    (0, b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)
# An object is read by ranges, never whole (it may be any size): first this much, grown 4x at a
# time while the header walk runs off its end, up to _MAX_HEADER_BYTES (Exif, ICC and XMP segments
# before the image data are a few hundred kB in practice).
_HEAD_BYTES = 64 * 1024
_MAX_HEADER_BYTES = 16 * 1024 * 1024
# The image data the full walk reads after the header, per declared pixel: a 16-bit RGBA PNG stored
# uncompressed takes 8 bytes and a filter byte a row, a quality-100 JPEG of noise 4-6 (CMYK); more
# image data than this allows means the object is not the image its header says. (A PNG's chunks
# after its image data are not image data: they are walked apart, see _object_facts.)
_BYTES_PER_PIXEL = 9
_DATA_SLACK_BYTES = 1024 * 1024
_PIECE_BYTES = 4 * 1024 * 1024
# Problem kinds (what a caller does about them): the server answers 415 for "unsupported" and
# "not_image" with a known format name, 400 otherwise.
EMPTY, UNREADABLE, NOT_IMAGE, TOO_MANY_PIXELS = "empty", "unreadable", "not_image", "too_many_pixels"


@dataclass(frozen=True)
class ImageFacts:
    """An encoded image's facts, read from its structure (no pixel decoded).

    Attributes:
        format: ``"JPEG"`` or ``"PNG"``; another recognised format's name (``"GIF"``, ``"HEIC"``
            ...) for files the pipelines do not read; ``""`` when not an image.
        stored_width, stored_height: The size the header declares (before orientation).
        orientation: EXIF orientation 1-8 (1 without one, or for a value outside 1-8).
        problem: Why the file cannot be used, in words naming what is wrong; ``None`` when fine.
        problem_kind: ``"empty"``, ``"unreadable"``, ``"not_image"``, ``"unsupported"`` or
            ``"damaged"`` (truncation included); ``None`` when fine.
        end_offset: The byte just past the end marker (``FFD9`` or the ``IEND`` chunk).
        size_bytes: The file's length.
    """

    format: str = ""
    stored_width: int = 0
    stored_height: int = 0
    orientation: int = 1
    problem: str | None = None
    problem_kind: str | None = None
    end_offset: int = 0
    size_bytes: int = 0

    @property
    def swaps_axes(self) -> bool:
        """True for orientations 5-8 (a transpose or a quarter turn): width and height trade places."""
        return self.orientation >= 5

    @property
    def width(self) -> int:
        """Width of the decoded, oriented image: what DALI returns and crop windows are in."""
        return self.stored_height if self.swaps_axes else self.stored_width

    @property
    def height(self) -> int:
        """Height of the decoded, oriented image."""
        return self.stored_width if self.swaps_axes else self.stored_height

    @property
    def pixels(self) -> int:
        return self.stored_width * self.stored_height

    @property
    def trailing_bytes(self) -> int:
        """Bytes after the end marker (ignored by every decoder; not a problem)."""
        return max(0, self.size_bytes - self.end_offset) if self.end_offset else 0

    def pixel_problem(self, max_pixels: int, key: str) -> str | None:
        """Why the image is too large to decode (``key`` names the limit's config key), or ``None``."""
        if self.pixels <= max_pixels:
            return None
        return (
            f"too many pixels: the header declares {self.stored_width}x{self.stored_height} = {self.pixels:,} "
            f"pixels; the limit is {max_pixels:,} ({key}); refused without decoding"
        )

    def refusal(self, max_pixels: int, key: str) -> tuple[str, str] | None:
        """``(kind, reason)`` when the file cannot be used under ``max_pixels``, else ``None``."""
        if self.problem:
            return self.problem_kind or DAMAGED, self.problem
        too_many = self.pixel_problem(max_pixels, key)
        return (TOO_MANY_PIXELS, too_many) if too_many else None

    def to_row(self) -> list:
        """A compact JSON row (the dataset index's cache); :meth:`from_row` reads it back."""
        return [
            self.format,
            self.stored_width,
            self.stored_height,
            self.orientation,
            self.problem,
            self.problem_kind,
            self.end_offset,
            self.size_bytes,
        ]

    @classmethod
    def from_row(cls, row: list) -> ImageFacts:
        return cls(*row)


def read_image_facts(
    source: bytes | bytearray | memoryview | str | os.PathLike | ObjectPath, *, header_only: bool = False
) -> ImageFacts:
    """Read an image's facts from its bytes or its path, walking its structure (see the module docs).

    A path is memory-mapped, so only the bytes up to the end marker are read; a shard member
    (``shard-000000.tar#<offset>:<size>:<key>.jpg``) is its byte range of the tar, read at once. Never
    raises for bad data: what is wrong is :attr:`ImageFacts.problem`.

    Args:
        header_only: Walk the header only, what a decoder reads to size its output: a JPEG's
            markers up to its first scan, a PNG's chunks up to its first ``IDAT``. A file cut
            inside its image data passes (its ``end`` is 0); a few microseconds a file instead of
            a pass over all of its bytes.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _facts(bytes(source) if isinstance(source, memoryview) else source, header_only)
    try:
        if isinstance(source, str) and split_member(source) is not None:
            # A shard member names a byte range of its tar, no file or object of its own: one ranged read of its
            # size (the manifest's, bounded by what prepare wrote) instead of an open of a path that is not there.
            return _facts(read_bytes(source), header_only)
        if isinstance(source, ObjectPath) or is_object_url(source):
            with open_binary(str(source)) as fh:
                return _object_facts(fh, header_only)
        with open(Path(source), "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return ImageFacts(problem="empty: a zero-byte file", problem_kind=EMPTY)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _facts(data, header_only)
    except OSError as err:
        if is_outage(err):  # the store or the machine, not the file: never recorded as a bad file
            raise
        return ImageFacts(problem=f"unreadable: {err.strerror or err}", problem_kind=UNREADABLE)


def _object_facts(fh, header_only: bool) -> ImageFacts:
    """:func:`read_image_facts` of an object's ranged-read file, reading only what the walk needs (bounded).

    The header is walked on a prefix grown while the walk runs off its end; the full walk then reads
    at most what the declared size allows (see ``_BYTES_PER_PIXEL``). A PNG's chunks past that
    (text, XMP, APNG frames after the image data) are walked by ranged reads a piece at a time
    (:mod:`gpufeed.pipelines._png_tail`), so an object gets the answer its bytes get on disk. An
    object whose header or image data runs past those bounds is a problem naming its size, not a
    read of all of it.
    """
    size = fh.size
    if size == 0:
        return ImageFacts(problem="empty: a zero-byte file", problem_kind=EMPTY)
    data = _fill(fh, bytearray(), min(size, _HEAD_BYTES))
    head = _facts(data, True)
    while _ran_off(head) and len(data) < min(size, _MAX_HEADER_BYTES):
        data = _fill(fh, data, min(size, _MAX_HEADER_BYTES, 4 * len(data)))
        head = _facts(data, True)
    if _ran_off(head) and len(data) < size:
        return ImageFacts(
            head.format,
            problem=f"damaged {head.format}: its header runs past {len(data):,} bytes of the {size:,}-byte object; "
            "refused unread",
            problem_kind=DAMAGED,
            size_bytes=size,
        )
    if header_only or head.problem:  # a header problem is the full walk's too: both walk the same bytes to it
        return replace(head, size_bytes=size)
    cap = min(size, len(data) + _BYTES_PER_PIXEL * head.pixels + _DATA_SLACK_BYTES)
    data = _fill(fh, data, cap)
    full = _facts(data)
    resume = png_resume_point(data) if full.format == "PNG" and _ran_off(full) and cap < size else None
    del data  # what follows holds a piece at a time
    if resume is not None:  # chunks after the image data (text, XMP, APNG frames): walked, not held
        pos, idat = resume
        tail = walk_png_tail(fh, pos, idat, (full.stored_width, full.stored_height, full.orientation), cap - pos)
        if tail is not None:  # None: its IDAT chunks run past the cap, refused below as any such object
            return ImageFacts(*tail, size_bytes=size)
    if _ran_off(full) and cap < size:
        full = replace(
            full,
            problem=f"damaged {full.format}: no end marker in the first {cap:,} bytes of the {size:,}-byte object, "
            f"more than a {head.stored_width}x{head.stored_height} image takes; refused unread",
        )
    return replace(full, size_bytes=size)


def _fill(fh, data: bytearray, upto: int) -> bytearray:
    """The object's first ``upto`` bytes (fewer if it ends early), ``data`` being its first ones already read.

    Read in pieces straight into the result: one ``read(n)`` would hold the object's blocks, a copy
    of them and the result at once.
    """
    grown = bytearray(upto)
    grown[: len(data)] = data
    pos = len(data)
    fh.seek(pos)
    with memoryview(grown) as view:
        while pos < upto:
            got = fh.readinto(view[pos : min(upto, pos + _PIECE_BYTES)])
            if not got:
                break
            pos += got
    return grown if pos == upto else grown[:pos]


def image_format(head: bytes) -> str | None:
    """The image format a file's first bytes name by their magic number (``"JPEG"``, ``"PNG"``, ``"WebP"`` ...), or None."""
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head.startswith(_PNG_SIGNATURE):
        return "PNG"
    return next((name for offset, magic, name in _OTHER_FORMATS if head[offset : offset + len(magic)] == magic), None)


def _ran_off(facts: ImageFacts) -> bool:
    """Whether a walk stopped because its bytes ended (a prefix of an object may simply be too short)."""
    return (facts.problem or "").startswith("truncated")


def _facts(data, header_only: bool = False) -> ImageFacts:
    size = len(data)
    if size == 0:
        return ImageFacts(problem="empty: 0 bytes", problem_kind=EMPTY)
    head = bytes(data[:16])
    if head.startswith(b"\xff\xd8\xff"):
        return ImageFacts(*JpegWalk(data, header_only).facts(), size_bytes=size)
    if head.startswith(_PNG_SIGNATURE):
        return ImageFacts(*walk_png(data, header_only), size_bytes=size)
    for offset, magic, name in _OTHER_FORMATS:
        if head[offset : offset + len(magic)] == magic:
            return ImageFacts(
                format=name,
                problem=f"unsupported image format {name}; supported formats: JPEG, PNG",
                problem_kind=UNSUPPORTED,
                size_bytes=size,
            )
    if head.startswith(b"\xff\xd8"):
        return ImageFacts("JPEG", problem="damaged JPEG: no marker after the start-of-image", problem_kind=DAMAGED)
    return ImageFacts(
        problem="not an image: not a JPEG or PNG (no valid header)", problem_kind=NOT_IMAGE, size_bytes=size
    )
