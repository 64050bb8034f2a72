"""The handlers of ``gpufeed bench ...`` (their arguments are registered by ``bench.py``).

Imported only when a benchmark runs (the CLI resolves ``"gpufeed.commands._bench_handlers:<name>"``),
so it imports the benchmarks, torch, DALI and the server at module level.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.bench import print_perf_analyzer_points, quiet_http_logs
from gpufeed.bench.augment import print_augment_result, run_augment_bench
from gpufeed.bench.clips import print_clip_result, run_clip_bench
from gpufeed.bench.image_checks import print_image_checks, run_image_checks
from gpufeed.bench.loader import parse_vary, print_loader_result, print_sweep_result, run_loader_bench, run_loader_sweep
from gpufeed.bench.predict import print_predict_result, run_predict_bench
from gpufeed.bench.server import plot_server_results, print_server_result, run_server_bench
from gpufeed.bench.storage import print_storage_result, run_storage_bench
from gpufeed.bench.train import draw_train_plot, print_train_result, run_train_bench
from gpufeed.commands import require_extra
from gpufeed.core import SizePx, write_json
from gpufeed.synth import make_bench_images

__all__ = ["augment", "clips", "images", "loader", "predict", "server", "storage", "train"]


def loader(args: argparse.Namespace) -> int:
    variants = parse_vary(args.vary)  # a bad key or value stops here, before any image is made
    data = Path(args.data or make_bench_images(args.cache, args.images, *args.image_size))
    common = {
        "batch_size": args.batch_size,
        "rounds": args.rounds,
        "size_px": args.size_px,
        "device": args.device,
        "workers": args.workers,
    }
    if variants:  # the loader against itself: no DataLoader
        sweep = run_loader_sweep(data, variants, **common)
        print_sweep_result(sweep)
        return _written(sweep, args.json)
    result = run_loader_bench(data, **common)
    print_loader_result(result)
    return _written(result, args.json)


def images(args: argparse.Namespace) -> int:
    figures = run_image_checks(device=args.device)
    print_image_checks(figures)
    return _written(figures, args.json)


def augment(args: argparse.Namespace) -> int:
    result = run_augment_bench(
        device=args.device,
        model=args.model,
        batch_size=args.batch_size,
        size_px=args.image_size,
        amp=args.amp,
        rounds=args.rounds,
        num_threads=args.workers,
    )
    print_augment_result(result)
    return _written(result, args.json)


def clips(args: argparse.Namespace) -> int:
    result = run_clip_bench(
        data=args.data,
        sets=tuple(args.sets),
        videos=args.videos,
        seconds=args.seconds,
        video_size=args.video_size,
        gop=args.gop,
        clip_length=args.clip_length,
        stride=args.stride,
        size=args.size,
        batch_size=args.batch_size,
        clips=args.clips,
        naive_clips=args.naive_clips,
        sampler_clips=args.sampler_clips,
        verify_clips=args.verify_clips,
        rounds=args.rounds,
        workers=args.workers,
        contenders=tuple(args.contenders),
        seed=args.seed,
        device=args.device,
        decoder=args.decoder,
        cache=args.cache,
    )
    print_clip_result(result)
    return _written(result, args.json)


def server(args: argparse.Namespace) -> int:
    require_extra("bench", "gpufeed bench server")
    if args.protocol == "grpc":
        require_extra("grpc", "gpufeed bench server --protocol grpc")
    quiet_http_logs()
    folder = make_bench_images(args.cache, args.images, *args.image_size)
    images = [p.read_bytes() for p in sorted((folder / "photos").glob("*.jpg"))]
    results = []
    for architecture in args.models:
        result = run_server_bench(
            architecture=architecture,
            images=images,
            cache=args.cache,
            size_px=args.size_px,
            batch_size=args.batch_size,
            concurrency=tuple(args.concurrency),
            seconds=args.seconds,
            warmup_s=args.warmup_seconds,
            rounds=args.rounds,
            max_delay_ms=args.max_delay_ms,
            contenders=tuple(args.contenders),
            device=args.device,
            checkpoint=args.checkpoint,
            protocol=args.protocol,
            loadgen=args.loadgen,
        )
        print_server_result(result)
        print_perf_analyzer_points(result.get("perf_analyzer"))
        results.append(result)
    _written({"benchmark": "server", "runs": results}, args.json)
    if args.plot:
        print(f"plot: {plot_server_results(results, args.plot)}")
    return 0


def train(args: argparse.Namespace) -> int:
    result = run_train_bench(
        task=args.task,
        device=args.device,
        model=args.model,
        batch_size=args.batch_size,
        size_px=args.size_px,
        epochs=args.epochs,
        rounds=args.rounds,
        workers=args.workers,
        prefetch_factor=args.prefetch_factor,
        data=args.data,
        classes=args.classes,
        images=args.images,
        image_size=args.image_size,
        videos=args.videos,
        seconds=args.seconds,
        video_size=args.video_size,
        gop=args.gop,
        clip_length=args.clip_length,
        overrides=tuple(args.overrides),
        cache=args.cache,
        baseline=args.baseline,
    )
    print_train_result(result)
    _written(result, args.json)
    if args.plot:
        print(f"plot: {draw_train_plot(result, args.plot)}")
    return 0


def storage(args: argparse.Namespace) -> int:
    result = run_storage_bench(
        data=args.data,
        url=args.url,
        local_server=args.url is None,
        videos=args.videos,
        seconds=args.seconds,
        video_size=args.video_size,
        gop=args.gop,
        clip_length=args.clip_length,
        size=SizePx(args.size, args.size),
        batch_size=args.batch_size,
        clips=args.clips,
        bytes_clips=args.bytes_clips,
        rounds=args.rounds,
        workers=args.workers,
        seed=args.seed,
        device=args.device,
        cache=args.cache,
        storage_cache_dir=args.storage_cache,
        block_bytes=args.block_bytes,
    )
    print_storage_result(result)
    if args.json:
        write_json(args.json, result)
    return 0


def predict(args: argparse.Namespace) -> int:
    result = run_predict_bench(
        data=args.data,
        seconds=args.seconds,
        video_size=args.video_size,
        architecture=args.model,
        size_px=args.size_px,
        clip_length=args.clip_length,
        hop_frames=args.hop_frames,
        batch_size=args.batch_size,
        rounds=args.rounds,
        device=args.device,
        cache=args.cache,
    )
    print_predict_result(result)
    if args.json:
        write_json(args.json, result.to_json())
    return 0


def _written(figures: dict, path: Path | None) -> int:
    """Write ``figures`` as JSON to ``path`` when given; the exit status of a benchmark that ran (0)."""
    if path:
        write_json(path, _document(figures))
    return 0


def _document(value):
    """``value`` as JSON writes it, each :class:`SizePx` spelt as the config spells it (224, [352, 224])."""
    if isinstance(value, SizePx):
        return value.config_value()
    if isinstance(value, dict):
        return {k: _document(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_document(v) for v in value]
    return value
