"""``gpufeed bench clips`` with its real readers: fair rounds, the user's own data, torchcodec where it runs.

torchcodec's registry wheel needs the CUDA build of torch, which the test venv does not have: its
test skips there with the reason and runs in the peers' venv (``make peers``; ``.venv-peers/bin/python
-m pytest tests/test_bench_clips.py``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import time

import pytest
from conftest import DEVICES

from gpufeed.bench._clip_readers import gpufeed_reader, unavailable_reason
from gpufeed.bench._clip_rounds import child_pids, cpu_seconds, timed_round
from gpufeed.bench._clip_sets import BenchSet, SetSpec
from gpufeed.bench._clip_videos import make_bench_videos
from gpufeed.bench.clips import run_clip_bench
from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, VideoDataset

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

CPU = DeviceChoice("cpu", None, "test")
SMALL = {"clip_length": 5, "clips": 16, "naive_clips": 4, "verify_clips": 8, "rounds": 1, "batch_size": 4, "workers": 2}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    # 256 px, as the bench makes them: on smaller frames h264 blurs the tag squares past reading.
    return make_bench_videos(tmp_path_factory.mktemp("clips"), count=2, seconds=4, fps=30, size=256, gop=60, seed=0)


def test_a_gpufeed_round_leaves_no_worker_decoding_behind(videos):
    """Its workers would keep filling the prefetch queue during the next reader's round: they are gone."""
    spec = SetSpec("long_gop", VideoDataset.from_folder(videos), True)
    bench_set = BenchSet(spec, clip_length=5, stride=1, size=64, batch_size=4, workers=2, seed=0, device=CPU)
    before = child_pids()
    for epoch in range(2):
        times, _ = timed_round(lambda e=epoch: gpufeed_reader(bench_set.loader, e), 24)
        assert times.clips == 24 and child_pids() <= before, "no process the round started is left"
    assert bench_set.loader.pipeline_builds == 2, "each round starts its own pipeline: start-up is in every round"


def test_the_decoder_asked_for_reaches_the_loader(videos):
    """``bench clips --decoder``: gpufeed's video.decoder for the video sets (PyAV against NVDEC on a GPU)."""
    spec = SetSpec("long_gop", VideoDataset.from_folder(videos), True)
    args = {"clip_length": 5, "stride": 1, "size": 64, "batch_size": 4, "workers": 2, "seed": 0, "device": CPU}
    assert BenchSet(spec, decoder="pyav", **args).loader.source == "pyav"
    with pytest.raises(DatasetError, match="dali cannot decode h264 without a GPU"):
        BenchSet(spec, decoder="dali", **args)


def test_dalis_reader_lists_what_a_round_reads_not_whole_epochs(videos, tmp_path):
    """Each round builds its reader anew; DALI makes a frame decoder per list line while it builds (an
    NVDEC session, ~8 ms each, on an H100), so a list of whole epochs timed the build, not the reading."""
    from gpufeed.pipelines import PrepareOptions, prepare_videos

    report = prepare_videos(videos, tmp_path, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    spec = SetSpec("long_gop", VideoDataset.from_folder(tmp_path), True)
    args = {"clip_length": 5, "stride": 1, "size": 64, "batch_size": 4, "workers": 2, "seed": 0, "device": CPU}
    lines = {}
    for round_clips in (0, 16):
        bench_set = BenchSet(spec, decoder="dali", round_clips=round_clips, **args)
        times, _ = timed_round(lambda b=bench_set: gpufeed_reader(b.loader, 0), 16)
        assert times.clips == 16 and bench_set.loader.source == "dali"
        (build,) = bench_set.loader.reader_builds
        lines[round_clips] = build.lines
    assert lines[16] <= 16 + (2 + 2) * 4 < lines[0], lines


def test_a_round_whose_workers_are_spawned_ends(videos, monkeypatch, caplog):
    """On a GPU the workers are spawned, which starts multiprocessing's resource tracker for good.

    The tracker is this process's child until it exits; a round that waited for it failed every
    GPU run of ``bench clips`` ("still run 60 s after it was closed", first seen on an H100).
    """
    from multiprocessing import resource_tracker

    from gpufeed.pipelines import _cores

    monkeypatch.setattr(_cores, "cuda_initialised", lambda: True)  # what makes a GPU run spawn
    caplog.set_level(logging.INFO, logger="gpufeed")
    spec = SetSpec("long_gop", VideoDataset.from_folder(videos), True)
    bench_set = BenchSet(spec, clip_length=5, stride=1, size=64, batch_size=4, workers=2, seed=0, device=CPU)
    before = child_pids()
    times, _ = timed_round(lambda: gpufeed_reader(bench_set.loader, 0), 8)
    tracker = resource_tracker._resource_tracker._pid  # test-only look at the standard library's helper
    assert times.clips >= 8 and child_pids() <= before
    assert "worker process(es) with spawn" in caplog.text, "the patch reached the start method's choice"
    assert tracker is not None and os.path.exists(f"/proc/{tracker}"), "the spawn started the tracker, still alive"
    assert tracker not in child_pids(), "and it is not a process the round waits for"


def _burn(seconds: float, done) -> None:
    """Spin ``seconds`` of CPU, then wait to be told to go."""
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass
    done.wait(60)


def test_cpu_seconds_count_a_worker_process_while_it_still_runs():
    """A round's CPU is taken at its last clip, when the reader's workers are alive and not yet waited for."""
    context = multiprocessing.get_context("fork")
    done = context.Event()
    before = cpu_seconds()
    worker = context.Process(target=_burn, args=(0.4, done))
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while cpu_seconds() - before < 0.35 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cpu_seconds() - before >= 0.35, "the live worker's CPU counts before it exits"
    finally:
        done.set()
        worker.join()


def test_generated_sets_every_reader_exact(videos, tmp_path):
    cache = videos.parent.parent
    result = run_clip_bench(
        sets=("long_gop", "frame_folder"), videos=2, seconds=4, gop=60, cache=cache, size=SizePx(112, 112), device="cpu",
        contenders=("gpufeed", "decode_from_start", "opencv_seek"), **SMALL,
    )  # fmt: skip
    assert set(result["sets"]) == {"long_gop", "frame_folder"}
    assert result["sets"]["long_gop"]["exact_share"] == {"gpufeed": 1.0, "decode_from_start": 1.0, "opencv_seek": 1.0}
    assert all(ms > 0 for ms in result["sets"]["long_gop"]["cpu_ms_per_clip"].values())
    assert result["ratios"]["opencv_seek / gpufeed, CPU per clip (long_gop)"] > 0
    assert list(result["sets"]["frame_folder"]["clips_per_second"]) == ["gpufeed"]
    store = result["sets"]["frame_folder"]["store"]
    assert store["bytes_read_per_frame"] > 1000 and store["decode_ms_per_frame"] > 0
    assert 0 < store["fast_idct_mean_levels"] < 3, "the fast IDCT's error is measured, not assumed"
    assert any(line.startswith("frame_folder: ") for line in result["targets"])


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_the_users_own_folder_without_labels(videos, tmp_path, device):
    """--data: no tags there, so each reader's clips are compared with its own in-order decode (gpufeed's
    on a GPU through its sequential reader on NVDEC: FFmpeg's scaler differs from DALI's resize)."""
    own = tmp_path / "own"
    own.mkdir()
    for path in videos.glob("*.mp4"):
        shutil.copy(path, own / path.name)  # the videos without their label CSVs
    result = run_clip_bench(data=own, device=device.kind, contenders=("gpufeed", "opencv_seek"), **SMALL)
    assert result["data"] == str(own) and list(result["sets"]) == ["videos"]
    assert result["sets"]["videos"]["exact_share"] == {"gpufeed": 1.0, "opencv_seek": 1.0}


def test_a_deepethogram_project_as_the_users_own_data(tmp_path):
    from videohelp import make_deepethogram_project

    project = make_deepethogram_project(tmp_path / "project", "folder", (40, 30))
    result = run_clip_bench(data=project, device="cpu", contenders=("gpufeed",), **SMALL)
    assert list(result["sets"]) == ["frame_folder"] and result["sets"]["frame_folder"]["videos"] == 2


def test_torchcodec_reads_the_same_clips_exactly_and_its_sampler_its_own(videos):
    why = unavailable_reason("torchcodec_exact", str(next(videos.glob("*.mp4"))))
    if why:
        pytest.skip(f"torchcodec: {why}")
    result = run_clip_bench(
        sets=("long_gop",), videos=2, seconds=4, gop=60, cache=videos.parent.parent, size=SizePx(112, 112), device="cpu",
        contenders=("gpufeed", "torchcodec_exact", "torchcodec_approximate", "torchcodec_sampler"), sampler_clips=4,
        **SMALL,
    )  # fmt: skip
    figures = result["sets"]["long_gop"]
    assert figures["exact_share"] == {
        "gpufeed": 1.0,
        "torchcodec_exact": 1.0,
        "torchcodec_approximate": 1.0,
        "torchcodec_sampler": 1.0,
    }
    assert all(figures["clips_per_second"][c] > 0 for c in figures["exact_share"])
    assert any("torchcodec's best seek mode" in line for line in result["targets"])
