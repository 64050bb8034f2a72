"""Every sample exactly once at any world size, with real processes: clip loaders, and ``gpufeed train`` on gloo.

The training runs are real ``torchrun`` jobs on the CPU (gloo), stopped after a checkpoint and
resumed with ``--resume`` on another number of ranks. A kill after a checkpoint is made by
training one step past it and deleting the newer checkpoint: the step logs then hold a step the
resumed run must not count twice, as after a real kill. What the target compares: the sample ids
every rank logged (``telemetry.record_sample_ids``, padding rows marked) over all the runs, as a
multiset, against the uninterrupted epoch's: each sample once.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from videohelp import make_deepethogram_project, write_tagged_store

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.models._io import list_checkpoints
from gpufeed.pipelines import ClipLoader, VideoDataset
from gpufeed.pipelines._deepethogram import project_dataset

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

CPU = DeviceChoice("cpu", None, "test")


# -- clip loaders (clip slots are their samples) ---------------------------------------------------------
def _clip_loader(dataset, k: int, n: int) -> ClipLoader:
    return ClipLoader(
        dataset,
        train=True,
        video_cfg=VideoConfig(clip_length_frames=5, stride_frames=1, size_px=[32, 24]),
        loader_cfg=LoaderConfig(batch_size=3, last_batch="pad", num_threads=1),
        device=CPU,
        seed=4,
        shard_id=k,
        num_shards=n,
    )


def _clips(batch) -> list[tuple[int, int]]:
    valid = batch.valid.tolist()
    pairs = zip(batch.video_ids.tolist(), batch.start_frames.tolist(), strict=True)
    return [pair for pair, real in zip(pairs, valid, strict=True) if real]


def _reshard_clips(dataset, old: int, new: int) -> tuple[Counter, Counter]:
    """(clips read by ``old`` ranks stopped half-way through the epoch plus ``new`` ranks resumed, the whole epoch)."""
    read: Counter = Counter()
    states = []
    for k in range(old):
        loader = _clip_loader(dataset, k, old)
        stop = len(loader) // 2
        for i, batch in enumerate(loader):
            read.update(_clips(batch))
            if i + 1 == stop:
                break
        states.append(loader.state_dict())
        loader.close()
        assert states[-1]["epoch"] == 0 and states[-1]["batch"] == stop > 0, "stopped mid-epoch"
    for k in range(new):
        loader = _clip_loader(dataset, k, new)
        loader.load_state_dict(states)
        for batch in loader:
            read.update(_clips(batch))
        loader.close()
    table = loader.table
    videos, starts = table.clips(np.arange(len(table)), train=True, seed=4, epoch=0)
    return read, Counter(zip(videos.tolist(), starts.tolist(), strict=True))


def test_clip_loaders_of_every_source_resume_on_another_world_size_reading_each_clip_once(synth_dir, tmp_path):
    stores = tmp_path / "stores"
    for video, frames in enumerate((30, 24, 17)):
        write_tagged_store(stores / f"mouse_{video}", video, frames)
        write_tagged_store(stores / f"rat_{video}.h5", video, frames)
    project = make_deepethogram_project(tmp_path / "deg_deepethogram", "hdf5", (20, 16, 18, 22))
    datasets = {
        "videos (PyAV workers)": VideoDataset.from_folder(synth_dir / "videos"),
        "frame folders and HDF5 files": VideoDataset.from_folder(stores),
        "DeepEthogram project": project_dataset(project, split="train", val_fraction=0.25, seed=4),
    }
    for what, dataset in datasets.items():
        for old, new in ((2, 1), (1, 2)):
            read, whole = _reshard_clips(dataset, old, new)
            assert read == whole, f"{what}, {old} -> {new} ranks: clips read other than the epoch's, each once"


# -- gpufeed train under torchrun -------------------------------------------------------------------
def _config(path: Path, synth_dir: Path, batch: int, last_batch: str, list_file: Path | None = None) -> Path:
    mapping = {
        "device": "cpu",
        "seed": 0,
        "data": {"train": {"list_file": str(list_file or Path(synth_dir) / "images" / "train.txt")}},
        "image": {"size_px": 16},
        "loader": {"batch_size": batch, "num_threads": 1, "last_batch": last_batch},
        "model": {"name": "smallcnn"},
        "train": {"epochs": 1, "lr": 0.01, "warmup_steps": 1, "progress": False, "eval_every_epochs": 0},
        "augment": {"ops": []},
        "telemetry": {"metrics_port": 0, "record_sample_ids": True},
    }
    path.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    return path


def _train(ranks: int, cfg: Path, run: Path, *sets: str, resume: bool = False) -> None:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    cmd = [*launcher, *([] if launcher else [sys.executable]), "-m", "gpufeed", "train", "--config", str(cfg)]
    cmd += ["--out", str(run), *(["--resume"] if resume else [])]
    for value in sets:
        cmd += ["--set", value]
    # One thread per rank: up to 4 ranks share this machine's cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _kill_after_checkpoint(run: Path, step: int) -> None:
    """As if killed after ``step`` steps, before that step's checkpoint: the newest checkpoint goes."""
    newest = list_checkpoints(run)[-1]
    assert newest.name == f"ckpt-{step:09d}.pt"
    newest.unlink()


def _read_ids(run: Path) -> tuple[Counter, int]:
    """(every real sample id logged by every rank, padding rows logged) over the run folder's step logs."""
    read: Counter = Counter()
    padding = 0
    for path in sorted(run.glob("steps*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            pad = set(record.get("padding_rows", []))
            read.update(i for row, i in enumerate(record["sample_ids"]) if row not in pad)
            padding += len(pad)
    return read, padding


def _final_position(run: Path) -> dict:
    return torch.load(list_checkpoints(run)[-1], weights_only=True)["loader"][0]


def test_a_run_resumed_from_4_ranks_on_2_then_on_1_reads_each_image_once(synth_dir, tmp_path):
    """96 images, batch 5 per rank, pad: 4 ranks x 5 batches, then the rest on 2 ranks, then on 1."""
    cfg, run = _config(tmp_path / "train.yaml", synth_dir, 5, "pad"), tmp_path / "run"
    started = time.monotonic()
    _train(4, cfg, run, "train.checkpoint_every_steps=2", "train.max_steps=3")
    _kill_after_checkpoint(run, 3)
    _train(2, cfg, run, "train.checkpoint_every_steps=2", "train.max_steps=5", resume=True)
    _kill_after_checkpoint(run, 5)
    state = torch.load(list_checkpoints(run)[-1], weights_only=True)
    assert state["world_size"] == 2 and state["loader"][0]["history"] == [
        {"shards": 4, "consumed": [10, 10, 10, 10], "batch": 2}
    ], "the checkpoint of the 2 ranks records what the 4 read"
    _train(1, cfg, run, resume=True)
    read, padding = _read_ids(run)
    assert sorted(read) == list(range(96)) and set(read.values()) == {1}, "each image once over the three runs"
    # 4 ranks read 2 batches (40); 2 ranks 2 of 6 (20 of the 56 left); 1 rank the 36 left in 8 batches of 5.
    assert padding == 4, "the last world size's padding, marked in the log"
    assert _final_position(run)["epoch"] == 1 and _final_position(run)["batch"] == 0
    steps = [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13)), "rank 0 logged every step once: 2 + 2 + 8"
    print(f"4 -> 2 -> 1 ranks: {time.monotonic() - started:.0f} s")


def test_a_run_resumed_from_1_rank_on_2_reads_each_image_once(synth_dir, tmp_path):
    """drop: 1 rank reads 6 batches of 4; the 72 left split evenly over 2 ranks, so none sits out."""
    cfg, run = _config(tmp_path / "train.yaml", synth_dir, 4, "drop"), tmp_path / "run"
    _train(1, cfg, run, "train.checkpoint_every_steps=6", "train.max_steps=7")
    _kill_after_checkpoint(run, 7)
    _train(2, cfg, run, resume=True)
    read, padding = _read_ids(run)
    assert sorted(read) == list(range(96)) and set(read.values()) == {1} and padding == 0
    assert _final_position(run)["epoch"] == 1


def test_a_resume_on_more_ranks_keeps_the_learning_rate_going_down_to_the_runs_last_step(synth_dir, tmp_path):
    """2 epochs of 24 steps on 1 rank, stopped at step 30; the 72 images left on 2 ranks are 9 steps more.

    The schedule used to take its length from the new rank count from step 0 (2 x 12 = 24 steps):
    every step after the resume sat at the floor. It now goes on from where it stood to step 39.
    """
    cfg, run = _config(tmp_path / "train.yaml", synth_dir, 4, "drop"), tmp_path / "run"
    sets = ("train.epochs=2", "train.schedule=cosine", "train.warmup_steps=0")
    _train(1, cfg, run, *sets, "train.checkpoint_every_steps=30", "train.max_steps=30")
    _train(2, cfg, run, *sets, resume=True)
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run / "steps.jsonl").read_text().splitlines())}
    assert sorted(lrs) == list(range(1, 40)), "30 steps on 1 rank, then 9 on 2"
    before, after = lrs[30], [lrs[k] for k in range(31, 40)]
    assert 0 < after[0] < before, f"the rate goes on from {before} (it was {after[0]})"
    assert all(b < a for a, b in itertools.pairwise(after)), f"still going down: {after}"
    assert after[-1] < 0.05 * lrs[1], f"near the floor at the run's last step: {after[-1]}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_ranks_reading_different_file_lists_all_stop_naming_each_ranks_view(synth_dir, tmp_path):
    """Rank 1's list file lacks one image (a node with a stale copy): both ranks stop before any step."""
    full = Path(synth_dir) / "images" / "train.txt"
    stale = tmp_path / "stale" / "train.txt"
    stale.parent.mkdir()
    (stale.parent / "classes.txt").write_bytes((full.parent / "classes.txt").read_bytes())
    lines = full.read_text(encoding="utf-8").splitlines()
    base = full.parent
    stale.write_text("".join(f"{base / ln.split()[0]} {ln.split()[1]}\n" for ln in lines[:-1]), encoding="utf-8")
    configs = [_config(tmp_path / f"rank{r}.yaml", synth_dir, 4, "drop", lst) for r, lst in enumerate((full, stale))]
    port, procs = _free_port(), []
    started = time.monotonic()
    for rank, cfg in enumerate(configs):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": "0",  # one rank per node, as with two nodes
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        cmd = [sys.executable, "-m", "gpufeed", "train", "--config", str(cfg), "--out", str(tmp_path / "run")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise AssertionError("a rank still ran after 180 s (hung)") from None
        outputs.append((proc.returncode, err))
    took = time.monotonic() - started
    host = socket.gethostname()
    for code, err in outputs:
        assert code == 2 and "Traceback" not in err, err[-3000:]
        line = next(ln for ln in err.splitlines() if "the ranks disagree" in ln)
        assert "the ranks disagree on the training data (index), so their shares would not cover each epoch" in line
        assert f"rank 0 on {host}: index " in line and f", 96 samples, list file {full}" in line, line
        assert f"rank 1 on {host}: index " in line and f", 95 samples, list file {stale}" in line, line
    assert not (tmp_path / "run" / "steps.jsonl").exists(), "no step was taken"
    assert took < 120, f"took {took:.0f} s"
