"""`gpufeed check` on videos: each damaged, unsupported, VFR or mislabelled video, with path and reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from videohelp import write_odd_video

from gpufeed.pipelines import check_path

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def damaged(synth_dir, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(synth_dir / "videos", folder, ignore=shutil.ignore_patterns(".gpufeed"))
    cases = {}
    truncated = folder / "clip_000.mp4"
    truncated.write_bytes(truncated.read_bytes()[:-3000])
    cases[truncated] = ("video", "truncated")
    fake = folder / "notes.mp4"
    fake.write_text("this is not a video")
    cases[fake] = ("video", "not an mp4")
    csv = folder / "clip_001.csv"
    csv.write_text("\n".join(csv.read_text().splitlines()[:-5]) + "\n")
    cases[folder / "clip_001.mp4"] = ("label", "has 115 rows but the video has 120 frames")
    vfr = folder / "vfr.mp4"
    write_odd_video(vfr, 7, 40, durations_ms=(33, 50))
    warnings = {vfr: "variable frame rate"}
    odd = folder / "lossless.mkv"
    write_odd_video(odd, 8, 20, codec="ffv1")
    cases[odd] = ("video", "unsupported codec 'ffv1'")
    body = folder / "clip_002.mp4"
    data = bytearray(body.read_bytes())
    start = data.index(b"mdat") + 2500
    data[start : start + 300] = bytes(b ^ 0x33 for b in data[start : start + 300])
    body.write_bytes(bytes(data))
    cases[body] = ("video", "damaged: decoding fails")
    unlabelled = folder / "extra.mp4"
    write_odd_video(unlabelled, 9, 30, labels=False)
    cases[unlabelled] = ("label", "no label file: expected extra.csv")
    (folder / "readme.txt").write_text("hello")
    return folder, cases, warnings


def test_check_names_every_bad_video_and_why(damaged):
    folder, cases, warnings = damaged
    report = check_path(folder, progress=False)
    assert not report.ok
    found = {}
    for f in report.findings:
        found.setdefault(f.path, []).append(f)
    for path, (kind, words) in cases.items():
        assert any(f.kind == kind and words in f.reason for f in found.get(str(path), [])), (path, found.get(str(path)))
    assert [f.kind for f in found[str(folder / "readme.txt")]] == ["ignored"]
    for path, words in warnings.items():
        assert [f.kind for f in found[str(path)]] == ["warning"] and words in found[str(path)][0].reason
    assert report.bad_paths() == sorted(str(p) for p in cases)
    assert report.checked == len(list(folder.glob("*.m[pk][4v]")))


def test_synth_root_checks_images_and_videos(synth_dir):
    report = check_path(synth_dir, progress=False)
    assert report.ok, report.table()
    assert any("videos in" in s for s in report.sources)
    assert "no video checker" not in report.table()


@pytest.mark.process
def test_cli_exit_status_and_json(damaged, tmp_path):
    folder, cases, _ = damaged
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "check", str(folder), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    for path in cases:
        assert str(path) in proc.stdout
    assert json.loads(out.read_text())["ok"] is False


def test_a_video_shorter_than_one_clip_is_bad_and_quarantined(tmp_path):
    from gpufeed.cli import main

    folder = tmp_path / "videos"
    write_odd_video(folder / "five.mp4", 1, 5)
    write_odd_video(folder / "long.mp4", 2, 20)
    report = check_path(folder, progress=False)  # the default clip: 11 frames at stride 1
    assert [(f.path, f.kind, f.reason) for f in report.findings if f.kind not in ("decoder",)] == [
        (str(folder / "five.mp4"), "video", "too short: 5 frames, a clip spans 11")
    ]
    assert report.bad_paths() == [str(folder / "five.mp4")]
    assert check_path(folder, progress=False, clip_span_frames=5).ok, "a run whose clip spans 5 frames can use it"
    # --config: the run's clip (3 frames at stride 4 span 9), so the 20-frame video is fine and five.mp4 is not.
    config = tmp_path / "train.yaml"
    config.write_text("video: {clip_length_frames: 3, stride_frames: 4}\n")
    quarantine = tmp_path / "q.txt"
    assert main(["check", str(folder), "--config", str(config), "--quarantine", str(quarantine)]) == 1
    assert quarantine.read_text().splitlines() == [str(folder / "five.mp4")]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("notes.mkv", "a Matroska/WebM (EBML) header"),
        ("notes.webm", "a Matroska/WebM (EBML) header"),
        ("notes.avi", "an AVI 'RIFF' header"),
    ],
)
def test_a_text_file_named_as_a_video_names_the_header_it_lacks(tmp_path, name, expected):
    path = tmp_path / name
    path.write_text("frame,sniff\n0,1\n")
    (finding,) = check_path(path, progress=False).findings
    problem = finding.reason
    assert problem == (
        f"not a video: the file does not start with {expected} "
        "(its first bytes are no MP4/MOV, AVI, Matroska/WebM or MPEG-TS header)"
    )
    assert "Errno" not in problem
