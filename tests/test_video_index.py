"""The video index, label files and clip sampling: pure functions and file facts, no DALI."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from videohelp import write_odd_video

from gpufeed.pipelines import DatasetError, VideoDataset
from gpufeed.pipelines._clips import ClipGeometry, ClipTable
from gpufeed.pipelines._nvdec import choose_decoder
from gpufeed.pipelines._videos import VideoInfo, probe_video, read_label_csv
from gpufeed.synth import SynthSpec


def test_synth_videos_are_indexed_with_their_facts(synth_dir):
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    assert not dataset.problems
    assert dataset.num_frames.tolist() == list(SynthSpec().video_frames)
    assert dataset.behaviours == ("background", "groom", "rear", "walk")
    for info, labels in zip(dataset.infos, dataset.labels, strict=True):
        assert info.codec == "h264" and info.cfr and info.fps == pytest.approx(30.0)
        assert (info.width, info.height) == (96, 64)
        assert list(info.keyframes) == list(range(0, info.num_frames, 30)), "synth writes a keyframe every 30"
        assert labels.shape == (info.num_frames, 4)
        assert info.keyframe_at_or_before(59) == 30 and info.keyframe_at_or_before(60) == 60


def test_index_is_cached_beside_the_data_and_rebuilt_when_a_video_changes(synth_dir, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(synth_dir / "videos", folder, ignore=shutil.ignore_patterns(".gpufeed"))
    first = VideoDataset.from_folder(folder)
    cache = folder / ".gpufeed" / "videos-index.json"
    assert cache.is_file()
    victim = folder / "clip_001.mp4"
    write_odd_video(victim, 1, 40)
    again = VideoDataset.from_folder(folder)
    assert first.infos[1].num_frames == 120 and again.infos[1].num_frames == 40
    assert again.infos[0] == first.infos[0]


def test_variable_frame_rate_is_detected(tmp_path):
    path = tmp_path / "vfr.mp4"
    write_odd_video(path, 0, 45, durations_ms=(33, 33, 50))
    info = probe_video(path)
    assert info.num_frames == 45 and not info.cfr and info.problem is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("time,a\n0,1\n", "header must be 'frame,"),
        ("frame,a,b\n0,1\n", "expected 3 columns, got 2"),
        ("frame,a\n0,2\n", "must be 0 or 1"),
        ("frame,a\n0,x\n", "must be 0 or 1"),
        ("frame,a\n1,0\n", "expected 0"),
    ],
)
def test_label_csv_errors_name_the_file_and_line(tmp_path, text, words):
    path = tmp_path / "v.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=words) as info:
        read_label_csv(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("header", "column", "where"),
    [(b"frame,a,b,a\n", "a", "columns 2 and 4"), (b",walk,walk,rear\n", "walk", "columns 2 and 3")],
)
def test_a_label_csv_with_a_repeated_column_name_is_refused_at_its_header(tmp_path, header, column, where):
    path = tmp_path / "labels.csv"
    path.write_bytes(header + b"\xff\x00 not a row\n" * 1000)  # a body that would fail to parse if read
    with pytest.raises(ValueError) as info:
        read_label_csv(path, max_rows=2000)
    assert str(info.value) == (
        f"label file {path}: column '{column}' is named twice ({where}); each behaviour needs its own name"
    )


def test_missing_and_empty_video_folders(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        VideoDataset.from_folder(tmp_path / "nope")
    with pytest.raises(DatasetError, match="no videos"):
        VideoDataset.from_folder(tmp_path)


@pytest.mark.parametrize(("length", "stride"), [(11, 1), (11, 2), (4, 3), (1, 1)])
def test_eval_clips_tile_each_video_and_the_last_ends_at_its_end(length, stride):
    g = ClipGeometry(length, stride)
    for frames in range(1, 80):
        starts = g.eval_starts(frames)
        if frames < g.span_frames:
            assert len(starts) == 0
            continue
        assert starts[0] == 0 and starts[-1] == frames - g.span_frames, "the last clip ends on the last frame"
        assert all(s + g.span_frames <= frames for s in starts), "no clip runs past the end"
        assert (np.diff(starts)[:-1] == g.hop_frames).all() and (np.diff(starts) > 0).all()
        assert g.frames(int(starts[-1]))[-1] == frames - 1


def test_training_starts_cover_the_whole_valid_range_and_only_it():
    g = ClipGeometry(11, 2)
    table = ClipTable.build(np.array([60, 200]), np.array([0, 1]), g)
    seen = {0: set(), 1: set()}
    for epoch in range(300):
        videos, starts = table.clips(np.arange(len(table)), train=True, seed=3, epoch=epoch)
        for v, s in zip(videos.tolist(), starts.tolist(), strict=True):
            seen[v].add(s)
    for v, frames in ((0, 60), (1, 200)):
        assert seen[v] == set(range(frames - g.span_frames + 1)), f"video {v}: every valid start, nothing else"


def test_training_clips_are_a_function_of_seed_epoch_and_slot():
    table = ClipTable.build(np.array([100, 50, 80]), np.array([0, 2]), ClipGeometry(11, 1))
    assert set(table.slot_video.tolist()) == {0, 2}, "unusable videos get no slots"
    slots = np.arange(len(table))
    a = table.clips(slots, train=True, seed=1, epoch=0)
    sub = table.clips(slots[3:6], train=True, seed=1, epoch=0)
    assert np.array_equal(a[1][3:6], sub[1]), "a slot's start does not depend on its batch"
    assert not np.array_equal(a[1], table.clips(slots, train=True, seed=1, epoch=1)[1])
    assert not np.array_equal(a[1], table.clips(slots, train=True, seed=2, epoch=0)[1])
    evals = table.clips(slots, train=False, seed=1, epoch=5)
    assert np.array_equal(evals[1], table.slot_start) and np.array_equal(evals[0], table.slot_video)


def _infos(*codecs):
    return [VideoInfo(f"v{i}.mp4", codec=c, width=96, height=64, pix_fmt="yuv420p") for i, c in enumerate(codecs)]


def test_decoder_choice():
    assert choose_decoder("auto", True, _infos("h264")).source == "dali"
    assert choose_decoder("auto", False, _infos("h264")).source == "pyav"
    assert choose_decoder("auto", False, _infos("vp9", "mjpeg")).source == "dali"
    assert choose_decoder("pyav", True, _infos("h264")).source == "pyav"
    with pytest.raises(DatasetError, match="dali cannot decode h264 without a GPU"):
        choose_decoder("dali", False, _infos("h264", "vp9"))
