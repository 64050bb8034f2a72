"""Non-square image outputs (``image.size_px: [width, height]``): exact pixels, never transposed.

Every source image here encodes its own coordinates in its pixels, so an output pixel says which
source pixel it came from: a swapped width and height, a square crop or a stretched window shows
as wrong pixels, not just a wrong shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from PIL import Image

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.pipelines._windows import eval_windows, train_windows

pytestmark = pytest.mark.timeout(300)

WIDTH, HEIGHT = 352, 224


def _coords(width: int, height: int, ident: int = 0, block: int = 1) -> np.ndarray:
    """HWC uint8: red = column % 256, green = row, blue = ident * 16 + column // 256, per ``block`` square."""
    rows, cols = np.mgrid[0:height, 0:width] // block
    return np.stack([cols % 256, rows, ident * 16 + cols // 256], -1).astype(np.uint8)


def _loader(root, train, device, **image):
    return ImageLoader(
        ImageDataset.from_folder(root),
        train=train,
        image_cfg=ImagePipelineConfig(size_px=[WIDTH, HEIGHT], **image),
        loader_cfg=LoaderConfig(batch_size=4, last_batch="partial", shuffle=False, num_threads=2),
        device=device,
        seed=5,
    )


def _hwc(batch) -> np.ndarray:
    return batch.images.permute(0, 2, 3, 1).cpu().numpy()


def _write(root, images: dict[str, np.ndarray]):
    folder = root / "amber"
    folder.mkdir(parents=True)
    for name, pixels in images.items():
        Image.fromarray(pixels).save(folder / name)
    return root


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_centre_crop_keeps_the_output_shape(tmp_path, device):
    # 400x256 and 0.88: the centre 352x224 window is the output itself (scale 1), so every pixel is exact.
    root = _write(tmp_path, {"a.png": _coords(400, 256)})
    (batch,) = list(_loader(root, False, device, eval_crop_fraction=0.88))
    assert tuple(batch.images.shape) == (1, 3, HEIGHT, WIDTH)
    # exact: a lossless PNG at scale 1
    np.testing.assert_array_equal(_hwc(batch)[0], _coords(400, 256)[16 : 16 + HEIGHT, 24 : 24 + WIDTH])


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_downscale_maps_each_output_pixel_to_its_source_block(tmp_path, device):
    # 704x448 in 2x2 blocks halves to 352x224: output (r, c) is block (r, c). Red wraps at column
    # 256 (a step the filter blends), so the two columns beside the wrap are left out.
    root = _write(tmp_path, {"a.png": _coords(2 * WIDTH, 2 * HEIGHT, block=2)})
    (batch,) = list(_loader(root, False, device, eval_crop_fraction=1.0))
    got, want = _hwc(batch)[0].astype(int), _coords(WIDTH, HEIGHT).astype(int)
    keep = np.ones(WIDTH, dtype=bool)
    keep[[255, 256]] = False
    # exact: lossless PNG, 2x2 blocks of one value: every weight and sum is exact in float32
    np.testing.assert_array_equal(got[:, keep], want[:, keep])
    np.testing.assert_array_equal(got[:, ~keep, 1:], want[:, ~keep, 1:])  # green (row) is exact there too


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_train_window_of_the_output_aspect_is_not_distorted(tmp_path, device):
    # Crop area 1 and aspect 1 (relative to 352/224): the window is the whole image, flipped or not.
    images = {f"{i}.png": _coords(WIDTH, HEIGHT, ident=i) for i in range(4)}
    root = _write(tmp_path, images)
    loader = _loader(root, True, device, crop_area=[1.0, 1.0], crop_aspect_ratio=[1.0, 1.0], flip=True)
    (batch,) = list(loader)
    ids = batch.sample_ids.cpu().numpy()
    flips = train_windows(loader.dataset.sizes[ids], ids, 5, 0, (1.0, 1.0), (1.0, 1.0), True, WIDTH / HEIGHT).flip
    assert 0 < flips.sum() < len(ids), "the seed gives both flipped and unflipped samples"
    for k, sample_id in enumerate(ids):
        want = _coords(WIDTH, HEIGHT, ident=int(sample_id))
        # exact: a lossless PNG at scale 1, mirrored or not
        np.testing.assert_array_equal(_hwc(batch)[k], want[:, ::-1] if flips[k] else want)


def test_eval_windows_have_the_output_aspect():
    sizes = np.array([[400, 256], [1000, 200], [200, 1000], [352, 224]])
    w = eval_windows(sizes, 0.88, output_aspect=WIDTH / HEIGHT)
    # Wide output on a nearly-as-wide image: width binds; on a very wide one: height binds.
    np.testing.assert_array_equal(w.shape, [[352, 224], [277, 176], [176, 112], [310, 197]])
    np.testing.assert_array_equal(w.anchor, [[24, 16], [361, 12], [12, 444], [21, 13]])
    # A square output keeps the old rule: the centre square of fraction x the shorter side.
    np.testing.assert_array_equal(eval_windows(sizes, 0.5).shape, [[128, 128], [100, 100], [100, 100], [112, 112]])


def test_train_aspect_range_is_relative_to_the_output():
    sizes = np.array([[800, 800]] * 256)
    w = train_windows(sizes, np.arange(256), 0, 0, (0.2, 0.5), (3 / 4, 4 / 3), output_aspect=2.0)
    aspect = w.shape[:, 0] / w.shape[:, 1]
    assert aspect.min() >= 1.5 * 0.97 and aspect.max() <= 8 / 3 * 1.03
    assert aspect.min() < 1.7 and aspect.max() > 2.4, "the draws span the scaled range"
