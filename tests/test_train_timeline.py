"""Steps partition the training timeline: the steps of an epoch add up to its wall time.

``train()`` runs in-process on real DALI batches (images, and depth pairs for a dense model); only
its ``/metrics`` endpoint is left unserved (a unit test may not listen on a socket, and the
endpoint is not what is tested here). Each epoch's wall time is read around the loop's own
``run_epoch``; each step's period comes from the step log.
"""

from __future__ import annotations

import time

import pytest
import torch
from train_support import assert_steps_partition, train_config

from gpufeed.config import parse_config
from gpufeed.synth import write_paired_split
from gpufeed.train import _session, train
from gpufeed.train._loop import Loop
from gpufeed.train._telemetry import read_step_logs

pytestmark = pytest.mark.timeout(300)

# How far the steps of an epoch may be from its wall time: the epoch's set-up (its progress bar,
# the iterator) and its end (the last record's log line, the loader saying it is done) are in no step.
SHARE, ABSOLUTE_S = 0.05, 0.02


class _Unserved:
    """Stands in for the metrics endpoint: the registry is still filled, nothing listens."""

    def __init__(self, registry, host: str, port: int, run_dir, rank: int) -> None:
        self.address = f"{host}:{port}"

    def close(self) -> None:
        pass


@pytest.fixture
def epoch_walls(monkeypatch) -> dict[int, float]:
    """``{epoch: wall seconds of Loop.run_epoch}`` of the next ``train()``, run without a metrics server."""
    monkeypatch.setattr(_session, "MetricsServer", _Unserved)
    walls: dict[int, float] = {}
    run_epoch = Loop.run_epoch

    def timed(self, epoch: int) -> bool:
        started = time.perf_counter()
        try:
            return run_epoch(self, epoch)
        finally:
            walls[epoch] = time.perf_counter() - started

    monkeypatch.setattr(Loop, "run_epoch", timed)
    return walls


def _check(run_dir, walls: dict[int, float], epochs: int, on_cpu: bool) -> None:
    records = read_step_logs(run_dir)[0]
    assert sorted({r["epoch"] for r in records}) == list(range(epochs)) == sorted(walls)
    for epoch, wall_s in walls.items():
        steps = [r for r in records if r["epoch"] == epoch]
        total_s = sum(r["step_s"] for r in steps)
        assert abs(total_s - wall_s) <= SHARE * wall_s + ABSOLUTE_S, (
            f"epoch {epoch}: its {len(steps)} steps add up to {total_s:.3f} s, its wall time is {wall_s:.3f} s"
        )
    assert_steps_partition(records, on_cpu)


# On a GPU, what training may start (DALI's workers, the metrics server) is more than the unit tier
# allows: the GPU twin is a process test (tests/_gpu_checks.py reads what train() can start).
DEVICES_TRAIN = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.process])]


@pytest.mark.parametrize("device", DEVICES_TRAIN)
def test_image_steps_add_up_to_each_epochs_wall_time(synth_dir, tmp_path, epoch_walls, device):
    cfg = train_config(synth_dir, ["train.epochs=2", "train.eval_every_epochs=0"], device=device)
    train(cfg, tmp_path / "run")
    _check(tmp_path / "run", epoch_walls, 2, on_cpu=device == "cpu")


@pytest.mark.parametrize("device", DEVICES_TRAIN)
def test_dense_steps_add_up_to_each_epochs_wall_time(tmp_path, epoch_walls, device):
    root = write_paired_split(tmp_path / "pairs", 12, 96, 72, seed=0)
    mapping = {
        "device": device,
        "seed": 0,
        "data": {"train": {"root": str(root)}, "depth_scale": 0.001},
        "image": {"size_px": [64, 48]},
        "loader": {"batch_size": 4, "num_threads": 2},
        "model": {"name": "unet_resnet18"},
        "train": {"epochs": 2, "progress": False},
        "augment": {"ops": ["color_jitter"]},
        "telemetry": {"metrics_port": 0},
    }
    train(parse_config(mapping), tmp_path / "run")
    _check(tmp_path / "run", epoch_walls, 2, on_cpu=device == "cpu")


def test_steps_queued_ahead_still_add_up_and_keep_their_own_figures(synth_dir, tmp_path, epoch_walls, monkeypatch):
    """The GPU's order on the CPU: each step read after the next is queued, records one step late.

    Every step keeps its own loss and wait (the same as a run that reads each step at once), and
    the periods still add up to the epoch.
    """
    from gpufeed.train import _timeline

    overrides = ["train.epochs=2", "train.eval_every_epochs=0", "telemetry.record_sample_ids=true"]
    torch.manual_seed(0)
    train(train_config(synth_dir, overrides), tmp_path / "at-once")
    at_once = read_step_logs(tmp_path / "at-once")[0]

    made = []

    class Ahead(_timeline.StepTimeline):
        def __init__(self, launch_ahead: bool) -> None:
            super().__init__(launch_ahead=True)
            made.append(self)

    monkeypatch.setattr("gpufeed.train._loop.StepTimeline", Ahead)
    epoch_walls.clear()
    train(train_config(synth_dir, overrides), tmp_path / "ahead")
    assert made, "the loop cuts its epochs with the timeline"
    ahead = read_step_logs(tmp_path / "ahead")[0]
    assert [(r["step"], r["sample_ids"]) for r in ahead] == [(r["step"], r["sample_ids"]) for r in at_once]
    for a, b in zip(ahead, at_once, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), "a step's record holds its own loss"
    for epoch, wall_s in epoch_walls.items():
        total_s = sum(r["step_s"] for r in ahead if r["epoch"] == epoch)
        assert abs(total_s - wall_s) <= SHARE * wall_s + ABSOLUTE_S, (epoch, total_s, wall_s)
    assert_steps_partition(ahead, on_cpu=False)
