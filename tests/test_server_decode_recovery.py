"""A damaged image in a served batch costs its own decode, not a new decoder per damaged image.

The server's decoder (server/_preprocess.py) decodes a batch whose decode failed one image at a
time, so only the damaged ones fail. It used to build a new DALI pipeline after every failure: a
new decoder per damaged image (on a GPU a new nvJPEG decoder and its buffers, built holding
Python's lock). DALI's dynamic executor keeps running after an operator error, so the decoder now
rebuilds only when a known image no longer decodes as a fresh pipeline decoded it.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES

from gpufeed.config import SizePx
from gpufeed.server._preprocess import ImageDecoder, inspect_image
from gpufeed.synth._damaged import png_with_damaged_data
from gpufeed.synth._photos import encode_image, photo_pixels

pytestmark = pytest.mark.timeout(300)


def _blobs() -> tuple[list[bytes], bytes]:
    good = [encode_image(photo_pixels(160, 120, seed=k), "JPEG" if k % 2 else "PNG") for k in range(6)]
    return good, png_with_damaged_data(good[0])


def _sizes(blobs: list[bytes]) -> np.ndarray:
    return np.array([(i.width, i.height) for i in (inspect_image(b, 40_000_000) for b in blobs)], dtype=np.int64)


def _rows(n: int, device_id: int | None):
    """A decode destination as the server has it: numpy on the CPU, a CUDA tensor on a GPU (7: unwritten rows show)."""
    if device_id is None:
        return np.full((n, 3, 32, 32), 7, np.uint8)
    import torch

    return torch.full((n, 3, 32, 32), 7, dtype=torch.uint8, device=f"cuda:{device_id}")


def _host(rows) -> np.ndarray:
    return rows if isinstance(rows, np.ndarray) else rows.cpu().numpy()


def _fresh(blobs: list[bytes], device_id: int | None = None) -> np.ndarray:
    out = _rows(len(blobs), device_id)
    decoder = ImageDecoder(SizePx(32, 32), 0.875, 8, device_id, 2)
    assert decoder.decode_into(blobs, _sizes(blobs), out) == [None] * len(blobs)
    return _host(out)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_damaged_images_fail_alone_without_a_decoder_each(device):
    good, bad = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=8, device_id=device.device_id, num_threads=2)
    for round_ in range(3):  # three batches, each with damaged images among good ones
        blobs = [good[0], bad, good[1], good[2], bad, good[3], bad, good[4]]
        out = _rows(8, device.device_id)
        outcome = decoder.decode_into(blobs, _sizes(blobs), out)
        failed = [k for k, result in enumerate(outcome) if result is not None]
        assert failed == [1, 4, 6], round_
        assert all(outcome[k].reason == "corrupt_image" for k in failed)
        kept = [0, 2, 3, 5, 7]
        # exact: the same decoder options on the same device, which pick one decoder per image whatever its batch
        assert np.array_equal(_host(out)[kept], _fresh([blobs[k] for k in kept], device.device_id)), round_
        # One pipeline at the start and one at the first failure (the reference's), never one per damaged image.
        assert decoder.builds == 2, (round_, decoder.builds)
    alone = _rows(1, device.device_id)
    assert decoder.decode_into([bad], _sizes([bad]), alone)[0].reason == "corrupt_image"
    assert decoder.decode_into([good[5]], _sizes([good[5]]), alone) == [None]
    # exact: as above, one decoder kind on one device
    assert np.array_equal(_host(alone), _fresh([good[5]], device.device_id)) and decoder.builds == 2


def test_a_broken_pipeline_is_rebuilt_and_its_image_tried_again():
    good, bad = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
    out = np.zeros((1, 3, 32, 32), np.uint8)
    assert decoder.decode_into([bad], _sizes([bad]), out)[0].reason == "corrupt_image"  # the reference is taken
    assert decoder.builds == 2
    # Break it as a half-fed run would: one input queued ahead of the others, so every later run
    # pairs an image with another's window. The next failure finds the known image decoded wrong.
    decoder._pipe.feed_input("encoded", [np.frombuffer(bad, np.uint8)])
    outcome = decoder.decode_into([good[1]], _sizes([good[1]]), out)
    assert decoder.builds == 3
    assert outcome == [None], "a good image failed by a broken pipeline is decoded again on the new one"
    assert np.array_equal(out, _fresh([good[1]]))
