"""The dense loader: RGB and target maps cropped, flipped and resized together, checked pixel by pixel.

The synthetic maps carry their coordinates (depth ``1 + y * W + x``, one value per pixel; masks
are rectangles of ids), so every output map pixel is compared with the source value at the place
the sample's window and flip say it came from: DALI's nearest neighbour takes source pixel
``floor(roi_start + (i + 0.5) * (roi_end - roi_start) / out)``. The RGB's red and green ramps
(x and y) show it took the same geometry.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import DEVICES
from PIL import Image

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines._dense_loader import DenseLoader
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._windows import Windows
from gpufeed.synth._pairs import NO_DATA_BLOCK_PX, render_pair, synth_depth, write_paired_split

WIDTH, HEIGHT = 96, 72
OUT = (40, 30)  # (width, height): non-square on purpose


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    return write_paired_split(tmp_path_factory.mktemp("pairs") / "train", 10, WIDTH, HEIGHT, seed=3)


# (tie-free pixels, pixels) checked so far by _assert_nearest.
TIE_FREE = [0, 0]


def _source_index(start: int, length: int, out: int, flip: bool, map_px: int, rgb_px: int):
    """(index, tie) per output pixel along one axis, in exact integer arithmetic.

    Output pixel i's centre lies (i + 0.5) * length / out source pixels from the window's start
    (from its end when flipped), times map_px / rgb_px for a map of another size. Nearest takes
    the pixel that holds that point; when it falls exactly on the border of two pixels (a tie),
    either is as near, and DALI breaks ties differently per axis, so both are accepted there.
    """
    i = np.arange(out, dtype=np.int64)
    edge, sign = (start + length, -1) if flip else (start, 1)
    numerator = 2 * out * edge + sign * (2 * i + 1) * length
    numerator, denominator = numerator * map_px, 2 * out * rgb_px
    index = numerator // denominator
    tie = numerator % denominator == 0
    return np.clip(index, 0, map_px - 1), tie


def _expected(source: np.ndarray, windows: Windows, row: int, rgb_size=(WIDTH, HEIGHT)) -> np.ndarray:
    """The source values at the nearest pixels of window ``row`` (flip included), ties taken high."""
    return _candidates(source, windows, row, rgb_size)[0]


def _candidates(source: np.ndarray, windows: Windows, row: int, rgb_size=(WIDTH, HEIGHT)) -> list[np.ndarray]:
    (x0, y0), (w, h), flip = windows.anchor[row], windows.shape[row], bool(windows.flip[row])
    xs, x_tie = _source_index(x0, w, OUT[0], flip, source.shape[1], rgb_size[0])
    ys, y_tie = _source_index(y0, h, OUT[1], False, source.shape[0], rgb_size[1])
    x_alt = np.clip(np.where(x_tie, xs - 1, xs), 0, None)
    y_alt = np.clip(np.where(y_tie, ys - 1, ys), 0, None)
    return [source[np.ix_(a, b)] for a in (ys, y_alt) for b in (xs, x_alt)]


def _assert_nearest(got: np.ndarray, source: np.ndarray, windows: Windows, row: int, what: str) -> None:
    """Every pixel of ``got`` is the source value at its nearest source pixel (either one at a tie).

    Counts the tie-free pixels (one right answer) in ``TIE_FREE``, so a test can check they are most.
    """
    options = _candidates(source, windows, row)
    ok = np.zeros(got.shape, dtype=bool)
    for option in options:
        ok |= got == option
    exact = options[0] == options[3]  # pixels with no tie on either axis: one right answer
    TIE_FREE[0] += int(exact.sum())
    TIE_FREE[1] += exact.size
    assert ok.all(), (
        f"{what}: {int((~ok).sum())} pixels are not the source value at their place, e.g. {np.argwhere(~ok)[:3].tolist()}"
    )


def _loader(dataset, device, train: bool, **kwargs) -> DenseLoader:
    return DenseLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=OUT, eval_crop_fraction=0.75),  # [width, height]
        loader_cfg=LoaderConfig(batch_size=4, last_batch="partial"),
        device=device,
        seed=11,
        **kwargs,
    )


def _check_batch(
    loader, batch, windows: Windows | None = None, epoch: int = 0, map_scale: float = 1.0, jittered: bool = False
) -> int:
    """Assert every map pixel of ``batch`` exactly, and the RGB's geometry; return how many rows were flipped."""
    ids = batch.sample_ids.cpu().numpy()
    windows = windows or loader.crops(ids, epoch)
    for row, sample_id in enumerate(ids):
        rgb, depth, mask = render_pair(int(sample_id), WIDTH, HEIGHT, seed=3)
        if map_scale != 1.0:  # the maps on disk are the nearest-downscaled ones
            depth, mask = _downscaled(depth, map_scale), _downscaled(mask, map_scale)
        got_depth = batch.maps["depth"][row].cpu().numpy()
        got_mask = batch.maps["mask"][row].cpu().numpy()
        assert got_depth.shape == got_mask.shape == (OUT[1], OUT[0])
        _assert_nearest(got_depth, depth, windows, row, f"depth of sample {sample_id}")
        _assert_nearest(got_mask, mask, windows, row, f"mask of sample {sample_id}")
        # The RGB took the same window and flip: its red ramp (x) follows the same x positions.
        want_red = _expected(rgb[..., 0].astype(np.int64), windows, row)
        got_red = batch.images[row, 0].cpu().numpy().astype(np.int64)
        if jittered:  # brightness and contrast keep the ramp's direction (a wrong flip anticorrelates)
            assert np.corrcoef(got_red.ravel(), want_red.ravel())[0, 1] > 0.5, f"RGB of {sample_id} is off its window"
        else:
            assert np.median(np.abs(got_red - want_red)) <= 6, f"RGB of {sample_id} does not follow its window"
    return int(windows.flip.sum())


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_train_maps_follow_the_window_and_flip_exactly(pairs, device):
    TIE_FREE[:] = [0, 0]
    loader = _loader(PairedDataset.from_root(pairs), device, train=True)
    flips, seen = 0, []
    for epoch in range(2):
        for batch in loader:
            assert batch.images.shape == (len(batch), 3, OUT[1], OUT[0])
            assert str(batch.maps["depth"].dtype) == "torch.int32"  # 16-bit values, widened exactly
            flips += _check_batch(loader, batch, epoch=epoch)
            seen += batch.sample_ids.tolist()
    assert sorted(seen) == sorted(list(range(10)) * 2)
    assert TIE_FREE[0] > 0.75 * TIE_FREE[1], f"most pixels have one right answer: {TIE_FREE}"
    assert 0 < flips < 20  # both flipped and unflipped samples were checked


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_maps_are_centre_crops_exactly(pairs, device):
    loader = _loader(PairedDataset.from_root(pairs), device, train=False)
    batches = list(loader)
    assert [i for b in batches for i in b.sample_ids.tolist()] == list(range(10))
    for batch in batches:
        assert _check_batch(loader, batch) == 0


def _downscaled(values: np.ndarray, scale: float) -> np.ndarray:
    h, w = values.shape
    return np.asarray(Image.fromarray(values).resize((int(w * scale), int(h * scale)), Image.NEAREST))


def test_maps_of_another_size_are_refused_naming_both_files_or_scaled_when_asked(tmp_path):
    root = write_paired_split(tmp_path / "half", 4, WIDTH, HEIGHT, seed=3)
    for path in sorted((root / "depth").iterdir()) + sorted((root / "mask").iterdir()):
        Image.fromarray(_downscaled(np.asarray(Image.open(path)), 0.5)).save(path)
    strict = PairedDataset.from_root(root)
    assert sorted(strict.problems) == [0, 1, 2, 3]
    why = strict.problems[0]
    assert "size mismatch" in why and str(root / "depth" / "000000.png") in why and "48x36" in why
    assert str(root / "rgb" / "000000.jpg") in why and "96x72" in why and "data.scale_maps" in why
    with pytest.raises(DatasetError, match=r"000000\.jpg"):
        _loader(strict, _cpu(), train=False)
    loader = _loader(PairedDataset.from_root(root, scale_maps=True), _cpu(), train=True)
    for batch in loader:
        _check_batch(loader, batch, map_scale=0.5)


def test_colour_augmentation_never_touches_maps_and_its_flips_move_them(pairs):
    from gpufeed.pipelines import ColourJitter, LoaderAugment

    augment = LoaderAugment(jitter=ColourJitter(p=1.0, brightness=0.5, contrast=0.5), flip_p=0.5)
    loader = _loader(PairedDataset.from_root(pairs), _cpu(), train=True, augment=augment)
    for batch in loader:
        ids = batch.sample_ids.numpy()
        windows = loader.crops(ids, 0)
        toggles = augment.rows(11, 0, ids).flip.astype(windows.flip.dtype)  # as the feed toggles them
        windows = replace(windows, flip=windows.flip ^ toggles)
        _check_batch(loader, batch, windows, jittered=True)  # jitter on the RGB only: maps exact


def _cpu():
    return DeviceChoice("cpu", None, "test")


def test_linear_depth_is_the_bilinear_value_of_the_coordinates(pairs):
    # depth = 1 + y * W + x is linear in (x, y): bilinear resampling returns it at each output
    # pixel's centre, x = start + (i + 0.5) * window / out - 0.5 (pixel centres at k + 0.5), to rounding.
    loader = _loader(PairedDataset.from_root(pairs), _cpu(), train=False, depth_interp="linear")
    batch = next(iter(loader))
    windows = loader.crops(batch.sample_ids.numpy(), 0)
    for row in range(len(batch)):
        (x0, y0), (w, h) = windows.anchor[row], windows.shape[row]
        xs = x0 + (np.arange(OUT[0]) + 0.5) * w / OUT[0] - 0.5
        ys = y0 + (np.arange(OUT[1]) + 0.5) * h / OUT[1] - 0.5
        want = 1 + ys[:, None] * WIDTH + xs[None, :]
        # Away from the borders (clamped) and the no-data corner block, which blends with 0.
        inside = (ys[:, None] > NO_DATA_BLOCK_PX) & (xs[None, :] > 0.5) & (xs[None, :] < WIDTH - 1.5)
        inside &= ys[:, None] < HEIGHT - 1.5
        got = batch.maps["depth"][row].numpy()
        assert inside.sum() > 0.5 * inside.size
        np.testing.assert_allclose(got[inside], want[inside], atol=1.0)
        assert not np.array_equal(got, _expected(synth_depth(WIDTH, HEIGHT), windows, row))  # not nearest
