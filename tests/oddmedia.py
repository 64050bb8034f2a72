"""An odd-media corpus: the valid-but-unusual and the broken files real folders hold, generated here.

Deterministic, small (about 1.5 MB) and fast to write (a few seconds). Where the pixels can carry
it, every image and frame holds its :mod:`gpufeed.synth` tag, so a test checks the exact sample.

Images (:func:`write_image_corpus`), ``good/<class>/`` and ``bad/<class>/``:

* good: CMYK, progressive, grayscale and restart-marker JPEGs; 16-bit RGB, 16-bit grey, palette,
  grey+alpha, RGBA and Adam7-interlaced PNGs; all eight EXIF orientations (JPEG) and two (PNG
  ``eXIf``); 1x1 JPEG and PNG; a 4000x3000 JPEG; a JPEG with 200 KB of "motion photo" bytes and a
  PNG with bytes after ``IEND``;
* bad: JPEG cut short without an end marker, cut in half with ``FFD9`` appended (plain, and with
  restart markers), PNG cut short, PNG cut at a chunk boundary with ``IEND`` appended, a bad CRC,
  JPEG and PNG headers declaring 65,500 x 65,500 and 30,000 x 30,000, zero bytes, text named
  ``.jpg``, a GIF named ``.png``.

Videos (:func:`write_video_corpus`), each good one with its label CSV: h264 with B-frames, h264
4:4:4 at an odd size (97x65), VP9 at an odd size (95x63), a 600-frame GOP, h264 in Matroska,
variable frame rate, HEVC; bad: audio only, an mp4 cut inside its ``moov`` index, and a recording
cut before it had one.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps
from videohelp import encode_tagged_video, mux_silence

from gpufeed.synth import CLASS_NAMES, CLASS_WORDS, behaviour_labels, draw_tag
from gpufeed.synth._damaged import declare_size, png_chunk, png_chunks
from gpufeed.synth._videos import write_label_csv

__all__ = [
    "CLASSES",
    "OddImage",
    "OddVideo",
    "encode_png",
    "oriented_jpeg",
    "oriented_png",
    "reference_rgb",
    "stored_pixels",
    "write_image_corpus",
    "write_video_corpus",
]

CLASSES = CLASS_NAMES[:2]
# PIL's exif_transpose method per orientation, and the transpose that undoes it (to store the pixels).
_UNDO = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


@dataclass(frozen=True)
class OddImage:
    """One corpus image.

    Attributes:
        path: The file.
        label: Class index (its folder).
        ident: The tag drawn into its pixels (``None``: grey or too small to carry one).
        bad: Words ``gpufeed check``'s reason must contain (``None`` for a good file).
        decode_only: Bad, but only a strict decode can tell (the structure is whole).
    """

    path: Path
    label: int
    ident: int | None = None
    bad: str | None = None
    decode_only: bool = False


@dataclass(frozen=True)
class OddVideo:
    """One corpus video: ``verdict`` is ``good``, ``warning`` or ``bad``; ``words`` what check must say."""

    path: Path
    verdict: str
    words: str = ""
    num_frames: int = 0
    video_id: int | None = None


# -- encoders -------------------------------------------------------------------------------------


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def encode_png(pixels: np.ndarray, interlace: bool = False, exif: bytes | None = None) -> bytes:
    """A PNG of ``pixels`` (H, W) or (H, W, C) uint8/uint16: what PIL cannot write (16-bit RGB, Adam7)."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    height, width, channels = pixels.shape
    colour = {1: 0, 2: 4, 3: 2, 4: 6}[channels]
    depth = 16 if pixels.dtype == np.uint16 else 8
    samples = pixels.astype(">u2") if depth == 16 else pixels.astype(np.uint8)
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    raw = bytearray()
    for x0, y0, dx, dy in passes:
        sub = samples[y0::dy, x0::dx]
        if sub.size:
            for row in sub:
                raw += b"\x00" + row.tobytes()
    header = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, 1 if interlace else 0)
    extra = png_chunk(b"eXIf", exif) if exif else b""
    body = (
        png_chunk(b"IHDR", header) + extra + png_chunk(b"IDAT", zlib.compress(bytes(raw), 9)) + png_chunk(b"IEND", b"")
    )
    return b"\x89PNG\r\n\x1a\n" + body


def _jpeg(image: Image.Image, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=kwargs.pop("quality", 92), **kwargs)
    return buffer.getvalue()


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def stored_pixels(oriented: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels to store so that applying EXIF ``orientation`` shows ``oriented``."""
    image = Image.fromarray(oriented)
    return np.asarray(image.transpose(_UNDO[orientation]) if orientation in _UNDO else image)


def oriented_jpeg(oriented: np.ndarray, orientation: int, **kwargs) -> bytes:
    """A JPEG that shows ``oriented`` (HWC uint8) once its EXIF ``orientation`` is applied."""
    return _jpeg(Image.fromarray(stored_pixels(oriented, orientation)), exif=_exif(orientation), **kwargs)


def oriented_png(oriented: np.ndarray, orientation: int) -> bytes:
    """A PNG with an ``eXIf`` chunk that shows ``oriented`` once its ``orientation`` is applied."""
    tiff = _exif(orientation).removeprefix(b"Exif\x00\x00")  # an eXIf chunk holds the TIFF block alone
    return encode_png(stored_pixels(oriented, orientation), exif=tiff)


def reference_rgb(path: str | Path) -> np.ndarray:
    """What a decoder should return for an image file: PIL's ``exif_transpose(...).convert("RGB")``.

    Except for 16-bit greyscale, which PIL's ``convert`` clips at 255 instead of scaling: there the
    16-bit values are scaled to 8 bits (``round(v / 257)``), which is what DALI does.
    """
    with Image.open(path) as img:
        oriented = ImageOps.exif_transpose(img)
        if oriented.mode in ("I;16", "I;16B", "I"):
            grey = np.rint(np.asarray(oriented, dtype=np.float64) / 257.0).clip(0, 255).astype(np.uint8)
            return np.repeat(grey[:, :, None], 3, axis=2)
        return np.asarray(oriented.convert("RGB"))


# -- images ---------------------------------------------------------------------------------------


def _picture(width: int, height: int, seed: int) -> np.ndarray:
    """A smooth asymmetric picture (gradients and a corner mark): small to encode, easy to orient."""
    rng = np.random.default_rng(seed)
    # A row and a column broadcast into the picture: full int64 grids made the 4000x3000 photo 10x slower.
    x, y = np.arange(width), np.arange(height)[:, None]
    picture = np.empty((height, width, 3), np.int16)
    picture[..., 0] = x * 255 // max(width - 1, 1)
    picture[..., 1] = y * 255 // max(height - 1, 1)
    picture[..., 2] = (x + 2 * y) * 255 // max(width + 2 * height - 3, 1)
    picture[: max(1, height // 6), : max(1, width // 5)] = (250, 250, 40)  # top-left mark: shows any flip
    picture += rng.integers(-3, 4, picture.shape, dtype=np.int16)
    return np.clip(picture, 0, 255).astype(np.uint8)


def _tagged(width: int, height: int, ident: int, label: int) -> np.ndarray:
    return draw_tag(_picture(width, height, ident), ident, CLASS_WORDS[label])


def _good_images() -> list[tuple[str, int, bool, object]]:
    """(name, label, tagged, make(pixels-or-None) -> bytes), in sample-id order within each class."""
    jpeg = _jpeg
    rows: list[tuple[str, int, bool, object]] = [
        ("a_cmyk.jpg", 0, True, lambda px: jpeg(Image.fromarray(px).convert("CMYK"))),
        ("b_progressive.jpg", 0, True, lambda px: jpeg(Image.fromarray(px), progressive=True)),
        ("c_restart_markers.jpg", 0, True, lambda px: jpeg(Image.fromarray(px), restart_marker_blocks=3)),
        ("d_grey.jpg", 0, False, lambda _: jpeg(Image.fromarray(_picture(90, 70, 3)).convert("L"))),
        ("e_large_4000x3000.jpg", 0, True, None),
        ("f_tiny_1x1.jpg", 0, False, lambda _: jpeg(Image.new("RGB", (1, 1), (200, 60, 30)))),
        ("g_motion_photo.jpg", 0, True, lambda px: jpeg(Image.fromarray(px)) + _motion_photo_tail()),
        ("h_rgb16.png", 1, True, lambda px: encode_png(px.astype(np.uint16) * 257)),
        ("i_grey16.png", 1, False, lambda _: encode_png(_picture(70, 50, 9)[:, :, 0].astype(np.uint16) * 257 + 3)),
        ("j_palette.png", 1, True, lambda px: _png(Image.fromarray(px).quantize(256, dither=Image.Dither.NONE))),
        ("k_grey_alpha.png", 1, False, lambda _: _png(Image.fromarray(_picture(64, 48, 11)[:, :, :2], "LA"))),
        ("l_rgba.png", 1, True, lambda px: encode_png(np.dstack([px, _alpha(px)]))),
        ("m_interlaced.png", 1, True, lambda px: encode_png(px, interlace=True)),
        ("n_tiny_1x1.png", 1, False, lambda _: encode_png(np.array([[[30, 90, 200]]], dtype=np.uint8))),
        ("o_after_iend.png", 1, True, lambda px: encode_png(px) + b"\x00" * 512 + b"trailer"),
    ]
    rows += [(f"p_exif_{o}.jpg", 0, True, o) for o in range(1, 9)]
    rows += [(f"q_exif_{o}.png", 1, True, ("png", o)) for o in (6, 7)]
    return rows


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _alpha(px: np.ndarray) -> np.ndarray:
    height, width = px.shape[:2]
    return np.broadcast_to((np.arange(width) * 255 // max(width - 1, 1)).astype(np.uint8), (height, width)).copy()


def _motion_photo_tail() -> bytes:
    """What a phone appends after a photo's EOI: an MP4 header and 200 KB of video data."""
    return b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + np.random.default_rng(5).bytes(200_000)


def write_image_corpus(root: str | Path) -> list[OddImage]:
    """Write the odd images under ``root/good/<class>/`` and ``root/bad/<class>/`` (see the module docs).

    Good images' tags carry their sample id in ``ImageDataset.from_folder(root / "good")`` and
    their class word; the returned list is in that sample-id order, good files first.
    """
    root = Path(root)
    good = sorted(_good_images(), key=lambda row: (row[1], row[0]))
    corpus = []
    for ident, (name, label, tagged, make) in enumerate(good):
        path = root / "good" / CLASSES[label] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        size = (80, 60) if ident % 2 else (72, 96)
        pixels = _tagged(*size, ident, label) if tagged else None
        if make is None:  # the 4000x3000 photo
            data = _jpeg(Image.fromarray(_tagged(4000, 3000, ident, label)), quality=80)
        elif isinstance(make, int):
            data = oriented_jpeg(pixels, make)
        elif isinstance(make, tuple):
            data = oriented_png(pixels, make[1])
        else:
            data = make(pixels)
        path.write_bytes(data)
        corpus.append(OddImage(path, label, ident if tagged else None))
    corpus += _write_bad(root / "bad")
    return corpus


def _write_bad(folder: Path) -> list[OddImage]:
    pixels = _tagged(160, 120, 0, 0)
    noisy = np.clip(pixels.astype(int) + np.random.default_rng(1).integers(-40, 40, pixels.shape), 0, 255)
    photo = _jpeg(Image.fromarray(noisy.astype(np.uint8)))
    restart = _jpeg(Image.fromarray(noisy.astype(np.uint8)), restart_marker_blocks=2)
    png = _png(Image.fromarray(pixels))
    # A PNG whose compressed data stops early, but whose chunks (IDAT with a correct CRC, IEND) are
    # whole: as if it had been cut at a chunk boundary and given an IEND.
    noise = encode_png(np.random.default_rng(2).integers(0, 255, (200, 300, 3), dtype=np.uint8))
    _, idat_at, idat_length = next(chunk for chunk in png_chunks(noise) if chunk[0] == b"IDAT")
    stream = noise[idat_at + 8 : idat_at + 8 + idat_length]
    short_stream = noise[:idat_at] + png_chunk(b"IDAT", stream[: len(stream) // 3]) + png_chunk(b"IEND", b"")
    bad_crc = bytearray(png)
    bad_crc[png.index(b"IDAT") + 10] ^= 0x40
    gif = io.BytesIO()
    Image.fromarray(pixels).save(gif, "GIF")
    cases = [
        ("cut_no_end_marker.jpg", photo[: len(photo) * 2 // 3], "truncated JPEG", False),
        ("cut_with_ffd9.jpg", photo[: len(photo) // 2] + b"\xff\xd9", "premature end of data segment", True),
        ("cut_with_ffd9_restart.jpg", restart[: len(restart) // 2] + b"\xff\xd9", "restart markers", False),
        ("cut.png", png[: len(png) // 2], "truncated PNG", False),
        ("cut_then_iend.png", short_stream, "cannot be decoded", True),
        ("bad_crc.png", bytes(bad_crc), "CRC", False),
        ("bomb_65500.jpg", declare_size(_jpeg(Image.fromarray(pixels)), 65500, 65500), "too many pixels", False),
        ("bomb_30000.png", declare_size(png, 30000, 30000), "too many pixels", False),
        ("zero_bytes.jpg", b"", "zero-byte", False),
        ("text.jpg", b"these are my holiday notes, not a photo\n" * 20, "not an image", False),
        ("really_a_gif.png", gif.getvalue(), "unsupported image format GIF", False),
    ]
    out = []
    for k, (name, data, words, decode_only) in enumerate(cases):
        label = k % 2
        path = folder / CLASSES[label] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        out.append(OddImage(path, label, bad=words, decode_only=decode_only))
    return out


# -- videos ---------------------------------------------------------------------------------------


def _encode_video(path: Path, video_id: int, num_frames: int, **kwargs) -> None:
    encode_tagged_video(path, video_id, num_frames, label_seed=100 + video_id, **kwargs)


def _audio_only(path: Path) -> None:
    import av

    with av.open(str(path), "w") as container:
        mux_silence(container, container.add_stream("aac", rate=16000), 16 * 1024)


_X264 = {"crf": "18", "g": "30", "keyint_min": "30", "sc_threshold": "0"}


def write_video_corpus(folder: str | Path) -> list[OddVideo]:
    """Write the odd videos (and the good ones' label CSVs) into ``folder/good`` and ``folder/bad``.

    Good videos are named so that sorted order is video-id order, which their tags carry.
    """
    folder = Path(folder)
    good, bad = folder / "good", folder / "bad"
    specs = [
        ("a_bframes.mp4", 60, {"options": {**_X264, "bf": "3", "b_strategy": "0"}}, "good", ""),
        ("b_odd_444.mp4", 40, {"width": 97, "height": 65, "pix_fmt": "yuv444p", "options": _X264}, "good", ""),
        ("c_odd_vp9.webm", 40, {"codec": "libvpx-vp9", "width": 95, "height": 63, "options": {"g": "30"}}, "good", ""),
        ("d_gop600.mp4", 620, {"options": {**_X264, "g": "600", "keyint_min": "600"}}, "good", ""),
        ("e_matroska.mkv", 45, {"options": _X264}, "good", ""),
        ("f_hevc.mp4", 40, {"codec": "libx265", "options": {"x265-params": "log-level=error:keyint=20"}}, "good", ""),
        ("g_vfr.mp4", 45, {"durations_ms": (33, 33, 50), "options": _X264}, "warning", "variable frame rate"),
    ]
    out = []
    for video_id, (name, frames, kwargs, verdict, words) in enumerate(specs):
        path = good / name
        _encode_video(path, video_id, frames, **kwargs)
        out.append(OddVideo(path, verdict, words, frames, video_id))
    bad.mkdir(parents=True, exist_ok=True)
    _audio_only(bad / "audio_only.mp4")
    write_label_csv(bad / "audio_only.csv", behaviour_labels(30, seed=1))
    out.append(OddVideo(bad / "audio_only.mp4", "bad", "no video stream"))
    whole = bad / "moov_cut.mp4"
    _encode_video(whole, 20, 30, options=_X264)
    data = whole.read_bytes()
    moov = data.rindex(b"moov") - 4
    whole.write_bytes(data[: moov + (len(data) - moov) // 2])
    out.append(OddVideo(whole, "bad", "'moov'"))
    unfinished = bad / "no_moov.mp4"
    _encode_video(unfinished, 21, 30, options=_X264)
    data = unfinished.read_bytes()
    unfinished.write_bytes(data[: data.rindex(b"moov") - 4])
    out.append(OddVideo(unfinished, "bad", "no 'moov' box"))
    return out
