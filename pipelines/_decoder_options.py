"""nvJPEG's decoder arguments: the ``mixed`` image decoder's options, sized for the data a pipeline reads.

Training sizes nvJPEG's per-thread buffers for the image at a percentile of pixel count
(:func:`percentile_pick`), so one outlier does not set every thread's buffers; evaluation and
serving take the same all-or-nothing hardware-decoder share (:func:`eval_decoder_options`), so
serving gives evaluation's pixels bit for bit. The image graph
(:mod:`gpufeed.pipelines._image_pipeline`, which re-exports these names) hands them to
:func:`~gpufeed.pipelines._image_pipeline.decode_window`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BUFFER_PERCENTILE", "eval_decoder_options", "gpu_decoder_options", "percentile_pick"]

# DALI's own defaults for nvJPEG's per-thread buffers; raised only when the data needs more.
_DEVICE_PADDING_BYTES = 16 << 20
_HOST_PADDING_BYTES = 8 << 20


# nvJPEG's buffers are sized for the image at this percentile of pixel count, at most _CAP_PIXELS:
# one outlier (a 40 MP photo) would otherwise set every thread's buffers, ~2 GiB of device and
# ~4 GiB of pinned memory per pipeline at 16 threads. A larger image still decodes: DALI grows the
# buffer of the thread that meets it.
BUFFER_PERCENTILE = 99.0
_CAP_PIXELS = 4096 * 4096


def percentile_pick(pixels, percentile: float = BUFFER_PERCENTILE) -> int:
    """Index of the image at ``percentile`` of ``pixels``: the order statistic at ``floor(p (n - 1))``.

    numpy's ``percentile(..., method="lower")``, so the chosen image is always one of the data's
    own, never an interpolation. The largest image is chosen only when every image is as large
    (or there is one), never because a set is small: a nearest-rank ``ceil(p n)`` would pick the
    largest image of any set of up to 100 images at the 99th percentile, and one outlier would
    size every thread's buffers again.

    Args:
        pixels: Pixel count of every image (at least one).
        percentile: In [0, 100].
    """
    pixels = np.asarray(pixels).reshape(-1)
    if not len(pixels):
        raise ValueError("percentile_pick: no images")
    if not 0.0 <= percentile <= 100.0:
        raise ValueError(f"percentile_pick: percentile {percentile} is outside [0, 100]")
    rank = int(np.floor(percentile / 100.0 * (len(pixels) - 1) + 1e-9))
    return int(np.argsort(pixels, kind="stable")[rank])


def eval_decoder_options(hw_decoder_load: float) -> dict:
    """The ``mixed`` decoder's arguments for evaluation and serving: the one place both take them from.

    The evaluation loader (:func:`gpu_decoder_options` with ``train=False``) and the server's
    decoder (:class:`gpufeed.server._preprocess.ImageDecoder`, given ``loader.hw_decoder_load`` of
    the serving config) both call this, so an image takes the same decoder in both and serving
    gives evaluation's pixels bit for bit.

    * ``hw_decoder_load``: 1.0 when ``hw_decoder_load`` > 0, else 0.0, never a share in between.
      nvImageCodec (DALI's decoder) gives the hardware JPEG decoder a quota of
      ``round(share x batch size)`` JPEGs (rounded up to whole engines, set at the first batch),
      filled in its own order (chroma subsampling, then area, largest first), and the rest to
      nvJPEG's CUDA decoder (``image_generic_decoder.cpp`` and ``nvjpeg/hw_decoder.cpp``): with a
      share between 0 and 1 the decoder of an image depends on the other images of its batch and
      the batch's size, which differ between an evaluation batch and a served one. At 1.0 every
      JPEG the hardware decoder takes goes to it, at 0.0 none does, whatever the batch.
    * ``affine``: off (see :func:`gpu_decoder_options`).

    Args:
        hw_decoder_load: ``loader.hw_decoder_load``, the training share.
    """
    return {"hw_decoder_load": 1.0 if hw_decoder_load > 0 else 0.0, "affine": False}


def gpu_decoder_options(sizes, hw_decoder_load: float, *, train: bool = True, num_threads: int = 1) -> tuple[dict, str]:
    """Arguments for the ``mixed`` (nvJPEG) decoder, sized for the data, and what they reserve, in words.

    * ``hw_decoder_load``: share of JPEGs sent to the hardware JPEG decoder (A100, H100); the rest
      go through nvJPEG's CUDA/hybrid path, which also uses CPU threads. Training takes the share
      as given; evaluation takes all or nothing (:func:`eval_decoder_options`).
    * ``affine``: off. DALI pins thread i to core i by default, so every rank of a torchrun job,
      and its train and val pipelines, would pin the same first cores.
    * Training only (evaluation keeps DALI's defaults, 16 MiB device and 8 MiB pinned per thread):
      ``preallocate_width_hint`` / ``preallocate_height_hint`` for the hardware decoder, and
      ``device_memory_padding`` / ``host_memory_padding``, nvJPEG's per-thread device buffer and
      its two pinned host buffers, each one decoded RGB copy of the image at the
      :data:`BUFFER_PERCENTILE` th percentile of pixel count (:func:`percentile_pick`; at most
      4096 x 4096), never less than DALI's defaults.

    Args:
        sizes: (N, 2) (width, height) of the images the pipeline reads.
        train: Size for the data (True) or keep DALI's defaults (evaluation).
        num_threads: The pipeline's threads (each has its own buffers), for the description.

    Only the ``mixed`` backend accepts these: CPU pipelines never get them.
    """
    options = (
        {"hw_decoder_load": float(hw_decoder_load), "affine": False} if train else eval_decoder_options(hw_decoder_load)
    )
    device_pad, host_pad = _DEVICE_PADDING_BYTES, _HOST_PADDING_BYTES
    basis = "DALI's defaults (evaluation)"
    if train:
        sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
        pixels = sizes[:, 0] * sizes[:, 1]
        pick = percentile_pick(pixels)
        width, height = (int(v) for v in sizes[pick])
        if width * height > _CAP_PIXELS:
            scale = (_CAP_PIXELS / (width * height)) ** 0.5
            width, height = int(width * scale), int(height * scale)
        padding = -(-3 * width * height // (1 << 20)) << 20  # whole MiB
        device_pad, host_pad = max(device_pad, padding), max(host_pad, padding)
        options.update(
            preallocate_width_hint=width,
            preallocate_height_hint=height,
            device_memory_padding=device_pad,
            host_memory_padding=host_pad,
        )
        largest = int(pixels.max())
        basis = f"the {BUFFER_PERCENTILE:g}th-percentile image, {width}x{height} (largest: {largest / 1e6:.1f} MP)"
    mib = 1 << 20
    reserved = (
        f"nvJPEG buffers: {num_threads * device_pad // mib} MiB device ({num_threads} thread(s) x "
        f"{device_pad // mib} MiB) and {2 * num_threads * host_pad // mib} MiB pinned (2 x {num_threads} x "
        f"{host_pad // mib} MiB), sized for {basis}"
    )
    return options, reserved
