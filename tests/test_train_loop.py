"""The training loop in-process on real DALI batches of the synthetic JPEG/PNG dataset."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import DEVICES
from train_support import assert_steps_partition, train_config

from gpufeed.config import ConfigError, SizePx, load_config
from gpufeed.models import load_model
from gpufeed.models._io import list_checkpoints
from gpufeed.pipelines import ImageDataset
from gpufeed.train import TrainError, train
from gpufeed.train._telemetry import STEP_FIELDS

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.mark.parametrize("device", DEVICES)
def test_training_learns_and_leaves_a_complete_run_folder(synth_dir, tmp_path, device):
    cfg = train_config(synth_dir, ["train.keep_checkpoints=2"], device=device)
    result = train(cfg, tmp_path / "run")
    run = result.run_dir

    assert result.step == 36 and result.epoch == 6, "6 epochs of 96 images in batches of 16"
    records = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 37))
    # Host launch time is recorded on a GPU only (on the CPU launching a step runs it).
    unrecorded = {"sample_ids", "padding_rows"} | (set() if device == "gpu" else {"launch_s"})
    assert set(STEP_FIELDS) - unrecorded == set(records[0])
    first, last = records[:6], records[-6:]
    assert sum(r["loss"] for r in last) < 0.5 * sum(r["loss"] for r in first), "the loss falls"
    for r in records:
        assert r["loader_wait_s"] >= 0 and r["augment_s"] > 0 and r["compute_s"] > 0
        assert device == "cpu" or r["launch_s"] > 0
    assert_steps_partition(records, on_cpu=device == "cpu")

    evaluations = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evaluations] == [6, 12, 18, 24, 30, 36], "one evaluation per epoch"
    assert all(e["samples"] == 32 for e in evaluations), "every validation image, once"
    assert evaluations[-1]["accuracy"] >= 0.75, f"4 classes: chance is 0.25, got {evaluations}"

    assert [p.name for p in list_checkpoints(run)] == ["ckpt-000000030.pt", "ckpt-000000036.pt"]
    assert result.checkpoint == run / "checkpoints" / "ckpt-000000036.pt"
    model = load_model(run)
    assert model.spec.size_px == SizePx(32, 32) and model.spec.labels == ("amber", "birch", "cedar", "daisy")
    assert model.spec.eval_crop_fraction == cfg.image.eval_crop_fraction
    assert load_config(run / "config.yaml") == cfg, "the resolved config is saved with the run"

    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == 36 and summary["ranks"][0]["summary"]["steps"] == 36
    assert 0 < summary["ranks"][0]["summary"]["loader_wait_share"] < 1
    host, port = (run / "metrics-rank0.addr").read_text().strip().rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    if device == "gpu":
        assert "cuda" in result.device and summary["amp"] in ("bfloat16", "float16")


def _weights_and_moments(path):
    state = torch.load(path, map_location="cpu", weights_only=True)
    moments = [v for s in state["optimizer"]["state"].values() for k, v in sorted(s.items()) if k != "step"]
    return state, list(state["model"].values()), moments


def test_resume_continues_exactly_like_a_straight_run(synth_dir, tmp_path):
    # 14 steps straight, against 9 steps, stop, resume, 5 more: mid-epoch stop, epoch boundary
    # after the resume, colour jitter drawing from the restored generator state.
    straight = train(train_config(synth_dir, ["train.max_steps=14"]), tmp_path / "straight")
    first = train(train_config(synth_dir, ["train.max_steps=9"]), tmp_path / "split")
    assert first.step == 9 and first.checkpoint.name == "ckpt-000000009.pt"
    second = train(train_config(synth_dir, ["train.max_steps=14"]), tmp_path / "split", resume=True)
    assert second.step == 14 and second.summary["steps"] == 5, "only the remaining steps ran"

    a_state, a_weights, a_moments = _weights_and_moments(straight.checkpoint)
    b_state, b_weights, b_moments = _weights_and_moments(second.checkpoint)
    assert len(a_moments) == len(b_moments) > 0
    for a, b in zip(a_weights + a_moments, b_weights + b_moments, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert a_state["loader"] == b_state["loader"] and a_state["scheduler"] == b_state["scheduler"]

    losses_a = [json.loads(x)["loss"] for x in (tmp_path / "straight" / "steps.jsonl").read_text().splitlines()]
    lines_b = (tmp_path / "split" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines_b] == list(range(1, 15)), "one step log across the resume"
    assert [json.loads(x)["loss"] for x in lines_b] == pytest.approx(losses_a, rel=1e-5)


def test_resume_skips_a_damaged_newest_checkpoint_and_refuses_surprises(synth_dir, tmp_path, caplog):
    run = tmp_path / "run"
    train(train_config(synth_dir, ["train.epochs=2", "train.checkpoint_every_steps=4"]), run)
    names = [p.name for p in list_checkpoints(run)]
    assert names == ["ckpt-000000006.pt", "ckpt-000000008.pt", "ckpt-000000012.pt"]

    with pytest.raises(TrainError, match="already holds checkpoints: pass --resume"):
        train(train_config(synth_dir, ["train.epochs=3"]), run)
    with pytest.raises(TrainError, match=r"different model than this config builds \(name: 'smallcnn' -> 'resnet18'"):
        train(train_config(synth_dir, ["train.epochs=3", "model.name=resnet18"]), run, resume=True)

    newest = run / "checkpoints" / "ckpt-000000012.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a damaged disk
    result = train(train_config(synth_dir, ["train.epochs=2"]), run, resume=True)
    assert "ckpt-000000012.pt cannot be loaded" in caplog.text
    assert result.summary["steps"] == 4 and result.step == 12, "steps 9-12 ran again from ckpt-8"
    torch.load(newest, weights_only=True)  # rewritten whole


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (["model.name=resnet99"], "model.name", "known models: "),
        (["train.amp=fp16"], "train.amp", "fp16 needs a GPU"),
        (["model.num_classes=2"], "model.num_classes", "smaller than the 4 classes in the data"),
        (["data.train=null"], "data.train", "needs a training split"),
        (["model.name=clip_resnet18"], "video.train", "is a clip model and needs a folder of training videos"),
    ],
)
def test_config_problems_are_named_before_training(synth_dir, tmp_path, overrides, key, words):
    with pytest.raises(ConfigError) as info:
        train(train_config(synth_dir, overrides), tmp_path / "run")
    assert info.value.key_path == key and words in str(info.value)
    assert not list_checkpoints(tmp_path / "run")


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.train={d}/images", "data.val={d}/images/val"], "data.val.root"),
        (["model.name=clip_resnet18", "data.train=null", "video.train={d}", "video.val={d}/videos"], "video.val"),
    ],
)
def test_validation_data_inside_the_training_root_is_refused(synth_dir, tmp_path, overrides, key):
    """video.train at the folder holding val/ trained on the validation videos, and scored them, silently."""
    with pytest.raises(ConfigError) as info:
        train(train_config(synth_dir, [o.format(d=synth_dir) for o in overrides]), tmp_path / "run")
    assert info.value.key_path == key and "so training would read the validation data too" in str(info.value)
    assert not (tmp_path / "run").exists()


def test_a_resume_with_another_model_names_the_change_as_the_config_writes_it(synth_dir, tmp_path):
    run = tmp_path / "run"
    train(train_config(synth_dir, ["train.max_steps=1", "train.eval_every_epochs=0"]), run)
    with pytest.raises(TrainError) as info:
        train(train_config(synth_dir, ["train.max_steps=2", "image.size_px=40x32"]), run, resume=True)
    assert str(info.value).endswith("holds a different model than this config builds (size_px: 32 -> 40x32)")


def test_a_run_with_every_training_sample_skipped_stops_in_one_line(synth_dir, tmp_path):
    """Skipped while reading (an outage read as bad files), they left every epoch empty: a resume trained
    nothing and exited 0, as if finished."""
    run = tmp_path / "run"
    cfg = ["train.max_steps=1", "train.eval_every_epochs=0", "loader.on_bad_sample=skip"]
    train(train_config(synth_dir, cfg), run)
    (newest,) = list_checkpoints(run)
    state = torch.load(newest, weights_only=False)
    count = len(ImageDataset.from_folder(synth_dir / "images" / "train").paths)
    for loader in state["loader"]:
        loader["read_failures"] = list(range(count))  # every one of them
    torch.save(state, newest)
    words = rf"^epoch \d+ has no training batch: {count} sample\(s\) were skipped \(\S+/000000\.jpg: failed to decode"
    with pytest.raises(TrainError, match=words):
        train(train_config(synth_dir, ["train.max_steps=3", *cfg[1:]]), run, resume=True)


def test_a_run_folder_in_use_by_another_training_is_refused(synth_dir, tmp_path):
    """A second --resume into a running run's folder was accepted: both wrote checkpoints there."""
    from gpufeed.train._preflight import hold_run_folder

    run = tmp_path / "run"
    cfg = ["train.max_steps=1", "train.eval_every_epochs=0"]
    train(train_config(synth_dir, cfg), run)
    other = hold_run_folder(run, True)  # as a running training holds it (flock: per open file, so here too)
    try:
        with pytest.raises(TrainError, match=rf"^{run} is in use by another training \(PID \d+ on \S+, since "):
            train(train_config(synth_dir, ["train.max_steps=2", *cfg[1:]]), run, resume=True)
    finally:
        other.close()
    assert train(train_config(synth_dir, ["train.max_steps=2", *cfg[1:]]), run, resume=True).step == 2


def test_ddp_refuses_uneven_last_batches(synth_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"'loader\.last_batch': 'partial' gives ranks different step counts"):
        train(train_config(synth_dir, ["loader.last_batch=partial"]), tmp_path / "run")


def test_resume_without_a_run_folder_is_refused(synth_dir, tmp_path, monkeypatch):
    """Without --out each run gets a new folder: --resume there warned and trained from scratch."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrainError, match=r"^resume needs the run folder to continue: give it as --out RUN_DIR"):
        train(train_config(synth_dir), resume=True)
    assert not (tmp_path / "runs").exists()
