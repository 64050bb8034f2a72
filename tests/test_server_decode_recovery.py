"""A damaged image in a served batch costs its own decode, not a new decoder per damaged image.

The server's decoder (server/_preprocess.py) decodes a batch whose decode failed one image at a
time, so only the damaged ones fail. It used to build a new DALI pipeline after every failure: a
new decoder per damaged image (on a GPU a new nvJPEG decoder and its buffers, built holding
Python's lock). DALI's dynamic executor keeps running after an operator error, so the decoder now
rebuilds only when a known image no longer decodes as a fresh pipeline decoded it.

A rebuild that fails (CUDA out of memory, say) answers the rows it leaves undecoded with one line
and leaves no pipeline behind: one left unbuilt was built by DALI's next ``feed_input`` on its own,
unprimed and uncounted. The old pipeline is let go before the new one is built, so two decoders never
live at once (the failed run's traceback held the old one through the rebuild).
"""

from __future__ import annotations

import gc
import logging
import weakref

import numpy as np
import pytest
from conftest import DEVICES

from gpufeed.config import SizePx
from gpufeed.server import _preprocess
from gpufeed.server._preprocess import ImageDecoder, inspect_image, serve_pipeline
from gpufeed.synth._damaged import jpeg_without_segment, png_with_damaged_data
from gpufeed.synth._photos import encode_image, photo_pixels

pytestmark = pytest.mark.timeout(300)

# The good images' formats: baseline JPEGs (the GPU's hardware decoder), progressive JPEGs (nvJPEG's
# CUDA decoder; the hardware one takes baseline only) and PNGs (decoded on the CPU even on a GPU).
_FORMATS = ("baseline", "progressive", "png")


def _blobs() -> tuple[list[bytes], bytes, bytes]:
    """(six good images, baseline, progressive and PNG in turn; a damaged PNG; a damaged JPEG).

    Both damaged ones pass validation (:func:`inspect_image`) and fail DALI's decode: the PNG's
    compressed data is garbage, the JPEG has no quantisation tables.
    """
    good = []
    for k in range(6):
        pixels, kind = photo_pixels(160, 120, seed=k), _FORMATS[k % 3]
        good.append(
            encode_image(pixels, "PNG") if kind == "png" else encode_image(pixels, progressive=kind != "baseline")
        )
    return good, png_with_damaged_data(good[2]), jpeg_without_segment(good[0], 0xDB)


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
    """The images decoded in one batch by a new decoder with evaluation's options (the default), no failure seen."""
    out = _rows(len(blobs), device_id)
    decoder = ImageDecoder(SizePx(32, 32), 0.875, 8, device_id, 2)
    assert decoder.decode_into(blobs, _sizes(blobs), out) == [None] * len(blobs)
    return _host(out)


def _failing_builds(monkeypatch, count: int) -> None:
    """The next ``count`` pipeline builds fail as CUDA running out of memory would."""
    from nvidia.dali.pipeline import Pipeline

    build, left = Pipeline.build, [count]

    def build_or_fail(pipe):
        if left[0] and not pipe._built:
            left[0] -= 1
            raise RuntimeError("CUDA out of memory (simulated)\nCurrent pipeline object is no longer valid.")
        return build(pipe)

    monkeypatch.setattr(Pipeline, "build", build_or_fail)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_damaged_images_fail_alone_without_a_decoder_each(device):
    """Damaged JPEGs and PNGs among good baseline, progressive and PNG images: only they fail.

    On a GPU the damaged JPEG shares the batch with baseline JPEGs that go to the hardware decoder.
    When nvJPEG's batched hardware call fails, nvImageCodec marks its whole hardware sub-batch failed
    and decodes each of its images again on the fallbacks (nvJPEG's CUDA decoder, then the CPU),
    whose pixels differ by a level. A JPEG without quantisation tables fails every backend, so DALI
    fails the batch and every image is decoded again alone; the good rows equal a fresh decoder's
    bit for bit, so none keeps a fallback's pixels. Not shown: a damaged JPEG that some fallback
    decodes. DALI's batch then succeeds, no recovery runs, and its neighbours in the failed hardware
    sub-batch keep the CUDA decoder's pixels; DALI has no option that keeps a failed hardware
    sample from the fallbacks.
    """
    good, bad_png, bad_jpeg = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=8, device_id=device.device_id, num_threads=2)
    for round_ in range(3):  # three batches, each with damaged images among good ones
        blobs = [good[0], bad_jpeg, good[1], good[2], bad_png, good[3], bad_jpeg, good[4]]
        out = _rows(8, device.device_id)
        outcome = decoder.decode_into(blobs, _sizes(blobs), out)
        failed = [k for k, result in enumerate(outcome) if result is not None]
        assert failed == [1, 4, 6], round_
        assert all(outcome[k].reason == "corrupt_image" for k in failed)
        kept = [0, 2, 3, 5, 7]
        # exact: the same decoder options on the same device: every baseline JPEG to the hardware
        # decoder (primed), progressive JPEGs to nvJPEG's CUDA decoder, PNGs to the CPU, whatever the batch
        assert np.array_equal(_host(out)[kept], _fresh([blobs[k] for k in kept], device.device_id)), round_
        # One pipeline at the start and one at the first failure (the reference's), never one per damaged image.
        assert decoder.builds == 2, (round_, decoder.builds)
    alone = _rows(1, device.device_id)
    assert decoder.decode_into([bad_jpeg], _sizes([bad_jpeg]), alone)[0].reason == "corrupt_image"
    assert decoder.decode_into([good[3]], _sizes([good[3]]), alone) == [None]
    # exact: as above, one decoder kind per image format on one device
    assert np.array_equal(_host(alone), _fresh([good[3]], device.device_id)) and decoder.builds == 2


def test_a_broken_pipeline_is_rebuilt_and_its_image_tried_again():
    good, bad, _ = _blobs()
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


def test_a_failed_rebuild_answers_its_rows_in_one_line_and_the_next_batch_builds_a_counted_pipeline(monkeypatch):
    good, bad, _ = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
    _failing_builds(monkeypatch, 1)
    blobs = [good[0], bad, good[1]]
    outcome = decoder.decode_into(blobs, _sizes(blobs), _rows(3, None))  # the first failure's rebuild fails
    assert [getattr(result, "reason", None) for result in outcome] == ["internal"] * 3
    assert outcome[0].message == (
        "the image decoder could not be rebuilt after a failed decode (RuntimeError: CUDA out of memory (simulated))"
    )
    assert decoder._pipe is None and decoder.builds == 1, "no pipeline left to build itself unprimed"
    out = _rows(1, None)
    assert decoder.decode_into([good[3]], _sizes([good[3]]), out) == [None]
    assert decoder.builds == 2, "the next batch built (and on a GPU primed) a new pipeline itself"
    assert np.array_equal(out, _fresh([good[3]]))


def test_rows_decoded_before_a_failed_rebuild_are_kept(monkeypatch):
    good, bad, _ = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
    assert decoder.decode_into([bad], _sizes([bad]), _rows(1, None))[0].reason == "corrupt_image"  # the reference
    # The pipeline checks out after the batch fails, and is found broken after its damaged row, when
    # its rebuild fails: the rows before are decoded, the damaged one and those after are not.
    verdicts = iter([True, False])
    monkeypatch.setattr(_preprocess, "same_pixels", lambda got, want: next(verdicts))
    _failing_builds(monkeypatch, 1)
    blobs = [good[0], good[1], bad, good[3]]
    out = _rows(4, None)
    outcome = decoder.decode_into(blobs, _sizes(blobs), out)
    assert outcome[:2] == [None, None] and [result.reason for result in outcome[2:]] == ["internal"] * 2
    assert np.array_equal(out[:2], _fresh(blobs[:2]))


def test_the_old_pipeline_is_gone_before_a_new_one_is_built(monkeypatch):
    """Garbage collection off: only reference counts free the old pipeline, as they must on time."""
    good, bad, _ = _blobs()
    made: list[weakref.ref] = []
    alive_then: list[int] = []

    def counted(*args, **kwargs):
        alive_then.append(sum(ref() is not None for ref in made))
        pipe = serve_pipeline(*args, **kwargs)
        made.append(weakref.ref(pipe))
        return pipe

    monkeypatch.setattr(_preprocess, "serve_pipeline", counted)
    gc.collect()
    gc.disable()
    try:
        decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
        batch = [good[0], bad, good[1]]
        decoder.decode_into(batch, _sizes(batch), _rows(3, None))  # the first failure: the reference's pipeline
        for blobs in ([good[1]], batch):  # a broken pipeline found by a lone image, then by a batch
            decoder._pipe.feed_input("encoded", [np.frombuffer(bad, np.uint8)])
            decoder.decode_into(blobs, _sizes(blobs), _rows(len(blobs), None))
    finally:
        gc.enable()
    assert decoder.builds == 4
    assert alive_then == [0, 0, 0, 0], "pipelines still alive as each was built"


def test_a_failed_banded_decode_says_it_decoded_whole(caplog):
    good, bad, _ = _blobs()
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
    assert decoder.band_count(1) == 2 and decoder.exact_in_bands(decoder._windows(_sizes([bad])))
    caplog.set_level(logging.WARNING, logger="gpufeed.server")
    assert decoder.decode_into([bad], _sizes([bad]), _rows(1, None), bands=2)[0].reason == "corrupt_image"
    assert decoder.bands_used == 1, "decoded again whole"
    assert "decoding 1 image(s) in 2 bands each failed; decoding each whole, alone" in caplog.text
    out = _rows(1, None)
    assert decoder.decode_into([good[0]], _sizes([good[0]]), out, bands=2) == [None] and decoder.bands_used == 2
    assert np.array_equal(out, _fresh([good[0]]))
