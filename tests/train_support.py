"""Helpers for the training tests: a tiny, fast training config on the synthetic dataset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from gpufeed.config import Config, parse_config


def train_mapping(synth_dir: Path, device: str = "cpu") -> dict:
    """smallcnn at 32 px, batch 16: 6 steps per epoch on the 96 training images, seconds per run."""
    images = Path(synth_dir) / "images"
    return {
        "device": device,
        "seed": 0,
        "data": {"train": {"list_file": str(images / "train.txt")}, "val": {"list_file": str(images / "val.txt")}},
        # Crops keep at least a third of the image, so the label's colour block is usually in view.
        "image": {"size_px": 32, "crop_area": [0.35, 1.0]},
        "loader": {"batch_size": 16, "num_threads": 2},
        "model": {"name": "smallcnn"},
        "train": {"epochs": 6, "lr": 0.01, "warmup_steps": 3, "progress": False},
        # Colour jitter runs in the loader's graph, the blur on the device: both places train.
        "augment": {"ops": ["color_jitter", "gaussian_blur"]},
        "telemetry": {"metrics_port": 0},
    }


def train_config(synth_dir: Path, overrides: list[str] | tuple[str, ...] = (), device: str = "cpu") -> Config:
    return parse_config(train_mapping(synth_dir, device), overrides)


def write_train_config(path: Path, synth_dir: Path, device: str = "cpu") -> Path:
    path.write_text(yaml.safe_dump(train_mapping(synth_dir, device)), encoding="utf-8")
    return path


def gpufeed_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpufeed", *args]


def run_gpufeed(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        gpufeed_cmd(*args), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def assert_steps_partition(records: list[dict], on_cpu: bool) -> None:
    """The step log's periods are back to back within each epoch, and on the CPU each holds its own parts.

    A step's period ends where its record is taken (``time_unix``), so the periods of an epoch's
    steps after its first add up to the time between its first and last records. On the CPU, which
    reads each step as soon as it runs, a step's period holds its own wait, augment and compute.
    """
    for epoch in sorted({r["epoch"] for r in records}):
        steps = [r for r in records if r["epoch"] == epoch]
        span_s = steps[-1]["time_unix"] - steps[0]["time_unix"]
        between_s = sum(r["step_s"] for r in steps[1:])
        assert abs(between_s - span_s) <= 0.05 * span_s + 0.005, (
            f"epoch {epoch}: steps 2..{len(steps)} add up to {between_s:.3f} s between records {span_s:.3f} s apart"
        )
    if on_cpu:
        for r in records:
            parts_s = r["loader_wait_s"] + r["augment_s"] + r["compute_s"]
            assert r["step_s"] >= parts_s - 1e-4, f"step {r['step']}: {r['step_s']:.4f} s < its parts {parts_s:.4f} s"
