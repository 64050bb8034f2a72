"""Serving preprocessing: validate each encoded image before batching, then decode batches in DALI.

**Validation** (:func:`inspect_image`, per image, in the request handler, before any batching):
:func:`gpufeed.pipelines.read_image_facts`, the function the training index uses, so serving and
training judge a file alike: JPEG/PNG only (415 otherwise), pixel count from the header against
``serve.max_image_pixels`` (decompression bombs, never decoded), structure whole (JPEG markers
walked through the scans to the end-of-image marker, restart markers counted where the file has
them; PNG chunks and their CRCs to ``IEND``). Bytes after the end marker are fine. The size it
returns is the EXIF-oriented one, which is what DALI decodes to and crops in. A failure is a
:class:`RequestError` for that request alone.

Not done per request: the strict CPU decode that ``gpufeed check`` runs
(:func:`gpufeed.pipelines.decode_problem`). It is the only way to see a JPEG cut short with an
end marker appended (libjpeg warns and fills the rest grey; DALI returns that image), and it costs
an entropy decode on the CPU per image (measured on the development machine, shared 2-core CPU:
1.1 ms for 640x480, 7.6 ms for 1920x1080, 42 ms for 4000x3000), as much as or more than the DALI
decode the server is built to move off the CPU. Such a file is a damaged upload that still
decodes to an image; the answer describes what was sent. A PNG cut short anywhere fails DALI's
decode and is answered 400 ``corrupt_image`` alone (below).

**Decoding** (:class:`ImageDecoder`, per batch, on the batcher's thread): one DALI graph

==================  ==========================================================  ================
stage               output                                                      where
==================  ==========================================================  ================
external_source     encoded bytes (uint8, 1-D) + crop window per image          CPU
decoders.image_slice uint8 HWC RGB, the crop window only (ROI decode)           GPU ("mixed") or CPU
resize              uint8 (H, W, 3)                                             GPU or CPU
transpose           uint8 (3, H, W) "CHW"; the batch is (k, 3, H, W) NCHW       GPU or CPU
==================  ==========================================================  ================

The crop window is :func:`gpufeed.pipelines._windows.eval_windows` (scale until the model's
``W x H / eval_crop_fraction`` just fits, centre-crop ``W x H``; for a square model: resize the
shorter side to ``S / eval_crop_fraction``, centre-crop ``S``) over the oriented size, with the very operators and
arguments of the evaluation loader, its decoder options included (on a GPU: one function,
:func:`gpufeed.pipelines._image_pipeline.eval_decoder_options`, of the config's
``loader.hw_decoder_load``, gives both theirs), so the server feeds the model exactly what evaluation did. If
DALI fails on a batch (an image that passed validation but whose data is damaged), each image is
decoded alone so only the bad ones fail.

**Bands** (:meth:`ImageDecoder.decode_into` with ``bands`` > 1, CPU only): DALI decodes and resizes
one sample on one thread, so a lone image leaves the other cores idle while a client waits. Cut
into horizontal bands, an image becomes several samples that decode and resize side by side:
band ``b`` of ``n`` is output rows ``[H*b/n, H*(b+1)/n)``, the resize ROI over source rows
``[h*b/n, h*(b+1)/n)`` of the window, and its decode slice takes a few rows more on each side so the
antialiasing filter reads the same source pixels it reads for the whole image. Every output pixel
reads the same source pixels as in the whole-image resize, and where the image is downscaled by a binary
fraction (:meth:`ImageDecoder.exact_in_bands`; a shorter side divisible by 8 at 224 px and crop
0.875, as camera sizes are) DALI's float32 arithmetic gives it the same value, so the bands put
together equal the evaluation loader's image bit for bit (tests/test_server_bands.py); other
images decode whole. Measured on the development machine (2-core CPU, 640x480
JPEG to 224x224): 2.7-2.8 ms whole on one thread, 2.1-2.2 ms in two bands on two threads.
"""

from __future__ import annotations

import io
import logging
import math
import re

import numpy as np

from gpufeed.config import LoaderConfig
from gpufeed.core import SizePx
from gpufeed.pipelines import Windows, decode_window, eval_decoder_options, eval_windows, read_image_facts
from gpufeed.server._errors import RequestError

__all__ = ["MAX_BANDS", "ImageDecoder", "ImageInfo", "inspect_image", "serve_pipeline", "warmup_image"]

log = logging.getLogger("gpufeed.server")

MAX_PIXELS_KEY = "serve.max_image_pixels"
# Most bands an image is cut into. Every band entropy-decodes the JPEG rows above it again, so
# more bands gain less; 2 is what a 2-core machine measured (more cores: unmeasured).
MAX_BANDS = 2
MIN_BAND_ROWS = 16
# loader.hw_decoder_load's default: a decoder made without the server's config decodes as evaluation does by default.
_DEFAULT_HW_LOAD = LoaderConfig().hw_decoder_load
# ImageFacts problem kinds -> the request's failure reason.
_REASONS = {"unsupported": "unsupported_media_type", "too_many_pixels": "too_many_pixels"}


class ImageInfo:
    """What validation learned about one encoded image: its format, oriented size and EXIF orientation."""

    __slots__ = ("format", "height", "orientation", "width")

    def __init__(self, fmt: str, width: int, height: int, orientation: int = 1) -> None:
        self.format, self.width, self.height, self.orientation = fmt, width, height, orientation

    def __repr__(self) -> str:
        return f"ImageInfo({self.format}, {self.width}x{self.height}, orientation {self.orientation})"


def inspect_image(data: bytes, max_pixels: int, where: str = "the image") -> ImageInfo:
    """Check an encoded image without decoding its pixels; raise :class:`RequestError` if unusable.

    Args:
        data: The encoded bytes.
        max_pixels: Largest allowed width x height.
        where: How to name this image in messages, e.g. ``"image 2 of input 'image'"``.

    Returns:
        The format and the decoded (EXIF-oriented) width and height.
    """
    if not data:
        raise RequestError("corrupt_image", f"{where} is empty (0 bytes)")
    facts = read_image_facts(data)
    refused = facts.refusal(max_pixels, MAX_PIXELS_KEY)
    if refused:
        kind, why = refused
        raise RequestError(_REASONS.get(kind, "corrupt_image"), f"{where}: {why}")
    return ImageInfo(facts.format, facts.width, facts.height, facts.orientation)


def serve_pipeline(
    size_px: SizePx, max_batch: int, device_id: int | None, num_threads: int, gpu_options: dict | None = None
):
    """The server's decode graph, defined but not built (:meth:`ImageDecoder` builds it).

    Args:
        size_px: Output size.
        max_batch: Most samples per call.
        device_id: CUDA device, or ``None`` for the CPU.
        num_threads: DALI CPU threads.
        gpu_options: The ``mixed`` decoder's arguments: the evaluation loader's
            (:func:`gpufeed.pipelines._image_pipeline.eval_decoder_options`).
    """
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None

    @pipeline_def(enable_conditionals=False)
    def serve_graph():
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
        out_size = fn.external_source(name="out_size", dtype=types.FLOAT, ndim=1)
        # The evaluation loader's own fragment and decoder options: serving decodes, crops and
        # resamples exactly as evaluation.
        images = decode_window(
            encoded,
            anchor,
            shape,
            roi_start,
            roi_end,
            size_px=size_px,
            on_gpu=on_gpu,
            gpu_options=gpu_options,
            out_size=out_size,
        )
        return fn.transpose(images, perm=[2, 0, 1], output_layout="CHW")

    return serve_graph(
        batch_size=max_batch,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=1,
        exec_dynamic=True,
    )


class ImageDecoder:
    """DALI decode + centre crop + resize of encoded images into a uint8 NCHW batch.

    Args:
        size_px: Output size, the model card's ``size_px``.
        crop_fraction: The card's ``eval_crop_fraction``.
        max_batch: Most samples per DALI call (images, or bands of images); smaller batches are fine.
        device_id: CUDA device for nvJPEG and GPU resize; ``None`` decodes on the CPU.
        num_threads: DALI CPU threads.
        gpu_options: The ``mixed`` decoder's arguments; default: the evaluation loader's under the
            default ``loader.hw_decoder_load``
            (:func:`~gpufeed.pipelines._image_pipeline.eval_decoder_options`). The server passes
            those of its config's ``loader.hw_decoder_load``.
    """

    def __init__(
        self,
        size_px: SizePx,
        crop_fraction: float,
        max_batch: int,
        device_id: int | None,
        num_threads: int,
        gpu_options: dict | None = None,
    ):
        self.size, self.crop_fraction, self.max_batch = size_px, crop_fraction, max_batch
        self.device_id, self.num_threads = device_id, num_threads
        self.gpu_options = dict(gpu_options) if gpu_options is not None else eval_decoder_options(_DEFAULT_HW_LOAD)
        self.bands_used = 1  # bands per image of the last decode_into call
        self._pipe = self._build()

    def _build(self):
        pipe = serve_pipeline(self.size, self.max_batch, self.device_id, self.num_threads, self.gpu_options)
        pipe.build()
        return pipe

    def band_count(self, images: int) -> int:
        """How many bands each of ``images`` images is cut into so they use this decoder's threads (CPU).

        A power of two that divides the output height, at most :data:`MAX_BANDS`, with
        ``images * bands`` within the threads and the batch size; 1 on a GPU (nvJPEG is parallel).
        """
        bands = 1
        if self.device_id is not None or images < 1:
            return 1
        while (
            bands * 2 <= MAX_BANDS
            and images * bands * 2 <= min(self.num_threads, self.max_batch)
            and self.size.height_px % (bands * 2) == 0
            and self.size.height_px // (bands * 2) >= MIN_BAND_ROWS
        ):
            bands *= 2
        return bands

    def _windows(self, sizes: np.ndarray) -> Windows:
        return eval_windows(sizes, self.crop_fraction, self.size.width_px / self.size.height_px)

    def exact_in_bands(self, windows: Windows) -> bool:
        """Whether every window resamples to the same pixels in bands as whole.

        DALI computes each output row's source position in float32. Cut into bands, a row's
        position is computed from another origin, which gives the same number only when the
        arithmetic is exact: when the scales ``h / H`` and ``w / W`` are binary fractions (``H /
        gcd(h, H)`` a power of two; for 224-pixel models at ``eval_crop_fraction`` 0.875, a
        shorter side divisible by 8, as camera and phone sizes are). Measured on 300 such
        downscaled JPEGs at four output sizes, and on the odd-image corpus: no pixel differs.
        Elsewhere it does, in a few pixels by one level: about half the images with other scales,
        and a few upscaled ones (a window smaller than the output) even at binary scales. Those
        decode whole.
        """
        out_h, out_w = self.size.hw
        for w, h in windows.shape.tolist():
            if w < out_w or h < out_h or not (_binary_fraction(h, out_h) and _binary_fraction(w, out_w)):
                return False
        return True

    def _feed(self, images: list[bytes], windows: Windows, bands: int) -> None:
        roi_start, roi_end = windows.roi()
        out_h, out_w = self.size.hw
        encoded = [np.frombuffer(b, dtype=np.uint8) for b in images]
        if bands == 1:
            samples = (encoded, list(windows.anchor), list(windows.shape), list(roi_start), list(roi_end))
        else:
            samples = _band_samples(encoded, windows, roi_start, roi_end, out_h, bands)
        pipe = self._pipe
        for name, data in zip(("encoded", "anchor", "shape", "roi_start", "roi_end"), samples, strict=True):
            pipe.feed_input(name, data)
        pipe.feed_input("out_size", [np.array([out_h // bands, out_w], dtype=np.float32)] * (len(images) * bands))

    def _run(self, images: list[bytes], windows: Windows, out, bands: int = 1) -> None:
        self._feed(images, windows, bands)
        (tensors,) = self._pipe.run()
        out_h, out_w = self.size.hw
        if bands == 1:
            tensor = tensors.as_tensor()
            expected = (len(images), 3, out_h, out_w)
            if tuple(tensor.shape()) != expected:
                raise RuntimeError(f"decoder produced {tensor.shape()}, expected {expected}")
            self._copy(tensor, out)
            return
        rows = out_h // bands
        for k in range(len(images) * bands):  # band b of image i is sample i * bands + b (CPU only)
            band = np.asarray(tensors[k])
            if band.shape != (3, rows, out_w):
                raise RuntimeError(f"decoder produced a band of {band.shape}, expected {(3, rows, out_w)}")
            i, b = divmod(k, bands)
            out[i, :, b * rows : (b + 1) * rows] = band

    def _copy(self, tensor, out) -> None:
        if self.device_id is None:
            np.copyto(out, np.asarray(tensor))
        else:
            import torch
            from nvidia.dali.plugin.pytorch import feed_ndarray

            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(out.device))

    def decode_into(self, images: list[bytes], sizes: np.ndarray, out, bands: int = 1) -> list[BaseException | None]:
        """Decode ``images`` (with (width, height) ``sizes``) into ``out``, row by row.

        Args:
            out: A contiguous ``(len(images), 3, S, S)`` uint8 destination: a numpy array on the
                CPU, a CUDA torch tensor on the GPU (rows of the model's input batch).
            bands: Cut each image into this many bands decoded side by side (CPU; see
                :meth:`band_count`) where that gives the same pixels (:meth:`exact_in_bands`),
                else decode whole; :attr:`bands_used` says which it did.

        Returns:
            One entry per image: ``None`` when decoded, else a :class:`RequestError` saying why.
        """
        if not images:
            return []
        if len(images) * bands > self.max_batch:
            raise ValueError(f"{len(images)} images x {bands} band(s) exceed the decoder's batch size {self.max_batch}")
        if bands > 1 and (self.device_id is not None or self.size.height_px % bands):
            raise ValueError(f"{bands} bands: a CPU decoder whose output height divides by it only")
        windows = self._windows(sizes)
        if bands > 1 and not self.exact_in_bands(windows):
            bands = 1
        self.bands_used = bands
        try:
            self._run(images, windows, out, bands)
            return [None] * len(images)
        except RuntimeError as err:
            # DALI marks a pipeline that hit an operator error as no longer valid: start a new one.
            self._pipe = self._build()
            if len(images) == 1 and bands == 1:
                return [self._failure(err)]
            log.warning("decoding a batch of %d failed; decoding its images one by one", len(images))
        results: list[BaseException | None] = []
        for i in range(len(images)):
            try:
                self._run(images[i : i + 1], windows.select(i), out[i : i + 1])
                results.append(None)
            except RuntimeError as err:
                self._pipe = self._build()
                results.append(self._failure(err))
        return results

    @staticmethod
    def _failure(err: RuntimeError) -> RequestError:
        # DALI's message holds a traceback with server paths; pass on only the decoder's verdict.
        lines = [line.strip(" :") for line in str(err).splitlines() if line.strip()]
        detail = next((line for line in lines if line.startswith("Failed to decode")), "the decoder rejected its data")
        detail = re.sub(r"\s*sample #\d+", "", detail)  # an index into a DALI batch, not the request's
        return RequestError("corrupt_image", f"the image data is damaged ({detail[:200]})")


def _binary_fraction(source: int, output: int) -> bool:
    """Whether ``source / output`` is a binary fraction (``output / gcd`` a power of two)."""
    q = output // math.gcd(int(source), output)
    return q & (q - 1) == 0


def _band_samples(encoded: list, windows, roi_start: np.ndarray, roi_end: np.ndarray, out_h: int, bands: int):
    """The DALI inputs of ``bands`` horizontal bands per image: (encoded, anchor, shape, roi_start, roi_end).

    Band ``b`` resamples source rows ``[h*b/n, h*(b+1)/n)`` of the window (exact in float32: ``n``
    is a power of two) into ``out_h / n`` output rows, and decodes the window rows it covers plus a
    margin wider than the antialiasing filter's reach (``h / out_h`` source rows, plus the
    interpolation's one), so every output pixel reads the same source pixels as in the whole image.
    """
    columns: tuple[list, list, list, list, list] = ([], [], [], [], [])
    for i, blob in enumerate(encoded):
        (x, y), (w, h) = windows.anchor[i], windows.shape[i]
        margin = math.ceil(h / out_h) + 2
        for b in range(bands):
            first, last = h * b / bands, h * (b + 1) / bands  # source rows of this band, in the window
            top = max(0, math.floor(first) - margin)
            bottom = min(int(h), math.ceil(last) + margin)
            columns[0].append(blob)
            columns[1].append(np.array([x, y + top], dtype=np.int32))
            columns[2].append(np.array([w, bottom - top], dtype=np.int32))
            columns[3].append(np.array([first - top, roi_start[i][1]], dtype=np.float32))
            columns[4].append(np.array([last - top, roi_end[i][1]], dtype=np.float32))
    return columns


def warmup_image(width_px: int, height_px: int) -> bytes:
    """A JPEG of twice the model's input size, a smooth pattern: what warm-up batches decode."""
    from PIL import Image

    yy, xx = np.mgrid[0 : height_px * 2, 0 : width_px * 2]
    pixels = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()
