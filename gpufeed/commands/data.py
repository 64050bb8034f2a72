"""Data commands: ``synth`` (write the embedded dataset), ``check`` (find bad files), ``prepare`` (videos)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands._arg_types import location
from gpufeed.commands.bench import _size  # WIDTHxHEIGHT, as the bench commands read it

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# libraries they run (numpy, PIL, DALI, PyAV), are in _synth_handlers.py (synth runs without DALI and
# onnxruntime) and _data_handlers.py (check, prepare).


def register(sub: argparse._SubParsersAction) -> None:
    # The order here is the order of `gpufeed --help`.
    _register_synth(sub)
    _register_check(sub)
    _register_prepare(sub)


def _register_synth(sub: argparse._SubParsersAction) -> None:
    """``gpufeed synth``: the embedded synthetic dataset."""
    p = sub.add_parser(
        "synth",
        help="write the small deterministic synthetic dataset (images, h264 videos, RGB + depth + mask pairs)",
        description="Write JPEG/PNG images in class folders with list files, and h264 videos with per-frame "
        "behaviour labels. Pixels carry the sample id and label (frames: frame index and video id).",
    )
    p.add_argument("--out", required=True, type=Path, help="folder to write into (created if missing)")
    p.add_argument("--classes", type=int, default=4, help="number of classes (default 4)")
    p.add_argument("--train-per-class", type=int, default=24, help="training images per class (default 24)")
    p.add_argument("--val-per-class", type=int, default=8, help="evaluation images per class (default 8)")
    p.add_argument("--videos", type=int, default=3, help="number of videos (default 3)")
    p.add_argument(
        "--video-frames", type=int, nargs="+", default=[150, 120, 96], help="frame counts, cycled over the videos"
    )
    p.add_argument("--gop", type=int, default=30, help="keyframe interval of the videos in frames (default 30)")
    p.add_argument("--paired-train", type=int, default=16, help="RGB + depth + mask pairs in dense/train (default 16)")
    p.add_argument("--paired-val", type=int, default=8, help="pairs in dense/val (default 8)")
    p.add_argument("--paired-size", type=_size, default=(96, 72), help="pair size WxH (default 96x72; e.g. 640x480)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func="gpufeed.commands._synth_handlers:synth")


def _register_check(sub: argparse._SubParsersAction) -> None:
    """``gpufeed check``: every file that would stop or poison training."""
    p = sub.add_parser(
        "check",
        help="list every file that would stop or poison training (images, videos, frame stores, projects, pairs)",
        description="Check data before training, naming every bad file and why. DATA may be: class folders or "
        "an image list file; a paired (dense) split, rgb/ with depth/ and/or mask/, or a folder of such splits; "
        "a video folder (video files, frame folders and .h5 frame files, each with its label CSV); one video file, "
        "frame folder or .h5 frame file; a DeepEthogram project (project_config.yaml and DATA/); a folder of "
        "split folders (train/, val/ ...: each checked as its own dataset, with a warning); 'gpufeed synth' "
        "output (images/, videos/, dense/); an image shard folder ('gpufeed prepare --shards': each image read "
        "from its byte range of the tar); or single JPEG/PNG images, files or s3:// objects (other image formats, "
        "such as GIF, are named as unsupported). Exit status 1 when problems are found.",
    )
    # Text, not Path: a dataset may be s3://bucket/prefix, which pathlib would read as s3:/bucket/prefix.
    p.add_argument("data", nargs="+", type=location, help="dataset paths, local or s3://bucket/prefix (see above)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument(
        "--quarantine",
        type=Path,
        help="write the bad files' absolute paths here, one per line, for the config key loader.quarantine_file",
    )
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=None,
        metavar="N",
        help="images whose header declares more pixels are bad, never decoded (default: the config key "
        "data.max_image_pixels' default, 40,000,000)",
    )
    p.add_argument(
        "--num-classes",
        type=int,
        default=None,
        metavar="K",
        help="also read every mask of the paired splits and name each holding a class id >= K (other than the "
        "ignore id), which a K-class segmentation model refuses (default: --config's model.num_classes)",
    )
    p.add_argument(
        "--mask-ignore-id",
        type=int,
        default=None,
        metavar="ID",
        help="the mask id excluded from training, allowed in any mask (default: --config's data.mask_ignore_id, 255)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a training config: its model.num_classes (or data.classes), data.mask_ignore_id and "
        "data.max_image_pixels are the defaults of the options above",
    )
    p.set_defaults(func="gpufeed.commands._data_handlers:check")


def _register_prepare(sub: argparse._SubParsersAction) -> None:
    """``gpufeed prepare``: videos re-encoded for exact random clip reads, or data written as shards."""
    p = sub.add_parser(
        "prepare",
        help="re-encode videos for fast exact random clip reads (CFR h264, short GOP), copying labels",
        description="Re-encode every video under SRC into DST (same relative paths): constant frame rate, yuv420p, "
        "no audio, no B-frames, a keyframe every --gop frames (default: twice the span of one clip, at least 8). "
        "Label CSVs are copied after checking one row per frame. Ends with a table of random-seek cost "
        "per clip before and after. Exit status 1 when a video fails (the others are still prepared).",
    )
    # Text, not Path: with --shards, SRC may be s3://bucket/prefix.
    p.add_argument(
        "src", type=location, help="folder of videos (and <name>.csv label files); with --shards, an image split too"
    )
    p.add_argument("--out", type=Path, help="folder to write into (must not be SRC); not with --shards")
    p.add_argument(
        "--shards",
        metavar="DIR",
        type=location,
        help="write SRC as WebDataset-style tar shards in DIR (local or s3://) instead: an image split (class "
        "folders or a list file) as images with labels, a video folder or DeepEthogram project as its clips' "
        "frames with per-frame labels (--clip-length-frames, --stride-frames, --image-format, --jpeg-quality)",
    )
    p.add_argument(
        "--shard-kind",
        choices=("auto", "images", "clips"),
        default="auto",
        help="what SRC holds (default auto: clips when it holds videos, frame stores or a DeepEthogram project)",
    )
    p.add_argument("--shard-bytes", type=int, default=256 << 20, help="close a shard past this size (default 256 MiB)")
    p.add_argument("--codec", choices=("h264", "vp9"), default="h264", help="h264 (NVDEC; default) or vp9 (DALI CPU)")
    p.add_argument("--gop", type=int, default=0, help="keyframe interval in frames (default 0: twice the clip span)")
    p.add_argument("--crf", type=int, default=23, help="constant quality, lower is better (default 23)")
    p.add_argument("--fps", type=float, default=0.0, help="output frame rate (default: the source's average)")
    p.add_argument("--preset", default="medium", help="x264 preset (default medium)")
    p.add_argument(
        "--tune", choices=("fastdecode", "none"), default="fastdecode", help="x264 tune (default fastdecode)"
    )
    p.add_argument("--clip-length-frames", type=int, default=11, help="frames per clip to optimise for (default 11)")
    p.add_argument("--stride-frames", type=int, default=1, help="stride of those clips (default 1)")
    p.add_argument("--probe-clips", type=int, default=20, help="random clips timed per video (0: skip; default 20)")
    p.add_argument(
        "--store",
        default="video",
        help="video: re-encode (default); a frame store kind (folder, hdf5): every frame as one image, in "
        "DeepEthogram's vidio layouts (<name>/000000000.jpg ... or <name>.h5)",
    )
    p.add_argument(
        "--image-format", choices=("jpeg", "png"), default="jpeg", help="frame encoding of --store (default jpeg)"
    )
    p.add_argument("--jpeg-quality", type=int, default=95, help="JPEG quality of --store frames (default 95)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.set_defaults(func="gpufeed.commands._data_handlers:prepare")
