"""``gpufeed predict`` as a user runs it: a child process, its exit status, its lines, its files, its memory.

A DeepEthogram project with one record that cannot be read: the others get DeepEthogram's output
files, the bad one is one line, the exit status says some failed, and a second run keeps what the
same model did. A long video costs no more memory than a short one (the frames stream through the windows).
"""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from _serving import write_checkpoint
from videohelp import encode_tagged_video, make_deepethogram_project

from gpufeed.models import checkpoint_path, create_model, model_state
from gpufeed.predict._export_cache import cached_export

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

# The CLI's own main in a child, its peak resident memory printed last. With GPUFEED_RESET_PEAK set,
# the peak restarts at the first progress line (writing 5 to /proc/self/clear_refs resets VmHWM), so
# it is the scoring's own: loading torch, the checkpoint and onnxruntime peaks higher than scoring
# does, and a peak over the whole run would hide a video's frames being kept.
RSS = """
import os, sys

class _PeakFromFirstProgress:
    def __init__(self, stream):
        self.stream, self.armed = stream, bool(os.environ.get("GPUFEED_RESET_PEAK"))

    def write(self, text):
        if self.armed and text.startswith("predict:"):
            self.armed = False
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")
            print("PEAK_RESET", file=sys.stdout, flush=True)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stderr = _PeakFromFirstProgress(sys.stderr)
from gpufeed.cli import main
status = main(sys.argv[1:])
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0].split()[1]
print("MAXRSS_KB", peak, flush=True)
sys.exit(status)
"""


def _gpufeed(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``gpufeed ARGS`` in a child process (the CLI's own main, with its peak memory printed last)."""
    return subprocess.run(
        [sys.executable, "-c", RSS, *args], capture_output=True, text=True, timeout=500, env=_env() | env
    )


def _env() -> dict:
    import os

    # A line at every update: the test reads one whatever the machine's speed.
    return {**os.environ, "GPUFEED_PROGRESS": "lines", "GPUFEED_PROGRESS_INTERVAL_S": "0.001"}


def _max_rss_kb(done: subprocess.CompletedProcess) -> int:
    line = [s for s in done.stdout.splitlines() if s.startswith("MAXRSS_KB")][-1]
    return int(line.split()[1])


def test_a_project_in_one_command_with_a_bad_record(tmp_path):
    project = make_deepethogram_project(tmp_path / "proj", "mp4", (26, 33, 20))
    (project / "DATA" / "mouse02" / "mouse02.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x01" * 64)
    checkpoint = write_checkpoint(tmp_path / "run", "r3d_small", num_classes=5, size_px=32, clip_length_frames=4,
                                  labels=("background", "groom", "rear", "walk", "sit"))  # fmt: skip
    done = _gpufeed("predict", str(checkpoint), str(project), "--format", "hdf5")
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpufeed predict: error:")]
    assert errors == [errors[0]] and "record mouse02 (mouse02.mp4)" in errors[0], done.stderr
    assert "predict: 2 scored, 0 kept (already done by this model), 1 failed; 59 frames" in done.stdout
    assert "frame/s" in done.stderr, "the progress lines say frames per second"
    for key, frames in (("mouse00", 26), ("mouse01", 33)):
        with h5py.File(project / "DATA" / key / f"{key}_outputs.h5", "r") as handle:
            # As deepethogram.projects.import_outputfile reads it: the group, P, thresholds, class_names.
            probabilities = handle["r3d_small"]["P"][:]
            assert probabilities.shape == (frames, 5) and ((probabilities > 0) & (probabilities < 1)).all()
            assert handle["r3d_small"]["thresholds"][:].shape == (5,)
            assert [n.decode() for n in handle["r3d_small"]["class_names"][:]][1] == "groom"
    assert not (project / "DATA" / "mouse02" / "mouse02_outputs.h5").exists()
    again = _gpufeed("predict", str(checkpoint), str(project), "--format", "hdf5", "--quiet")
    assert (
        again.returncode == 1
        and "0 scored, 2 kept (already done by this model; --overwrite scores them again), 1 failed" in again.stdout
    )


def test_usage_errors_are_one_line_and_status_2(tmp_path):
    checkpoint = write_checkpoint(tmp_path / "run", "smallcnn", num_classes=2, size_px=32)
    done = _gpufeed("predict", str(checkpoint), str(tmp_path / "missing"))
    assert done.returncode == 2 and done.stderr.strip().endswith("does not exist"), done.stderr
    assert "predict: " not in done.stdout, "named before the model is loaded (it took seconds to say)"
    done = _gpufeed("predict", str(tmp_path / "nothing"), str(tmp_path))
    assert done.returncode == 2 and "no checkpoint" not in done.stdout
    assert "give a checkpoint (.pt), a training run folder or an exported model folder" in done.stderr


def test_a_long_video_costs_no_more_memory_than_a_short_one(tmp_path):
    """9,000 frames at 64 px would hold 110 MB if kept; the scoring's peak memory grows by less than 40 MB
    over a 300-frame video's (measured: +9 MB; with every chunk kept, +162 MB), with windows 25 frames
    wide, 8 apart: few windows, so the model costs little."""
    torch.manual_seed(0)
    model = create_model("r3d_small", num_classes=3, size_px=64, clip_length_frames=4)
    checkpoint = checkpoint_path(tmp_path / "run", 1)
    checkpoint.parent.mkdir(parents=True)
    torch.save({**model_state(model), "step": 1, "config": {"video": {"stride_frames": 8}}}, checkpoint)
    # Its export made before, in the cache the children use: neither run's peak holds the exporter's.
    cached_export(checkpoint, 8)
    peaks = {}
    for name, frames in (("short", 300), ("long", 9000)):
        encode_tagged_video(tmp_path / name / f"{name}.mp4", 1, frames, options={"g": "60"}, labels=False)
        done = _gpufeed("predict", str(checkpoint), str(tmp_path / name), "--hop-frames", "25", GPUFEED_RESET_PEAK="1")
        assert done.returncode == 0, done.stderr
        assert "PEAK_RESET" in done.stdout, "the peak is the scoring's own: it restarts at the first progress line"
        rows = (tmp_path / name / f"{name}_predictions.csv").read_text().splitlines()
        assert len(rows) == frames + 1
        peaks[name] = _max_rss_kb(done)
    grown_mb = (peaks["long"] - peaks["short"]) / 1024
    print(f"peak RSS: short {peaks['short'] / 1024:.0f} MB, long {peaks['long'] / 1024:.0f} MB (+{grown_mb:.1f} MB)")
    assert grown_mb < 40, f"the long video's run peaked {grown_mb:.1f} MB higher"
    values = np.loadtxt(tmp_path / "long" / "long_predictions.csv", delimiter=",", skiprows=1)
    assert values[:, 0].tolist() == list(range(9000))


def test_a_checkpoint_is_exported_by_the_first_run_only_and_the_runtime_flag_keeps_pytorch(tmp_path):
    video = tmp_path / "videos" / "mouse.mp4"
    encode_tagged_video(video, 1, 24, options={"bf": "2"}, labels=False)
    checkpoint = write_checkpoint(tmp_path / "run", "r3d_small", num_classes=3, size_px=32, clip_length_frames=4)
    cache = tmp_path / "exports"
    outputs = {}
    for run in ("first", "second", "torch"):
        runtime = ["--runtime", "torch"] if run == "torch" else []
        done = _gpufeed(
            "predict", str(checkpoint), str(video), "--out", str(tmp_path / run), "--export-cache", str(cache), *runtime
        )
        assert done.returncode == 0, done.stderr
        outputs[run] = (tmp_path / run / "mouse_predictions.csv").read_text()
        said = done.stdout + done.stderr
        if run == "torch":
            assert ", PyTorch" in done.stdout and "exporting" not in said and "cached in" not in said
        else:
            assert f"its export, cached in {cache}" in done.stdout
            assert ("exporting" in said) == (run == "first") and ("is in the cache" in said) == (run == "second")
            assert "onnxruntime agrees with PyTorch on the first batch" in said
    assert outputs["first"] == outputs["second"]
    first, torch_run = (
        np.loadtxt(text.splitlines()[1:], delimiter=",") for text in (outputs["first"], outputs["torch"])
    )
    assert np.abs(first - torch_run).max() < 1e-5
