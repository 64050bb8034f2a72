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
arguments of the evaluation loader, so the server feeds the model exactly what evaluation did. If
DALI fails on a batch (an image that passed validation but whose data is damaged), each image is
decoded alone so only the bad ones fail.
"""

from __future__ import annotations

import logging
import re

import numpy as np

from gpufeed._size import SizePx, parse_size_px
from gpufeed.pipelines import read_image_facts
from gpufeed.pipelines._image_pipeline import decode_window
from gpufeed.pipelines._windows import eval_windows
from gpufeed.server._errors import RequestError

__all__ = ["ImageDecoder", "ImageInfo", "inspect_image"]

log = logging.getLogger("gpufeed.server")

MAX_PIXELS_KEY = "serve.max_image_pixels"
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


class ImageDecoder:
    """DALI decode + centre crop + resize of encoded images into a uint8 NCHW batch.

    Args:
        size_px: Output size, (width_px, height_px) or one number (the model card's ``size_px``).
        crop_fraction: The card's ``eval_crop_fraction``.
        max_batch: Largest batch (the model's N); smaller batches are fine.
        device_id: CUDA device for nvJPEG and GPU resize; ``None`` decodes on the CPU.
        num_threads: DALI CPU threads.
    """

    def __init__(
        self, size_px: SizePx | int, crop_fraction: float, max_batch: int, device_id: int | None, num_threads: int
    ):
        self.size, self.crop_fraction, self.max_batch = parse_size_px(size_px), crop_fraction, max_batch
        self.device_id, self.num_threads = device_id, num_threads
        self._pipe = self._build()

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        size, on_gpu = self.size, self.device_id is not None

        @pipeline_def(enable_conditionals=False)
        def serve_graph():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
            anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
            shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
            roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
            roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
            # The evaluation loader's own fragment: serving crops and resamples exactly as evaluation.
            images = decode_window(encoded, anchor, shape, roi_start, roi_end, size_px=size, on_gpu=on_gpu)
            return fn.transpose(images, perm=[2, 0, 1], output_layout="CHW")

        pipe = serve_graph(
            batch_size=self.max_batch,
            num_threads=self.num_threads,
            device_id=self.device_id,
            prefetch_queue_depth=1,
            exec_dynamic=True,
        )
        pipe.build()
        return pipe

    def _run(self, images: list[bytes], sizes: np.ndarray):
        windows = eval_windows(sizes, self.crop_fraction, self.size.width_px / self.size.height_px)
        roi_start, roi_end = windows.roi()
        pipe = self._pipe
        pipe.feed_input("encoded", [np.frombuffer(b, dtype=np.uint8) for b in images])
        pipe.feed_input("anchor", list(windows.anchor))
        pipe.feed_input("shape", list(windows.shape))
        pipe.feed_input("roi_start", list(roi_start))
        pipe.feed_input("roi_end", list(roi_end))
        (out,) = pipe.run()
        tensor = out.as_tensor()
        expected = (len(images), 3, *self.size.hw)
        if tuple(tensor.shape()) != expected:
            raise RuntimeError(f"decoder produced {tensor.shape()}, expected {expected}")
        return tensor

    def _copy(self, tensor, out) -> None:
        if self.device_id is None:
            np.copyto(out, np.asarray(tensor))
        else:
            import torch
            from nvidia.dali.plugin.pytorch import feed_ndarray

            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(out.device))

    def decode_into(self, images: list[bytes], sizes: np.ndarray, out) -> list[BaseException | None]:
        """Decode ``images`` (with (width, height) ``sizes``) into ``out``, row by row.

        Args:
            out: A contiguous ``(len(images), 3, S, S)`` uint8 destination: a numpy array on the
                CPU, a CUDA torch tensor on the GPU (rows of the model's input batch).

        Returns:
            One entry per image: ``None`` when decoded, else a :class:`RequestError` saying why.
        """
        if not images:
            return []
        if len(images) > self.max_batch:
            raise ValueError(f"{len(images)} images exceed the decoder's batch size {self.max_batch}")
        try:
            self._copy(self._run(images, sizes), out)
            return [None] * len(images)
        except RuntimeError as err:
            # DALI marks a pipeline that hit an operator error as no longer valid: start a new one.
            self._pipe = self._build()
            if len(images) == 1:
                return [self._failure(err)]
            log.warning("decoding a batch of %d failed; decoding its images one by one", len(images))
        results: list[BaseException | None] = []
        for i in range(len(images)):
            try:
                self._copy(self._run(images[i : i + 1], sizes[i : i + 1]), out[i : i + 1])
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
