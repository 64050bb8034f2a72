"""The training loop's parts on their own: metrics, tasks, augmentation, schedule, checkpoints."""

from __future__ import annotations

import itertools
import json
import math
import random

import numpy as np
import pytest
import torch
from prometheus_client import generate_latest

from gpufeed.config import AugmentConfig, ConfigError, TrainConfig, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.models._io import list_checkpoints
from gpufeed.train._augment import build_augmenter
from gpufeed.train._checkpoint import (
    capture_rng,
    load_latest_checkpoint,
    remove_stale_temp_files,
    restore_rng,
    save_checkpoint,
    temp_path,
)
from gpufeed.train._optim import lr_factor, resolve_amp
from gpufeed.train._profiling import parse_profile_steps
from gpufeed.train._summary import format_summary, summarize
from gpufeed.train._tasks import Accuracy, ImageTask, MultiLabelF1
from gpufeed.train._telemetry import StepRecord, TrainMetrics

CONTRACT_METRICS = {
    "gpufeed_train_loader_wait_seconds": "histogram",
    "gpufeed_train_augment_seconds": "histogram",
    "gpufeed_train_compute_seconds": "histogram",
    "gpufeed_train_step_seconds": "histogram",
    "gpufeed_train_samples_total": "counter",
    "gpufeed_train_steps_total": "counter",
    "gpufeed_train_skipped_samples_total": "counter",
    "gpufeed_train_epoch": "gauge",
    "gpufeed_train_loss": "gauge",
}


def _record(step, wait, augment, compute, batch=1, samples=16):
    return StepRecord(step, 0, batch, 3, 0.0, wait, augment, compute, wait + augment + compute, samples, 0.5, 1e-3)


def test_metric_names_types_and_labels_follow_the_contract():
    metrics = TrainMetrics(rank=3)
    metrics.observe(_record(1, 0.002, 0.001, 0.02))
    metrics.observe(_record(2, 0.2, 0.001, 0.02))
    registry = metrics.registry
    families = {m.name: m for m in registry.collect()}
    found = {(m.name + "_total" if m.type == "counter" else m.name): m.type for m in families.values()}
    assert found == CONTRACT_METRICS
    assert registry.get_sample_value("gpufeed_train_loader_wait_seconds_count", {"rank": "3"}) == 2
    assert registry.get_sample_value("gpufeed_train_loader_wait_seconds_bucket", {"rank": "3", "le": "0.005"}) == 1
    assert registry.get_sample_value("gpufeed_train_samples_total", {"rank": "3"}) == 32
    assert registry.get_sample_value("gpufeed_train_step_seconds_sum", {"rank": "3"}) == pytest.approx(0.244)
    text = generate_latest(registry).decode()
    labels = {line.split("{", 1)[1].split("}", 1)[0] for line in text.splitlines() if "{" in line}
    assert all(set(part.split("=")[0] for part in label.split(",")) <= {"rank", "le"} for label in labels)


def test_accuracy_counts_valid_rows_only():
    metric = Accuracy()
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 1.0]])
    metric.update(logits, torch.tensor([0, 0, 0, 1]), torch.tensor([True, True, True, False]))
    result = metric.compute()
    assert result["samples"] == 3 and result["accuracy"] == pytest.approx(2 / 3)
    expected_loss = torch.nn.functional.cross_entropy(logits[:3], torch.tensor([0, 0, 0]))
    assert result["loss"] == pytest.approx(float(expected_loss), rel=1e-6)


def test_multilabel_f1_matches_hand_counts():
    metric = MultiLabelF1(3, ("a", "b", "c"))
    # class a: TP 2, FP 1, FN 0 -> 4/5; class b: TP 0, FP 0, FN 1 -> 0; class c: never present or predicted.
    logits = torch.tensor([[5.0, -5.0, -5.0], [5.0, -5.0, -5.0], [5.0, -5.0, -5.0], [-5.0, -5.0, -5.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    metric.update(logits[:2], targets[:2])
    metric.update(logits[2:], targets[2:])
    metric.update(logits[:1], 1 - targets[:1], torch.tensor([False]))  # padding row: ignored
    result = metric.compute()
    assert result["f1"] == {"a": pytest.approx(0.8), "b": 0.0, "c": None}
    assert result["macro_f1"] == pytest.approx(0.4) and result["samples"] == 4


def test_image_loss_ignores_padding_rows():
    task = ImageTask(3)
    logits, targets = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    valid = torch.tensor([True, True, False, True])
    expected = torch.nn.functional.cross_entropy(logits[valid], targets[valid])
    assert torch.allclose(task.loss(logits, targets, valid), expected)


@pytest.mark.parametrize("op", ["color_jitter", "grayscale", "gaussian_blur", "rotation", "erasing", "horizontal_flip"])
def test_every_augment_op_keeps_the_uint8_contract(op):
    cfg = parse_config({"augment": {"ops": [op], op: {"p": 1.0}}}).augment
    augment = build_augmenter(cfg)
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 24, 24), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    out = augment(images)
    assert out.dtype == torch.uint8 and out.shape == images.shape
    assert not torch.equal(out, images), f"{op} at p=1 changes the pixels"
    with pytest.raises(ValueError, match=r"uint8 \(N, 3, H, W\)"):
        augment(images.float())


def test_clip_augmentation_is_the_same_on_every_frame_of_a_clip():
    cfg = parse_config(
        {"augment": {"ops": ["color_jitter", "rotation"], "color_jitter": {"p": 1.0}, "rotation": {"p": 1.0}}}
    )
    augment = build_augmenter(cfg.augment, clips=True)
    frame = torch.randint(0, 256, (2, 3, 1, 20, 20), dtype=torch.uint8)
    clips = frame.expand(2, 3, 5, 20, 20).contiguous()  # every frame of a clip identical
    out = augment(clips)
    assert out.shape == clips.shape and out.dtype == torch.uint8
    for t in range(1, 5):
        assert torch.equal(out[:, :, t], out[:, :, 0]), "one set of parameters per clip"
    assert not torch.equal(out[:, :, 0], clips[:, :, 0])
    assert not torch.equal(out[0, :, 0], out[1, :, 0]), "different clips, different parameters"
    images = clips[:, :, 0]
    assert build_augmenter(AugmentConfig(ops=()))(images) is images, "no ops: passed through untouched"


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(warmup_steps=4, schedule="cosine", min_lr_fraction=0.1)
    factors = [lr_factor(step, 20, cfg) for step in range(21)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4] == pytest.approx(1.0) and factors[20] == pytest.approx(0.1)
    assert factors[12] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in itertools.pairwise(factors[4:])), "monotone decay"
    linear = TrainConfig(schedule="linear")
    assert lr_factor(5, 10, linear) == pytest.approx(0.5)
    assert lr_factor(7, 10, TrainConfig(schedule="constant")) == 1.0


@pytest.mark.parametrize("native", [True, False])
def test_amp_auto_takes_bf16_only_where_the_gpu_has_it_natively(monkeypatch, native):
    """torch counts emulated bf16 (a T4's) as supported unless asked not to; auto must then take fp16."""
    # A GPU whose bf16 is native (an A100) or emulated only: torch's own answer for each question.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    gpu = DeviceChoice("gpu", 0, "test")
    assert resolve_amp("auto", gpu) is (torch.bfloat16 if native else torch.float16)
    assert resolve_amp("fp16", gpu) is torch.float16
    if native:
        assert resolve_amp("bf16", gpu) is torch.bfloat16
    else:
        with pytest.raises(ConfigError, match=r"train\.amp.*bf16 is not supported by Tesla T4; use fp16"):
            resolve_amp("bf16", gpu)


def test_checkpoints_are_written_atomically_and_pruned(tmp_path):
    payload = {"model": {"w": torch.arange(4.0)}, "model_spec": {}, "optimizer": {}, "step": 0, "loader": []}
    for step in (1, 2, 3):
        save_checkpoint({**payload, "step": step}, tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000002.pt", "ckpt-000000003.pt"]
    stray = temp_path(tmp_path / "checkpoints" / "ckpt-000000004.pt")
    stray.write_bytes(b"half a checkpoint")
    assert stray.name.startswith(".") and stray not in list_checkpoints(tmp_path)
    path, state = load_latest_checkpoint(tmp_path)
    assert path.name == "ckpt-000000003.pt" and state["step"] == 3
    assert remove_stale_temp_files(tmp_path) == [stray] and not stray.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000002.pt", "ckpt-000000003.pt"]


def test_no_loadable_checkpoint_is_an_error_naming_each_file(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / "ckpt-000000005.pt").write_bytes(b"not a zip")
    torch.save({"weights": 1}, folder / "ckpt-000000006.pt")
    with pytest.raises(ValueError, match=r"ckpt-000000006\.pt: not a gpufeed training checkpoint") as info:
        load_latest_checkpoint(tmp_path)
    assert "ckpt-000000005.pt" in str(info.value)
    assert load_latest_checkpoint(tmp_path / "empty") is None


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1)
    random.seed(2)
    np.random.seed(3)
    state = capture_rng()
    expected = (torch.rand(3), random.random(), np.random.rand())
    path = save_checkpoint({"rng": [state]}, tmp_path, 1)
    loaded = torch.load(path, weights_only=True)["rng"][0]
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    restore_rng(loaded)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], again[0]) and expected[1:] == again[1:]


def test_summary_shares_and_table():
    records = [_record(1, 0.5, 0.0, 0.1, batch=0)] + [_record(i, 0.01, 0.01, 0.08) for i in range(2, 11)]
    summary = summarize([r.__dict__ for r in records])
    assert summary["steps"] == 10 and summary["samples"] == 160
    total = 0.6 + 9 * 0.1
    assert summary["loader_wait_share"] == pytest.approx((0.5 + 9 * 0.01) / total)
    assert summary["steady_loader_wait_share"] == pytest.approx(0.1)
    assert summary["stages"]["compute_s"]["p50_s"] == pytest.approx(0.08)
    table = format_summary(summary, "title")
    assert "loader wait" in table and "10 steps, 160 samples" in table and "10.0% without" in table


def test_host_launch_is_summarised_where_every_step_has_it():
    """A GPU run's records carry launch_s: a stage of its own; a CPU run's (None) leave it out."""
    records = [_record(i, 0.01, 0.01, 0.08) for i in range(1, 11)]
    cpu = summarize([r.__dict__ for r in records])
    assert "launch_s" not in cpu["stages"] and "host launch" not in format_summary(cpu)
    assert "launch_s" not in json.loads(records[0].to_json()), "omitted from the step log where not measured"
    for i, record in enumerate(records):
        record.launch_s = 0.002 * (i + 1)
    gpu = summarize([json.loads(r.to_json()) for r in records])
    assert gpu["stages"]["launch_s"]["total_s"] == pytest.approx(0.11)
    assert gpu["stages"]["launch_s"]["share"] == pytest.approx(0.11 / 1.0)
    rows = format_summary(gpu).splitlines()
    assert [row.split()[0] for row in rows[2:7]] == ["loader", "augment", "compute", "host", "step"]
    records[3].launch_s = None  # one step without it: the stage would cover some steps only
    assert "launch_s" not in summarize([r.__dict__ for r in records])["stages"]


@pytest.mark.parametrize(("text", "ok"), [("3:7", (3, 7)), ("5:5", (5, 5)), ("0:3", None), ("7:3", None), ("x", None)])
def test_profile_steps_parsing(text, ok):
    if ok:
        assert parse_profile_steps(text) == ok
    else:
        with pytest.raises(ValueError, match="--profile-steps"):
            parse_profile_steps(text)


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"augment": {"ops": ["rotate"]}}, "augment.ops[0]", "allowed: color_jitter, grayscale"),
        ({"augment": {"ops": ["erasing", "erasing"]}}, "augment.ops", "listed twice"),
        ({"augment": {"gaussian_blur": {"kernel_size_px": 4}}}, "augment.gaussian_blur.kernel_size_px", "odd"),
        ({"augment": {"erasing": {"scale": [0.5, 0.1]}}}, "augment.erasing.scale", "is empty"),
        ({"train": {"amp": "fp8"}}, "train.amp", "allowed: auto, bf16, fp16, off"),
        ({"train": {"schedule": "step"}}, "train.schedule", "allowed: cosine, linear, constant"),
        ({"train": {"lr": 0}}, "train.lr", "must be > 0.0"),
        ({"train": {"epochs": 0}}, "train.epochs", "must be >= 1"),
        ({"train": {"max_steps": 0}}, "train.max_steps", "must be >= 1"),
        ({"train": {"label_smoothing": 1.0}}, "train.label_smoothing", "must be < 1.0"),
        ({"model": {"num_classes": 0}}, "model.num_classes", "must be >= 1"),
        ({"model": {"std": [0.2, 0.0, 0.2]}}, "model.std", "must be > 0.0"),
        ({"model": {"size_px": 64}}, "model.size_px", "unknown key"),
        ({"telemetry": {"metrics_port": 70000}}, "telemetry.metrics_port", "must be <= 65535"),
        ({"telemetry": {"linger_seconds": -1}}, "telemetry.linger_seconds", "must be >= 0.0"),
    ],
)
def test_training_config_errors_name_the_key(data, key, words):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key_path == key and words in str(info.value)


def test_training_keys_are_described_with_contract_defaults():
    from gpufeed.config import describe_config

    rows = {row[0]: row for row in describe_config()}
    for key in ("train.epochs", "train.amp", "augment.ops", "model.name", "telemetry.metrics_port"):
        assert rows[key][3], f"{key} has a description"
    cfg = parse_config(None)
    assert (cfg.telemetry.metrics_host, cfg.telemetry.metrics_port, cfg.telemetry.linger_seconds) == (
        "127.0.0.1",
        9400,
        0.0,
    )


def test_a_resume_seeds_the_generators_a_checkpoint_does_not_hold_per_rank():
    """A CPU-written checkpoint resumed on GPUs: each rank's device generator is seeded afresh (the
    session's common seed would otherwise give every rank the same device-drawn augmentations)."""
    from gpufeed.train._run_state import resume_generators

    torch.manual_seed(1)
    cpu_written = capture_rng()
    assert cpu_written["cuda"] is None, "this machine has no CUDA"
    gpu_written = {**cpu_written, "cuda": torch.zeros(16, dtype=torch.uint8)}
    assert resume_generators([cpu_written, cpu_written], 1, on_gpu=True) == (cpu_written, "cuda")
    assert resume_generators([cpu_written, cpu_written], 1, on_gpu=False) == (cpu_written, "none")
    assert resume_generators([gpu_written], 0, on_gpu=True) == (gpu_written, "none")
    assert resume_generators([gpu_written], 2, on_gpu=True) == (None, "all"), "a rank it has none for"
    assert resume_generators([], 0, on_gpu=False) == (None, "all")
