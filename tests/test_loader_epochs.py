"""One pipeline per loader for many epochs: builds counted, prefetch across epochs, honest failures.

Every loader builds its DALI pipeline once and streams plan batches epoch after epoch; these
tests count the builds (``pipeline_builds``) while checking that every epoch still holds exactly
the samples, crops and clips a freshly built loader gives for it, and that a failure no file
explains is a :class:`PipelineError` with DALI's own message, never bad data.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import zlib

import numpy as np
import pytest
import torch
from conftest import DEVICES
from PIL import Image
from videohelp import frame_tags

from gpufeed.config import ImagePipelineConfig, LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    BadSampleError,
    ClipLoader,
    ImageDataset,
    ImageLoader,
    PipelineError,
    PrepareOptions,
    VideoDataset,
    prepare_videos,
)
from gpufeed.pipelines._epochs import cuda_initialised
from gpufeed.pipelines._pipeline_session import _process_state
from gpufeed.synth import read_tag

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")


def _images(dataset, device, *, train=True, batch=8, last_batch="partial", seed=0, **kw):
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=40),
        loader_cfg=LoaderConfig(batch_size=batch, last_batch=last_batch, num_threads=2, **kw),
        device=device,
        seed=seed,
    )


def _clips(dataset, decoder, device, *, train=True, batch=4, fit="stretch", seed=0, **kw):
    kw.setdefault("last_batch", "partial")
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=11, stride_frames=2, size_px=32, fit=fit, decoder=decoder),
        loader_cfg=LoaderConfig(batch_size=batch, num_threads=2, **kw),
        device=device,
        seed=seed,
    )


def _epoch(loader):
    return [(b.sample_ids.cpu(), b.images.cpu(), b.valid.cpu()) for b in loader]


@pytest.fixture(scope="module")
def vp9_dir(synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vp9epochs") / "videos"
    report = prepare_videos(synth_dir / "videos", out, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    return out


# -- images ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("last_batch", ["partial", "pad", "drop"])
def test_image_loader_builds_one_pipeline_for_three_epochs(train_set, device, last_batch):
    loader = _images(train_set, device, batch=10, last_batch=last_batch, seed=3)
    epochs = []
    for epoch in range(3):
        loader.set_epoch(epoch)  # as the training loop does: the next epoch keeps the pipeline
        epochs.append(_epoch(loader))
    assert loader.pipeline_builds == 1
    n = len(train_set)
    for epoch, got in enumerate(epochs):
        fresh = _images(train_set, device, batch=10, last_batch=last_batch, seed=3)
        fresh.set_epoch(epoch)
        expected = _epoch(fresh)
        assert len(got) == len(expected) == len(loader)
        for (ids, px, valid), (ids_e, px_e, valid_e) in zip(got, expected, strict=True):
            # exact: the same batches on the same decoder and device, one pipeline or a fresh one
            assert torch.equal(ids, ids_e) and torch.equal(px, px_e) and torch.equal(valid, valid_e)
        sizes = [len(ids) for ids, _, _ in got]
        if last_batch == "partial":
            assert sizes == [10] * (n // 10) + [n % 10], "a short last batch is a short DALI batch"
        real = torch.cat([ids[valid] for ids, _, valid in got]).tolist()
        assert len(set(real)) == len(real) and (last_batch == "drop" or sorted(real) == list(range(n)))
    firsts = [got[0][0] for got in epochs]
    assert not torch.equal(firsts[0], firsts[1]) and not torch.equal(firsts[1], firsts[2]), "reshuffled every epoch"


def test_evaluation_pixels_are_exact_in_every_epoch(synth_dir):
    dataset = ImageDataset.from_list(synth_dir / "images" / "val.txt")
    loader = _images(dataset, CPU, train=False, batch=5)
    for _ in range(3):
        seen = []
        for batch in loader:
            for image, sample_id in zip(batch.images, batch.sample_ids.tolist(), strict=True):
                assert read_tag(image, "CHW").ident == sample_id
                seen.append(sample_id)
        assert seen == list(range(len(dataset)))
    assert loader.pipeline_builds == 1


def test_prefetch_crosses_the_epoch_boundary(train_set):
    loader = _images(train_set, CPU, batch=8, prefetch_queue_depth=2)
    batches = sum(1 for _ in loader)
    fed = loader._session.feed.iteration
    assert fed > batches, f"DALI was fed {fed} batches by the end of a {batches}-batch epoch: none of the next"
    first = next(iter(loader))
    expected = loader._spec().plan(1).sample_ids[:8]
    assert first.sample_ids.tolist() == expected.tolist() and loader.pipeline_builds == 1


def test_the_pipeline_is_rebuilt_only_when_the_position_jumps(train_set):
    straight = [ids for ids, _, _ in _epoch(_images(train_set, CPU, seed=9))]
    loader = _images(train_set, CPU, seed=9)
    got = []
    for i, batch in enumerate(loader):
        got.append(batch.sample_ids)
        if i == 2:
            break
    loader.load_state_dict(loader.state_dict())  # go on where it stopped: the same pipeline
    got += [b.sample_ids for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(got, straight, strict=True)) and loader.pipeline_builds == 1
    loader.load_state_dict({"epoch": 0, "batch": 1, "seed": 9})  # a jump back: rebuilt
    assert torch.equal(next(iter(loader)).sample_ids, straight[1]) and loader.pipeline_builds == 2
    assert len(loader.build_times_s) == 2 and all(t > 0 for t in loader.build_times_s), "every build timed"
    loader.set_epoch(5)  # not the next epoch: rebuilt
    list(loader)
    loader.set_epoch(6)  # the next one: kept
    list(loader)
    assert loader.pipeline_builds == 3 and loader.epoch == 7


def test_each_for_is_a_new_pass_as_a_dataloaders_is(train_set):
    """A ``for`` left part-way (a sanity-check ``break``) left the rest of its epoch to the next ``for``:
    a validation pass after it scored 21 of 25 images, and a training epoch after it was 4 batches."""
    evaluation = _images(train_set, CPU, train=False, seed=3)
    whole = [b.sample_ids for b in evaluation]
    for _ in evaluation:
        break
    again = [b.sample_ids for b in evaluation]
    assert len(again) == len(whole) and all(torch.equal(a, b) for a, b in zip(again, whole, strict=True))

    second = [b.sample_ids for b in _epoch_of(_images(train_set, CPU, seed=5), 1)]
    loader = _images(train_set, CPU, seed=5)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert loader.state_dict()["batch"] == 2, "the state still says where the left pass stood"
    got = [b.sample_ids for b in loader]  # epoch 1, whole
    assert loader.epoch == 2 and len(got) == len(second)
    assert all(torch.equal(a, b) for a, b in zip(got, second, strict=True))

    first = iter(loader)
    next(first)
    newer = iter(loader)
    next(newer)
    with pytest.raises(RuntimeError, match="ImageLoader: this iterator was left for a newer iter"):
        next(first)
    loader.close()


def test_a_resume_at_another_batch_size_reads_each_sample_of_the_epoch_once(train_set):
    """The state's batch index was read at the new size: 8 samples in, a resume at twice the size skipped 8."""
    whole = sorted(i for ids, _, _ in _epoch(_images(train_set, CPU, seed=6)) for i in ids.tolist())
    small = _images(train_set, CPU, batch=4, seed=6)
    batches = iter(small)
    read = [i for _ in range(3) for i in next(batches).sample_ids.tolist()]
    larger = _images(train_set, CPU, batch=8, seed=6)
    larger.load_state_dict(small.state_dict())
    read += [i for b in larger for i in b.sample_ids.tolist()]
    assert sorted(read) == whole and larger.epoch == 1
    assert [len(b) for b in larger] == [len(b) for b in _images(train_set, CPU, seed=6)], "the next epoch as usual"
    with pytest.raises(ValueError, match="loader state saved at batch size 4, this loader reads 8: give every rank"):
        ImageLoader(train_set, 8, size_px=40, device=CPU, seed=6, shard_id=0, num_shards=2).load_state_dict(
            {**small.state_dict(), "shard": [0, 2]}
        )


def test_a_finished_epoch_reads_as_the_next_ones_start(train_set):
    """A checkpoint written after an epoch's last step, before its iterator ends, resumes at the next epoch."""
    loader = _images(train_set, CPU, batch=16, seed=4)
    iterator = iter(loader)
    for _ in range(len(loader)):
        next(iterator)  # every batch taken; the loop has not asked for the end yet
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["batch"] == 0
    assert loader.batches_left(1) == 0, "a one-epoch run is over: no epoch more to go"
    assert loader.batches_left(2) == len(loader)
    second = [b.sample_ids for b in _epoch_of(_images(train_set, CPU, batch=16, seed=4), 1)]
    resumed = _images(train_set, CPU, batch=16, seed=4)
    resumed.load_state_dict({"epoch": 0, "batch": len(loader), "seed": 4})  # as older checkpoints hold it
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["batch"] == 0
    got = [b.sample_ids for b in resumed]
    assert len(got) == len(second) and all(torch.equal(a, b) for a, b in zip(got, second, strict=True))


def _epoch_of(loader, epoch):
    loader.set_epoch(epoch)
    return list(loader)


def _copy_split(synth_dir, tmp_path):
    root = tmp_path / "train"
    shutil.copytree(synth_dir / "images" / "train", root, ignore=shutil.ignore_patterns(".gpufeed"))
    return root


def test_a_skipped_bad_file_costs_one_rebuild(synth_dir, tmp_path):
    root = _copy_split(synth_dir, tmp_path)
    victim = sorted(root.rglob("*.png"))[5]
    data = bytearray(victim.read_bytes())
    # Damage the compressed pixels but keep the chunk's CRC right, so that the file passes the
    # dataset's scan and fails only when it is decoded (inside the pipeline).
    kind = data.index(b"IDAT")
    length = int.from_bytes(data[kind - 4 : kind], "big")
    start = kind + 8
    data[start : start + 40] = bytes(b ^ 0x5A for b in data[start : start + 40])
    end = kind + 4 + length
    data[end : end + 4] = zlib.crc32(bytes(data[kind:end])).to_bytes(4, "big")
    victim.write_bytes(bytes(data))
    dataset = ImageDataset.from_folder(root)
    bad = dataset.paths.index(str(victim))
    with pytest.raises(BadSampleError) as info:
        list(_images(dataset, CPU, train=False))
    assert [path for path, _ in info.value.problems] == [str(victim)], "only the bad file is named"
    loader = _images(dataset, CPU, on_bad_sample="skip")
    for epoch in range(3):
        loader.set_epoch(epoch)
        ids = [i for b in loader for i in b.sample_ids.tolist()]
        assert bad not in ids and (epoch == 0 or sorted(ids) == [i for i in range(len(dataset)) if i != bad])
    assert list(loader.skipped) == [bad] and loader.pipeline_builds == 2, "one rebuild, after the failure"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("policy", ["error", "skip"])
def test_a_crop_window_the_image_lacks_is_a_pipeline_error_not_bad_data(synth_dir, tmp_path, device, policy):
    root = _copy_split(synth_dir, tmp_path)
    dataset = ImageDataset.from_folder(root)
    # The index says one size, the file now decodes to another (as EXIF rotation or a replaced file
    # do): a perfectly good image whose crop window lies outside it.
    victim = max(range(len(dataset)), key=lambda i: int(dataset.sizes[i].prod()))
    Image.new("RGB", (24, 16), (200, 30, 30)).save(dataset.paths[victim])
    loader = _images(dataset, device, train=False, on_bad_sample=policy)
    with pytest.raises(PipelineError) as info:
        list(loader)
    error = info.value
    assert not isinstance(error, BadSampleError)
    assert "cropping window" in error.reason and "no longer valid" not in error.reason, error.reason
    assert "cropping window" in error.dali_message and "index" in error.cause
    assert dataset.paths[victim] in error.checked and "decode fine outside DALI" in str(error)
    assert loader.skipped == {} and loader.read_failures == {}, "skip cannot help, so nothing is skipped"


# -- clips --------------------------------------------------------------------------------------------
CLIP_CASES = [
    pytest.param(("h264", "pyav", "cpu"), id="h264-pyav-cpu"),
    pytest.param(("vp9", "dali", "cpu"), id="vp9-dali-cpu"),
    pytest.param(("h264", "dali", "gpu"), id="h264-nvdec-gpu", marks=pytest.mark.gpu),
]


def _exact_clips(batch, dataset, stride=2):
    clips = []
    for k in range(len(batch)):
        video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
        frames = start + np.arange(11) * stride
        assert frame_tags(batch.clips[k], "CTHW") == [(int(f), video) for f in frames], "exactly the named frames"
        expected = torch.as_tensor(dataset.labels[video][frames], dtype=torch.float32)
        # exact: labels read from the CSV, not pixels
        assert torch.equal(batch.frame_labels[k].cpu(), expected)
        clips.append((video, start))
    return clips


@pytest.mark.process
@pytest.mark.parametrize("case", CLIP_CASES)
@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
def test_clip_loader_builds_one_pipeline_for_three_epochs(synth_dir, vp9_dir, case, fit):
    codec, decoder, device = case
    dataset = VideoDataset.from_folder(vp9_dir if codec == "vp9" else synth_dir / "videos")
    loader = _clips(dataset, decoder, GPU if device == "gpu" else CPU, fit=fit, seed=2)
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        got = [c for batch in loader for c in _exact_clips(batch, dataset)]
        videos, starts = loader.epoch_clips(epoch)
        assert got == list(zip(videos.tolist(), starts.tolist(), strict=True)), "the planned clips, in order"
        assert len(got) % 4 != 0, "a short last batch is exercised"
        seen.append(got)
    assert seen[0] != seen[1] != seen[2], "each epoch draws new clips"
    assert loader.pipeline_builds == 1


@pytest.mark.process
def test_a_resumed_clip_loader_builds_once_and_continues_exactly(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    straight = _clips(dataset, "pyav", CPU, seed=5)
    reference = [c for _ in range(3) for b in straight for c in _exact_clips(b, dataset)]
    stopped = _clips(dataset, "pyav", CPU, seed=5)
    got = []
    for i, batch in enumerate(stopped):
        got += _exact_clips(batch, dataset)
        if i == 3:
            break
    resumed = _clips(dataset, "pyav", CPU, seed=5)
    resumed.load_state_dict(stopped.state_dict())
    got += [c for _ in range(3) for b in resumed for c in _exact_clips(b, dataset)][: len(reference) - len(got)]
    assert got == reference and resumed.pipeline_builds == 1 and resumed.epoch == 3


@pytest.mark.process
def test_spawned_pyav_workers_read_the_same_exact_clips(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    runs = {}
    for method in ("fork", "spawn"):
        loader = _clips(dataset, "pyav", CPU, seed=8, worker_start_method=method)
        runs[method] = [(c, b.clips.sum().item()) for _ in range(2) for b in loader for c in _exact_clips(b, dataset)]
        assert loader.pipeline_builds == 1
        loader.close()
    assert runs["fork"] == runs["spawn"]


@pytest.mark.process
def test_a_dead_pyav_worker_is_a_pipeline_error_not_bad_data(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    loader = _clips(dataset, "pyav", CPU, on_bad_sample="skip")
    iterator = iter(loader)
    next(iterator)
    pid = loader._session.worker_pids[0]
    os.kill(pid, signal.SIGKILL)  # what the out-of-memory killer does
    deadline = time.monotonic() + 30
    while _process_state(pid) not in (None, "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(PipelineError) as info:
        list(iterator)
    assert "worker" in info.value.reason and "died" in info.value.cause
    assert loader.skipped == {}, "no video is blamed"
    rest = [c for b in loader for c in _exact_clips(b, dataset)]  # a new pipeline finishes the epoch
    videos, starts = loader.epoch_clips(0)
    assert rest == list(zip(videos.tolist(), starts.tolist(), strict=True))[4:] and loader.pipeline_builds == 2


@pytest.mark.gpu
@pytest.mark.process  # PyAV decodes in DALI's worker processes
def test_pyav_clips_work_after_cuda_is_initialised(synth_dir):
    torch.zeros(1, device="cuda")  # as a model already on the GPU, or device: auto's probe, does
    assert cuda_initialised()
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    for device in (CPU, GPU):
        loader = _clips(dataset, "pyav", device, seed=1)
        for _ in range(2):
            clips = [c for b in loader for c in _exact_clips(b, dataset)]
            assert len(clips) == len(loader.table)
        assert loader.pipeline_builds == 1
        loader.close()
