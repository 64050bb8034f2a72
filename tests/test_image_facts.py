"""Image facts from structure: orientation, end markers, trailing bytes, cuts, bombs; and DALI's window coordinates."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from conftest import DEVICES
from oddmedia import encode_png, oriented_jpeg, oriented_png
from PIL import Image, ImageOps

from gpufeed.config._data import DataConfig
from gpufeed.config._serve import ServeConfig
from gpufeed.pipelines import _image_verify as verify
from gpufeed.pipelines import decode_problem, read_image_facts
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.synth._damaged import declare_size

pytestmark = pytest.mark.timeout(300)


def _noisy(width: int = 160, height: int = 120, seed: int = 0) -> np.ndarray:
    """A photo-like picture: gradients plus noise, so its entropy-coded data is long."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) % 256], -1)
    return np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, **kwargs) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=kwargs.pop("quality", 90), **kwargs)
    return buffer.getvalue()


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _asymmetric(width: int = 64, height: int = 40) -> np.ndarray:
    yy, xx = np.mgrid[0:height, 0:width]
    image = np.stack([xx * 255 // (width - 1), yy * 255 // (height - 1), (3 * xx + yy) % 256], -1).astype(np.uint8)
    image[:8, :12] = (255, 255, 0)
    return image


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_and_oriented_size_match_pil(orientation):
    stored_png = encode_png(np.zeros((40, 64, 3), np.uint8), exif=_tiff_orientation(orientation))
    for data in (oriented_jpeg(_asymmetric(), orientation), stored_png):
        facts = read_image_facts(data)
        reference = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
        assert facts.problem is None and facts.orientation == orientation
        assert (facts.width, facts.height) == reference.size
        assert facts.swaps_axes == (orientation >= 5)


def _tiff_orientation(value: int, kind: int = 3) -> bytes:
    return b"MM\x00*\x00\x00\x00\x08\x00\x01" + struct.pack(">HHIHH", 0x0112, kind, 1, value, 0) + b"\x00" * 4


@pytest.mark.parametrize(
    ("tiff", "expected"),
    [
        (_tiff_orientation(9), 1),  # out of range: no rotation, as decoders do
        (_tiff_orientation(6, kind=4), 1),  # not a SHORT
        (_tiff_orientation(6)[:14], 1),  # the entry is cut off
        (b"II*\x00\xff\xff\x00\x00", 1),  # IFD offset past the end
        (b"\x00" * 20, 1),
    ],
)
def test_malformed_exif_means_no_rotation_never_an_error(tiff, expected):
    data = encode_png(np.zeros((4, 6, 3), np.uint8), exif=tiff)
    facts = read_image_facts(data)
    assert facts.problem is None and facts.orientation == expected


def test_bytes_after_the_end_marker_are_not_truncation():
    jpeg, png = _jpeg(_noisy()), _png(_noisy())
    for data, tail in ((jpeg, b"\x00\x00\x00\x18ftypmp42" + bytes(5000)), (png, b"padding" * 100)):
        facts = read_image_facts(data + tail)
        assert facts.problem is None, facts.problem
        assert facts.trailing_bytes == len(tail) and facts.end_offset == len(data)
        assert decode_problem(data + tail) is None


@pytest.mark.parametrize("fmt", ["jpeg", "progressive", "png"])
def test_every_cut_is_caught_by_structure_or_strict_decode(fmt):
    pixels = _noisy()
    data = _png(pixels) if fmt == "png" else _jpeg(pixels, progressive=fmt == "progressive")
    end_marker = b"\xff\xd9" if fmt != "png" else struct.pack(">I", 0) + b"IEND" + struct.pack(">I", 0xAE426082)
    missed = []
    for cut in np.linspace(20, len(data) - 3, 40).astype(int):
        for blob in (data[:cut], data[:cut] + end_marker):
            facts = read_image_facts(blob)
            if facts.problem is None and decode_problem(blob) is None:
                missed.append((int(cut), len(blob) - cut))
    assert not missed, f"cuts (at byte, bytes appended) that nothing caught: {missed}"


def test_jpeg_cut_in_half_with_ffd9_structure_says_whole_strict_decode_says_cut():
    data = _jpeg(_noisy())
    half = data[: len(data) // 2] + b"\xff\xd9"
    assert read_image_facts(half).problem is None, "a plain scan has nothing to count"
    assert "premature end of data segment" in decode_problem(half)
    Image.open(io.BytesIO(half)).load()  # what every lenient decoder does: no error, grey fill


def test_restart_markers_let_the_structure_walk_see_a_cut_scan():
    data = _jpeg(_noisy(), restart_marker_blocks=4)
    assert read_image_facts(data).problem is None
    facts = read_image_facts(data[: len(data) // 2] + b"\xff\xd9")
    assert facts.problem_kind == "damaged" and "restart markers" in facts.problem and "cut short" in facts.problem


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda j, p: j[:-300], "truncated JPEG"),
        (lambda j, p: j[:400], "truncated JPEG"),
        (lambda j, p: j[:3], "truncated JPEG"),
        (lambda j, p: j[:200] + b"\xff\xd9", "truncated JPEG"),  # EOI inside the headers: no scan
        (lambda j, p: p[:-5], "truncated PNG"),
        (lambda j, p: p[:40], "truncated PNG"),
        (lambda j, p: p[:33] + p[-12:], "no image data"),
        (lambda j, p: p[:30] + bytes([p[30] ^ 1]) + p[31:], "CRC"),
        (lambda j, p: b"", "empty"),
        (lambda j, p: b"plain text, not a picture", "not an image"),
        (lambda j, p: b"GIF89a" + bytes(40), "unsupported image format GIF"),
        (lambda j, p: b"RIFF\x00\x00\x00\x00WEBPVP8 ", "unsupported image format WebP"),
        (lambda j, p: b"\x00\x00\x00\x1cftypheic" + bytes(40), "unsupported image format HEIC"),
    ],
)
def test_damage_is_named(make, words):
    jpeg, png = _jpeg(_noisy()), _png(_noisy())
    facts = read_image_facts(make(jpeg, png))
    assert facts.problem is not None and words in facts.problem, facts.problem


def test_pixel_bombs_are_refused_by_header_without_decoding(monkeypatch):
    decoded = []
    monkeypatch.setattr(verify, "_decode_jpeg", lambda data: decoded.append("jpeg"))
    monkeypatch.setattr(verify, "_decode_png", lambda data: decoded.append("png"))
    jpeg_bomb = declare_size(_jpeg(_noisy(32, 32)), 65500, 65500)
    png_bomb = declare_size(_png(_noisy(32, 32)), 30000, 30000)
    assert len(jpeg_bomb) < 10_000
    for bomb, (width, height) in ((jpeg_bomb, (65500, 65500)), (png_bomb, (30000, 30000))):
        facts = read_image_facts(bomb)
        assert facts.problem is None and (facts.width, facts.height) == (width, height)
        kind, why = facts.refusal(DEFAULT_MAX_IMAGE_PIXELS, "data.max_image_pixels")
        assert kind == "too_many_pixels" and f"{width * height:,} pixels" in why and "data.max_image_pixels" in why
        assert "too many pixels" in decode_problem(bomb)
    assert decoded == [], "a bomb reached a decoder"
    # Under a raised limit the same file would be decoded: the refusal is the limit's doing.
    decode_problem(jpeg_bomb, max_pixels=10**10)
    assert decoded == ["jpeg"]


def test_the_data_and_serve_limits_share_one_default():
    assert DataConfig().max_image_pixels == ServeConfig().max_image_pixels == DEFAULT_MAX_IMAGE_PIXELS


def test_unsupported_jpeg_kinds_are_named():
    data = bytearray(_jpeg(_noisy(32, 32)))
    at = data.find(b"\xff\xc0")
    data[at + 1] = 0xC3  # lossless
    facts = read_image_facts(bytes(data))
    assert facts.problem_kind == "unsupported" and "lossless" in facts.problem


def test_files_are_read_by_path_too(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_bytes(oriented_jpeg(_asymmetric(), 6) + b"tail")
    facts = read_image_facts(path)
    assert (facts.format, facts.width, facts.height, facts.orientation) == ("JPEG", 64, 40, 6)
    assert (facts.stored_width, facts.stored_height) == (40, 64)
    assert facts.trailing_bytes == 4
    (tmp_path / "empty.jpg").write_bytes(b"")
    assert read_image_facts(tmp_path / "empty.jpg").problem_kind == "empty"
    assert read_image_facts(tmp_path / "missing.jpg").problem_kind == "unreadable"


# -- DALI: which coordinates image_slice's window is in ----------------------------------------------


def _slice_all(blobs, windows, device_id):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=len(blobs), num_threads=2, device_id=device_id)
    def graph():
        encoded = fn.external_source(source=lambda: [np.frombuffer(b, np.uint8) for b in blobs], batch=True)
        anchor = fn.external_source(source=lambda: [np.array(w[:2], np.int32) for w in windows], batch=True)
        shape = fn.external_source(source=lambda: [np.array(w[2:], np.int32) for w in windows], batch=True)
        device = "cpu" if device_id is None else "mixed"
        return fn.decoders.image_slice(encoded, anchor, shape, axis_names="WH", device=device, output_type=types.RGB)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    if device_id is not None:
        out = out.as_cpu()
    return [np.asarray(out[k]) for k in range(len(blobs))]


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_dali_image_slice_takes_its_window_in_oriented_coordinates(device):
    """For every orientation, JPEG and PNG: DALI's window is over the EXIF-oriented image."""
    picture = _asymmetric()
    blobs, windows, references = [], [], []
    for orientation in range(1, 9):
        jpeg = oriented_jpeg(picture, orientation, quality=100, subsampling=0)
        for data in (jpeg, oriented_png(picture, orientation)):
            facts = read_image_facts(data)
            assert (facts.width, facts.height) == (64, 40)  # the oriented picture, whatever the storage
            window = (5, 3, 30, 25)  # x, y, w, h in oriented pixels
            reference = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
            blobs.append(data)
            windows.append(window)
            references.append(reference[3:28, 5:35])
    for k, got in enumerate(_slice_all(blobs, windows, device.device_id)):
        assert got.shape == references[k].shape, (k, got.shape)
        assert np.abs(got.astype(int) - references[k]).mean() < 1.0, f"case {k}: not the oriented window"


def test_mangled_files_never_raise():
    """Bit flips, cuts and splices anywhere: a verdict every time, never an exception."""
    rng = np.random.default_rng(7)
    exif = Image.Exif()
    exif[0x0112] = 6
    seeds = [
        _jpeg(_noisy(48, 40), exif=exif.tobytes()),
        _jpeg(_noisy(48, 40), progressive=True, restart_marker_blocks=2),
        encode_png(_noisy(40, 30), exif=_tiff_orientation(6)),
        encode_png(_noisy(40, 30), interlace=True),
    ]
    verdicts = set()
    for k in range(3000):
        data = bytearray(seeds[k % len(seeds)])
        for _ in range(int(rng.integers(1, 6))):
            at = int(rng.integers(0, len(data)))
            data[at] ^= 1 << int(rng.integers(0, 8))
        if k % 5 == 0:
            data = data[: int(rng.integers(1, len(data)))]
        facts = read_image_facts(bytes(data))
        verdicts.add(facts.problem_kind)
    assert {None, "damaged"} <= verdicts
