"""``gpufeed predict`` with an image model: one row per image of a folder (or one image).

Each image is checked from its header as the server checks a request's (format, size against the
pixel limit, EXIF orientation: :func:`~gpufeed.server._preprocess.inspect_image`) and decoded by the
server's decoder (DALI: nvJPEG on a GPU; resize so the model's size enlarged by ``1 /
eval_crop_fraction`` just fits, centre crop), so a file gets the numbers a POST of it gets. The
answer is one CSV, ``image,<class>,...``, a row per image (its path relative to the source) in
sorted order, written whole and renamed into place; an image that cannot be read has no row, one
line in the log and in the report, and the others are still scored. A second run keeps the rows
when this model wrote the CSV (the manifest beside it says, :mod:`._manifest`) and scores only the
images without one: new images, and those that failed, which fail again rather than pass unseen.

A JPEG is also decoded strictly, as ``gpufeed check`` does
(:func:`~gpufeed.pipelines.decode_problem`): one cut short and given a new end marker (``FFD9``)
passes the header check and DALI decodes it with its missing part grey, so only the strict decode
sees it. It runs on a thread pool beside DALI's decode and the model, and costs an entropy decode
of each JPEG on the CPU (1.7 ms for 640x480, see ``docs/images.md``). The server skips it to keep
a request's latency; predict writes rows nobody looks at image by image, so a half-grey picture's
scores would pass unseen.
"""

from __future__ import annotations

import csv
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from gpufeed.core import atomic_path, progress_bar
from gpufeed.pipelines import decode_problem, default_num_threads, eval_decoder_options
from gpufeed.predict._inputs import find_images
from gpufeed.predict._manifest import Manifests, explain, model_identity, output_key
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

    A CSV already there keeps its rows when this model wrote it (as ``.gpufeed-predict.json`` beside
    it records: the model's SHA-256 and class names); only images
    without a row are scored (new ones, and those that failed before), and rows of images no
    longer under ``source`` are dropped. A CSV another model wrote, or one with no record of its
    model, is scored again whole (one line says why); so is every image with ``overwrite``.

    Returns:
        A :class:`~gpufeed.predict.PredictReport`: one result per image (``scored``, ``failed``, or
        ``skipped``: its row kept), in the CSV's order.
    """
    started = time.perf_counter()
    images, path = find_images(source, out)
    root = Path(source) if Path(source).is_dir() else Path(source).parent
    names = [str(image.relative_to(root)) for image in images]
    order = {name: i for i, name in enumerate(names)}
    manifests, key = Manifests(model_identity(predictor), predictor.source), output_key(path)
    held = None if overwrite else _kept_rows(path, key, predictor.labels, manifests)
    kept = held or {}
    gone = [name for name in kept if name not in order]
    if gone:  # the CSV answers for SOURCE as it is now, as a fresh run's would
        log.info("predict: %d row(s) of images no longer in %s dropped from %s", len(gone), source, path)
        kept = {name: row for name, row in kept.items() if name in order}
    report = PredictReport([VideoResult(name, "skipped", path) for name in kept], unit="images")
    todo = [image for image, name in zip(images, names, strict=True) if name not in kept]
    rows = _score_images(todo, root, predictor, max_pixels, progress, report, path) if todo else {}
    if held is None or rows or gone:  # else the CSV there is already the answer
        manifests.forget(path, key)  # before the CSV changes: a kill then leaves no record, not a wrong one
        header = ",".join(["image", *(_cell(n) for n in predictor.labels)])
        merged = sorted({**kept, **rows}.items(), key=lambda item: order[item[0]])
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            # surrogateescape: a file name that is not UTF-8 is written as its own bytes, the name on disk
            # (strict UTF-8 failed here, after every image had been scored).
            lines = [header, *(row for _, row in merged)]
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
        manifests.record(path, key)
    report.seconds = time.perf_counter() - started
    per_image = report.seconds / max(1, len(rows))
    report.results = [
        VideoResult(r.name, "scored", path, 1, 0, per_image) if r.status == "scored" else r for r in report.results
    ]
    report.results.sort(key=lambda r: order[r.name])
    return report


def _kept_rows(path: Path, key: str, labels: tuple[str, ...], manifests: Manifests) -> dict[str, str] | None:
    """The rows of the CSV at ``path`` to keep (image name -> its line) when this model wrote it; else
    ``None`` (one line says why when it is there). A row that does not read is left out: its image is scored."""
    if not path.is_file():
        return None
    why = manifests.problem(path, key)
    if why is None:
        try:
            with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
                rows = list(csv.reader(handle))
        except OSError as err:
            why = f"it cannot be read ({err.strerror or err})"
        else:
            if rows and rows[0] == ["image", *labels]:
                return {row[0]: ",".join([_cell(row[0]), *row[1:]]) for row in rows[1:] if _row_reads(row, labels)}
            why = "its header is not image and this model's classes"
    log.warning("predict: scoring every image again: %s: %s", path, explain(why))
    return None


def _row_reads(row: list[str], labels: tuple[str, ...]) -> bool:
    """Whether a CSV row is an image name and a probability per class."""
    if len(row) != len(labels) + 1 or not row[0]:
        return False
    try:
        return all(0.0 <= float(cell) <= 1.0 for cell in row[1:])
    except ValueError:
        return False


def _score_images(
    images: list[Path],
    root: Path,
    predictor: Predictor,
    max_pixels: int,
    progress: bool,
    report: PredictReport,
    path: Path,
) -> dict[str, str]:
    """Score ``images``; their rows (name -> line). Each image is added to ``report`` (``path``: the CSV)."""
    spec, batch = predictor.spec, predictor.batch_size
    device_id = predictor.device.device_id if predictor.device.is_gpu else None
    options = eval_decoder_options(predictor.hw_decoder_load)  # as the checkpoint's evaluation decoded
    decoder = ImageDecoder(spec.size_px, spec.eval_crop_fraction, batch, device_id, 2, options)
    shape = (batch, 3, spec.size_px.height_px, spec.size_px.width_px)
    buffer = (
        torch.zeros(shape, dtype=torch.uint8, device=predictor.device.torch_device) if device_id is not None else None
    )
    host = np.zeros(shape, dtype=np.uint8)
    rows: dict[str, str] = {}
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
                    rows[name] = ",".join([_cell(name), *(f"{v:.9g}" for v in row)])
                    report.results.append(VideoResult(name, "scored", path, frames=1))
            bar.update(min(batch, len(images) - first))
    finally:
        pool.shutdown(cancel_futures=True)
        bar.close()
    return rows


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
