"""Whether a reader returned exactly the frames asked for (``gpufeed bench clips``' untimed pass).

* Generated sets carry each frame's (index, video) in its pixels: a clip is exact when every frame's
  tag is the one asked for (:func:`tag_share`). torchcodec's sampler picks its own starts, so its
  clips are checked for frames that follow each other by the stride in the right video
  (:func:`sampler_tag_share`).
* The user's videos carry no tags: each reader's clips are compared, bit for bit, with the same
  reader's own frames decoded in order from the start of the file (:func:`reference_share`), so a
  seek that lands on a neighbouring frame shows, whatever the reader's resize does to pixels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpufeed.bench._clip_readers import _torchcodec_decoder
from gpufeed.core import SizePx
from gpufeed.pipelines import FrameFitter, VideoFrameReader, VideoRef, iter_frame_chunks
from gpufeed.synth import TagError, read_tag

__all__ = ["reference_share", "sampler_tag_share", "sequential_frames", "tag_share"]


def _as_square(frame) -> np.ndarray:
    """A (3, H, W) frame resampled (nearest) to (3, H, H): the generated videos are square, and their
    tag's flat squares sit where :func:`read_tag` looks only when the frame has their proportions."""
    arr = frame.detach().cpu().numpy() if hasattr(frame, "detach") else np.asarray(frame)
    height, width = arr.shape[1:]
    if height == width:
        return arr
    return arr[:, :, (np.arange(height) * width + width // 2) // height]


def _tags(clip, length: int) -> list[tuple[int, int]] | None:
    try:
        return [(tag.ident, tag.aux) for tag in (read_tag(_as_square(clip[:, t]), "CHW") for t in range(length))]
    except TagError:
        return None


def _stacked(batches: list) -> list:
    return [clip for batch in batches for clip in batch]


def tag_share(batches: list, clips: list[tuple[int, int]], length: int, stride: int) -> float:
    """Share of clips ((3, T, H, W) each) whose every frame carries the (frame index, video id) asked for."""
    stacked = _stacked(batches)
    good = 0
    for clip, (video, start) in zip(stacked, clips, strict=False):
        tags = _tags(clip, length)
        good += tags is not None and tags == [(start + t * stride, video) for t in range(length)]
    return good / max(1, min(len(stacked), len(clips)))


def sampler_tag_share(batches: list, video_of_clip: Callable[[int], int], length: int, stride: int) -> float:
    """Share of sampler clips whose frames follow each other by ``stride`` in the video the call was for."""
    stacked = _stacked(batches)
    good = 0
    for c, clip in enumerate(stacked):
        tags = _tags(clip, length)
        if tags is not None:
            first = tags[0][0]
            good += tags == [(first + t * stride, video_of_clip(c)) for t in range(length)]
    return good / max(1, len(stacked))


def sequential_frames(
    reader: str, path: str, wanted: set[int], size: SizePx, ref: VideoRef, loader=None, info=None
) -> dict[int, np.ndarray]:
    """Frames ``wanted`` of ``path`` as ``reader`` decodes them in order from frame 0, (H, W, 3) uint8 each.

    ``loader`` (gpufeed's ClipLoader) and ``info`` (the video's VideoInfo): on a GPU gpufeed's reference is
    read by its sequential reader on the loader's own device and decoder (NVDEC, or nvJPEG for a frame
    store), whose frames are the clip loader's; FFmpeg's swscale pass differs from NVDEC plus DALI's
    resize by a level here and there.
    """
    last = max(wanted)
    out: dict[int, np.ndarray] = {}
    if reader == "gpufeed" and loader is not None and loader.device.is_gpu:
        args = {
            "size_px": size,
            "fit": loader.video_cfg.fit,
            "chunk_frames": 64,
            "device": loader.device,
            "hw_decoder_load": loader.cfg.hw_decoder_load,
        }
        frames_reader = VideoFrameReader(info, decoder=loader.video_cfg.decoder, **args)
        if frames_reader.source != loader.source:  # the folder went to PyAV where this video alone would not
            frames_reader = VideoFrameReader(info, decoder=loader.source, **args)
        for chunk in frames_reader:
            first = int(chunk.frame_indices[0])
            frames = chunk.frames.permute(0, 2, 3, 1).cpu().numpy()  # (C, 3, H, W) -> (C, H, W, 3)
            out.update({first + k: frame for k, frame in enumerate(frames) if first + k in wanted})
            if first + len(frames) > last:
                break
    elif reader == "gpufeed":
        for first, chunk in iter_frame_chunks(ref, 64, threads=1, fitter=FrameFitter(size)):
            out.update({first + k: frame for k, frame in enumerate(chunk) if first + k in wanted})
            if first + len(chunk) > last:
                break
    elif reader == "opencv_seek":
        import cv2

        capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
        for index in range(last + 1):
            ok, frame = capture.read()
            if not ok:
                break
            if index in wanted:
                small = cv2.resize(frame, tuple(size), interpolation=cv2.INTER_AREA)
                out[index] = cv2.cvtColor(small, cv2.COLOR_BGR2RGB)
        capture.release()
    else:  # torchcodec, exact index, decoded in order
        decoder = _torchcodec_decoder(path, "exact", size)
        for first in range(0, last + 1, 64):
            chunk = decoder.get_frames_in_range(first, min(first + 64, last + 1)).data.numpy()
            out.update({first + k: frame for k, frame in enumerate(chunk) if first + k in wanted})
    return out


def reference_share(
    reader: str,
    batches: list,
    clips: list[tuple[str, int]],
    refs: dict[str, VideoRef],
    length: int,
    stride: int,
    size: SizePx,
    loader=None,
    infos: dict | None = None,
) -> float:
    """Share of clips equal, bit for bit, to ``reader``'s own in-order decode of the same frames
    (gpufeed's: through ``loader``'s device and decoder, ``infos`` per path; see :func:`sequential_frames`)."""
    stacked = _stacked(batches)[: len(clips)]
    wanted: dict[str, set[int]] = {}
    for path, start in clips[: len(stacked)]:
        wanted.setdefault(path, set()).update(range(start, start + length * stride, stride))
    kind = "torchcodec" if reader.startswith("torchcodec") else reader
    frames = {
        path: sequential_frames(kind, path, indices, size, refs[path], loader, (infos or {}).get(path))
        for path, indices in wanted.items()
    }
    good = 0
    for clip, (path, start) in zip(stacked, clips, strict=False):
        arr = clip.detach().cpu().numpy() if hasattr(clip, "detach") else np.asarray(clip)
        got = np.moveaxis(arr, 0, -1)  # (3, T, H, W) -> (T, H, W, 3)
        want = [frames[path].get(start + t * stride) for t in range(length)]
        good += all(w is not None and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    return good / max(1, len(stacked))
