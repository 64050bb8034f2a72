"""Shared pieces of the reliability runs: the small training job, data, captured CLI calls."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpufeed.core import module_argv
from gpufeed.synth import SynthSpec, write_synthetic_dataset

__all__ = [
    "CliOutcome",
    "LogCapture",
    "ensure_synth",
    "gpufeed_argv",
    "run_cli",
    "step_records",
    "tiny_train_mapping",
    "write_train_yaml",
]


def tiny_train_mapping(synth_dir: Path, epochs: int = 4, checkpoint_every_steps: int = 4) -> dict:
    """smallcnn at 32 px on the synthetic images, batch 16: 6 steps per epoch, seconds per run on a CPU.

    ``device: cpu`` and two DALI threads make runs bit-for-bit repeatable on one machine, which is
    what the kill -9 comparison relies on.
    """
    images = Path(synth_dir) / "images"
    return {
        "device": "cpu",
        "seed": 0,
        "data": {"train": {"list_file": str(images / "train.txt")}, "val": {"list_file": str(images / "val.txt")}},
        "image": {"size_px": 32, "crop_area": [0.35, 1.0]},
        "loader": {"batch_size": 16, "num_threads": 2},
        "model": {"name": "smallcnn"},
        "train": {
            "epochs": epochs,
            "lr": 0.01,
            "warmup_steps": 3,
            "checkpoint_every_steps": checkpoint_every_steps,
            "progress": False,
        },
        "augment": {"ops": ["color_jitter"]},
        "telemetry": {"metrics_port": 0},
    }


def write_train_yaml(path: Path, mapping: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
    return path


def ensure_synth(folder: Path, progress: bool = False) -> Path:
    """The default synthetic dataset in ``folder`` (written once; reused when already there)."""
    folder = Path(folder)
    if not (folder / "synth.json").is_file():
        write_synthetic_dataset(folder, SynthSpec(), progress=progress)
    return folder


def gpufeed_argv(*args: str) -> list[str]:
    """The command line of a ``gpufeed`` subprocess run by this Python."""
    return module_argv("gpufeed", *args)


def step_records(run_dir: Path, since_unix: float = 0.0) -> list[dict]:
    """Complete step records in ``run_dir/steps.jsonl`` written after ``since_unix`` (a torn last line is ignored)."""
    path = Path(run_dir) / "steps.jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return []
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written, or cut short by a kill
        if record.get("time_unix", 0.0) >= since_unix:
            records.append(record)
    return records


@dataclass
class CliOutcome:
    """What a ``gpufeed`` command run in this process returned and printed.

    Attributes:
        status: The exit status ``gpufeed.cli.main`` returned (2 for a user error).
        error: The ``gpufeed ...: error: ...`` line printed on stderr ('' when none).
        stdout: What it printed on stdout.
        seconds: Wall time of the call.
    """

    status: int
    error: str
    stdout: str
    seconds: float


def run_cli(*args: str) -> CliOutcome:
    """Run ``gpufeed ARGS`` in this process, as a user would see it (exit status, error line)."""
    # Deferred: the one import up the layers (tests/test_layers.py lists it), and the CLI's module
    # imports every command group.
    from gpufeed.cli import main

    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    lines = [line for line in err.getvalue().splitlines() if ": error: " in line]
    return CliOutcome(status, lines[-1] if lines else "", out.getvalue(), time.perf_counter() - started)


class LogCapture(logging.Handler):
    """Collects the ``gpufeed`` logger's records at WARNING and above while installed (a context manager)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> LogCapture:
        logging.getLogger("gpufeed").addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("gpufeed").removeHandler(self)
