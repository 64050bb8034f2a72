"""Helpers for the scoring tests: a clip "model" that reads the frames' tags, and the rule's reference values.

:class:`TagModel` is a real ``torch.nn.Module`` taking uint8 clips ``(N, 3, T, H, W)``: it reads the
:mod:`gpufeed.synth` tag of every frame, fails when a window's frames are not ``s, s + d, ...`` of
one video (clamped to its last frame), and answers logits that are a known function of the window's
first frame. So a test knows each window's logits from its start alone, and each frame's expected
probabilities from the rule (:func:`expected_frames`), without running anything under test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from gpufeed.device import DeviceChoice
from gpufeed.models import ModelSpec, WindowPlan
from gpufeed.models._clip_sampling import ClipSampling
from gpufeed.predict import Predictor
from gpufeed.synth import read_tag

CPU = DeviceChoice("cpu", None, "test")
TAG_CLASSES = ("background", "groom", "rear")


def window_logits(starts: np.ndarray, classes: int = len(TAG_CLASSES)) -> np.ndarray:
    """The logits :class:`TagModel` answers for windows starting at ``starts``: (N, classes) float32."""
    starts = np.asarray(starts, dtype=np.int64)
    c = np.arange(classes, dtype=np.int64)
    return (((starts[:, None] * (c + 3) + 5 * c) % 23).astype(np.float32) - 11.0) / 4.0


class TagModel(nn.Module):
    """Reads the tags of a clip's frames and answers :func:`window_logits` of its first frame (see the module docs).

    Args:
        num_frames: Frames of the video (a window's frames past the end repeat the last one): one
            count, or a count per video id (the tags' ``aux``) when it scores several videos.
        stride_frames: The gap between a window's frames.
        video_id: The video id every frame must carry (``None``: any, but one per window).
        fail_after: Raise after scoring this many windows (a model that breaks mid-video).
    """

    def __init__(
        self,
        num_frames: int | dict[int, int],
        stride_frames: int = 1,
        video_id: int | None = None,
        fail_after: int | None = None,
    ) -> None:
        super().__init__()
        self.num_frames, self.stride, self.video_id = num_frames, stride_frames, video_id
        self.fail_after = fail_after
        self.windows_seen: list[tuple[int, int]] = []  # (video id, first frame)

    def forward(self, clips: torch.Tensor) -> torch.Tensor:
        assert clips.dtype == torch.uint8 and clips.ndim == 5, (clips.dtype, clips.shape)
        starts = []
        for clip in clips.cpu():
            tags = [read_tag(clip[:, t].numpy(), "CHW") for t in range(clip.shape[1])]
            first, video = tags[0].ident, tags[0].aux
            count = self.num_frames if isinstance(self.num_frames, int) else self.num_frames[video]
            want = np.minimum(first + np.arange(len(tags)) * self.stride, count - 1)
            got = [tag.ident for tag in tags]
            videos = {t.aux for t in tags}
            if got != want.tolist() or len(videos) != 1 or (self.video_id is not None and videos != {self.video_id}):
                raise AssertionError(f"a window holds frames {got} of videos {sorted(videos)}; expected {want}")
            if self.fail_after is not None and len(self.windows_seen) >= self.fail_after:
                raise RuntimeError("the model broke down mid-video")
            starts.append(first)
            self.windows_seen.append((video, first))
        return torch.from_numpy(window_logits(np.array(starts)))


def tag_predictor(
    num_frames: int | dict[int, int],
    clip_length_frames: int = 5,
    stride_frames: int = 1,
    batch_size: int = 4,
    size_px: int = 40,
    fail_after: int | None = None,
) -> Predictor:
    """A :class:`~gpufeed.predict.Predictor` whose model is a :class:`TagModel` (multi-label: sigmoid scores)."""
    spec = ModelSpec(
        name="r3d_small",
        task="clip",
        num_classes=len(TAG_CLASSES),
        multilabel=True,
        size_px=size_px,
        clip_length_frames=clip_length_frames,
        labels=TAG_CLASSES,
    )
    module = TagModel(num_frames, stride_frames, fail_after=fail_after)
    return Predictor(
        Path("tag-model"), "checkpoint", spec, TAG_CLASSES, ClipSampling(stride_frames), batch_size, CPU, _module=module
    )


def expected_frames(plan: WindowPlan, num_frames: int, classes: int = len(TAG_CLASSES)) -> np.ndarray:
    """The rule, computed the slow way: each frame's mean over the windows covering it of sigmoid(logits)."""
    starts = plan.starts(num_frames)
    probabilities = 1.0 / (1.0 + np.exp(-window_logits(starts, classes).astype(np.float32)))
    probabilities = probabilities.astype(np.float32).astype(np.float64)
    out = np.zeros((num_frames, classes))
    for i in range(num_frames):
        covering = [k for k, s in enumerate(starts) if s <= i < min(s + plan.span_frames, num_frames)]
        out[i] = probabilities[covering].mean(axis=0)
    return out.astype(np.float32)
