"""The clip loader on real h264 and VP9 files: exact frames, labels, sampling, resume, bad videos.

Every frame carries (frame index, video id) in its pixels, so each test checks that clip ``k`` is
exactly frames ``s, s + stride, ...`` of the video it names. Paths: PyAV keyframe seeks for h264
on the CPU, DALI's own reader for VP9 on the CPU (the same reader NVDEC runs on a GPU), and DALI
on NVDEC for h264 (``gpu`` mark).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from videohelp import decode_all, frame_tags, write_odd_video

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import BadSampleError, ClipLoader, DatasetError, PrepareOptions, VideoDataset, prepare_videos
from gpufeed.pipelines._pyav import ClipDecoder, VideoRef

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

CASES = [
    pytest.param(("h264", "pyav", "cpu"), id="h264-pyav-cpu"),
    pytest.param(("vp9", "dali", "cpu"), id="vp9-dali-cpu"),
    pytest.param(("h264", "dali", "gpu"), id="h264-nvdec-gpu", marks=pytest.mark.gpu),
]


@pytest.fixture(scope="module")
def vp9_dir(synth_dir, tmp_path_factory):
    """The synth videos re-encoded to VP9 (what DALI's CPU decoder reads), keyframes every 30 frames."""
    out = tmp_path_factory.mktemp("vp9") / "videos"
    report = prepare_videos(synth_dir / "videos", out, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    return out


@pytest.fixture
def videos(request, synth_dir, vp9_dir):
    codec, decoder, device = request.param
    folder = vp9_dir if codec == "vp9" else synth_dir / "videos"
    choice = DeviceChoice("gpu", 0, "test") if device == "gpu" else DeviceChoice("cpu", None, "test")
    return VideoDataset.from_folder(folder), decoder, choice


def _loader(dataset, decoder, device, train, *, batch=4, stride=1, size=48, fit="stretch", seed=0, **loader_kw):
    loader_kw.setdefault("last_batch", "partial")
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=11, stride_frames=stride, size_px=size, fit=fit, decoder=decoder),
        loader_cfg=LoaderConfig(batch_size=batch, num_threads=2, **loader_kw),
        device=device,
        seed=seed,
    )


def _check_batch(batch, dataset, stride, size, device):
    n = len(batch)
    assert batch.clips.shape == (n, 3, 11, size, size) and batch.clips.dtype == torch.uint8
    assert batch.clips.is_contiguous(memory_format=torch.channels_last_3d), "DALI's FHWC as a permuted view"
    assert batch.clips.device.type == ("cuda" if device.is_gpu else "cpu")
    assert batch.frame_labels.shape == (n, 11, 4) and batch.frame_labels.dtype == torch.float32
    assert batch.behaviours == dataset.behaviours
    clips = []
    for k in range(n):
        video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
        frames = start + np.arange(11) * stride
        assert frames[-1] < dataset.infos[video].num_frames, "never past the end of the video"
        assert frame_tags(batch.clips[k], "CTHW") == [(int(f), video) for f in frames], "exactly the named frames"
        expected = torch.as_tensor(dataset.labels[video][frames], dtype=torch.float32)
        # exact: labels read from the CSV and ids, not pixels
        assert torch.equal(batch.frame_labels[k].cpu(), expected), "labels of exactly those frames"
        assert torch.equal(batch.centre_labels[k].cpu(), expected[5])
        clips.append((video, start))
    return clips


@pytest.mark.parametrize("videos", CASES, indirect=True)
@pytest.mark.parametrize("stride", [1, 2])
def test_evaluation_reads_every_clip_in_order_exactly(videos, stride):
    dataset, decoder, device = videos
    loader = _loader(dataset, decoder, device, train=False, stride=stride)
    seen = [c for batch in loader for c in _check_batch(batch, dataset, stride, 48, device)]
    expected = list(zip(loader.table.slot_video.tolist(), loader.table.slot_start.tolist(), strict=True))
    assert seen == expected and len(loader) == -(-len(expected) // 4)
    span = 10 * stride + 1
    for video, info in enumerate(dataset.infos):
        assert max(s for v, s in seen if v == video) == info.num_frames - span, "the last clip ends on the last frame"


@pytest.mark.parametrize("videos", CASES, indirect=True)
def test_training_reads_random_clips_exactly_and_repeatably(videos):
    dataset, decoder, device = videos
    loader = _loader(dataset, decoder, device, train=True, stride=2, seed=7, last_batch="drop")
    first = [c for batch in loader for c in _check_batch(batch, dataset, 2, 48, device)]
    second = [c for batch in loader for c in _check_batch(batch, dataset, 2, 48, device)]
    assert len(first) == len(second) == len(loader.table) // 4 * 4
    assert first != second, "each epoch draws new clips"
    assert len({v for v, _ in first}) == len(dataset), "clips come from every video"
    again = _loader(dataset, decoder, device, train=True, stride=2, seed=7, last_batch="drop")
    assert [c for batch in again for c in _check_batch(batch, dataset, 2, 48, device)] == first


def test_videos_without_labels_give_clips_with_no_label_columns(synth_dir):
    # A folder indexed without its label files (a benchmark's or a user's own videos) is still
    # read: its batches carry K = 0 label columns instead of failing on the first batch.
    dataset = VideoDataset.from_folder(synth_dir / "videos", require_labels=False)
    assert dataset.behaviours == () and all(rows is None for rows in dataset.labels)
    loader = _loader(dataset, "pyav", DeviceChoice("cpu", None, "test"), train=False, batch=4)
    batch = next(iter(loader))
    loader.close()
    n = len(batch)
    assert batch.frame_labels.shape == (n, 11, 0) and batch.centre_labels.shape == (n, 0)
    for k in range(n):
        video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
        assert frame_tags(batch.clips[k], "CTHW") == [(start + i, video) for i in range(11)]


def test_epoch_clips_tells_what_an_epoch_will_read(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    loader = _loader(dataset, "pyav", DeviceChoice("cpu", None, "test"), train=True, seed=4, last_batch="pad", batch=8)
    videos, starts = loader.epoch_clips(1)
    loader.set_epoch(1)
    got = [(int(v), int(s)) for b in loader for v, s in zip(b.video_ids, b.start_frames, strict=True)]
    assert got == list(zip(videos.tolist(), starts.tolist(), strict=True))
    assert len(got) % 8 == 0 and loader.epoch == 2


def test_every_decoder_reads_the_same_clips_and_pixels(vp9_dir):
    dataset = VideoDataset.from_folder(vp9_dir)
    cpu = DeviceChoice("cpu", None, "test")
    runs = {}
    for decoder in ("dali", "pyav"):
        loader = _loader(dataset, decoder, cpu, train=True, seed=11, size=40)
        assert loader.source == decoder
        batches = list(loader)
        runs[decoder] = (
            torch.cat([b.video_ids for b in batches]),
            torch.cat([b.start_frames for b in batches]),
            torch.cat([b.clips for b in batches]).float(),
        )
    assert torch.equal(runs["dali"][0], runs["pyav"][0]) and torch.equal(runs["dali"][1], runs["pyav"][1])
    # Same frames and fit; DALI resizes with an antialiased linear filter, PyAV with swscale area.
    diff = (runs["dali"][2] - runs["pyav"][2]).abs()
    assert diff.mean() < 2.0


@pytest.mark.gpu
def test_nvdec_reads_the_same_clips_as_the_cpu_path(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    runs = {}
    for name, device, decoder in (
        ("nvdec", DeviceChoice("gpu", 0, "test"), "dali"),
        ("cpu", DeviceChoice("cpu", None, "test"), "pyav"),
    ):
        loader = _loader(dataset, decoder, device, train=True, seed=3, size=40)
        batches = list(loader)
        runs[name] = (
            torch.cat([torch.stack([b.video_ids.cpu(), b.start_frames.cpu()], 1) for b in batches]),
            torch.cat([b.clips.cpu() for b in batches]).float(),
        )
    # exact: video ids and start frames
    assert torch.equal(runs["nvdec"][0], runs["cpu"][0]), "the same clips, whichever decoder"
    assert (runs["nvdec"][1] - runs["cpu"][1]).abs().mean() < 3.0


def test_centre_crop_resizes_the_central_square(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    cpu = DeviceChoice("cpu", None, "test")
    batch = next(iter(_loader(dataset, "pyav", cpu, train=False, size=32, fit="centre_crop")))
    from PIL import Image

    reference = decode_all(dataset.paths[0])
    for t in range(11):
        square = Image.fromarray(reference[t][:, 16:80]).resize((32, 32), Image.BILINEAR)
        got = batch.clips[0, :, t].permute(1, 2, 0).numpy().astype(np.float32)
        assert np.abs(got - np.asarray(square, dtype=np.float32)).mean() < 3.0


def test_resume_mid_epoch_continues_exactly(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    cpu = DeviceChoice("cpu", None, "test")

    def clips(batches):
        return [(b.video_ids.tolist(), b.start_frames.tolist(), b.clips.sum().item()) for b in batches]

    straight = _loader(dataset, "pyav", cpu, train=True, seed=5)
    reference = clips(list(straight)) + clips(list(straight))
    stopped = _loader(dataset, "pyav", cpu, train=True, seed=5)
    got = []
    for i, batch in enumerate(stopped):
        got += clips([batch])
        if i == 2:
            break
    state = stopped.state_dict()
    assert state["epoch"] == 0 and state["batch"] == 3
    resumed = _loader(dataset, "pyav", cpu, train=True, seed=5)
    resumed.load_state_dict(state)
    got += clips(list(resumed)) + clips(list(resumed))
    assert got == reference


def test_two_shards_split_the_clips(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    cpu = DeviceChoice("cpu", None, "test")
    shards = []
    for k in range(2):
        loader = ClipLoader(
            dataset,
            train=False,
            video_cfg=VideoConfig(size_px=32, decoder="pyav"),
            loader_cfg=LoaderConfig(batch_size=4, num_threads=1),
            device=cpu,
            shard_id=k,
            num_shards=2,
        )
        shards.append([(int(v), int(s)) for b in loader for v, s in zip(b.video_ids, b.start_frames, strict=True)])
    assert not set(shards[0]) & set(shards[1])
    assert len(shards[0]) + len(shards[1]) == len(loader.table)


def test_keyframe_seeks_return_the_frames_of_a_decode_from_the_start(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    info = dataset.infos[0]
    reference = decode_all(info.path)
    decoder = ClipDecoder()
    rng = np.random.default_rng(0)
    starts = [*rng.integers(0, info.num_frames - 21, 25).tolist(), 0, info.num_frames - 21, 29, 30, 31]
    for start in starts:
        frames = start + np.arange(11) * 2
        before = decoder.frames_decoded
        clip = decoder.read(VideoRef.from_info(info), frames)
        assert all(np.array_equal(clip[t], reference[f]) for t, f in enumerate(frames)), f"clip at {start}"
        # It seeks: at most one GOP before the clip is decoded, never the video from its start.
        assert decoder.frames_decoded - before <= 30 + 21
    assert decoder.frames_decoded < len(starts) * info.num_frames / 3


def _damaged_copy(synth_dir, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(synth_dir / "videos", folder, ignore=shutil.ignore_patterns(".gpufeed"))
    victim = folder / "clip_001.mp4"
    data = bytearray(victim.read_bytes())
    start = data.index(b"mdat") + 3000
    data[start : start + 400] = bytes(b ^ 0x5A for b in data[start : start + 400])  # index intact, bitstream not
    victim.write_bytes(bytes(data))
    return folder, victim


def test_a_corrupt_video_is_named_or_skipped(synth_dir, tmp_path):
    folder, victim = _damaged_copy(synth_dir, tmp_path)
    dataset = VideoDataset.from_folder(folder)
    assert not dataset.problems, "the index cannot see bitstream damage"
    cpu = DeviceChoice("cpu", None, "test")
    with pytest.raises(BadSampleError) as info:
        for _ in _loader(dataset, "pyav", cpu, train=False):
            pass
    assert info.value.problems[0][0] == str(victim) and "cannot decode" in info.value.problems[0][1]
    loader = _loader(dataset, "pyav", cpu, train=False, on_bad_sample="skip")
    videos = {int(v) for batch in loader for v in batch.video_ids}
    assert 1 in loader.skipped and "cannot decode" in loader.skipped[1]
    assert videos == {0, 2} or videos == {0, 1, 2}, "clips decoded before the failure may remain"
    assert {int(v) for batch in loader for v in batch.video_ids} == {0, 2}, "the next epoch leaves it out"


def test_truncated_and_too_short_videos_are_refused_before_reading(synth_dir, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(synth_dir / "videos", folder, ignore=shutil.ignore_patterns(".gpufeed"))
    victim = folder / "clip_002.mp4"
    victim.write_bytes(victim.read_bytes()[:-2000])
    write_odd_video(folder / "clip_003.mp4", 3, 8)
    dataset = VideoDataset.from_folder(folder)
    cpu = DeviceChoice("cpu", None, "test")
    with pytest.raises(DatasetError) as info:
        _loader(dataset, "pyav", cpu, train=True)
    message = str(info.value)
    assert f"{victim}: truncated" in message and "clip_003.mp4: too short: 8 frames" in message
    loader = _loader(dataset, "pyav", cpu, train=False, on_bad_sample="skip")
    assert {int(v) for batch in loader for v in batch.video_ids} == {0, 1}


def test_the_reader_list_opens_each_file_once_per_batch_and_tags_the_plan_row(vp9_dir, tmp_path):
    """DALI's reader reopens a file whenever a row changes file: rows are sorted per batch, tags keep plan rows."""
    from gpufeed.pipelines._clip_pipeline import write_stream_list
    from gpufeed.pipelines._clip_plan import ClipDraw, ClipPlan
    from gpufeed.pipelines._sampler import PlanStream

    dataset = VideoDataset.from_folder(vp9_dir)
    loader = _loader(dataset, "dali", DeviceChoice("cpu", None, "test"), train=True, seed=5, batch=8)
    stream = PlanStream(loader._spec(), 0, 0, plan_ahead=True)
    plan = ClipPlan(stream, ClipDraw(loader.table, train=True, seed=5), batch_size=8)
    list_file, iterations, _, _, _ = write_stream_list(tmp_path, list(dataset.paths), plan)
    lines = [line.split() for line in list_file.read_text().splitlines()]
    assert len(lines) == iterations * 8
    switches = {"list": 0, "plan": 0}
    for k in range(iterations):
        videos, starts = plan(k)
        rows = lines[k * 8 : (k + 1) * 8]
        keys = [(dataset.paths.index(path), int(start)) for path, _, start, _ in rows]
        assert keys == sorted(keys), "by (video, start) within the batch"
        for path, tag, start, _ in rows:  # the tag names the plan row the line is
            j = int(tag) - k * 8
            assert (dataset.paths[videos[j]], int(starts[j])) == (path, int(start))
        assert sorted(int(tag) for _, tag, _, _ in rows) == list(range(k * 8, k * 8 + 8))
        switches["list"] += len({v for v, _ in keys})
        switches["plan"] += 1 + int(np.sum(videos[1:] != videos[:-1]))
    assert switches["list"] < switches["plan"], switches
