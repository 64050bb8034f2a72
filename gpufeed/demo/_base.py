"""The demo's embedded config and the banner that opens each of its stages."""

from __future__ import annotations

from pathlib import Path

from gpufeed.config import Config, parse_config

__all__ = ["DEMO_CONFIG", "banner", "demo_config"]

# The embedded default. Paths are relative to the run folder.
DEMO_CONFIG = {
    "device": "auto",
    "seed": 0,
    "data": {
        "train": {"list_file": "data/images/train.txt"},
        "val": {"list_file": "data/images/val.txt"},
    },
    "image": {"size_px": 64},
    "loader": {"batch_size": 16, "last_batch": "drop"},
    "video": {"train": "data/videos", "val": "data/videos", "size_px": 64},
}


def demo_config(out: Path, device: str = "auto") -> Config:
    """The demo's config, with paths under ``out``.

    Args:
        out: The demo's run folder; the config's relative paths resolve under it.
        device: ``auto``, ``gpu`` or ``cpu``.
    """
    return parse_config(DEMO_CONFIG, overrides=[f"device={device}"], base_dir=Path(out).resolve())


def banner(text: str) -> None:
    """Print the heading of a stage (flushed, so it shows before a slow stage's first line)."""
    print(f"\n== {text}", flush=True)
