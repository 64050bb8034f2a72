"""Shared benchmark helpers: machine facts and medians (tables and JSON live in gpufeed._text, gpufeed._files)."""

from __future__ import annotations

import platform
import statistics

__all__ = ["machine_facts", "median"]


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
