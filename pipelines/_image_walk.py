"""The structure walks behind :func:`gpufeed.pipelines.read_image_facts`: JPEG markers and PNG chunks.

Each walk returns ``(format, stored width, stored height, EXIF orientation, problem, problem kind,
end offset)`` and reads nothing past the end marker. See :mod:`gpufeed.pipelines._image_facts`
for what is judged and why.
"""

from __future__ import annotations

import re
import struct
import zlib

__all__ = ["DAMAGED", "UNSUPPORTED", "JpegWalk", "Walk", "exif_orientation", "png_chunk_problem", "walk_png"]

DAMAGED, UNSUPPORTED = "damaged", "unsupported"
# (format, stored width, stored height, orientation, problem, problem kind, end offset)
Walk = tuple[str, int, int, int, str | None, str | None, int]

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


class JpegWalk:
    """One walk over a JPEG's markers (see the module docs)."""

    def __init__(self, data, header_only: bool = False) -> None:
        self.data, self.size, self.header_only = data, len(data), header_only
        self.frame: tuple[int, int, int, int, list[tuple[int, int, int]]] | None = None  # sof, bits, h, w, comps
        self.orientation = 0  # 0: no Exif orientation seen yet
        self.restart_interval = 0
        self.scans = 0
        self.scanned_components: set[int] = set()

    def _fail(self, why: str, truncated: bool = False) -> Walk:
        word = "truncated JPEG" if truncated else "damaged JPEG"
        return self._facts(problem=f"{word}: {why}", kind=DAMAGED)

    def _facts(self, problem=None, kind=None, end=0) -> Walk:
        _sof, _bits, height, width, _comps = self.frame or (0, 0, 0, 0, [])
        return "JPEG", width, height, self.orientation or 1, problem, kind, end

    def facts(self) -> Walk:
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
            if code == 0xDA and self.header_only:  # the header ends where the first scan's data begins
                _sof, _bits, height, width, _comps = self.frame or (0, 0, 0, 0, [])
                if width == 0 or height == 0:
                    return self._facts(f"damaged JPEG: the header declares an empty size {width}x{height}", DAMAGED)
                return self._facts()
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
        assert self.frame is not None, "a scan header is refused before the frame header"
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
        assert self.frame is not None, "a scan header is refused before the frame header"
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

    def _end(self, end: int) -> Walk:
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


def png_chunk_problem(pos: int, size: int, length: int, kind: bytes) -> tuple[str, bool] | None:
    """What is wrong with the chunk header ``(length, kind)`` at byte ``pos`` of a ``size``-byte PNG.

    Shared by :func:`walk_png` and the ranged walk of an object's last chunks
    (:mod:`gpufeed.pipelines._png_tail`), so both give the same answer for the same bytes.

    Returns:
        ``(why, truncated)``, or ``None`` when the header is sound and its chunk lies in the file.
    """
    name = kind.decode("latin-1")
    if not kind.isalpha():
        return f"no valid chunk at byte {pos:,} (type {kind!r})", False
    if length > 0x7FFFFFFF:
        return f"chunk {name} at byte {pos:,} declares {length:,} bytes (more than PNG allows)", False
    if pos + 12 + length > size:
        return (
            f"chunk {name} at byte {pos:,} declares {length:,} bytes but the file ends {size - pos - 8:,} bytes later",
            True,
        )
    return None


def walk_png(data, header_only: bool = False) -> Walk:
    size, pos = len(data), 8
    view = memoryview(data)
    width = height = 0
    orientation, idat, first = 1, 0, True

    def fail(why: str, truncated: bool = False) -> Walk:
        word = "truncated PNG" if truncated else "damaged PNG"
        return "PNG", width, height, orientation, f"{word}: {why}", DAMAGED, 0

    try:
        while True:
            if pos + 8 > size:
                return fail(f"the file ends after {size:,} bytes, before the IEND chunk", True)
            length, kind = struct.unpack(">I4s", view[pos : pos + 8])
            if (problem := png_chunk_problem(pos, size, length, kind)) is not None:
                return fail(*problem)
            name, end = kind.decode("latin-1"), pos + 12 + length
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
                if header_only:  # the header is every chunk before the image data
                    return "PNG", width, height, orientation, None, None, 0
                idat += 1
            elif kind == b"eXIf" and orientation == 1:
                orientation = exif_orientation(bytes(body))
            elif kind == b"IEND":
                if not idat:
                    return fail("no image data: IEND comes before any IDAT chunk", True)
                return "PNG", width, height, orientation, None, None, end
            pos = end
    except struct.error:  # a crafted Exif block pointing past its end
        return fail("a chunk's contents cannot be parsed")
    finally:
        view.release()
