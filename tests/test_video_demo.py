"""The demo's clip stage and the `video` config section."""

from __future__ import annotations

import pytest

from gpufeed.config import ConfigError, parse_config
from gpufeed.demo import run_clip_demo
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
