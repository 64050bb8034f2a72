"""The handler of ``gpufeed predict`` (its arguments are registered by ``predict.py``).

Imported only when the command runs, so it imports the predictor (torch, DALI, onnxruntime) at module level.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufeed.core import is_object_url
from gpufeed.device import resolve_device
from gpufeed.pipelines import DatasetError
from gpufeed.predict import load_predictor, predict_images, predict_videos

__all__ = ["predict"]


def predict(args: argparse.Namespace) -> int:
    if not is_object_url(str(args.source)) and not Path(args.source).exists():  # before the model loads (seconds)
        raise DatasetError(f"{args.source} does not exist")
    predictor = load_predictor(
        args.model,
        resolve_device(args.device),
        batch_size=args.batch_size or 0,
        runtime=args.runtime,
        export_cache=args.export_cache,
        export_cache_max_mb=args.export_cache_max_mb,
        window_runs=args.window_runs,
    )
    print(f"predict: {predictor.describe()}", flush=True)
    if predictor.head.takes_clips:
        try:
            report = predict_videos(
                args.source,
                predictor,
                out=args.out,
                fmt=args.fmt,
                hop_frames=args.hop_frames,
                chunk_frames=args.chunk_frames,
                decoder=args.decoder,
                overwrite=args.overwrite,
                latent_name=args.latent_name,
                allowed_roots=tuple(args.allowed_roots),
                progress=not args.quiet,
                plot=args.plot,
            )
        except ValueError as err:
            print(f"gpufeed predict: error: {err}", file=sys.stderr)
            return 2
    elif predictor.head.classifies and not predictor.head.takes_clips:
        if args.fmt != "csv" or args.hop_frames is not None or args.plot:
            print(
                "gpufeed predict: error: an image model writes one CSV; --format hdf5, --hop-frames and --plot are "
                "for clip models",
                file=sys.stderr,
            )
            return 2
        report = predict_images(args.source, predictor, out=args.out, overwrite=args.overwrite, progress=not args.quiet)
    else:
        print(
            f"gpufeed predict: error: {predictor.spec.name} is a {predictor.head.kind} model; predict scores clip and "
            "image classifiers",
            file=sys.stderr,
        )
        return 2
    for result in report.failed:
        print(f"gpufeed predict: error: {result.error}", file=sys.stderr)
    print(f"predict: {report.summary()}", flush=True)
    return 1 if report.failed else 0
