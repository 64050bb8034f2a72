"""``gpufeed bench storage``: its arguments (kept apart from ``bench.py``, which holds the others')."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands._arg_types import location

# Every gpufeed call imports this module to register its arguments; the handler, which imports the
# benchmark (torch, DALI, boto3), is in _bench_handlers.py.

__all__ = ["register_storage"]


def register_storage(kinds: argparse._SubParsersAction) -> None:
    """Add ``gpufeed bench storage`` to the bench kinds."""
    p = kinds.add_parser(
        "storage",
        help="random clips from object storage (s3://) against the same files on local disk, and bytes per clip",
        description="The same videos read by the same clip loader from a local folder and from an s3:// prefix "
        "holding copies of them: by default a local S3 server (moto, on 127.0.0.1; needs 'moto[server]') the run "
        "starts and uploads the videos to, or --url, a bucket of yours (the standard AWS settings). Rounds "
        "alternate the two; prints clips/s of each, their ratio against the 0.8x target, the bytes a clip "
        "fetches against the file size, and the load average.",
    )
    p.add_argument("--data", type=Path, help="a local folder of videos (default: generated long-GOP h264 videos)")
    p.add_argument(
        "--url",
        type=location,
        help="an s3:// prefix already holding copies of --data's files (default: a local moto server)",
    )
    p.add_argument("--videos", type=int, default=4, help="generated videos (default 4)")
    p.add_argument("--seconds", type=int, default=60, help="length of each generated video in seconds (default 60)")
    p.add_argument("--video-size", type=int, default=256, help="generated frame width and height (default 256)")
    p.add_argument("--gop", type=int, default=30, help="keyframe interval of the generated videos (default 30)")
    p.add_argument("--clip-length", type=int, default=11, help="frames per clip (default 11)")
    p.add_argument("--size", type=int, default=112, help="output frame side (default 112)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--clips", type=int, default=192, help="clips per timed round (default 192)")
    p.add_argument("--bytes-clips", type=int, default=64, help="clips of the bytes-per-clip pass (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per source, interleaved (default 3)")
    p.add_argument("--workers", type=int, default=0, help="PyAV worker processes per loader; 0 = one per core")
    p.add_argument("--storage-cache", type=Path, help="storage.cache_dir for the bucket's reads (default: none)")
    p.add_argument(
        "--block-bytes",
        type=int,
        default=1 << 20,
        help="storage.block_bytes, the unit of ranged reads (default 1048576)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="cpu")
    p.add_argument("--cache", type=Path, default=Path(".cache/bench"), help="where generated videos are kept")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.set_defaults(func="gpufeed.commands._bench_handlers:storage")
