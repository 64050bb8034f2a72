"""Dense training in-process: unet_resnet18 on real DALI batches of synthetic RGB + depth / mask pairs.

Also the masked metrics against hand-computed values, and exact resume.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from train_support import assert_steps_partition

from gpufeed.config import ConfigError, parse_config
from gpufeed.models import export_model, load_model
from gpufeed.synth import write_paired_split
from gpufeed.train import train
from gpufeed.train._dense import DepthTask, SegmentationTask
from gpufeed.train._errors import TrainError

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dense")
    write_paired_split(root / "train", 12, 96, 72, seed=0)
    write_paired_split(root / "val", 4, 96, 72, seed=1)
    return root


def _config(root: Path, overrides=()):
    mapping = {
        "device": "cpu",
        "seed": 0,
        "data": {"train": {"root": str(root / "train")}, "val": {"root": str(root / "val")}, "depth_scale": 0.001},
        "image": {"size_px": [64, 48], "crop_area": [0.5, 1.0]},
        "loader": {"batch_size": 4, "num_threads": 2},
        "model": {"name": "unet_resnet18"},
        "train": {"epochs": 2, "lr": 0.003, "progress": False},
        "augment": {"ops": ["color_jitter", "horizontal_flip"]},
        "telemetry": {"metrics_port": 0},
    }
    return parse_config(mapping, list(overrides))


def test_depth_trains_evaluates_and_reports_loader_vs_compute(dense_dir, tmp_path):
    result = train(_config(dense_dir), tmp_path / "run")
    assert result.step == 6 and result.epoch == 2, "2 epochs of 12 pairs in batches of 4"
    evaluations = [json.loads(line) for line in (tmp_path / "run" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluations] == [3, 6]
    last = evaluations[-1]
    assert last["samples"] == 4 and last["pixels"] > 0
    assert {"abs_rel", "rmse", "delta1", "loss"} <= set(last) and 0 <= last["delta1"] <= 1
    records = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert all(r["loader_wait_s"] >= 0 and r["compute_s"] > 0 for r in records)
    assert_steps_partition(records, on_cpu=True)
    assert 0 < result.summary["loader_wait_share"] < 1
    model = load_model(tmp_path / "run")
    assert model.spec.task == "depth" and model.spec.num_classes == 1
    # Export: normalisation inside, the maps' shape in the card, onnxruntime agreeing with PyTorch.
    card = export_model(tmp_path / "run", tmp_path / "model", batch_sizes=[1, 2])
    assert card.to_dict()["output"]["shape"] == [2, 1, 48, 64] and "depth per pixel" in card.to_dict()["scores"]
    assert card.parity["max_abs_diff"] <= card.parity["tolerance"]


def test_segmentation_trains_and_needs_its_classes(dense_dir, tmp_path):
    overrides = ["model.task=segmentation", "train.max_steps=2"]
    with pytest.raises(ConfigError, match=r"model\.num_classes"):
        train(_config(dense_dir, overrides), tmp_path / "none")
    result = train(_config(dense_dir, [*overrides, "model.num_classes=4"]), tmp_path / "seg")
    last = result.evaluations[-1]
    assert {"miou", "pixel_accuracy", "iou"} <= set(last) and 0 <= last["pixel_accuracy"] <= 1
    assert load_model(tmp_path / "seg").spec.task == "segmentation"
    # Mask ids 1..3 need 4 classes: 3 is a one-line error naming the id and the mask files, not a device assert.
    with pytest.raises(
        TrainError, match=r"mask id 3 in \S+/mask/\S+\.png, .* \(the training split\) is outside the 3 classes 0\.\.2"
    ):
        train(_config(dense_dir, [*overrides, "model.num_classes=3"]), tmp_path / "three")


def test_a_flip_on_the_device_is_refused_for_dense_models(dense_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"augment\.horizontal_flip\.where"):
        train(_config(dense_dir, ["augment.horizontal_flip.where=torch"]), tmp_path / "run")


def _same_bits(a_path, b_path) -> list[str]:
    """Names of the weights and buffers that differ in any bit between two checkpoints."""
    a = torch.load(a_path, map_location="cpu", weights_only=True)["model"]
    b = torch.load(b_path, map_location="cpu", weights_only=True)["model"]
    return [name for name in a if not torch.equal(a[name], b[name])]


def test_dense_resume_continues_exactly_like_a_straight_run(dense_dir, tmp_path):
    straight = train(_config(dense_dir, ["train.max_steps=5"]), tmp_path / "straight")
    train(_config(dense_dir, ["train.max_steps=2"]), tmp_path / "split")
    second = train(_config(dense_dir, ["train.max_steps=5"]), tmp_path / "split", resume=True)
    assert second.step == 5 and second.summary["steps"] == 3
    assert _same_bits(straight.checkpoint, second.checkpoint) == [], "bit for bit, not within a tolerance"
    a = torch.load(straight.checkpoint, map_location="cpu", weights_only=True)
    b = torch.load(second.checkpoint, map_location="cpu", weights_only=True)
    assert a["loader"] == b["loader"] and a["threads"] == b["threads"] == [torch.get_num_threads()]


def test_two_identical_dense_runs_give_bit_identical_weights(dense_dir, tmp_path):
    """Data order, crops, flips, colour draws and CPU kernels at a fixed thread count: nothing left to chance."""
    small = ["train.max_steps=4", "image.size_px=32"]
    first = train(_config(dense_dir, small), tmp_path / "a")
    second = train(_config(dense_dir, small), tmp_path / "b")
    assert _same_bits(first.checkpoint, second.checkpoint) == []
    losses = [
        [json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()]
        for run in (tmp_path / "a", tmp_path / "b")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 4


def test_a_resume_with_another_cpu_thread_count_is_warned_of(dense_dir, tmp_path, caplog):
    """Another thread count changes a CPU step's last bits: the resume says so, and how to avoid it."""
    run = tmp_path / "run"
    train(_config(dense_dir, ["train.max_steps=1", "image.size_px=32"]), run)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        train(_config(dense_dir, ["train.max_steps=2", "image.size_px=32"]), run, resume=True)
    finally:
        torch.set_num_threads(threads)
    assert f"computing with {threads} CPU threads, this one has {threads + 1}" in caplog.text
    assert f"OMP_NUM_THREADS={threads}" in caplog.text


def test_depth_metrics_and_loss_leave_out_no_data_and_padding():
    task = DepthTask(depth_scale=0.5, no_data=0)
    targets = torch.tensor([[[2, 4], [0, 8]], [[6, 6], [6, 6]]], dtype=torch.int32)  # metres: 1, 2, -, 4
    logits = torch.tensor([[[1.0, 3.0], [9.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]]).unsqueeze(1)
    valid = torch.tensor([True, False])  # the second row is padding
    assert float(task.loss(logits, targets, valid)) == pytest.approx((0 + 1 + 0) / 3)
    metric = task.new_metric()
    metric.update(logits, targets, valid)
    out = metric.compute()
    assert out["pixels"] == 3 and out["samples"] == 1
    assert out["abs_rel"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert out["rmse"] == pytest.approx(math.sqrt(1 / 3))
    assert out["delta1"] == pytest.approx(2 / 3)  # 3 / 2 = 1.5 is outside 1.25


def test_segmentation_metrics_ignore_the_ignore_id():
    task = SegmentationTask(num_classes=2, labels=("bg", "fg"), ignore_id=255)
    targets = torch.tensor([[[0, 1], [1, 255]]])
    logits = torch.tensor([[[[5.0, 0.0], [5.0, 5.0]], [[0.0, 5.0], [0.0, 0.0]]]])  # predicts 0, 1, 0, 0
    metric = task.new_metric()
    metric.update(logits, targets)
    out = metric.compute()
    assert out["pixels"] == 3 and out["pixel_accuracy"] == pytest.approx(2 / 3)
    assert out["iou"] == {"bg": pytest.approx(1 / 2), "fg": pytest.approx(1 / 2)}
    assert out["miou"] == pytest.approx(1 / 2)


def test_segmentation_from_a_list_file_is_inferred_from_its_maps(dense_dir, tmp_path):
    lines = [f"rgb/{i:06d}.jpg mask/{i:06d}.png" for i in range(8)]
    (dense_dir / "train" / "masks.txt").write_text("\n".join(lines) + "\n")
    mapping = {
        "device": "cpu",
        "data": {"train": {"list_file": str(dense_dir / "train" / "masks.txt")}},
        "image": {"size_px": 32},
        "loader": {"batch_size": 4, "num_threads": 2},
        "model": {"name": "unet_resnet18", "num_classes": 4},
        "train": {"epochs": 1, "progress": False},
        "telemetry": {"metrics_port": 0},
    }
    result = train(parse_config(mapping), tmp_path / "run")
    assert result.step == 2
    spec = load_model(tmp_path / "run").spec
    assert spec.task == "segmentation" and spec.num_classes == 4 and spec.map_fill == 255
