"""``gpufeed cache list|prune|clear``: the exports ``gpufeed predict`` keeps of checkpoints, looked at and cleaned."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpufeed.commands.predict import max_mb

# Every gpufeed call imports this module to register its arguments; the handlers, which import the
# predict package (torch, onnxruntime), are in _cache_handlers.py.


def register(sub: argparse._SubParsersAction) -> None:
    cache = sub.add_parser(
        "cache",
        help="the export cache of gpufeed predict: list its exports, prune it to a size, clear it",
        description="gpufeed predict exports a checkpoint to ONNX once and keeps the export in a cache folder "
        "(--dir, else $GPUFEED_EXPORT_CACHE_DIR, else ~/.cache/gpufeed/exports), removing the least recently "
        "used beyond $GPUFEED_EXPORT_CACHE_MAX_MB (default 2048) after each new export. Only folders whose "
        "export_key.json names them as gpufeed's exports are counted or removed; an export another process "
        "is loading is kept.",
    )
    actions = cache.add_subparsers(dest="cache", metavar="ACTION", required=True)
    commands = (
        ("list", "the exports, least recently used first: size, last use, checkpoint; and what else is there"),
        ("prune", "remove the least recently used exports until the rest hold at most --max-mb"),
        ("clear", "remove every export (those being loaded by another process are kept)"),
    )
    for name, what in commands:
        p = actions.add_parser(name, help=what, description=what[0].upper() + what[1:] + ".")
        p.add_argument(
            "--dir",
            "--export-cache",  # the name gpufeed predict gives it
            dest="dir",
            type=Path,
            metavar="DIR",
            help="the cache folder, as gpufeed predict --export-cache names it (default: "
            "$GPUFEED_EXPORT_CACHE_DIR, else ~/.cache/gpufeed/exports)",
        )
        if name == "prune":
            p.add_argument(
                "--max-mb",
                type=max_mb,
                metavar="MB",
                help="what the exports may hold, MB of 10^6 bytes (default: $GPUFEED_EXPORT_CACHE_MAX_MB, else 2048)",
            )
        p.set_defaults(func=f"gpufeed.commands._cache_handlers:{name}_exports")
