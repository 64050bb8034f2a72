"""Progress displays a log can hold: a bar on a terminal, a plain line every few seconds elsewhere.

``gpufeed.core._progress.progress_bar`` is what every long command uses (bench, train, prepare,
check, synth, reliability). Written to a file or a pipe it must not redraw with carriage returns
(a tqdm bar wrote about 1,500 of them into one ``bench clips`` log): it writes one line at most
every interval and one at the end, or nothing for a task shorter than the interval.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

from gpufeed.core._progress import LineProgress, progress_bar, progress_mode


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_task_writes_a_line_per_interval_and_one_at_the_end():
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=1920, desc="prepare", unit="frame", interval_s=10, stream=out, clock=clock)
    for _ in range(1920):  # 30 s of work, an update every 1/64 s
        clock.now += 1 / 64
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 4, lines  # at 10, 20 and 30 s, then the end
    assert lines[0] == "prepare: 640/1920 frame (33%), 64 frame/s, 10 s"
    assert lines[-1].endswith("(done)") and "1920/1920" in lines[-1]


def test_a_task_left_short_of_its_total_does_not_end_done():
    """Ctrl-C in predict ended on ``2372/6820 frame (35%) ... (done)``."""
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=100, desc="predict", unit="frame", interval_s=10, stream=out, clock=clock)
    clock.now += 11
    bar.update(35)
    bar.close()
    assert out.getvalue().splitlines()[-1].endswith("35/100 frame (35%), 3.18 frame/s, 11 s (stopped)")


def test_a_short_task_writes_nothing_and_iteration_counts_every_item():
    out, clock = io.StringIO(), _Clock()
    seen = list(LineProgress(range(50), desc="decoding", interval_s=10, stream=out, clock=clock))
    assert seen == list(range(50)) and out.getvalue() == ""


def test_postfix_and_description_appear_in_the_next_line():
    out, clock = io.StringIO(), _Clock()
    bar = LineProgress(total=None, desc="epoch 1/2", unit="step", initial=5, interval_s=1, stream=out, clock=clock)
    bar.set_postfix_str("loss 0.52", refresh=False)
    clock.now = 2.0
    bar.update(4)
    assert out.getvalue() == "epoch 1/2: 9 step, 2 step/s, 2 s, loss 0.52\n"


@pytest.mark.parametrize(
    ("stream", "env", "mode"),
    [
        (_Terminal(), {}, "bar"),
        (io.StringIO(), {}, "lines"),  # a file or a pipe
        (_Terminal(), {"CI": "true"}, "lines"),
        (_Terminal(), {"GPUFEED_PROGRESS": "off"}, "off"),
        (io.StringIO(), {"GPUFEED_PROGRESS": "bar"}, "bar"),
    ],
)
def test_the_display_follows_the_output_and_the_environment(stream, env, mode):
    assert progress_mode(stream, env) == mode


def test_a_bad_setting_is_named():
    with pytest.raises(ValueError, match=r"GPUFEED_PROGRESS='fancy' is not allowed; allowed: auto, bar, lines, off"):
        progress_mode(io.StringIO(), {"GPUFEED_PROGRESS": "fancy"})


def test_a_command_writing_to_a_file_leaves_plain_lines(tmp_path, monkeypatch, capsys):
    """A real long task (writing the bench's videos), its stderr captured as a file: lines, no redraws."""
    from gpufeed.bench._clip_videos import make_bench_videos

    monkeypatch.delenv("GPUFEED_PROGRESS", raising=False)
    monkeypatch.setenv("GPUFEED_PROGRESS_INTERVAL_S", "0.001")
    make_bench_videos(tmp_path, count=1, seconds=2, fps=30, size=64, gop=30, seed=0)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("bench videos:")]
    assert lines and lines[-1].startswith("bench videos: 60/60 frame (100%)") and lines[-1].endswith("(done)")


def test_off_counts_and_writes_nothing(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv("GPUFEED_PROGRESS", "off")
    bar = progress_bar(total=10, desc="x", stream=out)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert bar.n == 10 and out.getvalue() == ""
    assert np.isclose(bar.n / bar.total, 1.0)
