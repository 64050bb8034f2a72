"""DDP reporting: the job's loader wait from every rank's step log, the report's ranks, the rank in log lines.

Under DDP a rank that waits for its loader holds the others in the gradient all-reduce, where
their timings book the wait as compute: rank 0's figures alone can show a loader-bound job as
compute-bound. The step logs here are written by the training loop's own writer
(:class:`StepLog`, :class:`StepRecord`) for two ranks, as a straggler run writes them.
"""

from __future__ import annotations

import logging

import matplotlib.axes
import pytest

from gpufeed import cli
from gpufeed.train._report import draw_report
from gpufeed.train._summary import format_job, job_loader_wait, job_loader_wait_of_run, summarize
from gpufeed.train._telemetry import StepLog, StepRecord, read_step_logs, step_log_path

STEPS = 12
PER_EPOCH = 6


def _record(rank: int, step: int, wait: float, compute: float) -> StepRecord:
    # On the CPU a step's period holds its own wait and compute (see _telemetry).
    return StepRecord(
        step=step,
        epoch=(step - 1) // PER_EPOCH,
        batch=(step - 1) % PER_EPOCH,
        rank=rank,
        time_unix=1_700_000_000.0 + step,
        loader_wait_s=wait,
        augment_s=0.001,
        compute_s=compute,
        step_s=wait + 0.001 + compute + 0.002,
        samples=16,
        loss=1.0,
        lr=1e-3,
        sample_ids=list(range(16)),
    )


def _write_straggler_run(run, steps: dict[int, int] | None = None) -> None:
    """Rank 1's loader sleeps 0.3 s a batch; rank 0 waits for nothing, then 0.3 s for rank 1's gradients."""
    timings = {0: (0.0, 0.33), 1: (0.3, 0.03)}  # (loader wait, compute) as measured in /tmp/audit7/ddp/straggler.py
    for rank, (wait, compute) in timings.items():
        log = StepLog(step_log_path(run, rank))
        for step in range(1, (steps or {}).get(rank, STEPS) + 1):
            log.write(_record(rank, step, wait, compute))
        log.close()


def test_the_job_figure_names_the_rank_that_waited_and_takes_its_share(tmp_path):
    _write_straggler_run(tmp_path)
    logs = read_step_logs(tmp_path)
    rank0, rank1 = summarize(logs[0]), summarize(logs[1])
    assert rank0["loader_wait_share"] == 0.0, "rank 0 on its own reports no loader wait at all"

    job = job_loader_wait_of_run(tmp_path)
    assert job["worst_rank"] == 1 and job["steps"] == STEPS
    assert job["loader_wait_share"] == pytest.approx(rank1["loader_wait_share"])
    assert job["loader_wait_share"] == pytest.approx(0.3 / 0.333)
    assert job["steady_loader_wait_share"] == pytest.approx(rank1["steady_loader_wait_share"])
    assert job["worst_rank_loader_wait_share"] == pytest.approx(rank1["loader_wait_share"])
    assert job["rank_loader_wait_share"] == {"0": 0.0, "1": pytest.approx(rank1["loader_wait_share"])}
    assert job_loader_wait(r for records in logs.values() for r in records) == job, "the report's figure too"
    line = format_job(job)
    assert "loader wait 90.1% of step time" in line and "rank 1 waited most" in line


def test_a_step_counts_the_ranks_that_logged_it(tmp_path):
    # A resume on one rank: rank 1's log was cut at step 4, the later steps are rank 0's alone.
    _write_straggler_run(tmp_path, steps={1: 4})
    with (tmp_path / "steps.jsonl").open("a") as log:
        log.write('{"step": 13, "rank": 0, "loader_wa')  # a line a kill cut short
    job = job_loader_wait_of_run(tmp_path)
    assert job["steps"] == STEPS and job["worst_rank"] == 1
    assert job["loader_wait_share"] == pytest.approx(4 * 0.3 / (4 * 0.333 + 8 * 0.333))


def test_the_report_shows_the_rank_that_waited_and_the_job(tmp_path, monkeypatch):
    _write_straggler_run(tmp_path)
    titles = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, *a, **k: (titles.append(t), real(ax, t))[1])
    png, text = draw_report(tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rank 1 (waited most of 2 ranks" in titles[0] and "job loader wait 90.1%" in titles[0]
    assert "rank 0\n" in text and "rank 1\n" in text and "rank 1 waited most" in text


def test_a_single_rank_report_is_unchanged(tmp_path, monkeypatch):
    log = StepLog(step_log_path(tmp_path, 0))
    for step in range(1, STEPS + 1):
        log.write(_record(0, step, 0.01, 0.1))
    log.close()
    titles = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, *a, **k: (titles.append(t), real(ax, t))[1])
    _, text = draw_report(tmp_path)
    assert titles == [f"{tmp_path.name}: loader wait vs compute (rank 0, {STEPS} steps)"]
    assert "job" not in text and job_loader_wait_of_run(tmp_path)["worst_rank"] == 0


def _line(fmt: str) -> str:
    record = logging.LogRecord("gpufeed", logging.INFO, __file__, 1, "training smallcnn", None, None)
    return logging.Formatter(fmt, datefmt="%H:%M:%S").format(record)


def test_log_lines_carry_the_rank_under_torchrun(tmp_path, monkeypatch):
    single = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    assert cli.log_format({}) == cli.log_format({"RANK": "0", "WORLD_SIZE": "1"}) == single
    assert _line(cli.log_format({"RANK": "1", "WORLD_SIZE": "2"})).endswith(" INFO [rank 1] gpufeed: training smallcnn")
    assert "rank" not in _line(cli.log_format({"WORLD_SIZE": "two"})), "training names a malformed variable itself"

    # main() sets up logging with it, from the environment torchrun gives each rank.
    configured = []
    monkeypatch.setattr(logging, "basicConfig", lambda **kwargs: configured.append(kwargs))
    monkeypatch.setattr(cli, "resolve_handler", lambda name: lambda args: 0)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert cli.main(["synth", "--out", str(tmp_path)]) == 0
    assert "[rank 3]" in _line(configured[-1]["format"])
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert cli.main(["synth", "--out", str(tmp_path)]) == 0
    assert configured[-1]["format"] == single


def _single_rank_run(run) -> None:
    run.mkdir(exist_ok=True)
    log = StepLog(step_log_path(run, 0))
    for step in range(1, STEPS + 1):
        log.write(_record(0, step, 0.01, 0.1))
    log.close()


@pytest.mark.parametrize(
    ("tail", "words"),
    [
        (b'{"step": 13, "garbage\n', "steps.jsonl:13: not a step record (Unterminated string"),
        (b"\xff\xfe\n", "steps.jsonl: not a step log: byte 0xff at offset"),
        (
            b'{"step": 13, "rank": 0, "step_s": 1e999, "loader_wait_s": 0.1}\n',
            "steps.jsonl:13: not a step record (step_s is inf)",
        ),
    ],
)
def test_report_names_a_damaged_step_log_in_one_line(tmp_path, capsys, tail, words):
    _single_rank_run(tmp_path)
    with (tmp_path / "steps.jsonl").open("ab") as f:
        f.write(tail)
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_report_leaves_out_a_last_record_a_kill_cut_short_and_refuses_an_empty_log(tmp_path, capsys):
    _single_rank_run(tmp_path / "killed")
    with (tmp_path / "killed" / "steps.jsonl").open("a") as f:
        f.write('{"step": 13, "rank": 0, "loader_wa')  # no newline: the write was cut
    png, text = draw_report(tmp_path / "killed")
    assert png.is_file() and f"{STEPS} steps" in text
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "steps.jsonl").write_text("")
    assert cli.main(["report", str(tmp_path / "empty")]) == 2
    assert "hold no step record" in capsys.readouterr().err


def test_report_out_takes_a_folder_or_a_figure_file_and_names_where_it_wrote(tmp_path, capsys):
    _single_rank_run(tmp_path / "run")
    (tmp_path / "figures").mkdir()
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "figures")]) == 0
    assert f"report written to {tmp_path / 'figures' / 'report.png'}" in capsys.readouterr().out
    assert (tmp_path / "figures" / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert cli.main(["report", str(tmp_path / "run"), "--out", str(tmp_path / "x.txt")]) == 2
    assert "expected a .png, .pdf or .svg file, or a folder" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()
    with pytest.raises(SystemExit):
        cli.main(["report", str(tmp_path / "run"), "--window", "0"])
