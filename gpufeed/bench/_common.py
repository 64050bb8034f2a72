"""Shared benchmark helpers: machine facts, medians, quiet HTTP logs (tables and JSON: gpufeed.core._text, gpufeed.core._files).

The reliability runs (``gpufeed.reliability``) drive the server with this package's client too.
"""

from __future__ import annotations

import logging
import platform
import statistics

__all__ = ["handed_over", "machine_facts", "median", "quiet_http_logs"]


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


def quiet_http_logs() -> None:
    """httpx logs every request at INFO; the runs poll and probe a lot, so keep that out of their output."""
    logging.getLogger("httpx").setLevel(logging.WARNING)


def handed_over(batch) -> None:
    """Wait until ``batch`` (a tensor) is there: on a GPU, its device's current stream, where the
    consumer would use it; not every stream of the device, whose DALI streams already decode later
    batches (a device-wide sync would time those too). A CPU tensor is there already."""
    if getattr(batch, "is_cuda", False):
        import torch

        torch.cuda.current_stream(batch.device).synchronize()
