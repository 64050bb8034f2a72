"""The demo's clip stage and the `video` config section."""

from __future__ import annotations

import pytest
from _serving import write_checkpoint
from conftest import DEVICES

from gpufeed.config import ConfigError, parse_config
from gpufeed.demo import run_clip_demo, run_predict_demo
from gpufeed.device import DeviceChoice

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


def test_clip_demo_stage_verifies_every_eval_clip(synth_dir, capsys):
    cfg = parse_config(
        {"video": {"train": "videos", "val": "videos", "size_px": 48}, "loader": {"batch_size": 8}},
        base_dir=synth_dir,
    )
    figures = run_clip_demo(cfg, DeviceChoice("cpu", None, "test"))
    assert figures["eval_clips_verified"] == 34 and figures["train_clips_per_second"] > 0
    out = capsys.readouterr().out
    assert "34/34 clips verified" in out and "all 150 frames" in out


@pytest.mark.live
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_predictions_stage_serves_a_video_as_predict_scores_it(synth_dir, tmp_path, capsys, device):
    """The demo's predictions stage on each device: ``predict`` writes a CSV per video, and the served
    model's answer to one posted video is checked against it (on a GPU, PyTorch in TF32 against the
    CUDA provider in fp32; the stage raises SystemExit beyond its tolerance)."""
    cfg = parse_config({"video": {"train": "videos", "val": "videos", "size_px": 48}}, base_dir=synth_dir)
    frames = cfg.video.clip_length_frames
    write_checkpoint(tmp_path / "run", "clip_resnet18", num_classes=3, size_px=48, clip_length_frames=frames)
    folder = run_predict_demo(tmp_path / "out", cfg, device, tmp_path / "run")
    assert len(list(folder.glob("*_predictions.csv"))) == 3 and len(list(folder.glob("*_predictions.png"))) == 3
    out = capsys.readouterr().out
    # Runs of windows are a CPU-provider graph: on a GPU the served windows go one by one.
    how = "windows one by one" if device.is_gpu else "runs of 32 windows"
    assert "served: clip_000.mp4 posted to /v1/models/behaviour/predict, 150 frames" in out and how in out


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("video.clip_length_frames=0", "must be >= 1"),
        ("video.fit=crop", "allowed: stretch, centre_crop"),
        ("video.decoder=nvdec", "allowed: auto, dali, pyav"),
        ("video.clips=3", "unknown key"),
    ],
)
def test_video_config_is_validated(override, words):
    with pytest.raises(ConfigError, match=words) as info:
        parse_config({}, overrides=[override])
    assert "video." in str(info.value)
