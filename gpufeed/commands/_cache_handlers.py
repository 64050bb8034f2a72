"""The handlers of ``gpufeed cache ...`` (their arguments are registered by ``cache.py``).

Imported only when one of them runs, so they import the predict package at module level.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from gpufeed.core import format_table
from gpufeed.predict import (
    ENV_EXPORT_CACHE_MAX_MB,
    ExportCachePrune,
    default_export_cache,
    export_cache_max_bytes,
    list_export_cache,
    prune_export_cache,
)

__all__ = ["clear_exports", "list_exports", "prune_exports"]

_MB = 1_000_000


def _limit(max_bytes: float) -> str:
    return "no limit" if math.isinf(max_bytes) else f"limit {max_bytes / _MB:,.0f} MB"


def list_exports(args: argparse.Namespace) -> int:
    cache_dir = args.dir or default_export_cache()
    try:
        listing = list_export_cache(cache_dir)
    except OSError as err:
        print(f"gpufeed cache list: error: cannot list {cache_dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    rows = [
        [
            e.name,
            e.size_bytes / _MB,
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.last_used_unix_s)),
            ",".join(map(str, e.batch_sizes)),
            e.checkpoint or f"sha256 {e.checkpoint_sha256[:12]}",
        ]
        for e in listing.entries
    ]
    print(
        f"export cache {cache_dir}: {len(rows)} export(s), {listing.total_bytes / _MB:,.1f} MB "
        f"({_limit(export_cache_max_bytes())}, ${ENV_EXPORT_CACHE_MAX_MB} or the default)"
    )
    if rows:
        print(format_table(["export", "MB", "last used (UTC)", "batch sizes", "checkpoint (last use)"], rows))
    for path, why in listing.others:
        print(f"not a gpufeed export, left alone: {path.name} ({why})")
    return 0


def _report(command: str, cache_dir, done: ExportCachePrune) -> int:
    freed = sum(e.size_bytes for e in done.removed)
    print(
        f"{command}: removed {len(done.removed)} export(s), {freed / _MB:,.1f} MB; "
        f"the exports in {cache_dir} now hold {done.left_bytes / _MB:,.1f} MB"
    )
    for entry in done.in_use:
        print(f"{command}: kept {entry.name}: another process is loading it")
    for entry, why in done.failed:
        print(f"{command}: error: cannot remove {entry.folder}: {why}", file=sys.stderr)
    return 1 if done.failed else 0


def _prune(command: str, args: argparse.Namespace, max_bytes: float) -> int:
    cache_dir = args.dir or default_export_cache()
    try:
        done = prune_export_cache(cache_dir, max_bytes)
    except OSError as err:
        print(f"{command}: error: cannot list {cache_dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    return _report(command, cache_dir, done)


def prune_exports(args: argparse.Namespace) -> int:
    limit = export_cache_max_bytes(args.max_mb)
    return _prune("gpufeed cache prune", args, limit)


def clear_exports(args: argparse.Namespace) -> int:
    return _prune("gpufeed cache clear", args, 0)
