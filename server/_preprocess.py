"""Serving preprocessing: validate each encoded image before batching, then decode batches in DALI.

**Validation** (:func:`inspect_image`, per image, in the request handler, before any batching):
header parse (format and size, EXIF rotation applied), JPEG/PNG only, pixel count against the
decompression-bomb limit, end-of-image marker present (truncation), PNG chunk CRCs. A failure is a
:class:`RequestError` for that request alone.

**Decoding** (:class:`ImageDecoder`, per batch, on the batcher's thread): one DALI graph

==================  ==========================================================  ================
stage               output                                                      where
==================  ==========================================================  ================
external_source     encoded bytes (uint8, 1-D) + crop window per image          CPU
decoders.image_slice uint8 HWC RGB, the crop window only (ROI decode)           GPU ("mixed") or CPU
resize              uint8 (S, S, 3)                                             GPU or CPU
transpose           uint8 (3, S, S) "CHW"; the batch is (k, 3, S, S) NCHW       GPU or CPU
==================  ==========================================================  ================

The crop window is :func:`gpufeed.pipelines.eval_windows` (resize the shorter side to
``S / eval_crop_fraction``, centre-crop ``S``), with the very operators and arguments of the
evaluation loader, so the server feeds the model exactly what evaluation did. If DALI fails on a
batch (an image that passed validation but whose data is damaged), each image is decoded alone so
only the bad ones fail.
"""

from __future__ import annotations

import io
import logging
import re

import numpy as np
from PIL import Image, UnidentifiedImageError

from gpufeed.pipelines import decode_window, eval_windows
from gpufeed.server._errors import RequestError

__all__ = ["ImageDecoder", "ImageInfo", "inspect_image"]

log = logging.getLogger("gpufeed.server")

# Magic numbers of formats people send by mistake: they get 415 naming the format, not "corrupt".
_OTHER_FORMATS = (
    (b"GIF8", "GIF"),
    (b"BM", "BMP"),
    (b"RIFF", "WebP/RIFF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"\x00\x00\x00\x0cjP", "JPEG 2000"),
    (b"%PDF", "PDF"),
)
_ROTATED = {5, 6, 7, 8}  # EXIF orientations that swap width and height


class ImageInfo:
    """What validation learned about one encoded image: its format and (oriented) size."""

    __slots__ = ("format", "height", "width")

    def __init__(self, fmt: str, width: int, height: int) -> None:
        self.format, self.width, self.height = fmt, width, height

    def __repr__(self) -> str:
        return f"ImageInfo({self.format}, {self.width}x{self.height})"


def inspect_image(data: bytes, max_pixels: int, where: str = "the image") -> ImageInfo:
    """Check an encoded image without decoding its pixels; raise :class:`RequestError` if unusable.

    Args:
        data: The encoded bytes.
        max_pixels: Largest allowed width x height.
        where: How to name this image in messages, e.g. ``"image 2 of input 'image'"``.
    """
    if not data:
        raise RequestError("corrupt_image", f"{where} is empty (0 bytes)")
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt, (width, height) = img.format or "", img.size
            if fmt in ("JPEG", "PNG") and width * height > max_pixels:
                raise RequestError(
                    "too_many_pixels",
                    f"{where} is {width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,} "
                    "(serve.max_image_pixels)",
                )
            orientation = img.getexif().get(0x0112, 1) if fmt == "JPEG" else 1
            if fmt == "PNG":
                img.verify()  # walks every chunk and checks its CRC: catches damaged data cheaply
    except RequestError:
        raise
    except Image.DecompressionBombError as err:
        raise RequestError("too_many_pixels", f"{where}: {err}") from None
    except UnidentifiedImageError:
        for magic, name in _OTHER_FORMATS:
            if data.startswith(magic):
                raise RequestError(
                    "unsupported_media_type", f"{where} is {name}; supported formats: JPEG, PNG"
                ) from None
        raise RequestError("corrupt_image", f"{where} is not a JPEG or PNG image (no valid header)") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise RequestError("corrupt_image", f"{where} is damaged: {err}") from None
    except Exception as err:  # a header parser tripping over crafted bytes (struct.error, IndexError, ...)
        raise RequestError(
            "corrupt_image", f"{where} is damaged: its header cannot be parsed ({type(err).__name__})"
        ) from None
    if fmt not in ("JPEG", "PNG"):
        raise RequestError("unsupported_media_type", f"{where} is {fmt}; supported formats: JPEG, PNG")
    if width <= 0 or height <= 0:
        raise RequestError("corrupt_image", f"{where} declares an empty size {width}x{height}")
    tail = data[-64:]
    if fmt == "JPEG" and b"\xff\xd9" not in tail:
        raise RequestError("corrupt_image", f"{where} is a truncated JPEG: no end-of-image marker (FFD9)")
    if fmt == "PNG" and b"IEND" not in tail[-12:]:
        raise RequestError("corrupt_image", f"{where} is a truncated PNG: it does not end with an IEND chunk")
    if orientation in _ROTATED:
        width, height = height, width
    return ImageInfo(fmt, width, height)


class ImageDecoder:
    """DALI decode + centre crop + resize of encoded images into a uint8 NCHW batch.

    Args:
        size_px: Output height and width (the model card's ``size_px``).
        crop_fraction: The card's ``eval_crop_fraction``.
        max_batch: Largest batch (the model's N); smaller batches are fine.
        device_id: CUDA device for nvJPEG and GPU resize; ``None`` decodes on the CPU.
        num_threads: DALI CPU threads.
    """

    def __init__(self, size_px: int, crop_fraction: float, max_batch: int, device_id: int | None, num_threads: int):
        self.size_px, self.crop_fraction, self.max_batch = size_px, crop_fraction, max_batch
        self.device_id, self.num_threads = device_id, num_threads
        self._pipe = self._build()

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        size, on_gpu = self.size_px, self.device_id is not None

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
        windows = eval_windows(sizes, self.crop_fraction)
        roi_start, roi_end = windows.roi()
        pipe = self._pipe
        pipe.feed_input("encoded", [np.frombuffer(b, dtype=np.uint8) for b in images])
        pipe.feed_input("anchor", list(windows.anchor))
        pipe.feed_input("shape", list(windows.shape))
        pipe.feed_input("roi_start", list(roi_start))
        pipe.feed_input("roi_end", list(roi_end))
        (out,) = pipe.run()
        tensor = out.as_tensor()
        if tuple(tensor.shape()) != (len(images), 3, self.size_px, self.size_px):
            raise RuntimeError(
                f"decoder produced {tensor.shape()}, expected {(len(images), 3, self.size_px, self.size_px)}"
            )
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
