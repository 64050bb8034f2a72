"""The embedded default dataset: small, deterministic, and self-describing in its pixels.

``gpufeed synth --out DIR`` (or :func:`write_synthetic_dataset`) writes::

    DIR/images/classes.txt              class names, one per line, in label order
    DIR/images/train/<class>/<id>.jpg|png
    DIR/images/val/<class>/<id>.jpg|png
    DIR/images/train.txt, val.txt       list files: "relative/path label"
    DIR/videos/clip_<k>.mp4             h264, yuv420p, constant frame rate
    DIR/videos/clip_<k>.csv             one multi-hot behaviour row per frame
    DIR/dense/train|val/rgb/<id>.jpg    RGB of the paired (dense-target) splits
    DIR/dense/train|val/depth/<id>.png  16-bit depth, a function of the pixel coordinates
    DIR/dense/train|val/mask/<id>.png   8-bit class ids in drawn rectangles (255: ignore band)
    DIR/synth.json                      what was written, with the parameters

Image pixels carry (sample id, label) and video frames carry (frame index, video id); see
:mod:`gpufeed.synth._tags`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from gpufeed.core import progress_bar, write_json

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.synth._damaged import declare_size as declare_size
from gpufeed.synth._damaged import jpeg_without_segment as jpeg_without_segment
from gpufeed.synth._damaged import png_chunk as png_chunk
from gpufeed.synth._damaged import png_declaring as png_declaring
from gpufeed.synth._damaged import png_with_damaged_data as png_with_damaged_data
from gpufeed.synth._images import CLASS_NAMES, IMAGE_SIZES, render_image, write_image_split
from gpufeed.synth._pairs import render_pair, synth_depth, write_paired_split
from gpufeed.synth._photos import encode_image as encode_image
from gpufeed.synth._photos import format_samples as format_samples
from gpufeed.synth._photos import make_bench_images as make_bench_images
from gpufeed.synth._photos import photo_pixels as photo_pixels
from gpufeed.synth._tags import CLASS_WORDS, Tag, TagError, draw_tag, read_tag
from gpufeed.synth._tags import tag_blocks as tag_blocks
from gpufeed.synth._videos import BEHAVIOURS, behaviour_labels, render_frame, write_video
from gpufeed.synth._videos import write_label_csv as write_label_csv

__all__ = [
    "BEHAVIOURS",
    "CLASS_NAMES",
    "CLASS_WORDS",
    "IMAGE_SIZES",
    "SynthSpec",
    "Tag",
    "TagError",
    "behaviour_labels",
    "draw_tag",
    "read_tag",
    "render_frame",
    "render_image",
    "render_pair",
    "synth_depth",
    "write_paired_split",
    "write_synthetic_dataset",
    "write_video",
]


@dataclass(frozen=True)
class SynthSpec:
    """How much synthetic data to write. The defaults make a dataset that a CPU reads in seconds."""

    num_classes: int = 4
    train_per_class: int = 24
    val_per_class: int = 8
    num_videos: int = 3
    video_frames: tuple[int, ...] = (150, 120, 96)
    video_width: int = 96
    video_height: int = 64
    video_fps: int = 30
    video_gop_frames: int = 30
    paired_train: int = 16
    paired_val: int = 8
    paired_width: int = 96
    paired_height: int = 72
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.num_classes <= len(CLASS_NAMES):
            raise ValueError(f"num_classes {self.num_classes} is out of range [1, {len(CLASS_NAMES)}]")
        if self.num_videos and not self.video_frames:
            raise ValueError("video_frames must list at least one frame count")


def write_synthetic_dataset(out: str | Path, spec: SynthSpec = SynthSpec(), progress: bool = True) -> Path:
    """Write the synthetic dataset into ``out`` (created if missing) and return ``out``.

    Deterministic: the same spec writes the same pixels. A progress display (gpufeed.core._progress) shows how far it is.
    """

    out = Path(out)
    images = out / "images"
    images.mkdir(parents=True, exist_ok=True)
    classes = CLASS_NAMES[: spec.num_classes]
    frames = [spec.video_frames[k % len(spec.video_frames)] for k in range(spec.num_videos)]
    total = spec.num_classes * (spec.train_per_class + spec.val_per_class) + sum(frames)
    total += spec.paired_train + spec.paired_val
    with progress_bar(total=total, desc="synth", unit="file", disable=not progress, leave=False) as bar:
        (images / "classes.txt").write_text("\n".join(classes) + "\n", encoding="utf-8")
        for split, per_class in (("train", spec.train_per_class), ("val", spec.val_per_class)):
            rows = write_image_split(images, split, classes, per_class, spec.seed, progress=bar)
            (images / f"{split}.txt").write_text("".join(f"{p} {label}\n" for p, label in rows), encoding="utf-8")
        for video_id, num_frames in enumerate(frames):
            write_video(
                out / "videos" / f"clip_{video_id:03d}.mp4",
                video_id=video_id,
                num_frames=num_frames,
                width=spec.video_width,
                height=spec.video_height,
                fps=spec.video_fps,
                gop_frames=spec.video_gop_frames,
                seed=spec.seed,
                progress=bar,
            )
        for split, count in (("train", spec.paired_train), ("val", spec.paired_val)):
            if count:
                size = (spec.paired_width, spec.paired_height)
                write_paired_split(out / "dense" / split, count, *size, spec.seed, progress=bar)
    manifest = {"spec": asdict(spec), "classes": list(classes), "behaviours": list(BEHAVIOURS)}
    write_json(out / "synth.json", manifest)
    return out
