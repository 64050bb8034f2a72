"""A lone image decoded in horizontal bands on several threads equals the whole-image decode, bit for bit.

The server cuts an image into bands (server/_preprocess.py) only when it runs alone, to use idle
cores; the model must never see a different pixel for it. Checked here over real-world files
(the odd-image corpus: CMYK, progressive, restart markers, greyscale, 16-bit and palette PNG,
alpha, interlaced, every EXIF orientation, bytes after the end marker, a 4000x3000 photo, 1x1
images) and over window shapes that stress the band edges (odd heights, upscaling, strong
downscaling, a non-square output).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.config import SizePx
from gpufeed.server._preprocess import MAX_BANDS, ImageDecoder, inspect_image
from gpufeed.synth._photos import encode_image, photo_pixels

pytestmark = pytest.mark.timeout(300)


def _sizes(blobs: list[bytes]) -> np.ndarray:
    infos = [inspect_image(blob, 40_000_000) for blob in blobs]
    return np.array([(i.width, i.height) for i in infos], dtype=np.int64)


def _decode(decoder: ImageDecoder, blobs: list[bytes], bands: int) -> np.ndarray:
    height, width = decoder.size.hw
    out = np.full((len(blobs), 3, height, width), 7, np.uint8)  # not zero: an unwritten row shows
    assert decoder.decode_into(blobs, _sizes(blobs), out, bands=bands) == [None] * len(blobs)
    return out


@pytest.fixture(scope="module")
def corpus(odd_images) -> list[bytes]:
    _, images = odd_images  # the session's (conftest.py)
    return [image.path.read_bytes() for image in images if image.path.parent.parent.name == "good"]


@pytest.mark.parametrize(
    "size_px", [SizePx(32, 32), SizePx(224, 224), SizePx(128, 96)], ids=["32px", "224px", "128x96px"]
)
def test_bands_equal_the_whole_image_on_real_world_files(corpus, size_px):
    whole = ImageDecoder(size_px, 0.875, max_batch=1, device_id=None, num_threads=1)
    banded = ImageDecoder(size_px, 0.875, max_batch=2, device_id=None, num_threads=2)
    assert banded.band_count(1) == 2
    used = []
    for k, blob in enumerate(corpus):
        expected = _decode(whole, [blob], 1)
        got = _decode(banded, [blob], 2)
        assert np.array_equal(got, expected), f"corpus file {k}: bands differ in {np.sum(got != expected)} values"
        used.append(banded.bands_used)
    assert used.count(2) >= 1, f"no corpus file was decoded in bands: {used}"


@pytest.fixture(scope="module")
def random_photos() -> list[tuple[int, int, bytes]]:
    """40 JPEGs of random sizes, half of them camera-like (divisible by 8), as (width, height, bytes).

    Made once for the module: every output size below decodes the same files, and drawing and
    encoding them (up to 1600x1600) cost more than the decodes.
    """
    rng = np.random.default_rng(7)
    photos = []
    for t in range(40):
        width, height = (int(v) for v in rng.integers(24, 1600, 2))
        if t % 2 == 0:
            width, height = max(8, width - width % 8), max(8, height - height % 8)
        photos.append((width, height, encode_image(photo_pixels(width, height, seed=t), "JPEG", quality=92)))
    return photos


@pytest.mark.parametrize(
    ("size_px", "crop_fraction"), [(SizePx(224, 224), 0.875), (SizePx(96, 96), 0.875), (SizePx(160, 96), 1.0)]
)
def test_bands_are_used_exactly_where_they_give_the_same_pixels(random_photos, size_px, crop_fraction):
    """Random sizes, half of them camera-like (divisible by 8): upscaling, 4x downscaling, odd heights."""
    # Every image is compared, banded or not: bands_used says which path ran, the pixels must agree.
    whole = ImageDecoder(size_px, crop_fraction, max_batch=1, device_id=None, num_threads=1)
    banded = ImageDecoder(size_px, crop_fraction, max_batch=2, device_id=None, num_threads=2)
    used = []
    for width, height, blob in random_photos:
        exact = banded.exact_in_bands(banded._windows(_sizes([blob])))
        assert np.array_equal(_decode(banded, [blob], 2), _decode(whole, [blob], 1)), f"{width}x{height}"
        assert banded.bands_used == (2 if exact else 1)
        used.append(banded.bands_used)
    assert 0 < used.count(2) < len(used), used


def test_two_images_in_bands_on_four_threads():
    blobs = [encode_image(photo_pixels(640, 480, seed=s), "JPEG", quality=95) for s in (1, 2)]
    whole = ImageDecoder(SizePx(224, 224), 0.875, max_batch=2, device_id=None, num_threads=1)
    banded = ImageDecoder(SizePx(224, 224), 0.875, max_batch=4, device_id=None, num_threads=4)
    assert banded.band_count(2) == min(2, MAX_BANDS)
    assert np.array_equal(_decode(banded, blobs, 2), _decode(whole, blobs, 1))
    assert banded.bands_used == 2


def test_band_count_follows_the_threads_and_the_output_height():
    def count(size_px, threads, images, max_batch=8):
        return ImageDecoder(SizePx(*size_px), 0.875, max_batch, None, threads).band_count(images)

    assert count((224, 224), 1, 1) == 1  # one thread: nothing side by side
    assert count((224, 224), 2, 1) == 2
    assert count((224, 224), 2, 2) == 1  # two images already fill two threads
    assert count((224, 224), 16, 1) == MAX_BANDS
    assert count((224, 224), 2, 1, max_batch=1) == 1  # the pipeline's batch holds one sample
    assert count((64, 31), 2, 1) == 1  # an odd height does not split at an exact row
    assert count((24, 24), 2, 1) == 1  # bands of 12 rows are not worth a thread


def test_a_damaged_image_in_bands_fails_alone():
    good = encode_image(photo_pixels(160, 120, seed=3), "PNG")
    bad = good[: len(good) // 2]
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=4, device_id=None, num_threads=2)
    out = np.zeros((2, 3, 32, 32), np.uint8)
    sizes = np.array([[160, 120], [160, 120]])
    outcome = decoder.decode_into([good, bad], sizes, out, bands=2)
    assert outcome[0] is None and outcome[1].reason == "corrupt_image"
    assert np.array_equal(out[:1], _decode(ImageDecoder(SizePx(32, 32), 0.875, 1, None, 1), [good], 1))


def test_bands_are_refused_where_they_cannot_be_exact():
    decoder = ImageDecoder(SizePx(64, 31), 0.875, max_batch=4, device_id=None, num_threads=2)
    with pytest.raises(ValueError, match="2 bands"):
        decoder.decode_into([b"x"], np.array([[10, 10]]), np.zeros((1, 3, 31, 64), np.uint8), bands=2)
