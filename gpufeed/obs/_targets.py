"""Scrape targets from training runs: ``metrics-rank<r>.addr`` files to Prometheus file_sd.

Each training rank serves its metrics on its own port (``telemetry.metrics_port: 0`` picks a
free one, which torchrun needs when ranks share a host) and writes ``host:port`` to
``RUN_DIR/metrics-rank<r>.addr`` once the endpoint is up. Prometheus's ``file_sd_configs``
re-reads a JSON target list whenever it changes, so writing one from those files is how a
multi-rank run gets scraped without editing the Prometheus config.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from gpufeed.core import write_json

__all__ = ["MetricsAddressError", "file_sd_groups", "read_metrics_addresses", "write_file_sd"]

_ADDR_FILE = re.compile(r"^metrics-rank(\d+)\.addr$")
_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


class MetricsAddressError(ValueError):
    """A ``metrics-rank<r>.addr`` file is missing or does not hold ``host:port``."""


def _parse_address(text: str, path: Path) -> tuple[str, int]:
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise MetricsAddressError(f"{path}: expected 'host:port' with a port in 1..65535, got {value!r}")
    return host, int(port)


def read_metrics_addresses(run_dir: str | Path) -> dict[int, tuple[str, int]]:
    """``{rank: (host, port)}`` from a training run folder's ``metrics-rank<r>.addr`` files.

    Raises:
        MetricsAddressError: A file holds something other than ``host:port`` (naming it).
        FileNotFoundError: The folder does not exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"training run folder {run_dir} does not exist")
    out = {}
    for path in sorted(run_dir.iterdir()):
        match = _ADDR_FILE.match(path.name)
        if match:
            out[int(match.group(1))] = _parse_address(path.read_text(encoding="utf-8"), path)
    return dict(sorted(out.items()))


def file_sd_groups(
    run_dirs: Iterable[str | Path], host: str = "127.0.0.1", labels: Mapping[str, str] | None = None
) -> list[dict]:
    """Prometheus file_sd target groups, one per training run folder.

    Args:
        run_dirs: Training run folders.
        host: Replaces a wildcard bind address (``0.0.0.0``, ``::``), which is not reachable as
            such: the host name or address Prometheus reaches the trainer at.
        labels: Extra target labels for every group (e.g. ``{"cluster": "lab"}``).

    Raises:
        MetricsAddressError: A run folder has no ``metrics-rank<r>.addr`` file, or a bad one.
    """
    groups = []
    for run_dir in run_dirs:
        addresses = read_metrics_addresses(run_dir)
        if not addresses:
            raise MetricsAddressError(
                f"{run_dir} has no metrics-rank<r>.addr file: is the trainer running with its metrics endpoint on?"
            )
        targets = []
        for addr_host, port in addresses.values():
            name = host if addr_host in _WILDCARDS else addr_host
            targets.append(f"[{name}]:{port}" if ":" in name and not name.startswith("[") else f"{name}:{port}")
        groups.append({"targets": targets, "labels": dict(labels or {})})
    return groups


def write_file_sd(path: str | Path, groups: list[dict]) -> Path:
    """Write a file_sd JSON target list atomically (Prometheus may read it at any moment)."""
    return write_json(path, groups, atomic=True)
