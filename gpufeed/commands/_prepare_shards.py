"""``gpufeed prepare SRC --shards DIR``: the handler (the arguments are ``prepare``'s, in ``data.py``)."""

from __future__ import annotations

import argparse
import sys

from gpufeed.core import data_path, format_table, write_json
from gpufeed.pipelines import (
    DatasetError,
    ImageDataset,
    VideoDataset,
    is_project,
    list_videos,
    project_dataset,
    write_clip_shards,
    write_image_shards,
)

# This module loads DALI and PyAV: imported by _data_handlers.py, which `gpufeed check` and `prepare` import.

__all__ = ["prepare_shards"]


def _kind(src: str, asked: str) -> str:
    """``images`` or ``clips``: as asked, or clips when ``src`` holds videos, frame stores or a project."""
    if asked != "auto":
        return asked
    root = data_path(src)
    if root.is_file():
        return "images"  # a list file
    return "clips" if is_project(root) or list_videos(root)[0] else "images"


def prepare_shards(args: argparse.Namespace) -> int:
    """Write ``args.src`` as shards in ``args.shards``; exit status 1 when a file was left out."""
    try:
        kind = _kind(args.src, args.shard_kind)
        root = data_path(args.src)
        if kind == "images":
            images = ImageDataset.from_list(root) if root.is_file() else ImageDataset.from_folder(root)
            report = write_image_shards(images, args.shards, shard_bytes=args.shard_bytes, progress=True)
        else:
            videos = (
                project_dataset(root, split="all", val_fraction=0.0, seed=0)
                if is_project(root)
                else VideoDataset.from_folder(root)
            )
            report = write_clip_shards(
                videos,
                args.shards,
                clip_length_frames=args.clip_length_frames,
                stride_frames=args.stride_frames,
                image_format=args.image_format,
                jpeg_quality=args.jpeg_quality,
                shard_bytes=args.shard_bytes,
                progress=True,
            )
    except (DatasetError, FileExistsError, ValueError) as err:
        print(f"gpufeed prepare: error: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {report.samples} {report.kind} sample(s) into {report.shards} shard(s) in {report.out} "
        f"({report.bytes / 2**20:,.1f} MiB)"
    )
    if report.skipped:
        print(format_table(["left out", "why"], [list(s) for s in report.skipped]))
    if args.json:
        write_json(args.json, report.to_dict())
    return 1 if report.skipped else 0
