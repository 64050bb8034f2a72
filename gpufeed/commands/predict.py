"""``gpufeed predict``: a trained model over videos (or images), per-frame class probabilities out."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands._arg_types import location
from gpufeed.commands.serve import _positive
from gpufeed.core import parse_limit_mb

# Every gpufeed call imports this module to register its arguments; the handler, which imports what it
# runs (torch, DALI, onnxruntime), is in _predict_handlers.py (bench predict's in _bench_handlers.py).


def max_mb(text: str) -> float:
    """An export cache's size limit for argparse: MB (10^6 bytes) >= 0, or ``none`` (``math.inf``: no limit)."""
    try:
        return parse_limit_mb(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _runtime_options(p: argparse.ArgumentParser) -> None:
    """What runs the model: the runtime, runs of windows, the export cache."""
    p.add_argument(
        "--runtime",
        choices=("auto", "torch", "onnx"),
        default="auto",
        help="what runs a checkpoint: auto (default: its export on onnxruntime on a CPU, exported once and cached; "
        "PyTorch on a GPU), torch, or onnx (an export that fails or disagrees with PyTorch on the first batch "
        "is an error rather than PyTorch)",
    )
    p.add_argument(
        "--no-window-runs",
        dest="window_runs",
        action="store_false",
        help="score every window through the plain graph; by default, with a window at every frame, a "
        "stacked-frame model on onnxruntime's CPU provider scores runs of windows that share its first "
        "convolution (the same probabilities within 1e-6, about 1.6x fewer CPU seconds)",
    )
    p.add_argument(
        "--export-cache",
        type=Path,
        metavar="DIR",
        help="where a checkpoint's exports are kept (default: $GPUFEED_EXPORT_CACHE_DIR, else "
        "~/.cache/gpufeed/exports)",
    )
    p.add_argument(
        "--export-cache-max-mb",
        type=max_mb,
        metavar="MB",
        help="after a new export, remove the least recently used exports beyond MB (10^6 bytes; default: "
        "$GPUFEED_EXPORT_CACHE_MAX_MB, else 2048; none: no limit; the new export is always kept)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="per-frame class probabilities for every frame of every video (or every image) with a trained model",
        description="Score SOURCE with MODEL: a checkpoint, a training run folder (its newest checkpoint) or an "
        "exported model folder. SOURCE is a video (mp4/avi/mov/mkv/webm/m4v/ts/mts/m2ts, a frame folder, an HDF5 file of encoded "
        "frames), a folder of videos or a DeepEthogram project; a clip model reads every frame once, in order, and "
        "gives each frame the mean probabilities of the windows that cover it. Writes <name>_predictions.csv per "
        "video (frame, then one column per class), or with --format hdf5 DeepEthogram's <name>_outputs.h5, beside "
        "each video or under --out. A video whose output this model already wrote is kept (outputs appear only "
        "when complete; .gpufeed-predict.json records which model wrote each), an image's row likewise; "
        "a video that cannot be read is named and the others are still scored (exit status 1). An image model "
        "over an image folder writes one predictions.csv, a row per image.",
    )
    p.add_argument("model", type=Path, metavar="MODEL", help="checkpoint, run folder or exported model folder")
    p.add_argument(
        "source",
        metavar="SOURCE",
        type=location,
        help="video, folder of videos or images, DeepEthogram project (local)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="output folder (default: beside each video); images: or the .csv to write",
    )
    p.add_argument(
        "--format", dest="fmt", choices=("csv", "hdf5"), default="csv", help="csv (default) or DeepEthogram's HDF5"
    )
    p.add_argument(
        "--hop-frames",
        type=_positive,
        metavar="N",
        help="frames between window starts (default 1: a window at every frame; the clip's span: each frame in one)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive,
        metavar="N",
        help="windows per model call of a checkpoint, and its export's largest batch (default 8 CPU, 32 GPU)",
    )
    _runtime_options(p)
    p.add_argument("--chunk-frames", type=_positive, default=64, metavar="N", help="frames decoded per step (64)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--decoder", choices=("auto", "dali", "pyav"), default="auto", help="as video.decoder (auto)")
    p.add_argument("--overwrite", action="store_true", help="score again what this model already wrote too")
    p.add_argument("--latent-name", metavar="NAME", help="HDF5 group name (default: the model's architecture)")
    p.add_argument(
        "--allowed-root",
        dest="allowed_roots",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder outside a DeepEthogram project its records may name (as data.allowed_roots); repeatable",
    )
    p.add_argument(
        "--plot",
        action="store_true",
        help="also draw <name>_predictions.png beside each output: each class's probability along the video "
        "and the most probable class",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func="gpufeed.commands._predict_handlers:predict")


def register_predict_bench(kinds: argparse._SubParsersAction) -> None:
    """``gpufeed bench predict`` (registered by :mod:`gpufeed.commands.bench` among the benchmarks)."""
    p = kinds.add_parser(
        "predict",
        help="gpufeed predict vs a careful user's PyAV + PyTorch loop: frames/s scoring the same video, same "
        "model, same windows",
        description="Score the same video (a generated camera-like h264 file, or your own with --data) with the same "
        "clip model and windows several ways, rounds interleaved: a careful user's loop (PyAV decode in order, "
        "to_ndarray resize, a rolling frame buffer, PyTorch inference_mode), gpufeed predict with the checkpoint "
        "(as loaded by default; with its windows one by one; in PyTorch), with its export (onnxruntime), and that "
        "export served by gpufeed serve, each video posted as an mp4 (with runs of windows, and without). Prints "
        "frames/s, ratios, the agreement of the outputs, the "
        "load average and the verdicts (>= 1.5x on a CPU; >= 5,000 frames/s for a clip ResNet-18 at 112 px on an H100).",
    )
    p.add_argument("--data", type=Path, help="your own video file or folder of videos (default: a generated video)")
    p.add_argument("--seconds", type=int, default=8, help="length of the generated video in seconds (default 8)")
    p.add_argument("--video-size", type=int, default=256, help="generated frame width and height (default 256)")
    p.add_argument("--model", default="clip_resnet18", help="clip network (default clip_resnet18)")
    p.add_argument("--size-px", type=int, default=112, help="model input size (default 112)")
    p.add_argument("--clip-length", type=int, default=11, help="frames per window (default 11)")
    p.add_argument("--hop-frames", type=int, default=1, help="frames between window starts (default 1)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="windows per model call (default: predict's, 32 on a GPU, 8 on a CPU)",
    )
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per contender, interleaved (default 3)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where the video and model are kept")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:predict")
