"""``gpufeed bench predict`` with its real contenders: the user's loop, ``predict`` and the served video.

A small run (a 2-second camera-like video, a clip ResNet-18 at 32 px, one round) checks the
harness, not the speed: every contender scores every frame of the same video with the same windows,
their outputs agree with the user's loop, and the served contenders really went through a server
(with runs of windows, and without).
"""

from __future__ import annotations

import pytest

from gpufeed.bench.predict import CONTENDERS, contenders, print_predict_result, run_predict_bench

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]

# 60 frames of 64 px, windows of 5 frames at 32 px: the harness, not the speed.
SMALL = {"seconds": 2, "video_size": 64, "size_px": 32, "clip_length": 5, "classes": 3, "batch_size": 4}


def test_every_contender_scores_the_same_video_and_agrees(tmp_path, capsys):
    result = run_predict_bench(**SMALL, rounds=1, device="cpu", cache=tmp_path)
    assert result.frames == 60 and set(result.rounds) == set(CONTENDERS)
    assert all(len(rounds) == 1 and rounds[0] > 0 for rounds in result.rounds.values())
    # Every contender wrote its CSVs (a contender without one has a NaN here, which fails); the user's
    # loop resizes with swscale's default filter, gpufeed with the loaders' area filter.
    assert set(result.agreement) == set(CONTENDERS[1:])
    assert all(diff < 0.01 for diff in result.agreement.values()), result.agreement
    print_predict_result(result)
    out = capsys.readouterr().out
    assert "served video (REST, one by one)" in out and "served: " in out


def test_a_gpu_run_leaves_out_the_contenders_that_would_repeat_others():
    """Runs of windows are a CPU-provider graph: on a GPU "one by one" is what the others already time."""
    assert contenders(False) == CONTENDERS
    assert contenders(True) == (
        "user loop",
        "predict (checkpoint)",
        "predict (checkpoint, torch)",
        "predict (exported)",
        "served video (REST)",
    )
