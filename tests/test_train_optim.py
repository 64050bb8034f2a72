"""AdamW's kernel (fused on CUDA) and checkpoints carrying another kernel's settings.

torch's ``load_state_dict`` takes ``fused`` from the saved groups and places each ``step`` counter
by it; a resume must keep the running optimizer's own kernel. The ``gpu`` twins check the fused
kernel on CUDA, a CPU checkpoint resumed there, and an fp16 step (``GradScaler`` on) that makes no
host synchronisation.

A resume with ``train.channels_last`` changed loads moments in the checkpoint's layout beside
convolution weights in the new one; the moments must take their parameters' strides, or CUDA's
fused AdamW refuses the step and torch's CPU fused kernel updates the wrong elements.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpufeed.config import TrainConfig
from gpufeed.train._optim import build_optimizer, load_optimizer_state
from gpufeed.train._tasks import to_channels_last

pytestmark = pytest.mark.timeout(120)

_CFG = TrainConfig(lr=1e-2, weight_decay=0.05, warmup_steps=0, schedule="constant")


def _model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)).to(device)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    for _ in range(steps):
        x = torch.randn(8, 6, generator=gen).to(device)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _fused_flags(optimizer: torch.optim.Optimizer) -> list:
    return [group["fused"] for group in optimizer.param_groups]


def test_a_cpu_optimizer_keeps_torchs_kernel_and_decays_only_matrices():
    optimizer = build_optimizer(_model("cpu"), _CFG)
    assert _fused_flags(optimizer) == [None, None]
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.05 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])


def test_a_checkpoint_of_a_fused_optimizer_resumes_on_the_running_kernel_with_the_same_steps():
    # A GPU run's checkpoint (fused: True) resumed on a CPU; torch 2.13 has a CPU fused kernel to write it.
    writer_model = _model("cpu")
    writer = torch.optim.AdamW(writer_model.parameters(), lr=1e-2, fused=True)
    _train(writer_model, writer, 3, seed=1)
    saved = copy.deepcopy(writer.state_dict())  # a loaded state of the same device would share the tensors
    assert saved["param_groups"][0]["fused"] is True

    model = _model("cpu")
    model.load_state_dict(writer_model.state_dict())
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_optimizer_state(plain, saved)
    assert _fused_flags(plain) == [None], "torch's own load would have turned the fused kernel on"
    state = next(iter(plain.state.values()))
    assert float(state["step"]) == 3.0
    assert all(
        torch.equal(plain.state[p]["exp_avg"], writer.state[q]["exp_avg"])
        for p, q in zip(model.parameters(), writer_model.parameters(), strict=True)
    )
    _train(model, plain, 2, seed=2)
    assert float(next(iter(plain.state.values()))["step"]) == 5.0


def test_a_checkpoint_of_another_group_count_is_refused_by_torch():
    optimizer = build_optimizer(_model("cpu"), _CFG)
    other = torch.optim.AdamW(_model("cpu").parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="parameter groups"):
        load_optimizer_state(optimizer, other.state_dict())


@pytest.mark.gpu
def test_a_gpu_optimizer_is_fused_and_resumes_a_cpu_checkpoint_fused():
    cpu_model = _model("cpu")
    cpu_optimizer = build_optimizer(cpu_model, _CFG)
    _train(cpu_model, cpu_optimizer, 3, seed=1)

    model = _model("cuda")
    model.load_state_dict(cpu_model.state_dict())
    optimizer = build_optimizer(model, _CFG)
    assert _fused_flags(optimizer) == [True, True]
    load_optimizer_state(optimizer, cpu_optimizer.state_dict())
    assert _fused_flags(optimizer) == [True, True]
    # The fused kernel keeps its step counters on the parameters' device.
    assert all(state["step"].is_cuda for state in optimizer.state.values())
    _train(model, optimizer, 2, seed=2)
    _train(cpu_model, cpu_optimizer, 2, seed=2)
    for gpu_param, cpu_param in zip(model.parameters(), cpu_model.parameters(), strict=True):
        torch.testing.assert_close(gpu_param.detach().cpu(), cpu_param.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
def test_an_fp16_step_with_the_gradient_scaler_makes_no_host_sync():
    model = _model("cuda")
    optimizer = build_optimizer(model, _CFG)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)  # no overflow: every step counts
    x = torch.randn(8, 6, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    step()  # the scaler's and the optimizer's state are made on the first step
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert float(next(iter(optimizer.state.values()))["step"]) == 4.0


def _conv_model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)).to(
        device
    )


def _conv_train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    for _ in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=gen).to(device)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _contiguous_checkpoint(device: str) -> tuple[nn.Module, dict]:
    """A conv model trained two steps with ``train.channels_last`` off, and its optimizer's state."""
    model = _conv_model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    _conv_train(model, optimizer, 2, seed=1)
    return model, copy.deepcopy(optimizer.state_dict())


def _resumed(writer: nn.Module, saved: dict, channels_last: bool) -> tuple[nn.Module, torch.optim.Optimizer]:
    device = next(writer.parameters()).device.type
    model = _conv_model(device)
    if channels_last:
        model = to_channels_last(model)
    model.load_state_dict(writer.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    load_optimizer_state(optimizer, copy.deepcopy(saved))
    return model, optimizer


def test_a_resume_into_channels_last_lays_the_moments_out_like_their_parameters():
    writer, saved = _contiguous_checkpoint("cpu")
    model, optimizer = _resumed(writer, saved, channels_last=True)
    weights = [p for p in model.parameters() if p.dim() == 4]
    assert weights and all(not p.is_contiguous() for p in weights), "the convolutions are channels_last"
    for index, param in enumerate(model.parameters()):
        state = optimizer.state[param]
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].stride() == param.stride(), f"{key} of parameter {index}"
            assert torch.equal(state[key], saved["state"][index][key]), f"{key} of parameter {index} keeps its values"


def test_a_fused_step_after_a_resume_into_channels_last_matches_the_contiguous_one():
    # torch 2.13's CPU fused AdamW does not check layouts: moments left in the checkpoint's
    # strides were paired with the wrong gradient elements (1.7e-3 away after one step).
    writer, saved = _contiguous_checkpoint("cpu")
    reference, reference_optimizer = _resumed(writer, saved, channels_last=False)
    model, optimizer = _resumed(writer, saved, channels_last=True)
    _conv_train(reference, reference_optimizer, 1, seed=2)
    _conv_train(model, optimizer, 1, seed=2)
    for param, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.detach(), expected.detach(), rtol=0, atol=1e-6)


@pytest.mark.gpu
def test_a_gpu_resume_into_channels_last_steps_with_the_fused_kernel():
    # fused=True as build_optimizer chooses on CUDA; the writer's layout is channels_last off.
    writer, saved = _contiguous_checkpoint("cuda")
    reference, reference_optimizer = _resumed(writer, saved, channels_last=False)
    model, optimizer = _resumed(writer, saved, channels_last=True)
    assert _fused_flags(optimizer) == [True]
    # Before the moments took their parameters' layout, this step raised "params, grads, exp_avgs,
    # and exp_avg_sqs must have same dtype, device, and layout".
    _conv_train(model, optimizer, 1, seed=2)
    _conv_train(reference, reference_optimizer, 1, seed=2)
    for param, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.detach(), expected.detach(), rtol=1e-4, atol=1e-5)
