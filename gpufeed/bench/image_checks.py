"""``gpufeed bench images``: what judging an image costs, per file, at the sizes people have.

For generated photo-like JPEGs and PNGs at 640x480, 1920x1080 and 4000x3000 it times, per image:

* **structure** (:func:`gpufeed.pipelines.read_image_facts`, what the dataset index and the
  server's validation run) against the baseline it replaced: a Pillow header parse plus a look at
  the last 64 bytes;
* **strict decode** (:func:`gpufeed.pipelines.decode_problem`, what ``gpufeed check`` and the
  loaders' re-check run) against Pillow's full decode;
* the **server's own decode** of the same image (its DALI graph on this machine's device: decode
  the evaluation window, resize to 224), which is what a strict decode per request would add to;
* and ``gpufeed check`` on two pixel bombs (a JPEG header declaring 65,500 x 65,500, a PNG
  declaring 30,000 x 30,000): seconds and the process's peak RSS.
"""

from __future__ import annotations

import resource
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from gpufeed.bench._common import machine_facts
from gpufeed.core import SizePx, format_table, progress_bar
from gpufeed.device import DeviceChoice, resolve_device
from gpufeed.pipelines import check_path, decode_problem, read_image_facts
from gpufeed.server import ImageDecoder, inspect_image
from gpufeed.synth import declare_size, encode_image, photo_pixels

__all__ = ["print_image_checks", "run_image_checks"]

SIZES = ((640, 480), (1920, 1080), (4000, 3000))


def _header_and_tail(path: Path) -> None:
    """The baseline: Pillow's header parse and a look for the end marker in the last 64 bytes."""
    from PIL import Image

    with Image.open(path) as img:
        _ = img.format, img.size
    with open(path, "rb") as fh:
        fh.seek(-64, 2)
        _ = b"\xff\xd9" in fh.read()


def _pil_decode(path: Path) -> None:
    from PIL import Image

    with Image.open(path) as img:
        img.load()


def _time_ms(fn: Callable[[], object], budget_s: float = 0.6, least: int = 3) -> float:
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < least or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000.0)


def _bomb_check(folder: Path) -> dict:
    for name in ("a", "b"):
        (folder / "bombs" / name).mkdir(parents=True, exist_ok=True)
    jpeg = declare_size(encode_image(photo_pixels(64, 48), "JPEG"), 65500, 65500)
    png = declare_size(encode_image(photo_pixels(64, 48), "PNG"), 30000, 30000)
    (folder / "bombs" / "a" / "bomb.jpg").write_bytes(jpeg)
    (folder / "bombs" / "b" / "bomb.png").write_bytes(png)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    report = check_path(folder / "bombs", progress=False)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "jpeg_bytes": len(jpeg),
        "seconds": seconds,
        "peak_rss_growth_mib": (after - before) / 1024.0,
        "findings": [f.reason for f in report.findings],
    }


def _server_decode(data: bytes, width: int, height: int, device: DeviceChoice) -> Callable[[], object]:
    """A callable running the server's decoder (evaluation window, resize to 224) on ``data``."""
    size = np.array([[width, height]])
    decoder = ImageDecoder(SizePx(224, 224), 0.875, 1, device.device_id, num_threads=1)
    if not device.is_gpu:
        host_out = np.empty((1, 3, 224, 224), dtype=np.uint8)
        return lambda: decoder.decode_into([data], size, host_out)
    import torch

    out = torch.empty((1, 3, 224, 224), dtype=torch.uint8, device="cuda")

    def serve() -> None:
        decoder.decode_into([data], size, out)
        torch.cuda.synchronize()

    return serve


def run_image_checks(*, device: str = "auto") -> dict:
    """Time every check on every size (see the module docs); returns the figures.

    Args:
        device: Where the server's decoder runs: ``auto``, ``gpu`` or ``cpu``.
    """

    choice = resolve_device(device)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [(w, h, fmt) for w, h in SIZES for fmt in ("JPEG", "PNG")]
        for width, height, fmt in progress_bar(cases, desc="images", unit="case", leave=False):
            data = encode_image(photo_pixels(width, height), fmt)
            path = folder / f"{width}x{height}.{fmt.lower()}"
            path.write_bytes(data)
            serve = _server_decode(data, width, height, choice)
            rows.append(
                {
                    "image": f"{width}x{height} {fmt}",
                    "bytes": len(data),
                    "baseline_header_tail_ms": _time_ms(partial(_header_and_tail, path)),
                    "structure_file_ms": _time_ms(partial(read_image_facts, path)),
                    "structure_request_ms": _time_ms(partial(inspect_image, data, 10**9)),
                    "pil_decode_ms": _time_ms(partial(_pil_decode, path)),
                    "strict_decode_ms": _time_ms(partial(decode_problem, path, max_pixels=10**9)),
                    "server_decode_ms": _time_ms(serve),
                }
            )
        bombs = _bomb_check(folder)
    return {"machine": machine_facts(choice), "rows": rows, "bombs": bombs}


def print_image_checks(figures: dict) -> None:
    """The table of :func:`run_image_checks`'s figures, then the pixel bombs and the device."""
    headers = [
        "image",
        "KiB",
        "header+tail ms",
        "structure ms (file)",
        "structure ms (request)",
        "PIL decode ms",
        "strict decode ms",
        "server decode ms",
        "strict / server",
    ]
    table = [
        [
            r["image"],
            round(r["bytes"] / 1024),
            r["baseline_header_tail_ms"],
            r["structure_file_ms"],
            r["structure_request_ms"],
            r["pil_decode_ms"],
            r["strict_decode_ms"],
            r["server_decode_ms"],
            f"{r['strict_decode_ms'] / r['server_decode_ms']:.2f}x",
        ]
        for r in figures["rows"]
    ]
    print(format_table(headers, [[f"{v:.3f}" if isinstance(v, float) else v for v in row] for row in table]))
    bombs = figures["bombs"]
    print(
        f"gpufeed check on a {bombs['jpeg_bytes']:,}-byte JPEG declaring 65,500 x 65,500 and a PNG declaring "
        f"30,000 x 30,000: {bombs['seconds'] * 1000:.1f} ms, peak RSS grew {bombs['peak_rss_growth_mib']:.1f} MiB; "
        f"{len(bombs['findings'])} finding(s): {bombs['findings'][0][:60]}..."
    )
    print(f"device: {figures['machine']['device']}")
