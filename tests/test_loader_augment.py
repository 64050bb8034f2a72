"""Augmentation inside the loaders' DALI graph: held to the numpy reference, keyed like the crop windows.

Each loader test reads the same plan twice, with and without augmentation (same seed, so the same
crop windows and decoded pixels), and checks every augmented sample against
``reference_augment(plain sample, its parameters)`` within one grey level.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DEVICES

from gpufeed.config import ImagePipelineConfig, LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    ClipLoader,
    ColourJitter,
    ImageLoader,
    LoaderAugment,
    VideoDataset,
    reference_augment,
)
from gpufeed.pipelines._augment import colour_coefficients, colour_matrices
from gpufeed.pipelines._windows import hash_uniforms, train_windows

pytestmark = pytest.mark.timeout(300)

STRONG = LoaderAugment(
    jitter=ColourJitter(p=0.9, brightness=0.4, contrast=0.4, saturation=0.5, hue=0.1), grayscale_p=0.3
)


def _images(dataset, device, augment=None, *, batch=8, seed=3, flip=True, shuffle=True):
    return ImageLoader(
        dataset,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=40, flip=flip),
        loader_cfg=LoaderConfig(batch_size=batch, num_threads=2, last_batch="partial", shuffle=shuffle),
        device=device,
        seed=seed,
        augment=augment,
    )


def _by_id(loader) -> dict[int, np.ndarray]:
    """sample id -> HWC uint8 image, over one epoch."""
    out = {}
    for batch in loader:
        for image, sample_id in zip(batch.images.cpu(), batch.sample_ids.tolist(), strict=True):
            out[sample_id] = image.permute(1, 2, 0).numpy()
    return out


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_image_loader_colour_matches_the_numpy_reference(train_set, device):
    plain, augmented = _by_id(_images(train_set, device)), _by_id(_images(train_set, device, STRONG))
    assert plain.keys() == augmented.keys() and len(plain) == len(train_set)
    ids = np.array(sorted(plain))
    rows = STRONG.rows(3, 0, ids)
    changed = 0
    for k, sample_id in enumerate(ids):
        expected = reference_augment(plain[sample_id], rows.colour[k]).astype(int)
        got = augmented[sample_id].astype(int)
        assert np.abs(got - expected).max() <= 1, f"sample {sample_id}: DALI and the reference differ by > 1 level"
        changed += int(np.abs(got - plain[sample_id]).mean() > 2)
    assert changed > len(ids) // 2, "the jitter visibly changed most samples"
    gray = (np.diff(rows.colour[:, :, :3], axis=1) == 0).all(axis=(1, 2))
    assert 0 < gray.sum() < len(ids), "some rows, not all, drawn grayscale"
    for sample_id in ids[gray]:
        image = augmented[int(sample_id)].astype(int)
        assert np.abs(image - image[..., :1]).max() <= 1, "grayscale rows have R = G = B"


def test_loader_flip_toggles_the_crop_windows_flip(train_set):
    cpu = DeviceChoice("cpu", None, "test")
    plain = _by_id(_images(train_set, cpu, flip=False))
    flipped = _by_id(_images(train_set, cpu, LoaderAugment(flip_p=1.0), flip=False))
    for sample_id, image in plain.items():
        # The mirror is folded into the resize ROI; resampling the mirrored ROI may round differently.
        assert np.abs(flipped[sample_id][:, ::-1].astype(int) - image).max() <= 1
    both = _by_id(_images(train_set, cpu, LoaderAugment(flip_p=1.0), flip=True))
    ids = np.array(sorted(plain))
    window_flips = train_windows(train_set.sizes[ids], ids, 3, 0).flip
    for k, sample_id in enumerate(ids):  # two coins: mirrored when exactly one of them says so
        expected = plain[sample_id][:, ::-1] if not window_flips[k] else plain[sample_id]
        assert np.abs(both[sample_id].astype(int) - expected).max() <= 1


def test_parameters_are_a_pure_function_of_seed_epoch_and_sample():
    ids = np.arange(200)
    rows = STRONG.rows(5, 2, ids)
    rng = np.random.default_rng(0)
    for subset in (rng.permutation(ids), ids[::7], ids[150:]):
        again = STRONG.rows(5, 2, subset)
        assert np.array_equal(again.colour, rows.colour[subset]), "no dependence on order or batch composition"
    assert not np.array_equal(STRONG.rows(5, 3, ids).colour, rows.colour), "a new epoch, new parameters"
    assert not np.array_equal(STRONG.rows(6, 2, ids).colour, rows.colour), "a new seed, new parameters"
    with_flip = LoaderAugment(jitter=STRONG.jitter, grayscale_p=STRONG.grayscale_p, flip_p=0.5).rows(5, 2, ids)
    assert np.array_equal(with_flip.colour, rows.colour), "enabling one op never moves another op's draws"


def test_augmentation_draws_are_independent_of_the_window_draws():
    ids = np.arange(20000)
    windows = hash_uniforms(0, 0, ids, 41)
    augment = STRONG.uniforms(0, 0, ids)
    assert np.array_equal(hash_uniforms(0, 0, ids, 41, stream=0), windows), "stream 0 is the windows' stream"
    corr = np.corrcoef(np.concatenate([windows, augment], axis=1).T)[:41, 41:]
    assert np.abs(corr).max() < 0.04, "no window draw predicts an augmentation draw"
    assert np.abs(augment.mean(axis=0) - 0.5).max() < 0.01


def test_colour_formula_is_the_same_in_numpy_and_torch():
    u = np.random.default_rng(1).random((64, 8))
    ours = colour_coefficients(u, STRONG.jitter, STRONG.grayscale_p, np)
    theirs = colour_coefficients(torch.tensor(u), STRONG.jitter, STRONG.grayscale_p, torch).numpy()
    assert np.allclose(ours, theirs, atol=1e-12)
    identity = colour_matrices(colour_coefficients(u, ColourJitter(p=0.0), None, np))
    assert np.allclose(identity, np.concatenate([np.eye(3), np.zeros((3, 1))], axis=1), atol=1e-6)
    grey = np.full((1, 1, 3), 77, np.uint8)
    for matrix in colour_matrices(colour_coefficients(u, ColourJitter(p=1.0, brightness=0.0, contrast=0.0), 0.5, np)):
        assert np.array_equal(reference_augment(grey, matrix), grey), "saturation, hue, grayscale keep greys"


def test_image_loader_resumes_with_the_same_augmentation(train_set):
    cpu = DeviceChoice("cpu", None, "test")
    first = _images(train_set, cpu, STRONG, batch=5)
    iterator = iter(first)
    next(iterator)
    state = first.state_dict()
    expected = [b.images.clone() for b in iterator]
    resumed = _images(train_set, cpu, STRONG, batch=5)
    resumed.load_state_dict(state)
    got = [b.images for b in resumed]
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_batch_size_does_not_change_any_sample(train_set):
    cpu = DeviceChoice("cpu", None, "test")
    small = _by_id(_images(train_set, cpu, STRONG, batch=4, shuffle=True))
    large = _by_id(_images(train_set, cpu, STRONG, batch=7, shuffle=False))
    assert small.keys() == large.keys()
    assert all(np.array_equal(small[i], large[i]) for i in small), "the same crop and colour in any batch"


def test_every_epoch_gets_its_own_parameters_through_one_pipeline(train_set):
    cpu = DeviceChoice("cpu", None, "test")
    plain, augmented = _images(train_set, cpu, batch=6), _images(train_set, cpu, STRONG, batch=6)
    previous = None
    for epoch in (0, 1, 2):
        clean, jittered = _by_id(plain), _by_id(augmented)
        ids = np.array(sorted(clean))
        rows = STRONG.rows(3, epoch, ids)
        for k, sample_id in enumerate(ids):
            expected = reference_augment(clean[sample_id], rows.colour[k]).astype(int)
            assert np.abs(jittered[sample_id].astype(int) - expected).max() <= 1, f"epoch {epoch}, sample {sample_id}"
        assert previous is None or not np.array_equal(previous, rows.colour), "each epoch draws anew"
        previous = rows.colour
    assert augmented.pipeline_builds == 1, "the parameters flow through the pipeline built once"


CLIP_CASES = [
    pytest.param(("pyav", "cpu"), id="h264-pyav-cpu"),
    # DALI's reader gets each batch's rows sorted by (video, start): the parameters must follow them.
    pytest.param(("dali", "cpu"), id="vp9-dali-cpu"),
    pytest.param(("dali", "gpu"), id="h264-nvdec-gpu", marks=pytest.mark.gpu),
]


@pytest.mark.process
@pytest.mark.parametrize("case", CLIP_CASES)
def test_clip_loader_applies_one_colour_and_flip_to_every_frame(synth_dir, tmp_path, case):
    decoder, device_name = case
    device = DeviceChoice("gpu", 0, "test") if device_name == "gpu" else DeviceChoice("cpu", None, "test")
    folder = synth_dir / "videos"
    if decoder == "dali" and device_name == "cpu":  # DALI's CPU reader takes VP9, not h264
        from gpufeed.pipelines import PrepareOptions, prepare_videos

        folder = tmp_path / "vp9"
        assert prepare_videos(synth_dir / "videos", folder, PrepareOptions(codec="vp9", probe_clips=0), False).ok
    dataset = VideoDataset.from_folder(folder)
    augment = LoaderAugment(jitter=STRONG.jitter, grayscale_p=0.2, flip_p=0.5)

    def clips(aug):
        loader = ClipLoader(
            dataset,
            train=True,
            video_cfg=VideoConfig(clip_length_frames=5, size_px=32, decoder=decoder),
            loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial"),
            device=device,
            seed=7,
            augment=aug,
        )
        slots = loader._plan(0).sample_ids
        return slots, torch.cat([b.clips.cpu() for b in loader]).permute(0, 2, 3, 4, 1).numpy()  # N, T, H, W, 3

    slots, plain = clips(None)
    slots_again, augmented = clips(augment)
    # exact: sample ids
    assert np.array_equal(slots, slots_again) and plain.shape == augmented.shape
    rows = augment.rows(7, 0, slots)
    assert 0 < rows.flip.sum() < len(slots)
    for k in range(len(slots)):
        expected = reference_augment(plain[k], rows.colour[k], bool(rows.flip[k])).astype(int)
        assert np.abs(augmented[k].astype(int) - expected).max() <= 1, f"clip {k}: one matrix and flip per clip"
