"""Shared benchmark helpers: timing rounds, medians, tables and JSON output."""

from __future__ import annotations

import json
import platform
import statistics
from pathlib import Path

__all__ = ["format_table", "machine_facts", "median", "write_json"]


def machine_facts(device) -> dict:
    """Facts that make a figure interpretable: CPU cores, GPU name, library versions."""
    import os

    import nvidia.dali
    import torch

    facts = {
        "python": platform.python_version(),
        "cpu_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "device": device.describe(),
        "torch": torch.__version__,
        "dali": nvidia.dali.__version__,
    }
    if device.is_gpu:
        facts["gpu"] = torch.cuda.get_device_name(device.device_id)
    return facts


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def format_table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [
        [f"{v:,.1f}" if isinstance(v, float) else str(v) for v in row] for row in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    lines = [
        "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True))
        for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, document: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
