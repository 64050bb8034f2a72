"""Triton's perf_analyzer against ``gpufeed serve``: getting the binary, its input data, its CSV.

perf_analyzer (Triton's C++ load generator, under model_analyzer and genai-perf too) ships in the
manylinux ``tritonclient`` wheels up to 2.41 as ``bin/perf_analyzer``. It needs ``libb64.so.0d``
(Debian's ``libb64-0d``) and ``libcudart.so.12`` (the ``nvidia-cuda-runtime-cu12`` wheel), and runs
without a GPU. :func:`ensure_perf_analyzer` puts all three in a cache folder, with no change to the
system: the wheels come from the package index through pip, libb64 from apt's archive unpacked
with ``dpkg -x`` when the system has none.

Input data: perf_analyzer sends a ``"b64"`` value of its ``--input-data`` JSON as the tensor's raw
bytes, and a BYTES tensor's raw bytes are length-prefixed elements (4 bytes, little-endian, then
the element). So a real JPEG goes in as the base64 of its length followed by its bytes
(:func:`write_image_data`); a ``"content"`` list of strings would send the text itself.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "PERF_ANALYZER_WHEEL",
    "PerfAnalyzer",
    "PerfAnalyzerUnavailable",
    "ensure_perf_analyzer",
    "perf_analyzer_points",
    "print_perf_analyzer_points",
    "run_perf_analyzer",
    "write_image_data",
    "write_pixel_data",
]

# The last tritonclient release whose manylinux wheel carries the perf_analyzer binary.
PERF_ANALYZER_WHEEL = "tritonclient==2.41.0"
_CUDART_WHEEL = "nvidia-cuda-runtime-cu12"
_LIBB64 = "libb64.so.0d"


class PerfAnalyzerUnavailable(RuntimeError):
    """perf_analyzer could not be had here; the message says which step failed and how to do it by hand."""


@dataclass(frozen=True)
class PerfAnalyzer:
    """A runnable perf_analyzer: the binary and the library folders it needs on ``LD_LIBRARY_PATH``."""

    binary: Path
    library_dirs: tuple[Path, ...] = field(default_factory=tuple)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        dirs = [str(d) for d in self.library_dirs]
        if env.get("LD_LIBRARY_PATH"):
            dirs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs)
        return env

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], env=self.env(), capture_output=True, text=True)
        return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"


def _pip_download(spec: str, platform: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    cmd += ["--platform", platform, "--python-version", "3.11", "-d", str(dest), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise PerfAnalyzerUnavailable(f"pip download {spec} ({platform}) failed: {' | '.join(tail)}")
    return wheels[0]


def _extract(wheel: Path, suffix: str, target: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(suffix)]
        if not names:
            raise PerfAnalyzerUnavailable(f"{wheel.name} holds no file ending in {suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(names[0]) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def _system_has(library: str) -> bool:
    try:
        listing = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    except OSError:
        return False
    return library in listing


def _libb64_dir(cache: Path) -> Path | None:
    """None when the system has libb64 already, else a cache folder holding it (from apt's archive)."""
    if _system_has(_LIBB64):
        return None
    unpacked = cache / "libb64"
    found = list(unpacked.rglob(_LIBB64)) if unpacked.exists() else []
    if not found:
        debs = cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(["apt-get", "download", "libb64-0d"], cwd=debs, capture_output=True, text=True)
        if got.returncode != 0:  # an old or empty package list: refresh it once (needs root)
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
            got = subprocess.run(["apt-get", "download", "libb64-0d"], cwd=debs, capture_output=True, text=True)
        deb = sorted(debs.glob("libb64-0d_*.deb"))
        if got.returncode != 0 or not deb:
            raise PerfAnalyzerUnavailable(
                f"{_LIBB64} is missing and 'apt-get download libb64-0d' failed ({got.stderr.strip()[:200]}); "
                "install Debian's libb64-0d (apt-get install libb64-0d)"
            )
        subprocess.run(["dpkg", "-x", str(deb[0]), str(unpacked)], check=True)
        found = list(unpacked.rglob(_LIBB64))
    return found[0].parent


def ensure_perf_analyzer(cache: Path) -> PerfAnalyzer:
    """A runnable perf_analyzer, fetched into ``cache`` on first use (about 15 MB).

    ``GPUFEED_PERF_ANALYZER`` names a binary to use instead (its libraries found as the system finds them).

    Raises:
        PerfAnalyzerUnavailable: a download or unpack failed, or the binary does not start; the
            message names the step.
    """
    named = os.environ.get("GPUFEED_PERF_ANALYZER")
    if named:
        tool = PerfAnalyzer(Path(named))
    else:
        cache = Path(cache).resolve()
        binary, cudart = cache / "bin" / "perf_analyzer", cache / "lib" / "libcudart.so.12"
        if not binary.exists():
            wheel = _pip_download(PERF_ANALYZER_WHEEL, "manylinux1_x86_64", cache / "wheels" / "tritonclient")
            _extract(wheel, "/data/bin/perf_analyzer", binary).chmod(0o755)
        if not cudart.exists():
            wheel = _pip_download(_CUDART_WHEEL, "manylinux2014_x86_64", cache / "wheels" / "cudart")
            _extract(wheel, "/lib/libcudart.so.12", cudart)
        dirs = [cudart.parent]
        b64 = _libb64_dir(cache)
        if b64 is not None:
            dirs.append(b64)
        tool = PerfAnalyzer(binary, tuple(dirs))
    probe = subprocess.run([str(tool.binary), "--version"], env=tool.env(), capture_output=True, text=True)
    if probe.returncode != 0:
        raise PerfAnalyzerUnavailable(f"{tool.binary} does not start: {(probe.stderr or probe.stdout).strip()[:300]}")
    return tool


def write_image_data(blobs: list[bytes], path: Path, input_name: str = "image") -> Path:
    """perf_analyzer ``--input-data`` JSON sending each encoded image in turn as a one-element BYTES tensor."""
    steps = [
        {input_name: {"b64": base64.b64encode(struct.pack("<I", len(blob)) + blob).decode("ascii"), "shape": [1]}}
        for blob in blobs
    ]
    path.write_text(json.dumps({"data": steps}))
    return path


def write_pixel_data(rows: list[np.ndarray], path: Path, input_name: str) -> Path:
    """perf_analyzer ``--input-data`` JSON sending each uint8 row (one decoded sample) in turn."""
    steps = [
        {
            input_name: {
                "b64": base64.b64encode(np.ascontiguousarray(r, np.uint8).tobytes()).decode(),
                "shape": list(r.shape),
            }
        }
        for r in rows
    ]
    path.write_text(json.dumps({"data": steps}))
    return path


def run_perf_analyzer(
    tool: PerfAnalyzer,
    *,
    model: str,
    url: str,
    protocol: str,
    input_data: Path,
    concurrency: list[int],
    csv_path: Path,
    requests_per_window: int = 50,
    timeout_s: float = 600.0,
) -> list[dict]:
    """Run perf_analyzer at each concurrency and return its CSV rows (one dict per concurrency).

    Measurement windows are counted in requests (``count_windows``) and any spread is accepted
    (``--stability-percentage 999``): on a shared machine the figures move, and the point is one
    measurement per concurrency, not perf_analyzer's own convergence.

    Raises:
        RuntimeError: perf_analyzer exited non-zero; the message holds its last lines.
    """
    if protocol not in ("http", "grpc"):
        raise ValueError(f"protocol {protocol!r} is not allowed; allowed: http, grpc")
    rows: list[dict] = []
    for clients in concurrency:
        point_csv = csv_path.with_name(f"{csv_path.stem}-c{clients}{csv_path.suffix}")
        cmd = [str(tool.binary), "-m", model, "-u", url, "-i", protocol, "--input-data", str(input_data)]
        cmd += ["--concurrency-range", str(clients), "--measurement-mode", "count_windows"]
        cmd += ["--measurement-request-count", str(max(requests_per_window, 2 * clients))]
        cmd += ["--stability-percentage", "999", "--max-trials", "10", "-f", str(point_csv)]
        done = subprocess.run(cmd, env=tool.env(), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0 or not point_csv.exists():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
            raise RuntimeError(f"perf_analyzer ({protocol}, concurrency {clients}) failed:\n{tail}")
        with open(point_csv, newline="") as f:
            rows += list(csv.DictReader(f))
    with open(csv_path, "w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows


def perf_analyzer_points(
    cache: Path, url: str, protocol: str, model: str, images: list[bytes], concurrency
) -> dict[str, dict[str, float]]:
    """perf_analyzer's figures for ``model`` at ``url`` at each concurrency, keyed by concurrency (as text).

    Each point: ``throughput_rps`` (its Inferences/Second: one image per request), and ``p50_ms``,
    ``p99_ms`` of its client-side latency.
    """
    folder = Path(cache) / "perf_analyzer"
    folder.mkdir(parents=True, exist_ok=True)
    tool = ensure_perf_analyzer(folder)
    data = write_image_data(images, folder / f"{model}-images.json")
    rows = run_perf_analyzer(
        tool,
        model=model,
        url=url,
        protocol=protocol,
        input_data=data,
        concurrency=list(concurrency),
        csv_path=folder / f"{model}-{protocol}.csv",
    )
    return {
        r["Concurrency"]: {
            "throughput_rps": float(r["Inferences/Second"]),
            "p50_ms": int(r["p50 latency"]) / 1000,
            "p99_ms": int(r["p99 latency"]) / 1000,
        }
        for r in rows
    }


def print_perf_analyzer_points(points: dict | None) -> None:
    """The table of :func:`perf_analyzer_points`, printed under the bench's own (nothing when ``None``)."""
    if not points:
        return
    print("\nperf_analyzer against gpufeed (KServe v2 infer, one JPEG per request):")
    print(f"{'clients':>8} {'req/s':>9} {'p50 ms':>9} {'p99 ms':>9}")
    for clients, point in points.items():
        print(f"{clients:>8} {point['throughput_rps']:9.1f} {point['p50_ms']:9.1f} {point['p99_ms']:9.1f}")
