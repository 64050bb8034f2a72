"""``gpufeed bench ...``: gpufeed's speed against its peers, as figures and ratios against in-run baselines.

Pass/fail runs (soak, overload, drain, fuzz) are ``gpufeed reliability``; their old ``bench`` names
still run, unlisted, until the next release.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import get_args

from gpufeed.bench import CONTENDERS as CLIP_CONTENDERS
from gpufeed.bench import GENERATED_SETS
from gpufeed.commands._bench_storage import register_storage
from gpufeed.commands.predict import register_predict_bench
from gpufeed.commands.reliability import register_server_runs
from gpufeed.config import VideoDecoder
from gpufeed.core import ConfigError, SizePx, parse_size_px

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# benchmarks (torch, DALI, the server), are in _bench_handlers.py, imported only when one runs.


def _size_px(text: str) -> SizePx:
    """An output size flag: ``224`` (a square) or ``352x224`` (width x height), read once here."""
    try:
        return parse_size_px(text, "--size-px")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 640x480, got {text!r}") from None
    return width, height


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="gpufeed's speed against the usual baselines (figures, not tests)")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    # The order here is the order of `gpufeed bench --help`.
    _register_loader(kinds)
    _register_images(kinds)
    _register_augment(kinds)
    _register_clips(kinds)
    register_predict_bench(kinds)  # gpufeed/commands/predict.py, beside the command it measures
    _register_server(kinds)
    register_train(kinds)
    register_storage(kinds)
    register_server_runs(kinds, renamed_from="bench")


def _register_loader(kinds: argparse._SubParsersAction) -> None:
    """``bench loader``: the image loader against torch DataLoader + PIL."""
    p = kinds.add_parser(
        "loader",
        help="gpufeed image loader vs torch DataLoader + PIL doing the same work",
        description="Random-resized crop to 224 (or --size-px), flip, uint8 CHW on the same files with the same "
        "batch size and one worker/thread per core. Prints images/s of each and the ratio.",
    )
    p.add_argument("--data", type=Path, help="class-folder dataset to use (default: generated photo-like JPEGs)")
    p.add_argument("--images", type=int, default=512, help="generated images (default 512)")
    p.add_argument("--image-size", type=_size, default=(640, 480), help="generated image size WxH (default 640x480)")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated images are kept")
    p.add_argument(
        "--size-px",
        type=_size_px,
        default=SizePx(224, 224),
        help="output size: N (square) or WIDTHxHEIGHT such as 352x224",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed epochs per loader, interleaved (default 3)")
    p.add_argument("--workers", type=int, default=0, help="workers/threads; 0 = one per core")
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="loader.KEY=V1,V2",
        help="compare gpufeed's loader with itself under each value (repeat for more keys: every combination; "
        "the first is the reference); no DataLoader runs. E.g. --vary loader.hw_decoder_load=0.9,1.0",
    )
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:loader")


def _register_images(kinds: argparse._SubParsersAction) -> None:
    """``bench images``: what judging an image costs."""
    p = kinds.add_parser(
        "images",
        help="what judging an image costs: structure walk, strict decode, the server's decode, pixel bombs",
        description="Per generated photo-like JPEG and PNG at 640x480, 1920x1080 and 4000x3000: the structure walk "
        "(the dataset index, the server's validation) against a header parse plus a 64-byte tail look, the strict "
        "decode of 'gpufeed check' against Pillow's full decode, and the server's own decode of the same image; "
        "then 'gpufeed check' on two pixel bombs (time, peak RSS).",
    )
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:images")


def _register_augment(kinds: argparse._SubParsersAction) -> None:
    """``bench augment``: each augmentation op where it can run, against the model step."""
    p = kinds.add_parser(
        "augment",
        help="each augmentation op where it can run (DALI graph, fused torch, Kornia) against the model step",
        description="Times every augmentation op on the training device (Kornia in float32 and in the step's "
        "precision, gpufeed's fused torch ops) and inside the loader's DALI graph (marginal cost per batch), beside "
        "the model step (forward + backward + AdamW) measured in the same run, and the default augmentation before "
        "(Kornia on the device) and now (in the DALI graph) as shares of the step. GPU defaults: ResNet-18, 224 px, "
        "batch 256, bf16; CPU: ResNet-18, 64 px, batch 16.",
    )
    p.add_argument("--model", help="model to step (default resnet18)")
    p.add_argument("--batch-size", type=int, help="batch size (default: 256 on a GPU, 16 on the CPU)")
    p.add_argument(
        "--image-size",
        type=_size_px,
        help="image size: N (square; default 224 on a GPU, 64 on the CPU) or WIDTHxHEIGHT such as 352x224",
    )
    p.add_argument("--amp", choices=("auto", "bf16", "fp16", "off"), default="auto", help="the step's precision")
    p.add_argument("--rounds", type=int, default=20, help="timed calls per variant (default 20)")
    p.add_argument("--workers", type=int, default=0, help="DALI threads; 0 = one per core")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:augment")


def _register_clips(kinds: argparse._SubParsersAction) -> None:
    """``bench clips``: random clips, gpufeed against torchcodec, OpenCV and decode-from-start."""
    p = kinds.add_parser(
        "clips",
        help="random clips: gpufeed vs torchcodec (exact and approximate seeks, its sampler), OpenCV seeking, "
        "decode-from-start; on generated sets or your own (--data)",
        description="Random clips from generated h264 sets (long GOP, after 'gpufeed prepare', one GOP per video, "
        "camera-like with B-frames) and JPEG frame stores, or from your own videos, frame stores or DeepEthogram "
        "project (--data). Same clips, same process count, same output for every reader; each reader started, "
        "timed and stopped the same way. Prints clips/s (whole round and steady), start-up, frames/s (against "
        "DeepEthogram's 1,200), whether each returned exactly the frames asked for, ratios and targets. torchcodec "
        "runs where it imports and decodes: 'make peers' builds .venv-peers, whose gpufeed runs it.",
    )
    p.add_argument(
        "--data",
        type=Path,
        help="your own folder of videos (label CSVs optional), frame folders and HDF5 files, or a DeepEthogram "
        "project; each kind found is one set (default: generated sets)",
    )
    p.add_argument(
        "--sets",
        nargs="+",
        choices=GENERATED_SETS,
        default=list(GENERATED_SETS),
        help="generated sets to read (default: all)",
    )
    p.add_argument("--videos", type=int, default=4, help="generated videos per set (default 4)")
    p.add_argument("--seconds", type=int, default=120, help="length of each long-GOP video in seconds (default 120)")
    p.add_argument("--video-size", type=int, default=256, help="generated frame width and height (default 256)")
    p.add_argument("--gop", type=int, default=250, help="keyframe interval of the long-GOP videos (default 250)")
    p.add_argument("--clip-length", type=int, default=11, help="frames per clip (default 11)")
    p.add_argument("--stride", type=int, default=1, help="frame stride within a clip (default 1)")
    p.add_argument(
        "--size",
        type=_size_px,
        default=SizePx(112, 112),
        help="output frame size: N (square, default 112) or WIDTHxHEIGHT such as 352x224",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--clips", type=int, default=256, help="clips per timed round (default 256)")
    p.add_argument("--naive-clips", type=int, default=12, help="clips per round for decode-from-start (default 12)")
    p.add_argument(
        "--sampler-clips", type=int, default=8, help="clips per torchcodec sampler call, from one video (default 8)"
    )
    p.add_argument("--verify-clips", type=int, default=24, help="clips checked for exact frames (default 24)")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per reader, interleaved (default 5)")
    p.add_argument("--workers", type=int, default=0, help="processes per reader; 0 = one per core")
    p.add_argument(
        "--contenders",
        nargs="+",
        default=list(CLIP_CONTENDERS),
        choices=list(CLIP_CONTENDERS),
        help="readers to run (default: all that are available)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument(
        "--decoder",
        choices=get_args(VideoDecoder),
        default="auto",
        help="gpufeed's video.decoder for the video sets (default auto: NVDEC on a GPU where it decodes the format)",
    )
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated videos are kept")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:clips")


def _register_server(kinds: argparse._SubParsersAction) -> None:
    """``bench server``: gpufeed serve against FastAPI + onnxruntime and LitServe."""
    p = kinds.add_parser(
        "server",
        help="gpufeed serve vs FastAPI+PIL+onnxruntime (one per request) vs LitServe (batching)",
        description="Serve the same model three ways (each its own process on a loopback port) and drive each with "
        "the same closed-loop client and JPEGs at every concurrency of the sweep, contenders interleaved. Prints "
        "throughput and p50/p99 latency per point, the throughput ratio against the plain server, the batch sizes "
        "gpufeed ran at, and verdicts on the speed targets.",
    )
    p.add_argument(
        "--models", nargs="+", default=["resnet18", "smallcnn"], help="architectures (default: resnet18 smallcnn)"
    )
    p.add_argument("--checkpoint", type=Path, help="serve this checkpoint instead of fresh weights (one model)")
    p.add_argument(
        "--size-px", type=_size_px, default=224, help="model input size: N (square, default 224) or WIDTHxHEIGHT"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=8,
        help="largest batch size N; gpufeed and LitServe serve the export at 1, 2, 4, .. N (default 8)",
    )
    p.add_argument(
        "--loadgen",
        choices=("gpufeed", "perf_analyzer"),
        default="gpufeed",
        help="perf_analyzer: after the sweep, also drive gpufeed with Triton's perf_analyzer (fetched into "
        "--cache on first use) and print its figures beside",
    )
    p.add_argument("--max-delay-ms", type=float, default=5.0, help="batching delay for gpufeed and LitServe")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64], help="clients (default 1 8 32 64)")
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per point (default 8)")
    p.add_argument("--warmup-seconds", type=float, default=2.0, help="unmeasured seconds before each point")
    p.add_argument("--rounds", type=int, default=1, help="sweeps, contenders rotated each round (default 1)")
    p.add_argument(
        "--contenders", nargs="+", choices=("gpufeed", "plain", "litserve"), default=["gpufeed", "plain", "litserve"]
    )
    p.add_argument(
        "--protocol",
        choices=("rest", "grpc"),
        default="rest",
        help="how gpufeed is driven: rest (multipart uploads, default) or grpc (KServe v2 ModelInfer with raw "
        "bytes; needs the grpc extra); the other contenders always speak HTTP",
    )
    p.add_argument("--images", type=int, default=64, help="generated JPEGs (default 64)")
    p.add_argument("--image-size", type=_size, default=(640, 480), help="generated image size WxH (default 640x480)")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where images and exports are kept")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--plot", type=Path, help="draw throughput and p99 against concurrency to this PNG")
    p.set_defaults(func="gpufeed.commands._bench_handlers:server")


def register_train(kinds: argparse._SubParsersAction) -> None:
    """``bench train``: the same training run fed by gpufeed and by a tuned DataLoader."""
    p = kinds.add_parser(
        "train",
        help="the same training run fed by gpufeed and by a tuned torch DataLoader: loader wait vs compute",
        description="Train the same model (same batch, size, augmentation, optimiser, steps, samples and order) "
        "once fed by gpufeed's loader and once by torch's DataLoader with PIL (images) or PyAV keyframe seeks "
        "(clips) doing the same work per sample (one worker per core, persistent, pinned memory, prefetch_factor), "
        "over several epochs, alternating loaders by round. Prints loader wait as a share of step time (whole run "
        "and without each epoch's first batch), each epoch's first-batch wait against the median, samples/s, "
        "p50/p95 of step, compute, augment and wait, the ratios, and the targets' verdicts. Defaults depend on the "
        "device: CPU smallcnn 64 px batch 32 (images) / r3d_small 64 px batch 4 (clips); GPU resnet18 224 px batch "
        "256 on 4,096 JPEGs / r3d_small 112 px batch 64.",
    )
    p.add_argument(
        "--task",
        choices=("images", "clips", "depth"),
        default="images",
        help="what to train on (default images; depth: RGB + 16-bit depth pairs, unet_resnet18)",
    )
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--model", help="registry name (default: by task and device, see above)")
    p.add_argument("--batch-size", type=int, help="samples per step (default: by task and device)")
    p.add_argument(
        "--size-px",
        dest="size_px",
        type=_size_px,
        help="model input size: N (square) or WIDTHxHEIGHT such as 352x224 (default: by device)",
    )
    p.add_argument("--epochs", type=int, help="epochs per loader and round (default 3 on a CPU, 4 on a GPU)")
    p.add_argument("--rounds", type=int, help="rounds, each running both loaders, order alternating (default 2)")
    p.add_argument("--workers", type=int, default=0, help="DALI threads and DataLoader workers; 0 = one per core")
    p.add_argument(
        "--prefetch-factor", type=int, default=4, help="DataLoader batches prefetched per worker (default 4)"
    )
    p.add_argument("--data", type=Path, help="class-folder images (--task images) or a video folder with label CSVs")
    p.add_argument("--classes", type=int, help="classes of the generated images (default 1000; --data: its classes)")
    p.add_argument("--images", type=int, help="generated JPEGs (default 512 on a CPU, 4096 on a GPU)")
    p.add_argument("--image-size", type=_size, default=(640, 480), help="generated image size WxH (default 640x480)")
    p.add_argument("--videos", type=int, help="generated videos (default 2 on a CPU, 4 on a GPU)")
    p.add_argument("--seconds", type=int, help="length of each generated video (default 8 on a CPU, 120 on a GPU)")
    p.add_argument("--video-size", type=int, default=256, help="generated frame width and height (default 256)")
    p.add_argument("--gop", type=int, default=250, help="keyframe interval before 'gpufeed prepare' (default 250)")
    p.add_argument("--clip-length", type=int, default=11, help="frames per clip (default 11)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config key for both sides (train.*, augment.*, image crop, loader.prefetch_queue_depth, seed)",
    )
    p.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="train fed by gpufeed alone, no DataLoader: to compare gpufeed's own settings (--set loader.*) or run "
        "long enough that start-up is a few percent of the run; no ratios, no CPU verdicts",
    )
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated data is kept")
    p.add_argument("--json", type=Path, help="write the figures (and every step's timings) here")
    p.add_argument("--plot", type=Path, help="draw loader wait vs compute per step, each loader run, to this PNG")
    p.set_defaults(func="gpufeed.commands._bench_handlers:train")
