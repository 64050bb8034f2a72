"""AdamW's kernel (fused on CUDA) and checkpoints carrying another kernel's settings.

torch's ``load_state_dict`` takes ``fused`` from the saved groups and places each ``step`` counter
by it; a resume must keep the running optimizer's own kernel. The ``gpu`` twins check the fused
kernel on CUDA, a CPU checkpoint resumed there, and an fp16 step (``GradScaler`` on) that makes no
host synchronisation.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpufeed.config import TrainConfig
from gpufeed.train._optim import build_optimizer, load_optimizer_state

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
