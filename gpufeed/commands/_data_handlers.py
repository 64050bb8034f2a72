"""The handlers of ``gpufeed check`` and ``gpufeed prepare`` (their arguments are registered by ``data.py``).

Imported only when one of them runs, so it imports the pipelines (DALI, PyAV) at module level.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpufeed.commands._prepare_shards import prepare_shards
from gpufeed.config import load_config
from gpufeed.core import configure_storage, is_object_url, write_json
from gpufeed.pipelines import (
    DEFAULT_MAX_IMAGE_PIXELS,
    CheckReport,
    PrepareOptions,
    check_mask_ids,
    check_path,
    prepare_videos,
)

__all__ = ["check", "prepare"]


def _check_limits(args: argparse.Namespace) -> tuple[int, int | None, int, int | None]:
    """(max pixels, class count or None, mask ignore id, clip span or None) from the options, then --config,
    then the defaults (a clip span of ``None``: the default video section's)."""
    max_pixels, num_classes, ignore_id, clip_span = DEFAULT_MAX_IMAGE_PIXELS, None, 255, None
    if args.config is not None:
        cfg = load_config(args.config)
        configure_storage(cfg.storage)  # its storage section reads s3:// data (cache, block size)
        max_pixels, ignore_id = cfg.data.max_image_pixels, cfg.data.mask_ignore_id
        num_classes = cfg.model.num_classes or len(cfg.data.classes or ()) or None
        # Training refuses a video shorter than one clip of the run's: the check must too.
        clip_span = (cfg.video.clip_length_frames - 1) * cfg.video.stride_frames + 1
    if args.num_classes is not None:
        if args.num_classes < 1:
            raise argparse.ArgumentTypeError(f"--num-classes {args.num_classes} must be >= 1")
        num_classes = args.num_classes
    if args.mask_ignore_id is not None:
        ignore_id = args.mask_ignore_id
    return args.max_image_pixels or max_pixels, num_classes, ignore_id, clip_span


def check(args: argparse.Namespace) -> int:
    try:
        max_pixels, num_classes, ignore_id, clip_span = _check_limits(args)
    except argparse.ArgumentTypeError as err:
        print(f"gpufeed check: error: {err}", file=sys.stderr)
        return 2
    report = CheckReport()
    for path in args.data:
        report.merge(check_path(path, max_pixels=max_pixels, clip_span_frames=clip_span))
        if num_classes is not None:
            report.merge(check_mask_ids(path, num_classes, ignore_id=ignore_id, max_pixels=max_pixels))
    print(report.table())
    if args.json:
        args.json.write_text(report.to_json() + "\n", encoding="utf-8")
    if args.quarantine:
        # Absolute, so the list means the same files from any working directory (training resolves
        # relative entries against the list's own folder instead).
        bad = sorted({p if is_object_url(p) else os.path.abspath(p) for p in report.bad_paths()})
        args.quarantine.write_text("".join(p + "\n" for p in bad), encoding="utf-8")
    return 0 if report.ok else 1


def prepare(args: argparse.Namespace) -> int:
    if args.shards is not None:
        if args.out is not None:
            print(
                "gpufeed prepare: error: give --out (re-encoded videos) or --shards (tar shards), not both",
                file=sys.stderr,
            )
            return 2
        return prepare_shards(args)
    if args.out is None:
        print("gpufeed prepare: error: the following arguments are required: --out (or --shards DIR)", file=sys.stderr)
        return 2
    try:
        options = PrepareOptions(
            codec=args.codec,
            gop_frames=args.gop,
            crf=args.crf,
            fps=args.fps,
            preset=args.preset,
            tune=args.tune,
            clip_length_frames=args.clip_length_frames,
            stride_frames=args.stride_frames,
            probe_clips=args.probe_clips,
            store=args.store,
            image_format=args.image_format,
            jpeg_quality=args.jpeg_quality,
        )
    except ValueError as err:
        print(f"gpufeed prepare: error: {err}", file=sys.stderr)
        return 2
    report = prepare_videos(Path(args.src), args.out, options)
    print(f"prepared {sum(v.problem is None for v in report.videos)} of {len(report.videos)} video(s) into {args.out}")
    if options.frame_store is None:
        tune = f", tune {options.tune}" if options.codec == "h264" else ""
        print(f"codec {options.codec}, GOP {options.resolved_gop_frames} frames, crf {options.crf}{tune}")
    else:
        quality = f" quality {options.jpeg_quality}" if options.image_format == "jpeg" else ""
        print(f"{options.store} of {options.image_format}{quality} frames, one image per frame")
    print(report.table())
    if args.json:
        write_json(args.json, report.to_dict())
    return 0 if report.ok else 1
