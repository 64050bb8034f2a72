"""``gpufeed bench ...``: benchmarks that print figures and ratios against in-run baselines."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed._schema import ConfigError
from gpufeed._size import parse_size_px, size_px_value
from gpufeed.commands import lazy


def _size_px(text: str) -> int | tuple[int, int]:
    """An output size flag: ``224`` (a square) or ``352x224`` (width x height)."""
    try:
        return size_px_value(parse_size_px(text, "--size-px"))
    except ConfigError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 640x480, got {text!r}") from None
    return width, height


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks against the usual baselines (figures, not tests)")
    kinds = bench.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)

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
        "--size-px", type=_size_px, default=224, help="output size: N (square) or WIDTHxHEIGHT such as 352x224"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="timed epochs per loader, interleaved (default 3)")
    p.add_argument("--workers", type=int, default=0, help="workers/threads; 0 = one per core")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=lazy("gpufeed.bench.loader:main_loader"))

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
    p.set_defaults(func=lazy("gpufeed.bench.image_checks:main_images"))

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
    p.set_defaults(func=lazy("gpufeed.bench.augment:main_augment"))

    p = kinds.add_parser(
        "clips",
        help="random h264 clips: gpufeed vs decode-from-start, OpenCV seeking (and torchcodec on a GPU)",
        description="Random clips from generated 2-minute 30 fps h264 videos with a long GOP, then the same videos "
        "after 'gpufeed prepare', and (--stores) as frame folders and HDF5 files of JPEG frames read by gpufeed. "
        "Same clips, same process count, same output for every reader; prints clips/s, frames/s (against "
        "DeepEthogram's 1,200), whether each returned exactly the frames asked for, and ratios.",
    )
    p.add_argument("--videos", type=int, default=4, help="generated videos (default 4)")
    p.add_argument("--seconds", type=int, default=120, help="length of each video in seconds (default 120)")
    p.add_argument("--video-size", type=int, default=256, help="generated frame width and height (default 256)")
    p.add_argument("--gop", type=int, default=250, help="keyframe interval of the generated videos (default 250)")
    p.add_argument("--clip-length", type=int, default=11, help="frames per clip (default 11)")
    p.add_argument("--stride", type=int, default=1, help="frame stride within a clip (default 1)")
    p.add_argument(
        "--size",
        type=_size_px,
        default=112,
        help="output frame size: N (square, default 112) or WIDTHxHEIGHT such as 352x224",
    )
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--clips", type=int, default=256, help="clips per timed round (default 256)")
    p.add_argument("--naive-clips", type=int, default=12, help="clips per round for decode-from-start (default 12)")
    p.add_argument("--verify-clips", type=int, default=24, help="clips checked for exact frames (default 24)")
    p.add_argument(
        "--stores",
        nargs="*",
        choices=("folder", "hdf5"),
        default=["folder", "hdf5"],
        help="also read the videos as frame folders / HDF5 files of JPEG frames (default both; none: --stores)",
    )
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per reader, interleaved (default 5)")
    p.add_argument("--workers", type=int, default=0, help="processes/threads per reader; 0 = one per core")
    p.add_argument(
        "--contenders",
        nargs="+",
        default=["gpufeed", "decode_from_start", "opencv_seek", "torchcodec"],
        choices=["gpufeed", "decode_from_start", "opencv_seek", "torchcodec"],
        help="readers to run (default: all that are available)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated videos are kept")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func=lazy("gpufeed.bench.clips:main_clips"))

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
    p.set_defaults(func=lazy("gpufeed.bench.server:main_server", extra="bench"))

    register_reliability(kinds)
    register_train(kinds)


def _add_served_model_args(p: argparse.ArgumentParser) -> None:
    """What every server reliability benchmark takes: the model, the device, the cache, the JSON."""
    p.add_argument("--model-dir", type=Path, help="model folder to serve (default: smallcnn 64 px, batch 8, exported)")
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="cpu", help="the server's device (default cpu)")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where the model and images are kept")
    p.add_argument("--json", type=Path, help="write the figures here")


def _add_overrides_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="serve config")


def _add_reliability_args(p: argparse.ArgumentParser, clients: int, seconds: float) -> None:
    _add_served_model_args(p)
    _add_overrides_arg(p)
    p.add_argument("--clients", type=int, default=clients, help=f"concurrent connections (default {clients})")
    p.add_argument("--seconds", type=float, default=seconds, help=f"measured seconds (default {seconds:g})")


def register_reliability(kinds) -> None:
    """``bench soak``, ``bench overload``, ``bench fuzz`` and ``bench drain``: the server's reliability figures."""
    p = kinds.add_parser(
        "soak",
        help="many clients for a long time against gpufeed serve: errors, RSS growth, throughput, p99",
        description="Start gpufeed serve (its own process) and drive it with CLIENTS closed-loop keep-alive connections "
        "sending multipart JPEGs for SECONDS after a warm-up. Prints throughput, p50/p99 latency, errors and the "
        "server's RSS after warm-up and at the end; exit status 1 if anything failed (errors, RSS growth >= "
        "--max-growth, not ready after, exit status != 0 on SIGTERM).",
    )
    _add_reliability_args(p, clients=64, seconds=60.0)
    p.add_argument("--warmup-seconds", type=float, default=10.0, help="load before measuring (default 10)")
    p.add_argument("--max-growth", type=float, default=0.10, help="largest RSS growth that passes (default 0.10)")
    p.add_argument("--plot", type=Path, help="draw throughput and RSS over time to this PNG")
    p.set_defaults(func=lazy("gpufeed.bench.soak:main_soak", extra="bench"))

    p = kinds.add_parser(
        "overload",
        help="far more load than capacity: bounded queue, 503 + Retry-After, bounded latency, nothing hangs",
        description="Start gpufeed serve with a small queue (--queue-capacity images) and drive it with CLIENTS "
        "closed-loop connections that never back off. Scrapes the queue depth every 50 ms. Prints offered and "
        "admitted load, the share refused with 503, admitted latency p50/p99/max, the largest queue depth seen; "
        "exit status 1 if the queue overflowed, a refusal lacked Retry-After, an admitted request exceeded the "
        "request timeout, a request went unanswered, or the server did not recover.",
    )
    _add_reliability_args(p, clients=64, seconds=10.0)
    p.add_argument("--queue-capacity", type=int, default=16, help="serve.queue_capacity (default 16 images)")
    p.add_argument("--request-timeout", type=float, default=5.0, help="serve.request_timeout_seconds (default 5)")
    p.set_defaults(func=lazy("gpufeed.bench.overload:main_overload", extra="bench"))

    p = kinds.add_parser(
        "drain",
        help="SIGTERM with requests in flight: readiness false, in-flight answered, new ones 503, exit 0",
        description="Start gpufeed serve, hold batch-size minus one requests in its batcher (a long max delay), send "
        "SIGTERM, and probe readiness and predictions during the drain. Accounts for every request sent (answered, "
        "refused at connect, dropped) and prints the exit status; exit status 1 if a request was dropped, an "
        "in-flight request lost its answer, readiness stayed true, or the server did not exit 0.",
    )
    _add_served_model_args(p)
    p.add_argument(
        "--hold-ms", type=float, default=2000.0, help="serve.max_delay_ms holding the requests (default 2000)"
    )
    p.add_argument("--shutdown-delay", type=float, default=2.0, help="serve.shutdown_delay_seconds (default 2)")
    p.set_defaults(func=lazy("gpufeed.bench.drain:main_drain", extra="bench"))

    p = kinds.add_parser(
        "fuzz",
        help="over a thousand malformed requests against gpufeed serve: every answer a 4xx naming the problem",
        description="Start gpufeed serve (max body 256 KiB, 4 M pixels, 8 images per request) and send the generated "
        "corpus of malformed requests (truncated, corrupt and bit-flipped JPEG/PNG, zero bytes, decompression-bomb "
        "headers, wrong content types, malformed and oversized JSON, wrong tensor shapes and dtypes, unknown, "
        "path-like and very long model names, broken multipart and query strings, wrong methods). Checks every "
        "answer (no 5xx, the expected status and reason, a message naming the problem), that valid requests are "
        "still answered correctly after each category, and that every refusal was counted by reason. Prints "
        "requests by category, status and reason; exit status 1 on any failure.",
    )
    _add_served_model_args(p)
    _add_overrides_arg(p)
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    p.set_defaults(func=lazy("gpufeed.bench.fuzz:main_fuzz", extra="bench"))


def register_train(kinds) -> None:
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
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated data is kept")
    p.add_argument("--json", type=Path, help="write the figures (and every step's timings) here")
    p.add_argument("--plot", type=Path, help="draw loader wait vs compute per step, both loaders, to this PNG")
    p.set_defaults(func=lazy("gpufeed.bench.train:main_train"))
