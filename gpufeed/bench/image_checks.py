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

import io
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from gpufeed._files import write_json
from gpufeed._text import format_table
from gpufeed.bench._common import machine_facts
from gpufeed.device import resolve_device
from gpufeed.pipelines import check_path, decode_problem, read_image_facts
from gpufeed.server._preprocess import ImageDecoder, inspect_image

__all__ = ["main_images", "run_image_checks"]

SIZES = ((640, 480), (1920, 1080), (4000, 3000))


def _photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    picture = np.stack([xx * 255 // width, yy * 255 // height, (xx // 7 + yy // 5) % 256], -1).astype(np.int16)
    picture += rng.integers(-25, 25, picture.shape, dtype=np.int16)
    return np.clip(picture, 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


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


def _time_ms(fn, budget_s: float = 0.6, least: int = 3) -> float:
    fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < least or time.perf_counter() < deadline:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times) * 1000.0)


def _bomb_check(folder: Path) -> dict:
    for name in ("a", "b"):
        (folder / "bombs" / name).mkdir(parents=True, exist_ok=True)
    small = _encode(_photo(64, 48), "JPEG")
    at = small.find(b"\xff\xc0")
    jpeg = small[: at + 5] + (65500).to_bytes(2, "big") * 2 + small[at + 9 :]
    png = bytearray(_encode(_photo(64, 48), "PNG"))
    png[16:24] = (30000).to_bytes(4, "big") * 2
    import zlib

    png[29:33] = zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")
    (folder / "bombs" / "a" / "bomb.jpg").write_bytes(jpeg)
    (folder / "bombs" / "b" / "bomb.png").write_bytes(bytes(png))
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


def _server_decode(data: bytes, width: int, height: int, device):
    """A callable running the server's decoder (evaluation window, resize to 224) on ``data``."""
    size = np.array([[width, height]])
    decoder = ImageDecoder(224, 0.875, 1, device.device_id, num_threads=1)
    if not device.is_gpu:
        out = np.empty((1, 3, 224, 224), dtype=np.uint8)
        return lambda: decoder.decode_into([data], size, out)
    import torch

    out = torch.empty((1, 3, 224, 224), dtype=torch.uint8, device="cuda")

    def serve():
        decoder.decode_into([data], size, out)
        torch.cuda.synchronize()

    return serve


def run_image_checks(device) -> dict:
    """Time every check on every size (see the module docs); returns the figures."""
    from tqdm import tqdm

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [(w, h, fmt) for w, h in SIZES for fmt in ("JPEG", "PNG")]
        for width, height, fmt in tqdm(cases, desc="images", unit="case", leave=False):
            data = _encode(_photo(width, height), fmt)
            path = folder / f"{width}x{height}.{fmt.lower()}"
            path.write_bytes(data)
            serve = _server_decode(data, width, height, device)
            rows.append(
                {
                    "image": f"{width}x{height} {fmt}",
                    "bytes": len(data),
                    "baseline_header_tail_ms": _time_ms(lambda path=path: _header_and_tail(path)),
                    "structure_file_ms": _time_ms(lambda path=path: read_image_facts(path)),
                    "structure_request_ms": _time_ms(lambda data=data: inspect_image(data, 10**9)),
                    "pil_decode_ms": _time_ms(lambda path=path: _pil_decode(path)),
                    "strict_decode_ms": _time_ms(lambda path=path: decode_problem(path, max_pixels=10**9)),
                    "server_decode_ms": _time_ms(serve),
                }
            )
        bombs = _bomb_check(folder)
    return {"rows": rows, "bombs": bombs}


def main_images(args) -> int:
    device = resolve_device(args.device)
    figures = run_image_checks(device)
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
    print(f"device: {device.describe()}")
    if args.json:
        write_json(args.json, {"machine": machine_facts(device), **figures})
    return 0
