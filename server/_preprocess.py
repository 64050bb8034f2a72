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

**Decoding** (:class:`ImageDecoder`, per batch, on the batcher's thread): one DALI graph (``_serve_graph.py``)

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
decoded alone so only the bad ones fail; if a new pipeline is needed and cannot be built, the
images left undecoded fail ``internal`` in one line and the next batch builds one.

**Bands** (CPU only): a lone image is cut into horizontal bands decoded side by side, bit for bit
the whole image's where that holds (:mod:`gpufeed.server._bands`).
"""

from __future__ import annotations

import contextlib
import logging
import re

import numpy as np

from gpufeed.config import LoaderConfig
from gpufeed.core import SizePx
from gpufeed.pipelines import Windows, eval_decoder_options, eval_windows, read_image_facts
from gpufeed.server._bands import MAX_BANDS as MAX_BANDS
from gpufeed.server._bands import MIN_BAND_ROWS, band_samples, binary_fraction
from gpufeed.server._errors import RequestError
from gpufeed.server._serve_graph import serve_pipeline as serve_pipeline
from gpufeed.server._warmup import same_pixels, warmup_image

__all__ = ["MAX_BANDS", "ImageDecoder", "ImageInfo", "inspect_image", "serve_pipeline"]

log = logging.getLogger("gpufeed.server")

MAX_PIXELS_KEY = "serve.max_image_pixels"
# loader.hw_decoder_load's default: a decoder made without the server's config decodes as evaluation does by default.
_DEFAULT_HW_LOAD = LoaderConfig().hw_decoder_load
# DALI's own hw_decoder_load (dali/operators/imgcodec/image_decoder.h: ``float hw_load = 0.9f``): what a
# ``mixed`` decoder given options without the key uses, so it takes the hardware decoder too.
_DALI_HW_LOAD = 0.9
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


class _NoPipeline(Exception):
    """No pipeline could be built after a failed decode; :attr:`failure` answers each row not decoded."""

    def __init__(self, failure: RequestError) -> None:
        super().__init__(failure.message)
        self.failure = failure


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
        self.builds = 0  # pipelines built, the first included
        self._probe = None  # a fresh pipeline's decode of the warm-up image (see _recover)
        self._pipe = None
        self._lost: RequestError | None = None  # why the last rebuild failed, while _pipe is None
        self._build()

    def _build(self) -> None:
        """Build the pipeline; on a GPU whose decoder takes the hardware decoder, decode one full batch.

        nvImageCodec fixes the hardware JPEG decoder's quota at its first batch (``round(load x
        batch size)``, rounded up to whole engines; ``image_generic_codec.h``) and sends the images
        of a larger batch past that quota to nvJPEG's CUDA decoder, whose pixels differ by a level.
        The server's first batch is a warm-up batch of its smallest size, so without this a served
        batch of 32 took two decoders where evaluation took one, and an image's pixels depended
        on its place in the batch.

        The old pipeline is let go first, so two decoders (on a GPU, two nvJPEG decoders and their
        buffers) never live at once. The new one is kept only once built and primed: DALI builds an
        unbuilt pipeline at its next ``feed_input``, which would serve unprimed and uncounted.
        """
        self._pipe = None
        pipe = serve_pipeline(self.size, self.max_batch, self.device_id, self.num_threads, self.gpu_options)
        pipe.build()
        self.builds += 1
        if self.device_id is not None and self.gpu_options.get("hw_decoder_load", _DALI_HW_LOAD) > 0:
            self._decode_warmup(self.max_batch, pipe)
        self._pipe = pipe

    def _rebuild(self, probe: bool = False) -> None:
        """:meth:`_build` after a failed decode, and with ``probe`` the reference decode (see :meth:`_recover`).

        Raises:
            _NoPipeline: It failed (CUDA out of memory, say); the rows left undecoded get its one line.
        """
        try:
            self._build()
            if probe:
                self._probe = self._decode_warmup(1)
        except Exception as err:  # whatever it was, the batch's rows must still be answered
            why = f"{type(err).__name__}: {next(iter(str(err).strip().splitlines()), 'no message')}"[:200]
        else:
            self._lost = None
            return
        self._pipe = None  # built but unprimed, or unable to decode the warm-up image: never served
        self._lost = RequestError("internal", f"the image decoder could not be rebuilt after a failed decode ({why})")
        log.error("%s", self._lost.message)
        raise _NoPipeline(self._lost)

    def _recover(self) -> bool:
        """Make the pipeline usable after a failed run, rebuilding it only where it has to be.

        DALI's dynamic executor keeps running after an operator error (on the CPU the next runs
        give a fresh pipeline's pixels), and a rebuild is a new decoder (22 ms on the 2-core CPU;
        on a GPU a new nvJPEG decoder, built holding Python's lock). So the warm-up image is
        decoded and compared bit for bit with a fresh pipeline's decode of it; a pipeline that
        differs (inputs fed but never consumed, a decoder in a bad state) is rebuilt.

        Returns:
            Whether the pipeline was found broken (and replaced): the failure may not be the image's.

        Raises:
            _NoPipeline: The pipeline had to be rebuilt and could not be.
        """
        if self._probe is None:  # the first failure: a new pipeline, and the reference from it
            self._rebuild(probe=True)
            return False
        try:
            same = same_pixels(self._decode_warmup(1), self._probe)
        except RuntimeError:
            same = False
        if same:
            return False
        log.warning("the image decoder no longer decodes a known image as it did; building a new one")
        self._rebuild()
        return True

    def _rows(self, n: int):
        """A destination of ``n`` decoded rows: numpy on the CPU, a CUDA tensor on a GPU."""
        out_h, out_w = self.size.hw
        if self.device_id is None:
            return np.zeros((n, 3, out_h, out_w), np.uint8)
        import torch

        return torch.zeros((n, 3, out_h, out_w), dtype=torch.uint8, device=f"cuda:{self.device_id}")

    def _decode_warmup(self, n: int, pipe=None):
        out_h, out_w = self.size.hw
        out = self._rows(n)
        blob, size = warmup_image(out_w, out_h)
        self._run([blob] * n, self._windows(np.array([size] * n)), out, pipe=pipe)
        return out

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
            if w < out_w or h < out_h or not (binary_fraction(h, out_h) and binary_fraction(w, out_w)):
                return False
        return True

    def _feed(self, pipe, images: list[bytes], windows: Windows, bands: int) -> None:
        roi_start, roi_end = windows.roi()
        out_h, out_w = self.size.hw
        encoded = [np.frombuffer(b, dtype=np.uint8) for b in images]
        if bands == 1:
            samples = (encoded, list(windows.anchor), list(windows.shape), list(roi_start), list(roi_end))
        else:
            samples = band_samples(encoded, windows, roi_start, roi_end, out_h, bands)
        for name, data in zip(("encoded", "anchor", "shape", "roi_start", "roi_end"), samples, strict=True):
            pipe.feed_input(name, data)
        pipe.feed_input("out_size", [np.array([out_h // bands, out_w], dtype=np.float32)] * (len(images) * bands))

    def _run(self, images: list[bytes], windows: Windows, out, bands: int = 1, pipe=None) -> None:
        """Decode on ``pipe`` (a pipeline being primed) or the decoder's; raise :class:`_NoPipeline` if it has none."""
        pipe = self._pipe if pipe is None else pipe
        if pipe is None:  # the last rebuild failed; decode_into tries again at its next batch
            raise _NoPipeline(self._lost or RequestError("internal", "the image decoder has no pipeline"))
        self._feed(pipe, images, windows, bands)
        (tensors,) = pipe.run()
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
                else decode whole; :attr:`bands_used` says which it did (1 when a failed banded
                decode was decoded again whole).

        Returns:
            One entry per image: ``None`` when decoded, else a :class:`RequestError` saying why
            (``internal`` for the rows left undecoded when no new pipeline could be built).
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
        done: list[BaseException | None] = []
        try:
            if self._pipe is None:  # the last rebuild failed: once more, built, primed and counted
                self._rebuild()
            message = self._try(images, windows, out, bands)
            if message is None:
                return [None] * len(images)
            if len(images) == 1 and bands == 1:
                return [self._decode_one(images[0], windows, out, message)]
            self.bands_used = 1
            shape = f" in {bands} bands each" if bands > 1 else ""
            log.warning("decoding %d image(s)%s failed; decoding each whole, alone", len(images), shape)
            self._recover()
            for i in range(len(images)):
                done.append(self._decode_one(images[i], windows.select(i), out[i : i + 1]))
        except _NoPipeline as lost:
            done += [lost.failure] * (len(images) - len(done))
        return done

    def _decode_one(self, image: bytes, windows: Windows, out, message: str | None = None) -> RequestError | None:
        """Decode one image into ``out``: ``None``, or why it failed (``message``: its failure already seen).

        Raises:
            _NoPipeline: The pipeline was found broken and could not be rebuilt, so it was not tried again.
        """
        if message is None:
            message = self._try([image], windows, out)
        if message is None:
            return None
        if not self._recover():
            return self._failure(message)
        message = self._try([image], windows, out)  # the pipeline was broken, not the image maybe: again
        if message is None:
            return None
        with contextlib.suppress(_NoPipeline):  # it failed on a new pipeline too: its own answer; the next row meets it
            self._recover()
        return self._failure(message)

    def _try(self, images: list[bytes], windows: Windows, out, bands: int = 1) -> str | None:
        """Decode into ``out``: ``None``, or DALI's message (the error's traceback holds the pipeline: let go)."""
        try:
            self._run(images, windows, out, bands)
        except RuntimeError as err:
            return str(err)
        return None

    @staticmethod
    def _failure(message: str) -> RequestError:
        # DALI's message holds a traceback with server paths; pass on only the decoder's verdict.
        lines = [line.strip(" :") for line in message.splitlines() if line.strip()]
        detail = next((line for line in lines if line.startswith("Failed to decode")), "the decoder rejected its data")
        detail = re.sub(r"\s*sample #\d+", "", detail)  # an index into a DALI batch, not the request's
        return RequestError("corrupt_image", f"the image data is damaged ({detail[:200]})")
