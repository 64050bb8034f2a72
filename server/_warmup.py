"""What warm-up needs: the image every served model decodes first, the bit-for-bit check decoders
make with it, and batches run side by side (:func:`run_together`)."""

from __future__ import annotations

import contextlib
import functools
import io
import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

__all__ = ["run_together", "same_pixels", "warmup_image"]

T = TypeVar("T")


@functools.cache
def warmup_image(width_px: int, height_px: int) -> tuple[bytes, tuple[int, int]]:
    """A JPEG of twice the model's input size, a smooth pattern, and its (width, height): what warm-up batches decode.

    Made once per size: decoders decode it again to prime and to check themselves (:class:`~gpufeed.server._preprocess.ImageDecoder`).
    """
    from PIL import Image

    size = (width_px * 2, height_px * 2)
    yy, xx = np.mgrid[0 : size[1], 0 : size[0]]
    pixels = np.stack([xx % 256, yy % 256, (xx + yy) % 256], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), size


def same_pixels(got, want) -> bool:
    """Whether two decoded batches (numpy arrays, or CUDA tensors on a GPU) are equal bit for bit."""
    if isinstance(got, np.ndarray):
        return np.array_equal(got, want)
    import torch

    return bool(torch.equal(got, want))  # a host read: this runs only after a failed decode


def run_together(calls: list[Callable[[Callable[[], None]], T]], timeout_s: float = 600.0) -> list[T]:
    """Run each call on a thread of its own, all of them inside their shared part at once.

    Each call gets ``meet``, which it calls where that part starts (a batch's inference): no call
    returns from ``meet`` before every call has reached it. This is how warm-up makes a session
    run batches side by side before any request does: onnxruntime's CUDA provider gives a run that
    starts while another is in progress a new set of streams (each with its cuBLAS and cuDNN
    handles, and arena memory of its own), and without this the first busy moment after start-up
    would pay for them inside requests.

    A call that ends without reaching ``meet`` (it raised, or had nothing to run) lets the others
    past it: none waits for a call that will not come.

    Returns:
        The calls' results, in order.

    Raises:
        BaseException: The first call's error (in call order), once every call has ended.
    """
    barrier = threading.Barrier(len(calls))

    def meet() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):  # a call ended before its shared part (see run)
            barrier.wait(timeout_s)

    results: list = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def run(k: int) -> None:
        try:
            results[k] = calls[k](meet)
        except BaseException as err:  # re-raised in the calling thread
            errors[k] = err
        finally:
            # Harmless once every call has met (the barrier has let them all through); else it
            # frees the calls still waiting for this one.
            barrier.abort()

    threads = [threading.Thread(target=run, args=(k,), name=f"gpufeed-warmup-{k}") for k in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for err in errors:
        if err is not None:
            raise err
    return results
