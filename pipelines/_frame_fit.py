"""YUV to RGB and the output fit of decoded video frames, in one swscale pass (the PyAV paths).

Imported by DALI's worker processes (through :mod:`gpufeed.pipelines._pyav`): numpy, PyAV and
``gpufeed.core._size`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._orientation import Orientation, frame_orientation

if TYPE_CHECKING:
    from av.video.reformatter import VideoReformatter

__all__ = ["FrameFitter", "orient_yuv420p"]


def orient_yuv420p(frame, orientation: Orientation):
    """A ``yuv420p`` frame as shown (:class:`~gpufeed.pipelines._orientation.Orientation`), each plane moved exactly.

    For re-encoding a video upright (``gpufeed prepare``): no conversion, so no loss. The frame's
    sides must be even; timestamps are the caller's to set.
    """
    import av

    if not orientation:
        return frame
    planes = frame.to_ndarray()  # (h * 3 / 2, w): Y, then U and V, each (h / 2, w / 2) in a row-major run
    height, width = frame.height, frame.width
    chroma = height * width // 4
    rest = planes[height:].reshape(-1)
    y = orientation.apply(planes[:height])
    u = orientation.apply(rest[:chroma].reshape(height // 2, width // 2))
    v = orientation.apply(rest[chroma:].reshape(height // 2, width // 2))
    out_h, out_w = y.shape
    shown = np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape(out_h * 3 // 2, out_w)
    new = av.VideoFrame.from_ndarray(shown, format="yuv420p")
    new.colorspace, new.color_range = frame.colorspace, frame.color_range
    return new


class FrameFitter:
    """YUV to RGB and, optionally, the output fit (``stretch`` or ``centre_crop`` to ``size_px``).

    ``size_px`` is the config's :class:`~gpufeed.config.SizePx`; ``centre_crop`` scales the frame until
    the output just fits inside it and keeps the centre, so nothing is distorted.

    One swscale pass converts and scales (area filter when shrinking, bilinear when growing): on a
    CPU that costs a fraction of converting at full size and resizing afterwards (measured: DALI's
    CPU resize made the clip path 2.5x slower). ``size_px=None`` keeps the decoded size. One reformatter serves every frame: ``frame.to_ndarray()`` builds a new one per
    call, which costs more than the conversion itself.

    Where it gives the same bytes, the pass writes planar RGB (``gbrp``), which the fitter
    interleaves, instead of packed RGB (``rgb24``): swscale computes both with the same arithmetic
    when its vertical filter has more than two taps, and only the planar writer is vectorised
    (256 px h264 to 112 px: 62 us a frame instead of 94; to 352x224: 264 instead of 517). With one
    or two taps (no vertical scaling, most enlargements, slight reductions) the packed writer takes
    its own one- and two-tap forms, which round differently. So for each frame geometry (format,
    size, colour space and range, output size, filter) the fitter converts a noise frame both ways
    once, and takes the planar pass only where every byte agrees (:meth:`planar_is_exact`).

    A frame whose display matrix turns or mirrors it (a phone held upright) comes out as shown, as
    players, OpenCV and FFmpeg's command line show it
    (:mod:`~gpufeed.pipelines._orientation`): the pass fits the stored frame to the shown output's
    size, sides swapped for a quarter turn, and the array is turned after it (an exact move).
    """

    def __init__(self, size_px: SizePx | None = None, fit: str = "stretch") -> None:
        if fit not in ("stretch", "centre_crop"):
            raise ValueError(f"fit {fit!r} is not allowed; allowed: stretch, centre_crop")
        self.size = size_px
        self.fit = fit
        self._reformatter: VideoReformatter | None = None
        self._planar: dict[tuple, bool] = {}  # frame geometry -> whether the planar pass gives the packed bytes

    def __call__(self, frame) -> np.ndarray:
        if self._reformatter is None:
            from av.video.reformatter import Interpolation, VideoReformatter

            self._reformatter = VideoReformatter()
            # Accurate rounding and full chroma interpolation: without them swscale's scaled path is
            # off by 1-2 levels (a flat 40 comes out 38); with them it matches DALI's conversion.
            exact = Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT | Interpolation.FULL_CHR_H_INP
            self._shrink, self._grow = Interpolation.AREA | exact, Interpolation.BILINEAR | exact
        orientation = frame_orientation(frame)
        width, height = orientation.shown_size(frame.width, frame.height)
        size = self.size
        if size is None:
            out_w, out_h = width, height
        elif self.fit == "stretch":
            out_w, out_h = size
        else:  # scale until the output just fits inside the frame, then keep the centre
            scale = max(size.width_px / width, size.height_px / height)
            out_w, out_h = max(size.width_px, round(width * scale)), max(size.height_px, round(height * scale))
        interpolation = self._shrink if out_w * out_h < width * height else self._grow
        # The pass writes the stored orientation: a quarter turn swaps the output's sides.
        pass_w, pass_h = orientation.shown_size(out_w, out_h)
        key = (
            frame.format.name,
            frame.width,
            frame.height,
            frame.colorspace,
            frame.color_range,
            pass_w,
            pass_h,
            interpolation,
        )
        planar = self._planar.get(key)
        if planar is None:
            planar = self._planar[key] = self.planar_is_exact(frame, pass_w, pass_h, interpolation)
        rgb: np.ndarray = self._reformatter.reformat(
            frame,
            width=pass_w,
            height=pass_h,
            format="gbrp" if planar else "rgb24",
            interpolation=interpolation,
            threads=1,
        ).to_ndarray()  # gbrp: PyAV interleaves the planes in R, G, B order
        if orientation:
            rgb = np.ascontiguousarray(orientation.apply(rgb))
        if size is not None and (out_w, out_h) != size:
            top, left = (out_h - size.height_px) // 2, (out_w - size.width_px) // 2
            rgb = np.ascontiguousarray(rgb[top : top + size.height_px, left : left + size.width_px])
        return rgb

    @staticmethod
    def planar_is_exact(frame, width: int, height: int, interpolation) -> bool:
        """Whether swscale's planar RGB pass gives the packed pass's bytes for frames like ``frame`` scaled to ``width`` x ``height``.

        Judged on a frame of noise of ``frame``'s format, size, colour space and range: which
        writer swscale takes depends on that geometry, not on the pixels, and where the two
        writers round differently noise shows it (every such geometry measured: hundreds of
        pixels one level apart). ``False`` when the noise frame cannot be made in that format.
        """
        import av
        from av.video.reformatter import Interpolation, VideoReformatter

        try:
            rng = np.random.default_rng(0)
            noise = rng.integers(0, 256, (frame.height, frame.width, 3), dtype=np.uint8)
            probe = VideoReformatter().reformat(
                av.VideoFrame.from_ndarray(noise, format="rgb24"),
                format=frame.format.name,
                interpolation=Interpolation.POINT,
            )
            probe.colorspace, probe.color_range = frame.colorspace, frame.color_range
            packed, planar = (
                VideoReformatter()
                .reformat(probe, width=width, height=height, format=fmt, interpolation=interpolation, threads=1)
                .to_ndarray()
                for fmt in ("rgb24", "gbrp")
            )
        except (ValueError, av.FFmpegError):  # a format swscale cannot write, or PyAV cannot hand over
            return False
        return packed.shape == planar.shape and bool(np.array_equal(packed, planar))
