"""Phone photos: all eight EXIF orientations train, evaluate and serve the picture as it is shown.

The reference is PIL's ``ImageOps.exif_transpose``: the crop windows are computed on its size and
cut from its pixels. The loader's evaluation and training crops and the server's crops must match
it (small resampling differences only), and the server's must equal the evaluation loader's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICES
from oddmedia import oriented_jpeg, oriented_png, reference_rgb
from PIL import Image

from gpufeed.config import ImagePipelineConfig, LoaderConfig, SizePx
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._windows import eval_windows, train_windows
from gpufeed.server._preprocess import ImageDecoder, inspect_image
from gpufeed.synth import CLASS_WORDS, draw_tag, read_tag

pytestmark = pytest.mark.timeout(300)

SIZE = 40
FRACTION = 0.875


def _portrait(ident: int) -> np.ndarray:
    """A 60x90 portrait (as a phone shows it) with a corner mark and the tag (ident, class 0)."""
    yy, xx = np.mgrid[0:90, 0:60]
    image = np.stack([xx * 4, yy * 2, (xx + yy) * 2 % 256], -1).clip(0, 255).astype(np.uint8)
    image[:12, :15] = (250, 250, 30)
    return draw_tag(image, ident, CLASS_WORDS[0])


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Sample ids 0-7: JPEG orientations 1-8; 8-15: PNG (eXIf) orientations 1-8. Stored landscape for 5-8."""
    folder = tmp_path_factory.mktemp("exif") / "amber"
    folder.mkdir()
    for ident in range(16):
        orientation = ident % 8 + 1
        if ident < 8:
            data = oriented_jpeg(_portrait(ident), orientation, quality=95)
            (folder / f"{ident:02d}.jpg").write_bytes(data)
        else:
            (folder / f"{ident:02d}.png").write_bytes(oriented_png(_portrait(ident), orientation))
    return ImageDataset.from_folder(folder.parent)


def _reference_crops(dataset, ids, windows) -> np.ndarray:
    out = []
    for k, sample_id in enumerate(ids):
        (x, y), (w, h) = windows.anchor[k], windows.shape[k]
        crop = Image.fromarray(reference_rgb(dataset.paths[sample_id])).crop((x, y, x + w, y + h))
        crop = crop.resize((SIZE, SIZE), Image.BILINEAR)
        out.append(np.asarray(crop.transpose(Image.FLIP_LEFT_RIGHT) if windows.flip[k] else crop))
    return np.stack(out).astype(np.float32)


def _loader(dataset, device, train):
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=SIZE, eval_crop_fraction=FRACTION),
        loader_cfg=LoaderConfig(batch_size=16, last_batch="partial", shuffle=False, num_threads=2),
        device=device,
        seed=4,
    )


def _hwc(images: torch.Tensor) -> np.ndarray:
    return images.permute(0, 2, 3, 1).cpu().numpy().astype(np.float32)


def test_the_index_stores_the_oriented_size(photos):
    assert not photos.problems
    for sample_id, path in enumerate(photos.paths):
        assert tuple(photos.sizes[sample_id]) == (60, 90), path
        assert photos.orientations[sample_id] == sample_id % 8 + 1
        assert reference_rgb(path).shape == (90, 60, 3)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_crops_match_the_exif_transposed_reference(photos, device):
    (batch,) = list(_loader(photos, device, train=False))
    ids = batch.sample_ids.cpu().numpy()
    assert ids.tolist() == list(range(16))
    got = _hwc(batch.images)
    want = _reference_crops(photos, ids, eval_windows(photos.sizes[ids], FRACTION))
    errors = np.abs(got - want).mean(axis=(1, 2, 3))
    assert errors.max() < 1.5, errors
    assert [read_tag(image, "CHW").ident for image in batch.images] == ids.tolist(), "the tag reads upright"
    # The pixels as stored (no orientation applied) are far from what came out, for 2-8.
    for k in range(16):
        if k % 8 == 0:
            continue
        stored = Image.open(photos.paths[k]).convert("RGB")
        window = eval_windows(np.array([stored.size]), FRACTION)
        (x, y), (w, h) = window.anchor[0], window.shape[0]
        raw = stored.crop((x, y, x + w, y + h)).resize((SIZE, SIZE), Image.BILINEAR)
        assert np.abs(got[k] - np.asarray(raw, np.float32)).mean() > 10 * errors[k] + 5, f"orientation {k % 8 + 1}"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_train_crops_match_the_exif_transposed_reference(photos, device):
    loader = _loader(photos, device, train=True)
    (batch,) = list(loader)
    ids = batch.sample_ids.cpu().numpy()
    windows = train_windows(photos.sizes[ids], ids, seed=4, epoch=0)
    assert windows.flip.any() and not windows.flip.all()
    assert (windows.shape[:, 1] > 60).any(), "some windows are taller than a stored landscape image"
    errors = np.abs(_hwc(batch.images) - _reference_crops(photos, ids, windows)).mean(axis=(1, 2, 3))
    assert errors.max() < 2.0, errors


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_server_crops_equal_the_eval_loaders(photos, device):
    blobs = [Path(path).read_bytes() for path in photos.paths]
    infos = [inspect_image(blob, DEFAULT_MAX_IMAGE_PIXELS, f"photo {k}") for k, blob in enumerate(blobs)]
    sizes = np.array([(info.width, info.height) for info in infos])
    assert (sizes == photos.sizes).all()
    decoder = ImageDecoder(SizePx(SIZE, SIZE), FRACTION, max_batch=16, device_id=device.device_id, num_threads=2)
    if device.is_gpu:
        out = torch.zeros((16, 3, SIZE, SIZE), dtype=torch.uint8, device="cuda")
    else:
        out = np.zeros((16, 3, SIZE, SIZE), dtype=np.uint8)
    assert decoder.decode_into(blobs, sizes, out) == [None] * 16
    served = torch.as_tensor(out).cpu()
    (batch,) = list(_loader(photos, device, train=False))
    # exact: the server's decoder has the eval loader's options (eval_decoder_options), same device
    assert torch.equal(served, batch.images.cpu().contiguous()), "serving and evaluation crop the same window"
    want = _reference_crops(photos, range(16), eval_windows(sizes, FRACTION))
    assert np.abs(_hwc(served) - want).mean(axis=(1, 2, 3)).max() < 1.5
