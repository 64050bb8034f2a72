"""The server's image validation: the training index's facts, per request, without decoding pixels."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from gpufeed.config import SizePx
from gpufeed.pipelines import decode_problem
from gpufeed.server import RequestError
from gpufeed.server._preprocess import ImageDecoder, inspect_image
from gpufeed.synth._damaged import declare_size

pytestmark = pytest.mark.timeout(300)


def _photo(width=160, height=120, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) % 256], -1)
    return np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)


def _encode(pixels, fmt, **kwargs) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def _refused(data: bytes, max_pixels: int = 40_000_000) -> RequestError:
    with pytest.raises(RequestError) as info:
        inspect_image(data, max_pixels, "image 0 of input 'image'")
    assert info.value.message.startswith("image 0 of input 'image'")
    return info.value


def test_bytes_after_the_end_marker_are_served_like_the_image_without_them():
    jpeg, png = _encode(_photo(), "JPEG", quality=90), _encode(_photo(), "PNG")
    with_tails = [jpeg + b"\x00\x00\x00\x18ftypmp42" + bytes(20_000), png + b"padding" * 50]
    decoder = ImageDecoder(SizePx(32, 32), 0.875, max_batch=2, device_id=None, num_threads=1)
    outputs = []
    for blobs in ([jpeg, png], with_tails):
        infos = [inspect_image(blob, 40_000_000) for blob in blobs]
        assert [(i.width, i.height) for i in infos] == [(160, 120)] * 2
        out = np.zeros((2, 3, 32, 32), np.uint8)
        assert decoder.decode_into(blobs, np.array([(i.width, i.height) for i in infos]), out) == [None, None]
        outputs.append(out)
    assert np.array_equal(*outputs)


@pytest.mark.parametrize(
    ("make", "reason", "words"),
    [
        (lambda j, p: j[: len(j) * 2 // 3], "corrupt_image", "truncated JPEG"),
        (lambda j, p: p[: len(p) // 2], "corrupt_image", "truncated PNG"),
        (lambda j, p: declare_size(j, 65500, 65500), "too_many_pixels", "serve.max_image_pixels"),
        (lambda j, p: declare_size(p, 30000, 30000), "too_many_pixels", "900,000,000 pixels"),
        (lambda j, p: b"\x00\x00\x00\x1cftypheic" + bytes(64), "unsupported_media_type", "HEIC"),
        (lambda j, p: b"hello" * 20, "corrupt_image", "not a JPEG or PNG"),
    ],
)
def test_bad_uploads_are_refused_with_what_is_wrong(make, reason, words):
    jpeg, png = _encode(_photo(), "JPEG", quality=90), _encode(_photo(), "PNG")
    refused = _refused(make(jpeg, png))
    assert refused.reason == reason and words in refused.message, refused.message


def test_a_jpeg_cut_in_half_with_ffd9_appended():
    """Restart markers make it visible to validation; without them only the strict decode sees it.

    The server does not run the strict decode per request (its cost is measured in docs/images.md): the
    plain half-JPEG passes validation and decodes, as in every browser, with its lower part grey.
    """
    plain = _encode(_photo(), "JPEG", quality=90)
    marked = _encode(_photo(), "JPEG", quality=90, restart_marker_blocks=4)
    refused = _refused(marked[: len(marked) // 2] + b"\xff\xd9")
    assert refused.reason == "corrupt_image" and "restart markers" in refused.message
    half = plain[: len(plain) // 2] + b"\xff\xd9"
    info = inspect_image(half, 40_000_000)
    assert (info.width, info.height) == (160, 120)
    assert "premature end of data segment" in decode_problem(half), "gpufeed check refuses it"
    out = np.zeros((1, 3, 32, 32), np.uint8)
    assert ImageDecoder(SizePx(32, 32), 1.0, 1, None, 1).decode_into([half], np.array([[160, 120]]), out) == [None]
    assert np.abs(out[0, :, -4:].astype(int) - 128).max() <= 2, "the part that was cut off is grey"


def test_oriented_size_is_what_validation_returns():
    exif = Image.Exif()
    exif[0x0112] = 8
    data = _encode(_photo(), "JPEG", exif=exif.tobytes())
    info = inspect_image(data, 40_000_000)
    assert (info.width, info.height, info.orientation) == (120, 160, 8)
