"""Ctrl-C or SIGTERM stops ``gpufeed train`` after a step, with a checkpoint of it, and says how to go on;
under torchrun every rank stops after the same step.

Before, SIGTERM (a scheduler's pre-emption) killed the run at once and SIGINT ended it with
"interrupted": every step since the last checkpoint was lost (500 steps apart by default). Each
test starts the real command in a session of its own and signals its whole process group, as a
terminal's Ctrl-C does: DALI's PyAV workers get the signal too, and must outlive it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from train_support import gpufeed_cmd, train_mapping

from gpufeed.models import list_checkpoints
from gpufeed.reliability._common import step_records
from gpufeed.train._telemetry import read_step_logs

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]


def _start(tmp_path, config: dict, *extra: str) -> subprocess.Popen:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    argv = gpufeed_cmd("train", "--config", str(path), "--out", str(tmp_path / "run"), *extra)
    with open(tmp_path / "train.log", "a", encoding="utf-8") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)


def _signal_after_steps(tmp_path, proc: subprocess.Popen, signum: int, steps: int = 2) -> str:
    """Signal the run's process group once it has logged ``steps`` steps; its log once it has ended."""
    run, deadline = tmp_path / "run", time.monotonic() + 240
    try:
        while len(step_records(run)) < steps and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        os.killpg(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return (tmp_path / "train.log").read_text()


def _stopped_at(log: str, signum: int, tmp_path) -> int:
    """The step the run says it stopped after; its checkpoint is the newest, and the step log ends there."""
    name = signal.Signals(signum).name
    last = log.rstrip().splitlines()[-1]
    found = re.fullmatch(
        rf"gpufeed train: stopped by {name} after step (\d+) \(epoch \d+, batch \d+ of \d+\); its checkpoint is "
        rf"(\S+): continue the run with --resume --out (\S+)",
        last,
    )
    assert found, log[-3000:]
    step = int(found[1])
    assert found[2] == str(list_checkpoints(tmp_path / "run")[-1]) and found[2].endswith(f"ckpt-{step:09d}.pt")
    assert found[3] == str((tmp_path / "run").resolve())
    assert [r["step"] for r in step_records(tmp_path / "run")][-1] == step
    return step


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_an_image_run_after_a_step_with_its_checkpoint_and_resume_ends_it(synth_dir, tmp_path, signum):
    config = train_mapping(synth_dir)
    config["train"]["epochs"] = 40  # about 240 steps: far from done when the signal comes
    proc = _start(tmp_path, config)
    log = _signal_after_steps(tmp_path, proc, signum)
    assert proc.returncode == 128 + signum, log[-3000:]
    step = _stopped_at(log, signum, tmp_path)
    assert step < 40 * 6
    config["train"]["epochs"] = 1 + (step // 6)  # the rest of the epoch it stopped in
    resumed = _start(tmp_path, config, "--resume")
    assert resumed.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
    steps = [r["step"] for r in step_records(tmp_path / "run")]
    assert steps == list(range(1, config["train"]["epochs"] * 6 + 1)), "every step once, none lost"


def test_ctrl_c_stops_a_clip_run_whose_pyav_workers_got_it_too(synth_dir, tmp_path):
    config = {
        "device": "cpu",
        "seed": 0,
        "video": {"train": str(synth_dir / "videos"), "decoder": "pyav", "size_px": [48, 32]},
        "loader": {"batch_size": 4, "num_threads": 2},
        "model": {"name": "r3d_small"},
        "train": {"epochs": 20, "progress": False},
        "telemetry": {"metrics_port": 0},
    }
    proc = _start(tmp_path, config)
    log = _signal_after_steps(tmp_path, proc, signal.SIGINT, steps=1)
    assert proc.returncode == 130, log[-3000:]
    _stopped_at(log, signal.SIGINT, tmp_path)
    # The workers leave Ctrl-C to the run: forked with its handler, each said it was stopping too.
    assert log.count("SIGINT: stopping after this step") == 1, log[-3000:]


def _start_torchrun(tmp_path, config: dict, *extra: str) -> subprocess.Popen:
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "gpufeed", "train"]
    argv += ["--config", str(path), "--out", str(tmp_path / "run"), *extra]
    with open(tmp_path / "train.log", "a", encoding="utf-8") as log:
        return subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)


def _rank_steps(run) -> dict[int, list[int]]:
    return {rank: [r["step"] for r in read_step_logs(run)[rank]] for rank in (0, 1)}


def _worker_of_rank(agent: subprocess.Popen, rank: int) -> int:
    """The pid of torchrun's worker process of ``rank`` (a child of the agent with RANK=rank)."""
    children = (Path(f"/proc/{agent.pid}/task/{agent.pid}/children")).read_text().split()
    for pid in map(int, children):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return pid
    raise AssertionError(f"no worker of rank {rank} among {children}")


def _ddp_config(synth_dir) -> dict:
    config = train_mapping(synth_dir)
    config["train"]["epochs"] = 400  # 3 steps an epoch on each of 2 ranks: far from done when the signal comes
    config["augment"]["ops"] = []
    return config


def test_ctrl_c_under_torchrun_stops_both_ranks_after_the_same_step_and_resume_ends_it(synth_dir, tmp_path):
    """Under torchrun each rank ended at once: nothing since the last checkpoint was kept. A terminal's
    Ctrl-C reaches every worker and the agent, which passes it on: one request, not "stop at once"."""
    config = _ddp_config(synth_dir)
    proc = _start_torchrun(tmp_path, config)
    log = _signal_after_steps(tmp_path, proc, signal.SIGINT, steps=3)
    assert proc.returncode != 0, log[-3000:]  # torchrun's agent ends on the signal it got, as it does
    lines = [line for line in log.splitlines() if line.startswith("gpufeed train: stopped by SIGINT after step")]
    assert len(lines) == 1, log[-3000:]  # rank 0 says it, once for the job
    step = int(re.match(r"gpufeed train: stopped by SIGINT after step (\d+)", lines[0])[1])
    assert _rank_steps(tmp_path / "run") == {0: list(range(1, step + 1)), 1: list(range(1, step + 1))}
    assert list_checkpoints(tmp_path / "run")[-1].name == f"ckpt-{step:09d}.pt"
    assert "stop at once" not in log.split(lines[0])[1]
    config["train"]["epochs"] = 1 + (step // 3)  # the rest of the epoch it stopped in
    resumed = _start_torchrun(tmp_path, config, "--resume")
    assert resumed.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-3000:]
    every = list(range(1, config["train"]["epochs"] * 3 + 1))
    assert _rank_steps(tmp_path / "run") == {0: every, 1: every}, "every step once on each rank, none lost"


def test_a_signal_to_one_rank_stops_every_rank_after_the_same_step(synth_dir, tmp_path):
    """A rank stopping alone would leave the other waiting for ever in the next gradient all-reduce."""
    proc = _start_torchrun(tmp_path, _ddp_config(synth_dir))
    run, deadline = tmp_path / "run", time.monotonic() + 240
    try:
        while len(step_records(run)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        os.kill(_worker_of_rank(proc, 1), signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "train.log").read_text()
    found = re.search(r"gpufeed train: stopped by SIGTERM after step (\d+) .*its checkpoint is (\S+):", log)
    assert found, log[-3000:]  # said by rank 0, which got no signal: it took rank 1's
    step = int(found[1])
    assert _rank_steps(run) == {0: list(range(1, step + 1)), 1: list(range(1, step + 1))}
    assert found[2] == str(list_checkpoints(run)[-1]) and found[2].endswith(f"ckpt-{step:09d}.pt")
