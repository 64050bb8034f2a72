"""``gpufeed predict`` with an image model: one row per image of a folder (or one image).

Each image is checked from its header as the server checks a request's (format, size against the
pixel limit, EXIF orientation: :func:`~gpufeed.server._preprocess.inspect_image`) and decoded by the
server's decoder (DALI: nvJPEG on a GPU; resize so the model's size enlarged by ``1 /
eval_crop_fraction`` just fits, centre crop), so a file gets the numbers a POST of it gets. The
answer is one CSV, ``image,<class>,...``, a row per image (its path relative to the source) in
sorted order, written whole and renamed into place; an image that cannot be read has no row, one
line in the log and in the report, and the others are still scored.

A JPEG is also decoded strictly, as ``gpufeed check`` does
(:func:`~gpufeed.pipelines.decode_problem`): one cut short and given a new end marker (``FFD9``)
passes the header check and DALI decodes it with its missing part grey, so only the strict decode
sees it. It runs on a thread pool beside DALI's decode and the model, and costs an entropy decode
of each JPEG on the CPU (1.7 ms for 640x480, see ``docs/images.md``). The server skips it to keep
a request's latency; predict writes rows nobody looks at image by image, so a half-grey picture's
scores would pass unseen.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from gpufeed.core import atomic_path, progress_bar
from gpufeed.pipelines import decode_problem, default_num_threads, eval_decoder_options
from gpufeed.predict._inputs import find_images
from gpufeed.predict._model import Predictor
from gpufeed.predict._outputs import _cell
from gpufeed.predict._run import PredictReport, VideoResult
from gpufeed.server import ImageDecoder, RequestError, inspect_image

__all__ = ["predict_images"]

log = logging.getLogger("gpufeed.predict")

DEFAULT_MAX_PIXELS = 40_000_000  # serve.max_image_pixels' default


def predict_images(
    source: str | Path,
    predictor: Predictor,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    progress: bool = True,
) -> PredictReport:
    """Class probabilities of every image under ``source`` with an image model (see the module docs).

    Returns:
        A :class:`~gpufeed.predict.PredictReport`: one result per image (``scored``, ``failed``), or one
        ``skipped`` result when the CSV is already there.
    """
    started = time.perf_counter()
    images, path = find_images(source, out)
    root = Path(source) if Path(source).is_dir() else Path(source).parent
    report = PredictReport()
    if path.is_file() and not overwrite:
        report.results.append(VideoResult(str(path.name), "skipped", path))
        return report
    spec, batch = predictor.spec, predictor.batch_size
    device_id = predictor.device.device_id if predictor.device.is_gpu else None
    options = eval_decoder_options(predictor.hw_decoder_load)  # as the checkpoint's evaluation decoded
    decoder = ImageDecoder(spec.size_px, spec.eval_crop_fraction, batch, device_id, 2, options)
    shape = (batch, 3, spec.size_px.height_px, spec.size_px.width_px)
    buffer = (
        torch.zeros(shape, dtype=torch.uint8, device=predictor.device.torch_device) if device_id is not None else None
    )
    host = np.zeros(shape, dtype=np.uint8)
    rows: list[str] = []
    bar = progress_bar(total=len(images), desc="predict", unit="image", disable=not progress, leave=True)
    pool = ThreadPoolExecutor(max_workers=default_num_threads(), thread_name_prefix="predict-strict")
    try:
        for first in range(0, len(images), batch):
            names, blobs, sizes, strict = _read_batch(
                images[first : first + batch], root, max_pixels, pool, report, path
            )
            if blobs:
                out_rows = buffer[: len(blobs)] if buffer is not None else host[: len(blobs)]
                outcome = decoder.decode_into(blobs, np.array(sizes, dtype=np.int64), out_rows)
                batch_in = buffer[: len(blobs)] if buffer is not None else torch.from_numpy(host[: len(blobs)])
                probabilities = predictor.class_scores(predictor.logits(batch_in))
                for name, row, problem, check in zip(names, probabilities, outcome, strict, strict=True):
                    problem = problem or check.result()  # DALI's own failure, else the strict decode's
                    if problem is not None:
                        report.results.append(_failed(name, path, problem))
                        continue
                    rows.append(",".join([_cell(name), *(f"{v:.9g}" for v in row)]))
                    report.results.append(VideoResult(name, "scored", path, frames=1))
            bar.update(min(batch, len(images) - first))
    finally:
        pool.shutdown(cancel_futures=True)
        bar.close()
    header = ",".join(["image", *(_cell(n) for n in predictor.labels)])
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        # surrogateescape: a file name that is not UTF-8 is written as its own bytes, the name on disk
        # (strict UTF-8 failed here, after every image had been scored).
        tmp.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8", errors="surrogateescape")
    report.seconds = time.perf_counter() - started
    for i, result in enumerate(report.results):
        if result.status == "scored":
            report.results[i] = VideoResult(result.name, "scored", path, 1, 0, report.seconds / max(1, len(rows)))
    return report


def _read_batch(
    images: list[Path], root: Path, max_pixels: int, pool: ThreadPoolExecutor, report: PredictReport, path: Path
) -> tuple[list[str], list[bytes], list[tuple[int, int]], list[Future[str | None]]]:
    """Read and header-check one batch's images; start each JPEG's strict decode on ``pool``.

    An image that cannot be read or fails the header check is added to ``report`` as failed here
    (``path``: the CSV its row would have gone to).

    Returns:
        (names, encoded bytes, oriented (width, height) sizes, the strict decodes' futures), one
        entry per image that passed.
    """
    names, blobs, sizes, strict = [], [], [], []
    for image in images:
        name = str(image.relative_to(root))
        try:
            blob = image.read_bytes()
            info = inspect_image(blob, max_pixels, name)
        except (OSError, RequestError) as err:
            report.results.append(_failed(name, path, err))
            continue
        names.append(name)
        blobs.append(blob)
        sizes.append((info.width, info.height))
        strict.append(pool.submit(_strict_problem, blob, info.format, max_pixels))
    return names, blobs, sizes, strict


def _strict_problem(blob: bytes, fmt: str, max_pixels: int) -> str | None:
    """Why a header-checked image fails ``gpufeed check``'s strict decode, or ``None``.

    A PNG is left to DALI: the header check walks every chunk's CRC to ``IEND``, and a PNG cut
    short anywhere fails DALI's own decode (``docs/serving.md``), so a strict decode would add a
    full decode for nothing.
    """
    return decode_problem(blob, max_pixels=max_pixels) if fmt == "JPEG" else None


def _failed(name: str, path: Path, err: BaseException | str) -> VideoResult:
    message = getattr(err, "message", None) or getattr(err, "strerror", None) or str(err)
    error = message if str(message).startswith(name) else f"{name}: {message}"
    log.error("predict: %s", error)
    return VideoResult(name, "failed", path, error=error)
