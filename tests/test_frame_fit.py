"""The PyAV paths' frame fit gives the bytes of one packed-RGB swscale pass, whichever pass it takes.

:class:`~gpufeed.pipelines._frame_fit.FrameFitter` converts and scales a decoded frame in one
swscale pass with the accurate flags. Where swscale's planar RGB writer gives the same bytes as its
packed one (judged per frame geometry on a noise frame), it takes the planar one, which is faster.
These tests hold every output to the packed pass (``_packed_reference``: what the fitter computed
before, for every frame) bit for bit, over pixel formats, sizes, both fits and frames of noise,
gradients and extreme values, and a real h264 video; and they hold that the planar pass is taken
where it is exact and refused where its bytes differ.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gpufeed.core import SizePx
from gpufeed.pipelines._frame_fit import FrameFitter

av = pytest.importorskip("av")


def _packed_reference(frame, size: SizePx | None, fit: str) -> np.ndarray:
    """The fit as one packed-RGB (rgb24) pass: area filter when shrinking, bilinear when growing, accurate flags."""
    from av.video.reformatter import Interpolation as I
    from av.video.reformatter import VideoReformatter

    exact = I.ACCURATE_RND | I.FULL_CHR_H_INT | I.FULL_CHR_H_INP
    width, height = frame.width, frame.height
    if size is None:
        out_w, out_h = width, height
    elif fit == "stretch":
        out_w, out_h = size
    else:
        scale = max(size.width_px / width, size.height_px / height)
        out_w, out_h = max(size.width_px, round(width * scale)), max(size.height_px, round(height * scale))
    flags = (I.AREA if out_w * out_h < width * height else I.BILINEAR) | exact
    rgb = VideoReformatter().reformat(frame, width=out_w, height=out_h, format="rgb24", interpolation=flags, threads=1)
    rgb = rgb.to_ndarray()
    if size is not None and (out_w, out_h) != size:
        top, left = (out_h - size.height_px) // 2, (out_w - size.width_px) // 2
        rgb = rgb[top : top + size.height_px, left : left + size.width_px]
    return rgb


def _frames(fmt: str, width: int, height: int) -> list:
    """Frames of ``fmt``: noise, a gradient and saturated stripes converted from RGB, and (8-bit formats) raw random planes."""
    from av.video.reformatter import VideoReformatter

    rng = np.random.default_rng(width * 7 + height)
    yy, xx = np.mgrid[0:height, 0:width]
    stripes = np.zeros((height, width, 3), np.uint8)
    stripes[::2, :, 0], stripes[1::2, ::3, 1], stripes[:, 1::2, 2] = 255, 255, 255
    pictures = [
        rng.integers(0, 256, (height, width, 3), dtype=np.uint8),
        np.stack([xx * 255 // max(1, width - 1), yy * 255 // max(1, height - 1), (xx + yy) % 256], -1).astype(np.uint8),
        stripes,
    ]
    frames = [VideoReformatter().reformat(av.VideoFrame.from_ndarray(p, format="rgb24"), format=fmt) for p in pictures]
    if fmt in ("yuv420p", "yuvj420p", "yuv444p", "nv12"):  # any byte in every plane: out-of-range values too
        raw = av.VideoFrame(width, height, fmt)
        for plane in raw.planes:
            plane.update(rng.integers(0, 256, plane.buffer_size, dtype=np.uint8).tobytes())
        frames.append(raw)
    return frames


FORMATS = ("yuv420p", "yuvj420p", "yuv422p", "yuv444p", "nv12", "gray", "yuv420p10le", "rgb24")
SIZES = (None, SizePx(112, 112), SizePx(352, 224), SizePx(64, 48), SizePx(113, 57))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("width", "height"), [(256, 256), (97, 65), (640, 272)])
def test_the_fit_gives_the_packed_passs_bytes_for_every_format_size_and_fit(fmt, width, height):
    frames = _frames(fmt, width, height)
    for size, fit in itertools.product(SIZES, ("stretch", "centre_crop")):
        fitter = FrameFitter(size, fit)
        for k, frame in enumerate(frames):
            got, want = fitter(frame), _packed_reference(frame, size, fit)
            assert got.dtype == np.uint8 and got.shape == want.shape, (fmt, size, fit, k)
            assert np.array_equal(got, want), f"{fmt} {width}x{height} -> {size} {fit}, frame {k}"


def test_a_real_videos_frames_fit_to_the_packed_passs_bytes(tmp_path):
    from videohelp import encode_tagged_video

    encode_tagged_video(tmp_path / "v.mp4", 3, 12, width=256, height=192, labels=False)
    with av.open(str(tmp_path / "v.mp4")) as container:
        frames = list(container.decode(container.streams.video[0]))
    for size, fit in itertools.product((SizePx(112, 112), SizePx(352, 224), None), ("stretch", "centre_crop")):
        fitter = FrameFitter(size, fit)
        assert all(np.array_equal(fitter(f), _packed_reference(f, size, fit)) for f in frames), (size, fit)


def test_the_planar_pass_is_taken_where_it_is_exact_and_refused_where_its_bytes_differ():
    from av.video.reformatter import Interpolation as I

    exact = I.ACCURATE_RND | I.FULL_CHR_H_INT | I.FULL_CHR_H_INP
    frame = _frames("yuv420p", 256, 256)[0]
    assert FrameFitter.planar_is_exact(frame, 112, 112, I.AREA | exact), "a 256 to 112 px reduction: many taps"
    small = _frames("yuv420p", 97, 65)[0]
    # Enlarged 97x65 -> 112x112: two-tap filters, where swscale's packed writer rounds its own way.
    assert not FrameFitter.planar_is_exact(small, 112, 112, I.BILINEAR | exact)
    fitter = FrameFitter(SizePx(112, 112))
    fitter(frame), fitter(small)
    assert sorted(fitter._planar.values()) == [False, True], "one geometry planar, the other packed"
