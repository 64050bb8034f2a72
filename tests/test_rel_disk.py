"""Training reliability: unwritable and full run folders fail before training; a disk filling mid-run."""

from __future__ import annotations

import os
import re

import pytest
import torch

from gpufeed.models import create_model
from gpufeed.reliability import run_disk_faults
from gpufeed.train._optim import build_optimizer
from gpufeed.train._preflight import estimate_checkpoint_bytes, first_missing, remove_unstarted_run, space_needed

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


def test_space_needed_follows_writes_and_pruning():
    c = 1000
    assert space_needed(c, [], keep=3) == 2 * c, "a fresh run: two new checkpoints side by side"
    assert space_needed(c, [c, c, c], keep=3) == c, "a resume at keep: each write adds one before pruning one"
    assert space_needed(c, [c], keep=1) == c
    assert space_needed(c, [], keep=3, writes=4) == 4 * c, "the peak of keeping 3: the fourth write before pruning"


def test_an_unstarted_run_folder_is_removed_only_when_it_holds_nothing_else(tmp_path):
    """A failed start left ``runs/<model>-<date>`` behind, one per attempt: empty checkpoints/, a dead address."""

    def scaffolding(name: str):
        run = tmp_path / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "metrics-rank0.addr").write_text("127.0.0.1:9400\n")
        (run / "steps.jsonl").write_text("")
        (run / "config.yaml").write_text("seed: 0\n")
        return run

    assert remove_unstarted_run(scaffolding("bare")) and not (tmp_path / "bare").exists()
    (scaffolding("checkpointed") / "checkpoints" / "ckpt-000000001.pt").write_bytes(b"x")
    (scaffolding("stepped") / "steps.jsonl").write_text('{"step": 1}\n')
    (scaffolding("notes") / "notes.txt").write_text("mine")
    for kept in ("checkpointed", "stepped", "notes"):
        assert not remove_unstarted_run(tmp_path / kept) and (tmp_path / kept).is_dir(), kept
    assert not remove_unstarted_run(tmp_path / "never-made")


def test_a_failed_first_start_leaves_no_empty_runs_folder(tmp_path):
    """The first run in a folder makes ``runs/`` too; a failed start left it behind, empty."""
    run = tmp_path / "runs" / "smallcnn-1"
    assert first_missing(run) == tmp_path / "runs" and first_missing(tmp_path) is None
    run.mkdir(parents=True)
    assert remove_unstarted_run(run, made_from=tmp_path / "runs") and not (tmp_path / "runs").exists()
    assert tmp_path.is_dir(), "a folder that was there before stays"
    # A run started beside it in the meantime keeps runs/ (and itself).
    run.mkdir(parents=True)
    (tmp_path / "runs" / "other").mkdir()
    assert remove_unstarted_run(run, made_from=tmp_path / "runs") and not run.exists()
    assert (tmp_path / "runs" / "other").is_dir()
    # Without made_from (runs/ was there before), only the run folder goes.
    run.mkdir()
    (tmp_path / "runs" / "other").rmdir()
    assert remove_unstarted_run(run) and (tmp_path / "runs").is_dir()


@pytest.mark.skipif(
    not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), a device whose writes fail with ENOSPC"
)
def test_a_write_failing_late_is_a_clear_error_and_the_checkpoint_estimate_is_close(synth_dir, tmp_path):
    from train_support import train_config

    from gpufeed.train import TrainError, train

    # summary.json, the run's last write, lands on /dev/full: a real "No space left on device".
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to("/dev/full")
    cfg = train_config(synth_dir, ["train.max_steps=1", "train.eval_every_epochs=0"])
    with pytest.raises(TrainError) as info:
        train(cfg, run)
    message = str(info.value)
    assert f"cannot write to the run folder {run}: No space left on device" in message
    assert "ckpt-000000001.pt, is intact" in message and "--resume" in message

    real = (run / "checkpoints" / "ckpt-000000001.pt").stat().st_size
    model = create_model("smallcnn", num_classes=4, size_px=32)
    estimate = estimate_checkpoint_bytes(model, build_optimizer(model, cfg.train))
    assert real <= estimate <= 1.15 * real, (real, estimate)
    resumed = build_optimizer(model, cfg.train)
    resumed.load_state_dict(torch.load(run / "checkpoints" / "ckpt-000000001.pt")["optimizer"])
    assert real <= estimate_checkpoint_bytes(model, resumed) <= 1.15 * real, "exact optimizer state after a resume"


def test_unwritable_and_full_run_folders_fail_before_training_and_a_full_disk_mid_run_keeps_the_last_checkpoint(
    synth_dir, tmp_path
):
    report = run_disk_faults(tmp_path, data=synth_dir)
    print(report.table())
    under = report.case("under a file")
    assert under.status == 2 and under.steps == 0 and f"{tmp_path / 'blocker' / 'run'}: Not a directory" in under.error
    if report.not_run:
        pytest.skip(f"mount cases not run: {next(iter(report.not_run.values()))}")

    for name in ("read-only mount", "read-only folder"):
        case = report.case(name)
        assert case.status == 2 and case.steps == 0 and "Read-only file system" in case.error, case
    assert str(tmp_path / "mnt-read-only" / "existing-run") in report.case("read-only folder").error

    full = report.case("full disk")
    assert full.status == 2 and full.steps == 0
    found = re.search(r"in (\S+): ([\d,]+) bytes \(.*\) free, ([\d,]+) bytes \(.*\) needed", full.error)
    assert found, full.error
    folder, free, needed = found.group(1), int(found.group(2).replace(",", "")), int(found.group(3).replace(",", ""))
    assert folder == str(tmp_path / "mnt-full" / "run") and 0 < free < needed

    mid = report.case("fills mid-run")
    assert mid.status == 2 and mid.steps == 3, "checkpoints 1 and 2 fit, the third does not"
    assert "ckpt-000000003.pt: No space left on device" in mid.error
    assert "ckpt-000000002.pt, is intact" in mid.error and "--resume" in mid.error
    assert mid.checkpoints == ["ckpt-000000001.pt loads (step 1)", "ckpt-000000002.pt loads (step 2)"]
    assert mid.temp_files_left == 0
    assert mid.resume_status == 0 and mid.resumed_steps == list(range(1, 13)), "after making room --resume finishes"
    assert report.ok, report.table()
