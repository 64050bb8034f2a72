"""The export parity check's inputs: real uint8 rows of each kind a head takes.

The check compares onnxruntime's outputs with PyTorch's on real inputs (:mod:`gpufeed.models._export`);
each task head says which inputs it takes (:meth:`~gpufeed.models._head.TaskHead.parity_inputs`)
and which agreement figure means something for it (:attr:`~gpufeed.models._head.TaskHead.agreement`):

==============  ===================  ======================================================================
task            card key             figure
==============  ===================  ======================================================================
image, clip     ``top1_agreement``   share of rows whose highest-scoring class is the same
segmentation    ``pixel_agreement``  share of pixels whose highest-scoring class is the same
depth           ``depth_rel_diff``   mean |onnx - torch| over every pixel, relative to the mean |depth|
==============  ===================  ======================================================================

Image and dense models get images through gpufeed's evaluation pipeline (exactly what the server
feeds): synthetic JPEG/PNG files, the images given, or, for a dense model given its paired split
(``rgb/`` with ``depth/`` or ``mask/``), its RGB images through the dense evaluation pipeline,
never its maps (:func:`image_inputs`). Clip models get rendered behaviour-video frames
(:func:`clip_inputs`). Inputs count only the rows the data has: padding rows of the last batch are
dropped (:func:`valid_rows`).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DenseLoader, ImageDataset, ImageLoader, PairedDataset, is_paired_root
from gpufeed.synth import SynthSpec, behaviour_labels, render_frame, write_synthetic_dataset

__all__ = ["clip_inputs", "dense_inputs", "image_inputs", "valid_rows"]

_CPU_PARITY = DeviceChoice("cpu", None, "export parity inputs")
_EVAL_PIPELINE = "through the evaluation pipeline (resize + centre crop, uint8 NCHW)"


def valid_rows(batch) -> np.ndarray:
    """A batch's images (N, 3, H, W) uint8 on the host, without its padding rows."""
    images = batch.images.contiguous().cpu().numpy()
    return images[batch.valid.cpu().numpy().astype(bool)]


def _loader_args(size, eval_crop_fraction: float, batch_size: int, device) -> dict:
    return {
        "train": False,
        "image_cfg": ImagePipelineConfig(size_px=size, eval_crop_fraction=eval_crop_fraction),
        "loader_cfg": LoaderConfig(batch_size=batch_size, last_batch="pad", num_threads=2, on_bad_sample="skip"),
        "device": device or _CPU_PARITY,
        "shard_id": 0,  # every parity input, whatever rank or process group this runs in
        "num_shards": 1,
    }


def _first_batches(loader, batches: int) -> np.ndarray:
    out = []
    for batch in loader:
        out.append(valid_rows(batch))  # the images the data has: padding rows are not counted
        if len(out) == batches:
            break
    if not out or not sum(map(len, out)):  # every image skipped as unreadable (on_bad_sample: skip)
        raise LookupError("none of its images could be read (gpufeed check lists why)")
    return np.concatenate(out)


def dense_inputs(root: Path, size, eval_crop_fraction: float, batch_size: int, batches: int, device):
    """Up to ``batch_size * batches`` RGB images of a paired split, through the dense evaluation pipeline.

    Returns:
        (uint8 NCHW images, what they are), only the images the split has.
    """
    loader = DenseLoader(PairedDataset.from_root(root), **_loader_args(size, eval_crop_fraction, batch_size, device))
    return _first_batches(loader, batches), f"RGB images of the paired split {root}"


def image_inputs(
    spec, batch_size: int, batches: int, data: str | Path | None, device, *, paired: bool = False
) -> tuple[np.ndarray, str]:
    """Up to ``batch_size * batches`` images through the evaluation pipeline, and what they are.

    Args:
        spec: The model's :class:`~gpufeed.models.ModelSpec` (size, crop).
        data: A list file or class folders; ``None``: synthetic JPEG/PNG images.
        paired: ``data`` may be a paired split (a dense model's): its RGB images are fed then.
    """
    size, crop = spec.size_px, spec.eval_crop_fraction
    data = Path(data) if data else None
    if paired and data is not None and is_paired_root(data):
        images, what = dense_inputs(data, size, crop, batch_size, batches, device)
        return images, f"{what} {_EVAL_PIPELINE}"
    with contextlib.ExitStack() as stack:
        if data is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpufeed-parity-")))
            per_class = -(-batch_size * batches // 4)
            write_synthetic_dataset(folder, SynthSpec(train_per_class=1, val_per_class=per_class, num_videos=0), False)
            dataset, what = ImageDataset.from_list(folder / "images" / "val.txt"), "synthetic JPEG/PNG images"
        else:
            dataset = ImageDataset.from_list(data) if data.is_file() else ImageDataset.from_folder(data)
            what = f"images from {data}"
        images = _first_batches(ImageLoader(dataset, **_loader_args(size, crop, batch_size, device)), batches)
    return images, f"{what} {_EVAL_PIPELINE}"


def clip_inputs(spec, batch_size: int, batches: int) -> tuple[np.ndarray, str]:
    """``batch_size * batches`` clips of rendered synthetic behaviour frames (uint8 NCTHW), and what they are.

    The clip loader is built elsewhere; the rendered frames (tags, bands, a moving bar) are the
    same pixels the synthetic videos hold, before h264.
    """
    t, (w, h) = spec.clip_length_frames, spec.size_px
    assert t is not None, "ModelSpec refuses a clip model without clip_length_frames"
    width = w * 3 // 2
    labels = behaviour_labels(batch_size * batches + t, seed=0)
    clips = np.empty((batch_size * batches, 3, t, h, w), dtype=np.uint8)
    for k in range(len(clips)):
        left = (width - w) // 2
        frames = [render_frame(k + j, k % 7, labels[k + j], width, h)[:, left : left + w] for j in range(t)]
        clips[k] = np.stack(frames).transpose(3, 0, 1, 2)
    return clips, "rendered synthetic behaviour-video frames (uint8 NCTHW)"
