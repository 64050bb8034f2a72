"""A run gone non-finite stops with a TrainError, and no checkpoint ever holds NaN or inf.

Before, ``train.lr: 1e8`` sent smallcnn's loss to NaN at step 5; the run went on to its last
epoch with exit status 0 and checkpointed NaN weights over the good ones.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from torch import nn
from train_support import train_config

from gpufeed.config import SizePx
from gpufeed.models import list_checkpoints, nonfinite_weights
from gpufeed.train import TrainError, train
from gpufeed.train._nonfinite import LossWatch, refuse_nonfinite_weights


def _logged_losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def _finite_checkpoint(path) -> bool:
    state = torch.load(path, map_location="cpu", weights_only=False)["model"]
    return all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def _train_to_an_error(synth_dir, run, overrides: list[str], device: str = "cpu") -> str:
    """The TrainError's message of a run of the tiny config at a rate too high for it."""
    with pytest.raises(TrainError) as info:
        train(train_config(synth_dir, ["train.warmup_steps=0", *overrides], device=device), run)
    return str(info.value)


# train() serves its /metrics and may start DALI's workers: the process tier, as test_train_loop.
@pytest.mark.process
def test_a_loss_gone_nan_stops_the_run_at_its_step(synth_dir, tmp_path):
    message = _train_to_an_error(synth_dir, tmp_path / "run", ["train.lr=1e8", "train.epochs=2"])
    losses = _logged_losses(tmp_path / "run")
    assert math.isnan(losses[-1]) and all(math.isfinite(x) for x in losses[:-1])  # the step that went NaN is logged
    assert f"step {len(losses)} (epoch 1): the loss is nan" in message
    assert "none was written before it" in message and "lower train.lr (now 1e+08)" in message
    assert not list_checkpoints(tmp_path / "run")


@pytest.mark.process
def test_weights_gone_non_finite_never_reach_a_checkpoint(synth_dir, tmp_path):
    """lr 1e3: the BatchNorm statistics overflow while the loss is still finite; every checkpoint on disk is sound."""
    message = _train_to_an_error(synth_dir, tmp_path / "run", ["train.lr=1e3", "train.checkpoint_every_steps=2"])
    written = list_checkpoints(tmp_path / "run")
    assert written and all(_finite_checkpoint(path) for path in written)
    assert f"the newest on disk is {written[-1]}" in message


def test_the_checkpoint_check_names_the_tensors_that_hold_nan_or_inf():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))
    refuse_nonfinite_weights(model, 7, 0.1, lambda: None)  # sound: nothing raised
    with torch.no_grad():
        model[1].running_var[2] = float("inf")
        model[2].weight[0, 0, 0, 0] = float("nan")
    assert nonfinite_weights(model, most=1) == (["1.running_var"], 2)
    with pytest.raises(TrainError) as info:
        refuse_nonfinite_weights(model, 7, 0.1, lambda: "ckpt-6.pt")
    assert str(info.value).startswith("step 7: 1.running_var, 2.weight hold NaN or inf; the checkpoint of step 7 is")
    assert "(the newest on disk is ckpt-6.pt): lower train.lr (now 0.1)" in str(info.value)


def test_outside_fp16_the_first_non_finite_loss_stops():
    watch = LossWatch(0.01, scaled=False)
    watch.check(1, 0, 2.3, lambda: pytest.fail("asked for the checkpoint of a finite step"))
    with pytest.raises(TrainError, match=r"^step 2 \(epoch 1\): the loss is inf"):
        watch.check(2, 0, float("inf"), lambda: None)


def test_under_fp16_skipped_steps_are_allowed_until_too_many_in_a_row():
    """GradScaler skips a step whose loss is non-finite, by design: only a run of them stops the run."""
    watch = LossWatch(0.01, scaled=True, in_a_row=3)
    nan = float("nan")
    for step, loss in enumerate([1.0, nan, nan, 0.9, nan, nan], start=1):  # a finite loss starts the count again
        watch.check(step, 0, loss, lambda: None)
    with pytest.raises(TrainError) as info:
        watch.check(7, 1, nan, lambda: "ckpt-4.pt")
    assert str(info.value).startswith("steps 5 to 7 (epoch 1 to 2): the loss was non-finite 3 steps in a row")
    assert "parameters are still those of step 4 (the newest on disk is ckpt-4.pt)" in str(info.value)


@pytest.mark.gpu
@pytest.mark.process
def test_an_fp16_run_that_does_not_recover_stops_and_checkpoints_stay_finite(synth_dir, tmp_path):
    """Under fp16 GradScaler skips the non-finite steps: the loss watch's run of them, or the
    BatchNorm statistics those forward passes spoiled at the next checkpoint, stops the run."""
    message = _train_to_an_error(
        synth_dir, tmp_path / "run", ["train.amp=fp16", "train.lr=1e8", "train.epochs=12"], "gpu"
    )
    assert "non-finite 30 steps in a row" in message or "hold NaN or inf" in message
    assert all(_finite_checkpoint(path) for path in list_checkpoints(tmp_path / "run"))


@pytest.mark.gpu
def test_the_checkpoint_check_reads_cuda_weights_once():
    """On the GPU: the verdict for every tensor comes back in one host read (one sync a checkpoint)."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).cuda()
    torch.cuda.synchronize()
    reads = []
    real = torch.Tensor.tolist
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.device) or real(t))
        assert nonfinite_weights(model) == ([], 0)
        model[1].running_mean.fill_(float("nan"))
        assert nonfinite_weights(model) == (["1.running_mean"], 1)
    assert reads == [torch.device("cuda", 0)] * 2


def test_a_checkpoint_with_nan_weights_is_named_by_export_and_predict(tmp_path):
    """Export blamed onnxruntime ("max |diff| nan"); predict's PyTorch runtime answered NaN for every frame."""
    from gpufeed.device import DeviceChoice
    from gpufeed.models import ExportError, export_model, untrained_checkpoint
    from gpufeed.pipelines import DatasetError
    from gpufeed.predict import load_predictor

    path = untrained_checkpoint(tmp_path, ("amber", "birch"), SizePx(32, 32), architecture="smallcnn")
    state = torch.load(path, weights_only=False)
    state["model"]["backbone.features.1.running_mean"][0] = float("nan")
    torch.save(state, path)
    words = "its weights hold NaN or inf (backbone.features.1.running_mean): the run that wrote it had diverged"
    with pytest.raises(ExportError, match=re.escape(f"cannot load a gpufeed model from {path}: {words}")):
        export_model(path, tmp_path / "exported")
    with pytest.raises(DatasetError, match=re.escape(words)):
        load_predictor(path, DeviceChoice("cpu", None, "test"), runtime="torch")
