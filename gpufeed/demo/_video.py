"""The demo's clip stage: random training clips, every evaluation clip verified, one video in order.

Called after the image stages of :func:`gpufeed.demo.run_demo` on the synthetic videos (``video.train`` and
``video.val`` of the demo config). Every frame of the synthetic videos carries (frame index,
video id) in its pixels, so the stage proves that each clip holds exactly the frames it names.
"""

from __future__ import annotations

import time

import numpy as np

from gpufeed.config import Config
from gpufeed.demo._base import banner
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, VideoDataset, VideoFrameReader
from gpufeed.synth import read_tag

__all__ = ["run_clip_demo"]


def run_clip_demo(cfg: Config, choice: DeviceChoice) -> dict:
    """Read clips with :class:`gpufeed.pipelines.ClipLoader` and verify them.

    Args:
        cfg: The demo's config (its ``video`` section names the synthetic videos).
        choice: The device the loaders run on.

    Returns:
        Figures: ``train_clips_per_second`` and ``eval_clips_verified``.

    Raises:
        SystemExit: A clip holds frames or labels other than those it names.
    """
    banner("clip loader")
    train = _clip_loader(cfg, cfg.video.train, train=True, device=choice)
    print(f"decoder: {train.source} ({train.decoder_reason})")
    start, clips = time.perf_counter(), 0
    for batch in train:
        clips += len(batch)
    seconds = time.perf_counter() - start
    t = cfg.video.clip_length_frames
    print(
        f"train epoch: {clips} random clips in {len(train)} batches of {tuple(batch.clips.shape)} {batch.clips.dtype} "
        f"on {batch.clips.device}, labels {tuple(batch.frame_labels.shape)}: {clips / seconds:,.1f} clips/s "
        f"({clips * t / seconds:,.0f} frames/s, pipeline start included)"
    )

    val = _clip_loader(cfg, cfg.video.val, train=False, device=choice)
    stride = cfg.video.stride_frames
    verified = 0
    for batch in val:
        for k in range(len(batch)):
            video, first = int(batch.video_ids[k]), int(batch.start_frames[k])
            frames = first + np.arange(t) * stride
            tags = [read_tag(batch.clips[k, :, i], "CHW") for i in range(t)]
            if [(g.ident, g.aux) for g in tags] != [(int(f), video) for f in frames]:
                raise SystemExit(f"clip of video {video} at frame {first} arrived with the wrong frames: {tags}")
            if not np.array_equal(batch.frame_labels[k].cpu().numpy(), val.dataset.labels[video][frames]):
                raise SystemExit(f"clip of video {video} at frame {first} has the wrong labels")
            verified += 1
    print(
        f"eval epoch: {verified}/{len(val.table)} clips verified frame by frame (indices and video ids drawn in "
        f"their pixels) with their labels; behaviours {list(val.behaviours)}"
    )

    info = val.dataset.infos[0]
    reader = VideoFrameReader(
        info,
        size_px=cfg.video.size_px,
        chunk_frames=32,
        device=choice,
        decoder=cfg.video.decoder,
        hw_decoder_load=cfg.loader.hw_decoder_load,
    )
    seen = [int(i) for chunk in reader for i in chunk.frame_indices.tolist()]
    if seen != list(range(info.num_frames)):
        raise SystemExit(f"sequential reader returned frames {seen[:5]}... instead of 0..{info.num_frames - 1}")
    print(f"sequential reader: all {info.num_frames} frames of {info.path} once, in order ({reader.source})")
    return {"train_clips_per_second": clips / seconds, "eval_clips_verified": verified}


def _clip_loader(cfg: Config, folder, *, train: bool, device: DeviceChoice) -> ClipLoader:
    """A clip loader over ``folder`` with the ``video`` and ``loader`` sections, as training builds it."""
    dataset = VideoDataset.from_folder(folder)
    return ClipLoader(dataset, train=train, video_cfg=cfg.video, loader_cfg=cfg.loader, device=device, seed=cfg.seed)
