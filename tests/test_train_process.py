"""``gpufeed train`` as real processes: the metrics endpoint, a Chrome trace, kill -9, torchrun DDP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from train_support import gpufeed_cmd, run_gpufeed, write_train_config

from gpufeed.models import create_model, load_model
from gpufeed.models._io import list_checkpoints
from gpufeed.train._checkpoint import param_digest
from gpufeed.train._profiling import STAGE_NAMES

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

HISTOGRAMS = ("loader_wait", "augment", "compute", "step")


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"training exited ({proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _scrape(address: str) -> dict:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted(sample.labels.items()))
            samples[(sample.name, labels)] = sample.value
    return samples


def test_metrics_endpoint_profile_trace_and_report(synth_dir, tmp_path):
    cfg = write_train_config(tmp_path / "train.yaml", synth_dir)
    run = tmp_path / "run"
    args = ["train", "--config", str(cfg), "--out", str(run), "--profile-steps", "2:3"]
    args += ["--set", "train.max_steps=8", "--set", "telemetry.linger_seconds=120"]
    proc = subprocess.Popen(gpufeed_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        address = _wait_for(
            lambda: (run / "metrics-rank0.addr").is_file() and (run / "metrics-rank0.addr").read_text().strip(),
            120,
            proc,
            "the metrics address file",
        )
        rank = (("rank", "0"),)
        _wait_for(lambda: (run / "summary.json").is_file(), 120, proc, "the end of training")
        steps = _scrape(address)
        assert steps[("gpufeed_train_steps_total", rank)] == 8
        for name in HISTOGRAMS:
            assert steps[(f"gpufeed_train_{name}_seconds_count", rank)] == 8, name
            assert steps[(f"gpufeed_train_{name}_seconds_sum", rank)] > 0, name
            assert steps[(f"gpufeed_train_{name}_seconds_bucket", (("le", "+Inf"), ("rank", "0")))] == 8, name
        assert steps[("gpufeed_train_samples_total", rank)] == 8 * 16
        assert steps[("gpufeed_train_skipped_samples_total", rank)] == 0
        assert steps[("gpufeed_train_epoch", rank)] == 1, "steps 7 and 8 are in the second epoch"
        assert steps[("gpufeed_train_loss", rank)] > 0
        assert all(dict(labels).keys() <= {"rank", "le"} for _, labels in steps), "no unbounded labels"
        assert proc.poll() is None, "the endpoint lingers after training"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert "loader wait" in out and "share of step time" in out, out + err

    trace = json.loads((run / "trace-steps2-3-rank0.json").read_text())
    names = [event.get("name") for event in trace["traceEvents"]]
    for stage in STAGE_NAMES:
        assert names.count(stage) == 2, f"{stage} appears once per profiled step"

    report = run_gpufeed("report", str(run))
    assert report.returncode == 0, report.stderr
    png = (run / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "8 steps, 128 samples" in report.stdout


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(synth_dir, tmp_path):
    cfg = write_train_config(tmp_path / "train.yaml", synth_dir)
    run = tmp_path / "run"
    args = ["train", "--config", str(cfg), "--out", str(run), "--set", "train.checkpoint_every_steps=2"]
    env = {**os.environ, "GPUFEED_CHECKPOINT_CHUNK_DELAY_MS": "400"}  # each 256 KiB chunk pauses: a slow disk
    proc = subprocess.Popen(gpufeed_cmd(*args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = run / "checkpoints"
    try:
        temp = _wait_for(
            lambda: (
                (folder / "ckpt-000000002.pt").is_file()
                and next((p for p in folder.glob(".ckpt-000000004.pt.tmp-*") if p.stat().st_size > 0), None)
            ),
            120,
            proc,
            "the write of the second checkpoint",
        )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert temp.exists(), "killed mid-write: the partial temporary file is still there"
    assert [p.name for p in list_checkpoints(run)] == ["ckpt-000000002.pt"], "the partial write is not a checkpoint"
    state = torch.load(folder / "ckpt-000000002.pt", weights_only=True)
    assert state["step"] == 2
    load_model(run)  # the newest checkpoint loads

    resumed = run_gpufeed("train", "--config", str(cfg), "--out", str(run), "--resume", "--set", "train.max_steps=5")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr and "step 2" in resumed.stderr
    assert not temp.exists(), "the stale temporary file is cleaned up"
    assert list_checkpoints(run)[-1].name == "ckpt-000000005.pt"
    steps = [json.loads(line)["step"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5], "steps after the last checkpoint are logged once, not twice"


def test_two_process_ddp_run_reads_disjoint_shards_and_agrees_on_weights(synth_dir, tmp_path):
    cfg = write_train_config(tmp_path / "train.yaml", synth_dir)
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "gpufeed", "train"]
    cmd += ["--config", str(cfg), "--out", str(run), "--set", "train.max_steps=2"]
    cmd += ["--set", "telemetry.record_sample_ids=true", "--set", "augment.ops=[]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    logs = {}
    for rank, name in ((0, "steps.jsonl"), (1, "steps-rank1.jsonl")):
        logs[rank] = [json.loads(line) for line in (run / name).read_text().splitlines()]
        assert [r["step"] for r in logs[rank]] == [1, 2] and {r["rank"] for r in logs[rank]} == {rank}
    for step in range(2):
        ids0, ids1 = logs[0][step]["sample_ids"], logs[1][step]["sample_ids"]
        assert len(ids0) == len(ids1) == 16
        assert not set(ids0) & set(ids1), "each rank reads its own shard"
    seen = [i for rank in logs for r in logs[rank] for i in r["sample_ids"]]
    assert len(set(seen)) == 64, "64 distinct images in 2 steps of 2 x 16"

    summary = json.loads((run / "summary.json").read_text())
    digests = [entry["param_digest"] for entry in summary["ranks"]]
    assert [entry["rank"] for entry in summary["ranks"]] == [0, 1] and digests[0] == digests[1]
    assert summary["job"]["steps"] == 2 and summary["job"]["worst_rank"] in (0, 1), "the job's loader wait, over ranks"
    assert "[rank 1]" in proc.stderr, "each rank's log lines say which rank"
    state = torch.load(list_checkpoints(run)[-1], weights_only=True)
    assert state["world_size"] == 2 and len(state["loader"]) == 2 and len(state["rng"]) == 2
    assert param_digest(load_model(run)) == digests[0], "the checkpoint holds the weights both ranks have"
    torch.manual_seed(0)
    fresh = create_model("smallcnn", num_classes=4, size_px=32)
    assert param_digest(fresh) != digests[0], "and they moved from the initial weights"
    ports = {(run / f"metrics-rank{r}.addr").read_text().strip() for r in range(2)}
    assert len(ports) == 2, "each rank serves its own metrics"


def test_cli_errors_are_one_line_with_exit_status_2(synth_dir, tmp_path):
    cfg = write_train_config(tmp_path / "train.yaml", synth_dir)
    bad = run_gpufeed("train", "--config", str(cfg), "--set", "train.amp=fast", "--out", str(tmp_path / "run"))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "config key 'train.amp': value 'fast' is not allowed; allowed: auto, bf16, fp16, off" in bad.stderr
    profile = run_gpufeed("train", "--config", str(cfg), "--profile-steps", "9:3")
    assert profile.returncode == 2 and "--profile-steps '9:3': need 1 <= A <= B" in profile.stderr
    report = run_gpufeed("report", str(tmp_path))
    assert report.returncode == 2 and f"no step log in {tmp_path}" in report.stderr
