"""Image facts of an object read by ranges agree with the same bytes read locally, past the image data too.

PNG allows ancillary chunks after the image data (text, XMP, ``eXIf``) and APNG keeps its further
frames there (``fcTL``/``fdAT``): an object is walked over them by their length fields, never held
whole, so a valid file is accepted from S3 exactly as from disk, and a cut one refused the same way.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

from gpufeed.core import _s3
from gpufeed.core._storage import S3Path
from gpufeed.pipelines import _png_tail, check_path, read_image_facts

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

MIB = 1024 * 1024


def _chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk: length, type, body and the CRC of type and body."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(size: tuple[int, int] = (64, 64)) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((size[1], size[0], 3), 90, np.uint8)).save(out, "PNG")
    return out.getvalue()


def _after_idat(png: bytes, *chunks: bytes) -> bytes:
    """``png`` with ``chunks`` between its last IDAT and its IEND (the last 12 bytes)."""
    assert png.endswith(_chunk(b"IEND", b""))
    return png[:-12] + b"".join(chunks) + png[-12:]


def _text(megabytes: float) -> bytes:
    return _chunk(b"tEXt", b"Comment\x00" + b"x" * int(megabytes * MIB))


def _exif(orientation: int) -> bytes:
    """An ``eXIf`` chunk whose IFD0 holds only the orientation tag."""
    tiff = b"MM\x00*" + struct.pack(">IH", 8, 1) + struct.pack(">HHIHH", 0x0112, 3, 1, orientation, 0)
    return _chunk(b"eXIf", tiff + b"\x00" * 4)


def _apng(frames: int = 12) -> bytes:
    """An animated PNG of noise: frame 1 is the IDAT image, the rest ``fdAT`` chunks after it."""
    rng = np.random.default_rng(7)
    images = [Image.fromarray(rng.integers(0, 256, (256, 256, 3), np.uint8)) for _ in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "PNG", save_all=True, append_images=images[1:], duration=40)
    return out.getvalue()


def _jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((48, 64, 3), 150, np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _both(bucket: S3Path, key: str, data: bytes):
    """The facts of ``data`` read from an object by ranges, and read from the bytes themselves."""
    _s3.put_bytes(bucket / key, data)
    return read_image_facts(str(bucket / key)), read_image_facts(data)


def test_a_png_with_a_large_text_chunk_and_exif_after_its_image_data_is_fine_from_an_object(s3_bucket):
    data = _after_idat(_png((64, 48)), _text(2), _exif(6))
    Image.open(io.BytesIO(data)).load()  # a decoder reads it
    ranged, local = _both(s3_bucket, "img/text.png", data)
    assert local.problem is None and local.orientation == 6 and (local.width, local.height) == (48, 64)
    assert ranged == local


def test_an_animated_png_is_fine_from_an_object(s3_bucket):
    data = _apng()
    assert Image.open(io.BytesIO(data)).n_frames == 12
    ranged, local = _both(s3_bucket, "img/anim.png", data)
    assert local.problem is None and (local.width, local.height) == (256, 256) and local.end_offset == len(data)
    assert ranged == local


def test_a_png_cut_inside_a_trailing_chunk_is_the_same_one_line_problem_both_ways(s3_bucket):
    whole = _after_idat(_png(), _text(2))
    cut = whole[: len(whole) - MIB // 2]
    ranged, local = _both(s3_bucket, "img/cut.png", cut)
    assert local.problem and local.problem.startswith("truncated PNG: chunk tEXt") and "\n" not in local.problem
    assert ranged == local


def test_a_bad_crc_in_a_trailing_chunk_is_the_same_problem_both_ways(s3_bucket):
    text = bytearray(_text(2))
    text[MIB] ^= 0xFF  # a flipped byte in the body: the chunk's CRC no longer matches
    ranged, local = _both(s3_bucket, "img/crc.png", _after_idat(_png(), bytes(text)))
    assert local.problem and "fails its CRC check" in local.problem
    assert ranged == local


def test_a_jpeg_with_megabytes_after_its_end_marker_is_the_same_both_ways(s3_bucket):
    data = _jpeg() + b"\x00\x00\x00\x18ftypmp42" + bytes(3 * MIB)  # a phone's appended video
    ranged, local = _both(s3_bucket, "img/motion.jpg", data)
    assert local.problem is None and local.trailing_bytes > 3 * MIB
    assert ranged == local


def test_check_of_an_object_prefix_keeps_trailing_chunk_pngs_and_names_the_cut_one(s3_bucket):
    whole = _after_idat(_png(), _text(2))
    objects = {
        "ds/cats/text.png": whole,
        "ds/cats/anim.png": _apng(),
        "ds/dogs/cut.png": whole[: len(whole) - MIB // 2],
        "ds/dogs/plain.png": _png(),
    }
    for key, data in objects.items():
        _s3.put_bytes(s3_bucket / key, data)
    report = check_path(str(s3_bucket / "ds"), progress=False)
    bad = [f for f in report.findings if f.kind not in ("warning", "ignored")]
    assert [f.path for f in bad] == [str(s3_bucket / "ds/dogs/cut.png")], report.findings
    assert "truncated PNG" in bad[0].reason and "\n" not in bad[0].reason


def test_64_mib_of_trailing_chunks_are_walked_in_bounded_memory(s3_bucket):
    chunks = [_text(4) if k % 2 else _chunk(b"zTXt", b"k\x00\x00" + bytes(4 * MIB)) for k in range(16)]
    data = _after_idat(_png(), *chunks)
    assert len(data) > 64 * MIB
    _s3.put_bytes(s3_bucket / "img/big.png", data)
    tracemalloc.start()
    try:
        ranged = read_image_facts(str(s3_bucket / "img/big.png"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ranged == read_image_facts(data)
    assert ranged.problem is None and ranged.end_offset == len(data)
    assert peak < 24 * MIB, peak  # whole, it would be 64 MiB and more


def test_trailing_chunks_past_the_bounds_are_one_line_refusals_naming_the_object_size(s3_bucket, monkeypatch):
    data = _after_idat(_png(), *[_text(0.5) for _ in range(6)])
    _s3.put_bytes(s3_bucket / "img/many.png", data)
    url = str(s3_bucket / "img/many.png")
    assert read_image_facts(url) == read_image_facts(data)  # within the bounds: fine

    monkeypatch.setattr(_png_tail, "MAX_TAIL_BYTES", 2 * MIB)
    by_bytes = read_image_facts(url)
    monkeypatch.setattr(_png_tail, "MAX_TAIL_BYTES", 64 * MIB)
    monkeypatch.setattr(_png_tail, "MAX_TAIL_CHUNKS", 3)
    by_count = read_image_facts(url)
    for facts in (by_bytes, by_count):
        assert facts.problem_kind == "damaged" and f"{len(data):,}-byte object" in facts.problem, facts
        assert "\n" not in facts.problem and "refused unread" in facts.problem


def test_png_image_data_past_its_bound_is_still_refused_unread(s3_bucket):
    png = _png()
    first_idat = png.index(b"IDAT") - 4
    # 3 MiB more image data than a 64x64 image takes, in chunks of 64 KiB as encoders write them.
    padding = [_chunk(b"IDAT", bytes(64 * 1024)) for _ in range(48)]
    data = png[:first_idat] + b"".join(padding) + png[first_idat:]
    ranged = read_image_facts(str(_put(s3_bucket, "img/fat.png", data)))
    assert ranged.problem and "no end marker in the first" in ranged.problem and "64x64" in ranged.problem


def _put(bucket: S3Path, key: str, data: bytes) -> S3Path:
    _s3.put_bytes(bucket / key, data)
    return bucket / key
