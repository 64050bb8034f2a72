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
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageFacts",
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
# Where entropy-coded data ends: FF followed by a marker code (not stuffing 00, not RSTn, not fill FF).
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_RESTART = re.compile(rb"\xff[\xd0-\xd7]")
_SOF_KINDS = {
    0xC0: "baseline",
    0xC1: "extended sequential",
    0xC2: "progressive",
    0xC3: "lossless",
    0xC5: "differential sequential",
    0xC6: "differential progressive",
    0xC7: "differential lossless",
    0xC9: "arithmetic sequential",
    0xCA: "arithmetic progressive",
    0xCB: "arithmetic lossless",
    0xCD: "arithmetic differential sequential",
    0xCE: "arithmetic differential progressive",
    0xCF: "arithmetic differential lossless",
}
_SEQUENTIAL = (0xC0, 0xC1, 0xC9)
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}

# Problem kinds (what a caller does about them): the server answers 415 for "unsupported" and
# "not_image" with a known format name, 400 otherwise.
EMPTY, UNREADABLE, NOT_IMAGE, UNSUPPORTED, DAMAGED, TOO_MANY_PIXELS = (
    "empty",
    "unreadable",
    "not_image",
    "unsupported",
    "damaged",
    "too_many_pixels",
)


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


def read_image_facts(source: bytes | bytearray | memoryview | str | os.PathLike) -> ImageFacts:
    """Read an image's facts from its bytes or its path, walking its structure (see the module docs).

    A path is memory-mapped, so only the bytes up to the end marker are read. Never raises for bad
    data: what is wrong is :attr:`ImageFacts.problem`.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _facts(bytes(source) if isinstance(source, memoryview) else source)
    path = Path(source)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                return ImageFacts(problem="empty: a zero-byte file", problem_kind=EMPTY)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _facts(data)
    except OSError as err:
        return ImageFacts(problem=f"unreadable: {err.strerror or err}", problem_kind=UNREADABLE)


def _facts(data) -> ImageFacts:
    size = len(data)
    if size == 0:
        return ImageFacts(problem="empty: 0 bytes", problem_kind=EMPTY)
    head = bytes(data[:16])
    if head.startswith(b"\xff\xd8\xff"):
        return _Jpeg(data).facts()
    if head.startswith(_PNG_SIGNATURE):
        return _png_facts(data)
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


# -- EXIF ---------------------------------------------------------------------------------------


def exif_orientation(tiff: bytes) -> int:
    """The orientation tag (0x0112) of IFD0 in a TIFF-structured EXIF block; 1 when absent or unreadable."""
    if tiff.startswith(b"Exif\x00\x00"):
        tiff = tiff[6:]
    if len(tiff) < 8 or tiff[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    if ifd + 2 > len(tiff):
        return 1
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for k in range(count):
        at = ifd + 2 + 12 * k
        if at + 12 > len(tiff):
            return 1
        tag, kind = struct.unpack_from(order + "HH", tiff, at)
        if tag == 0x0112:
            if kind != 3:  # SHORT, as the standard says; anything else is not a usable orientation
                return 1
            (value,) = struct.unpack_from(order + "H", tiff, at + 8)
            return value if 1 <= value <= 8 else 1
    return 1


# -- JPEG ---------------------------------------------------------------------------------------


def _marker_name(code: int) -> str:
    names = {0xC4: "DHT", 0xDB: "DQT", 0xDA: "SOS", 0xDD: "DRI", 0xFE: "COM", 0xDC: "DNL"}
    if code in _SOF_KINDS:
        return f"SOF{code - 0xC0}"
    if 0xE0 <= code <= 0xEF:
        return f"APP{code - 0xE0}"
    return names.get(code, f"FF{code:02X}")


class _Jpeg:
    """One walk over a JPEG's markers (see the module docs)."""

    def __init__(self, data) -> None:
        self.data, self.size = data, len(data)
        self.frame: tuple[int, int, int, int, list[tuple[int, int, int]]] | None = None  # sof, bits, h, w, comps
        self.orientation = 0  # 0: no Exif orientation seen yet
        self.restart_interval = 0
        self.scans = 0
        self.scanned_components: set[int] = set()

    def _fail(self, why: str, truncated: bool = False) -> ImageFacts:
        word = "truncated JPEG" if truncated else "damaged JPEG"
        return self._facts(problem=f"{word}: {why}", kind=DAMAGED)

    def _facts(self, problem=None, kind=None, end=0) -> ImageFacts:
        _sof, _bits, height, width, _comps = self.frame or (0, 0, 0, 0, [])
        return ImageFacts("JPEG", width, height, self.orientation or 1, problem, kind, end, self.size)

    def facts(self) -> ImageFacts:
        data, size, pos = self.data, self.size, 2
        while True:
            if pos >= size:
                return self._fail(f"the file ends after {size:,} bytes, before the end-of-image marker (FFD9)", True)
            if data[pos] != 0xFF:
                # Stray bytes between segments: libjpeg skips them with a warning, and so does this walk.
                found = data.find(b"\xff", pos)
                if found < 0:
                    return self._fail(f"no end-of-image marker (FFD9) after byte {pos:,}", True)
                pos = found
            while pos + 1 < size and data[pos + 1] == 0xFF:
                pos += 1  # fill bytes
            if pos + 1 >= size:
                return self._fail("the file ends inside a marker, before the end-of-image marker (FFD9)", True)
            code, at = data[pos + 1], pos
            pos += 2
            if code == 0xD9:
                return self._end(pos)
            if code == 0xD8:
                return self._fail(f"a second start-of-image marker at byte {at:,}")
            if 0xD0 <= code <= 0xD7 or code in (0x00, 0x01):
                continue  # standalone markers (and stray RST/stuffing outside a scan): no length
            if pos + 2 > size:
                return self._fail(f"the file ends inside the {_marker_name(code)} marker at byte {at:,}", True)
            (length,) = struct.unpack(">H", bytes(data[pos : pos + 2]))
            if length < 2:
                return self._fail(f"the {_marker_name(code)} segment at byte {at:,} declares {length} bytes")
            end = pos + length
            if end > size:
                return self._fail(
                    f"the {_marker_name(code)} segment at byte {at:,} declares {length:,} bytes but the file "
                    f"ends {size - pos:,} bytes later",
                    True,
                )
            problem = self._segment(code, bytes(data[pos + 2 : end]), at)
            if problem:
                return self._fail(problem)
            pos = end
            if code == 0xDA:
                pos, problem, truncated = self._scan(pos, at)
                if problem:
                    return self._fail(problem, truncated)

    def _segment(self, code: int, body: bytes, at: int) -> str | None:
        if code in _SOF_KINDS:
            if self.frame is not None:
                return f"a second frame header ({_marker_name(code)}) at byte {at:,}"
            if len(body) < 6:
                return f"the frame header at byte {at:,} is too short"
            bits, height, width, count = struct.unpack(">BHHB", body[:6])
            if len(body) < 6 + 3 * count or count == 0:
                return f"the frame header at byte {at:,} lists {count} components but is {len(body)} bytes long"
            comps = [(body[6 + 3 * k], body[7 + 3 * k] >> 4, body[7 + 3 * k] & 15) for k in range(count)]
            if any(h == 0 or v == 0 for _, h, v in comps):
                return f"the frame header at byte {at:,} has a component with sampling factor 0"
            self.frame = (code, bits, height, width, comps)
        elif code == 0xE1 and body.startswith(b"Exif\x00\x00") and not self.orientation:
            try:
                self.orientation = exif_orientation(body)
            except struct.error:
                self.orientation = 1  # an unreadable Exif block: decoders ignore it, so does this
        elif code == 0xDD and len(body) >= 2:
            (self.restart_interval,) = struct.unpack(">H", body[:2])
        elif code == 0xDA:
            if self.frame is None:
                return f"a scan (SOS) at byte {at:,} before any frame header (SOF)"
            count = body[0] if body else 0
            if count == 0 or len(body) < 1 + 2 * count:
                return f"the scan header at byte {at:,} is malformed"
            self._scan_components = [body[1 + 2 * k] for k in range(count)]
        return None

    def _units(self, components: list[int]) -> int:
        """MCUs (interleaved scan) or blocks (single component) a scan over ``components`` codes."""
        _sof, _bits, height, width, comps = self.frame
        hmax, vmax = max(c[1] for c in comps), max(c[2] for c in comps)
        if len(components) > 1:
            return -(-width // (8 * hmax)) * -(-height // (8 * vmax))
        sampling = next(((h, v) for cid, h, v in comps if cid == components[0]), (hmax, vmax))
        cw, ch = -(-width * sampling[0] // hmax), -(-height * sampling[1] // vmax)
        return -(-cw // 8) * -(-ch // 8)

    def _scan(self, pos: int, at: int) -> tuple[int, str | None, bool]:
        found = _SCAN_END.search(self.data, pos)
        if found is None:
            return pos, "the scan data runs to the end of the file with no end-of-image marker (FFD9)", True
        self.scans += 1
        self.scanned_components.update(self._scan_components)
        _sof, _bits, height, width, _comps = self.frame
        if self.restart_interval and height and width:
            expected = -(-self._units(self._scan_components) // self.restart_interval) - 1
            present = len(_RESTART.findall(self.data, pos, found.start()))
            if present < expected:
                return (
                    pos,
                    f"scan {self.scans} (byte {at:,}) holds {present} of its {expected} restart markers: its "
                    "data was cut short",
                    True,
                )
        return found.start(), None, False

    def _end(self, end: int) -> ImageFacts:
        if self.frame is None:
            return self._fail("the end-of-image marker comes before any frame header (SOF)", True)
        sof, bits, height, width, comps = self.frame
        if self.scans == 0:
            return self._fail("the end-of-image marker comes before any image data (no scan)", True)
        if width == 0 or height == 0:
            return self._facts(f"damaged JPEG: the header declares an empty size {width}x{height}", DAMAGED)
        if sof in _SEQUENTIAL:
            missing = {cid for cid, _, _ in comps} - self.scanned_components
            if missing:
                return self._fail(
                    f"no scan for {len(missing)} of the {len(comps)} components: the file was cut short", True
                )
        if bits != 8 or sof not in (0xC0, 0xC1, 0xC2):
            kind = _SOF_KINDS[sof]
            what = f"{bits}-bit {kind}" if bits != 8 else kind
            return self._facts(
                f"unsupported JPEG kind: {what}; supported formats: 8-bit baseline, extended or progressive JPEG, "
                "and PNG",
                UNSUPPORTED,
                end,
            )
        return self._facts(end=end)


# -- PNG ----------------------------------------------------------------------------------------


def _png_facts(data) -> ImageFacts:
    size, pos = len(data), 8
    view = memoryview(data)
    width = height = 0
    orientation, idat, first = 1, 0, True

    def fail(why: str, truncated: bool = False) -> ImageFacts:
        word = "truncated PNG" if truncated else "damaged PNG"
        return ImageFacts("PNG", width, height, orientation, f"{word}: {why}", DAMAGED, 0, size)

    try:
        while True:
            if pos + 8 > size:
                return fail(f"the file ends after {size:,} bytes, before the IEND chunk", True)
            length, kind = struct.unpack(">I4s", view[pos : pos + 8])
            name = kind.decode("latin-1")
            if not kind.isalpha():
                return fail(f"no valid chunk at byte {pos:,} (type {kind!r})")
            if length > 0x7FFFFFFF:
                return fail(f"chunk {name} at byte {pos:,} declares {length:,} bytes (more than PNG allows)")
            end = pos + 12 + length
            if end > size:
                return fail(
                    f"chunk {name} at byte {pos:,} declares {length:,} bytes but the file ends "
                    f"{size - pos - 8:,} bytes later",
                    True,
                )
            (crc,) = struct.unpack(">I", view[end - 4 : end])
            if zlib.crc32(view[pos + 4 : end - 4]) != crc:
                return fail(f"chunk {name} at byte {pos:,} fails its CRC check")
            body = view[pos + 8 : end - 4]
            if first:
                if kind != b"IHDR" or length != 13:
                    return fail("the first chunk is not a 13-byte IHDR header")
                width, height, depth, colour, _comp, _filter, interlace = struct.unpack(">IIBBBBB", body)
                if width == 0 or height == 0:
                    return fail(f"the header declares an empty size {width}x{height}")
                if depth not in _PNG_DEPTHS.get(colour, ()) or interlace > 1:
                    return fail(f"the header declares bit depth {depth}, colour type {colour}, interlace {interlace}")
                first = False
            elif kind == b"IDAT":
                idat += 1
            elif kind == b"eXIf" and orientation == 1:
                orientation = exif_orientation(bytes(body))
            elif kind == b"IEND":
                if not idat:
                    return fail("no image data: IEND comes before any IDAT chunk", True)
                return ImageFacts("PNG", width, height, orientation, None, None, end, size)
            pos = end
    except struct.error:  # a crafted Exif block pointing past its end
        return fail("a chunk's contents cannot be parsed")
    finally:
        view.release()
