"""`gpufeed prepare`: constant-rate short-GOP h264, frames and labels kept one for one."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import av
import pytest
from videohelp import decode_all, write_odd_video

from gpufeed.pipelines import DatasetError, PrepareOptions, VideoDataset, prepare_videos
from gpufeed.pipelines._videos import probe_video
from gpufeed.synth import read_tag

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def source(tmp_path):
    """Two tagged videos: long GOP with an audio track, and variable frame rate."""
    folder = tmp_path / "src"
    write_odd_video(folder / "a.mp4", 0, 90, gop=60, audio=True)
    write_odd_video(folder / "sub" / "b.mp4", 1, 45, durations_ms=(33, 33, 50))
    return folder


def test_prepare_keeps_every_frame_and_label_and_shortens_the_gop(source, tmp_path):
    out = tmp_path / "out"
    report = prepare_videos(source, out, PrepareOptions(probe_clips=5), progress=False)
    assert report.ok, report.table()
    for src_rel, video_id, frames in (("a.mp4", 0, 90), ("sub/b.mp4", 1, 45)):
        prepared = out / src_rel
        info = probe_video(prepared)
        assert info.problem is None and info.codec == "h264" and info.cfr, info
        assert info.num_frames == frames
        assert list(info.keyframes) == list(range(0, frames, 22)), "a keyframe every two clip spans (22 frames)"
        with av.open(str(prepared)) as container:
            assert not container.streams.audio, "audio is dropped"
            assert container.streams.video[0].codec_context.pix_fmt == "yuv420p"
        tags = [(t.ident, t.aux) for t in map(read_tag, decode_all(prepared))]
        assert tags == [(i, video_id) for i in range(frames)], "frames one for one, in order"
        assert prepared.with_suffix(".csv").read_bytes() == (source / src_rel).with_suffix(".csv").read_bytes()
    assert VideoDataset.from_folder(out).problems == {}
    table = report.table()
    assert "ms/clip before" in table and "ms/clip after" in table
    assert all(v.ms_per_clip_before > 0 and v.ms_per_clip_after > 0 for v in report.videos)


def test_a_label_file_that_does_not_match_is_reported_and_the_rest_prepared(source, tmp_path):
    csv = source / "a.csv"
    csv.write_text("\n".join(csv.read_text().splitlines()[:-3]) + "\n")
    report = prepare_videos(source, tmp_path / "out", PrepareOptions(probe_clips=0), progress=False)
    assert not report.ok
    bad = {v.source: v.problem for v in report.videos if v.problem}
    assert bad == {str(source / "a.mp4"): f"label file {csv} has 87 rows but the video has 90 frames"}
    assert (tmp_path / "out" / "sub" / "b.mp4").is_file() and not (tmp_path / "out" / "a.mp4").exists()


def test_prepare_refuses_to_write_into_its_source(source):
    with pytest.raises(DatasetError, match="must not be"):
        prepare_videos(source, source / "inside", PrepareOptions(probe_clips=0), progress=False)


@pytest.mark.process
def test_cli_prints_the_seek_table_and_fails_on_a_bad_video(source, tmp_path):
    shutil.copy(source / "a.mp4", source / "broken.mp4")
    (source / "broken.mp4").write_bytes((source / "a.mp4").read_bytes()[:5000])
    out_json = tmp_path / "report.json"
    args = ["prepare", str(source), "--out", str(tmp_path / "out"), "--gop", "8", "--probe-clips", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", *args, "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr
    assert "GOP 8 frames" in proc.stdout and "speed-up" in proc.stdout
    assert f"FAILED {source / 'broken.mp4'}: truncated" in proc.stdout
    report = json.loads(out_json.read_text())
    assert report["ok"] is False and len(report["videos"]) == 3


def test_a_video_shorter_than_a_clip_is_prepared_and_left_out_of_the_timing(source, tmp_path):
    write_odd_video(source / "short.mp4", 2, 6)
    report = prepare_videos(source, tmp_path / "out", PrepareOptions(probe_clips=4), progress=False)
    assert report.ok, report.table()
    table = report.table()
    assert "nan" not in table
    row = next(line for line in table.splitlines() if line.startswith("short.mp4"))
    assert row.split()[1:] == ["6", "6.0", "6.0", "-", "-", "-"]
    assert "mean over 2 video(s): " in table and "; 1 shorter than a clip, not timed" in table
