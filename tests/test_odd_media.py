"""The odd-media corpus (tests/oddmedia.py) through check, the image loader, the video index and training."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import DEVICES
from oddmedia import reference_rgb, write_video_corpus
from PIL import Image
from videohelp import frame_tags

from gpufeed.config import ImagePipelineConfig, LoaderConfig, parse_config
from gpufeed.pipelines import ImageDataset, ImageLoader, check_path, read_image_facts
from gpufeed.pipelines import _image_verify as verify
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._windows import eval_windows, train_windows
from gpufeed.synth import read_tag

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def corpus(odd_images):
    root, images = odd_images  # the session's images (conftest.py); the videos beside them are this module's
    videos = write_video_corpus(root / "videos")
    return root, images, videos


def _good(images):
    return [image for image in images if image.bad is None]


def _bad(images):
    return [image for image in images if image.bad is not None]


# -- check ----------------------------------------------------------------------------------------


def test_check_passes_every_good_image_and_names_every_bad_one(corpus, monkeypatch):
    root, images, _ = corpus
    decoded = []
    for name in ("_decode_jpeg", "_decode_png"):
        real = getattr(verify, name)
        monkeypatch.setattr(verify, name, lambda data, real=real: (decoded.append(data), real(data))[1])

    good = check_path(root / "images" / "good", progress=False)
    assert good.ok and good.findings == [], good.table()
    assert good.checked == len(_good(images))

    bad = check_path(root / "images" / "bad", progress=False)
    found = {f.path: f for f in bad.findings}
    for image in _bad(images):
        assert str(image.path) in found, f"{image.path.name} not reported"
        finding = found[str(image.path)]
        assert finding.kind == "image" and image.bad in finding.reason, (image.path.name, finding.reason)
    assert bad.bad_paths() == sorted(str(image.path) for image in _bad(images))
    # Bombs were refused by their headers: nothing over the limit reached a decoder.
    assert max(read_image_facts(data).pixels for data in decoded) <= DEFAULT_MAX_IMAGE_PIXELS


def test_only_a_strict_decode_finds_the_files_cut_behind_a_new_end_marker(corpus):
    root, images, _ = corpus
    index = ImageDataset.from_folder(root / "images" / "bad")
    for image in _bad(images):
        sample_id = index.paths.index(str(image.path))
        assert (sample_id in index.problems) != image.decode_only, image.path.name


@pytest.mark.process
def test_check_command_exit_status_and_report(corpus, tmp_path):
    root, images, _ = corpus
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "check", str(root / "images" / "good"), str(root / "videos" / "good")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 problem(s), 1 warning(s)" in proc.stdout
    assert "[decoder]" in proc.stdout and "b_odd_444.mp4: on a GPU decodes with PyAV" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "check", str(root / "images" / "bad"), "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(report.read_text())
    assert sorted(f["path"] for f in data["findings"]) == sorted(str(image.path) for image in _bad(images))


# -- the image loader -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("train", [False, True])
def test_loader_decodes_every_good_odd_image_like_pil(corpus, device, train):
    """CMYK, 16-bit, palette, grey+alpha, interlaced, EXIF, 1x1, 4000x3000, trailing bytes: as PIL shows them."""
    root, images, _ = corpus
    dataset = ImageDataset.from_folder(root / "images" / "good")
    assert not dataset.problems
    size = 48
    loader = ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=size),
        loader_cfg=LoaderConfig(batch_size=6, last_batch="partial", num_threads=2),
        device=device,
        seed=3,
    )
    errors, seen = {}, []
    for batch in loader:
        ids = batch.sample_ids.cpu().numpy()
        if train:
            windows = train_windows(dataset.sizes[ids], ids, 3, 0)
        else:
            windows = eval_windows(dataset.sizes[ids], ImagePipelineConfig().eval_crop_fraction)
        for k, sample_id in enumerate(ids):
            (x, y), (w, h) = windows.anchor[k], windows.shape[k]
            crop = Image.fromarray(reference_rgb(dataset.paths[sample_id])).crop((x, y, x + w, y + h))
            crop = crop.resize((size, size), Image.BILINEAR)
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT) if windows.flip[k] else crop
            got = batch.images[k].permute(1, 2, 0).cpu().numpy().astype(np.float32)
            errors[dataset.paths[sample_id].rsplit("/", 1)[-1]] = float(np.abs(got - np.asarray(crop)).mean())
            if not train and images[sample_id].ident is not None:
                assert read_tag(batch.images[k], "CHW").ident == sample_id == images[sample_id].ident
            seen.append(int(sample_id))
    assert sorted(seen) == list(range(len(dataset))), "every good image, nothing skipped"
    assert loader.skipped == {}
    # Mean levels off PIL after the crop and resize. On the CPU the decoder is PIL's own
    # (libjpeg-turbo), so only the resize differs. nvJPEG and the hardware JPEG decoder have
    # their own IDCT and chroma upsampling: an H100 gave up to 2.0 on these JPEGs, and libjpeg's
    # own fast IDCT with plain upsampling gives up to 3.2 here. A wrong orientation or channel
    # order gives 30 or more on every image that shows one.
    gpu_jpeg = device.kind == "gpu"
    worst = {n: e for n, e in errors.items() if e >= (4.0 if gpu_jpeg and n.endswith(".jpg") else 1.5)}
    assert not worst, (worst, errors)


# -- videos ---------------------------------------------------------------------------------------


def test_video_check_verdicts(corpus):
    root, _, videos = corpus
    good = check_path(root / "videos" / "good", progress=False)
    assert good.ok, good.table()
    warnings = {f.path: f.reason for f in good.findings if f.kind == "warning"}
    assert set(warnings) == {str(v.path) for v in videos if v.verdict == "warning"}
    for video in videos:
        if video.verdict == "warning":
            assert video.words in warnings[str(video.path)]
    # NVDEC cannot take h264 4:4:4 (High 4:4:4 Predictive), nor the 95x63 VP9 and 96x64 hevc videos, smaller
    # than its smallest frame for those codecs (128x128, 144x144): PyAV decodes them on a GPU.
    decoders = {f.path: f.reason for f in good.findings if f.kind == "decoder"}
    refused = {v.path.name.split("_", 1)[0]: v for v in videos if v.path.name.startswith(("b_", "c_", "f_"))}
    assert "PyAV, not NVDEC" in decoders[str(refused["b"].path)] and "High 4:4:4" in decoders[str(refused["b"].path)]
    assert "smaller than NVDEC's 128x128 for vp9" in decoders[str(refused["c"].path)]
    assert "smaller than NVDEC's 144x144 for hevc" in decoders[str(refused["f"].path)]
    folder = str(refused["b"].path.parent)
    shown = [v for v in videos if v.verdict != "bad"]
    assert f"on a GPU {len(shown) - 3} of {len(shown)} video(s) decode on NVDEC" in decoders[folder]
    assert set(decoders) == {*(str(v.path) for v in refused.values()), folder}
    assert {f.kind for f in good.findings} <= {"warning", "decoder"}

    bad = check_path(root / "videos" / "bad", progress=False)
    found = {f.path: f.reason for f in bad.findings if f.kind == "video"}
    for video in videos:
        if video.verdict == "bad":
            assert video.words in found.get(str(video.path), ""), (video.path.name, found)
    assert bad.bad_paths() == sorted(str(v.path) for v in videos if v.verdict == "bad")


# -- training -------------------------------------------------------------------------------------


class _BatchSpy:
    """Wraps the real training step: reads every batch's tags before the step runs on it."""

    def __init__(self, monkeypatch) -> None:
        from gpufeed.train._step import Stepper

        self.batches = []
        real = Stepper.launch  # what the training loop calls (it reads the outcome a step later)

        def spying(stepper, batch):
            self.batches.append(batch)
            return real(stepper, batch)

        monkeypatch.setattr(Stepper, "launch", spying)


@pytest.mark.process
def test_train_runs_on_the_good_odd_images_with_exact_samples(corpus, tmp_path, monkeypatch):
    from gpufeed.train import train

    root, images, _ = corpus
    good = root / "images" / "good"
    spy = _BatchSpy(monkeypatch)
    cfg = parse_config(
        {
            "device": "cpu",
            "data": {"train": {"root": str(good)}},
            # Whole images (area 1, the aspect ratio falls back to the full frame), unflipped: every
            # training crop still shows its tag.
            "image": {"size_px": 32, "crop_area": [1.0, 1.0], "flip": False},
            # The spy sees the loader's output, where the default colour jitter has already run.
            "augment": {"ops": []},
            "loader": {"batch_size": 5, "num_threads": 2, "last_batch": "partial"},
            "model": {"name": "smallcnn"},
            "train": {"epochs": 1, "lr": 0.01, "warmup_steps": 1, "progress": False},
            "telemetry": {"metrics_port": 0, "record_sample_ids": True},
        }
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == -(-len(_good(images)) // 5) and result.skipped == {}
    seen = []
    for batch in spy.batches:
        for image, sample_id in zip(batch.images, batch.sample_ids.tolist(), strict=True):
            if images[sample_id].ident is not None:
                assert read_tag(image, "CHW").ident == sample_id
            seen.append(sample_id)
    assert sorted(seen) == list(range(len(_good(images))))


@pytest.mark.process
def test_train_runs_on_the_good_odd_videos_with_exact_frames(corpus, tmp_path, monkeypatch):
    """B-frame h264, odd-size 4:4:4 h264 and VP9, a 600-frame GOP, Matroska, HEVC and VFR, through PyAV."""
    from gpufeed.train import train

    root, _, videos = corpus
    spy = _BatchSpy(monkeypatch)
    folder = str(root / "videos" / "good")
    cfg = parse_config(
        {
            "device": "cpu",
            "video": {"train": folder, "size_px": 32, "clip_length_frames": 5, "decoder": "auto"},
            "augment": {"ops": []},  # as above: the tags are read from the loader's output
            "loader": {"batch_size": 8, "num_threads": 2, "last_batch": "partial"},
            "model": {"name": "r3d_small"},
            "train": {"epochs": 1, "max_steps": 4, "lr": 0.01, "warmup_steps": 1, "progress": False},
            "telemetry": {"metrics_port": 0},
        }
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == 4 and result.skipped == {}
    clips = 0
    for batch in spy.batches:
        for clip, video_id, start in zip(
            batch.clips, batch.video_ids.tolist(), batch.start_frames.tolist(), strict=True
        ):
            assert frame_tags(clip, "CTHW") == [(start + t, video_id) for t in range(5)]
            clips += 1
    assert clips == 32
    touched = {int(v) for batch in spy.batches for v in batch.video_ids.tolist()}
    assert len(touched) >= 4, touched
    assert torch.is_tensor(spy.batches[0].clips)
    assert len({v.video_id for v in videos if v.video_id is not None}) == 7


@pytest.mark.process
def test_every_clip_of_every_good_odd_video_decodes_exactly_on_the_cpu(corpus):
    """Evaluation reads every clip slot: HEVC and B-frame h264 included, through the PyAV path."""
    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ClipLoader, VideoDataset

    root, _, videos = corpus
    cfg = parse_config(
        {
            "video": {"val": str(root / "videos" / "good"), "size_px": 32, "clip_length_frames": 11},
            "loader": {"batch_size": 8, "num_threads": 2},
        }
    )
    dataset = VideoDataset.from_folder(cfg.video.val)
    loader = ClipLoader(
        dataset, train=False, video_cfg=cfg.video, loader_cfg=cfg.loader, device=DeviceChoice("cpu", None, "test")
    )
    assert loader.source == "pyav" and {"h264", "hevc", "vp9"} <= loader.dataset.codecs
    per_video: dict[int, int] = {}
    for batch in loader:
        for clip, video_id, start in zip(
            batch.clips, batch.video_ids.tolist(), batch.start_frames.tolist(), strict=True
        ):
            assert frame_tags(clip, "CTHW") == [(start + t, video_id) for t in range(11)]
            per_video[video_id] = per_video.get(video_id, 0) + 1
    assert sorted(per_video) == sorted(v.video_id for v in videos if v.video_id is not None)
    assert sum(per_video.values()) == len(loader.table) and loader.skipped == {}


def test_bombs_are_bad_files_for_the_loader_and_the_limit_is_the_config_key(corpus, tmp_path):
    import shutil

    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import DatasetError
    from gpufeed.train._data import build_data
    from gpufeed.train._distributed import DistInfo

    _, images, _ = corpus
    folder = tmp_path / "photos" / "amber"
    folder.mkdir(parents=True)
    good = [image.path for image in _good(images) if image.path.suffix == ".jpg"][:4]
    bombs = [image.path for image in _bad(images) if "bomb" in image.path.name]
    for path in good + bombs:
        shutil.copy(path, folder / path.name)
    dataset = ImageDataset.from_folder(folder.parent)
    cpu = DeviceChoice("cpu", None, "test")

    def loader(policy):
        return ImageLoader(
            dataset,
            train=True,
            image_cfg=ImagePipelineConfig(size_px=32),
            loader_cfg=LoaderConfig(batch_size=2, num_threads=2, on_bad_sample=policy),
            device=cpu,
        )

    with pytest.raises(DatasetError) as info:
        loader("error")
    for bomb in bombs:
        assert f"{folder / bomb.name}: too many pixels" in str(info.value)
    skipping = loader("skip")
    assert sorted(skipping.skipped) == sorted(dataset.paths.index(str(folder / b.name)) for b in bombs)
    assert sorted(i for batch in skipping for i in batch.sample_ids.tolist()) == [
        i for i in range(len(dataset)) if i not in skipping.skipped
    ]
    # data.max_image_pixels reaches the index that training builds: below the photos' size, they are refused too.
    cfg = parse_config({"data": {"train": {"root": str(folder.parent)}, "max_image_pixels": 5000}})
    with pytest.raises(DatasetError, match=r"too many pixels.*\(data.max_image_pixels\)"):
        build_data(cfg, "image", cpu, DistInfo())


@pytest.mark.process
def test_a_variable_frame_rate_is_one_warning_for_loaders_sharing_the_videos(corpus, caplog, monkeypatch):
    """A train and a val loader over one folder said it twice."""
    import logging

    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ClipLoader, VideoDataset, _once

    monkeypatch.setattr(_once, "_said", set())  # other tests' loaders read these videos too
    root, _, _ = corpus
    cfg = parse_config({"video": {"val": str(root / "videos" / "good"), "size_px": 32, "clip_length_frames": 11}})
    dataset = VideoDataset.from_folder(cfg.video.val)
    caplog.set_level(logging.WARNING, logger="gpufeed")
    for train in (True, False):
        ClipLoader(dataset, train=train, video_cfg=cfg.video, device=DeviceChoice("cpu", None, "test")).close()
    said = [r.getMessage() for r in caplog.records if "variable frame rate" in r.getMessage()]
    assert len(said) == 1 and "g_vfr.mp4" in said[0], said
