"""Optimiser, learning-rate schedule and mixed precision, from the ``train`` config section."""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from gpufeed.config import ConfigError, TrainConfig

log = logging.getLogger("gpufeed")

__all__ = [
    "build_optimizer",
    "build_scheduler",
    "compile_model",
    "load_optimizer_state",
    "lr_factor",
    "resolve_amp",
    "schedule_progress",
]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; biases and normalisation parameters (1-d tensors) get no weight decay.

    On CUDA it is torch's fused AdamW: a kernel launch or two a step instead of several per
    parameter group, and under fp16 ``GradScaler.step`` hands its inf check to the kernel instead of
    reading it on the host (the one host wait of an fp16 step). Elsewhere torch's default.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.dim() <= 1 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=_fused(decay + no_decay))


def _fused(params: list[nn.Parameter]) -> bool | None:
    """``True`` where every parameter is on CUDA; ``None`` (torch's choice) otherwise."""
    return True if params and all(p.is_cuda for p in params) else None


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load ``saved`` (a ``state_dict()``) into ``optimizer``, keeping ``optimizer``'s own kernel.

    torch's ``load_state_dict`` takes every group setting from the saved groups, ``fused`` too, and
    places each ``step`` counter by it: a checkpoint written on a CPU would turn a GPU run's fused
    AdamW off, one written on a GPU would turn it on for a CPU run. Here each saved group takes the
    running optimizer's ``fused`` and ``foreach`` before loading, so the counters land where that
    kernel wants them.

    Each loaded state tensor shaped like its parameter then takes the parameter's memory layout
    (:func:`_match_parameter_layouts`).
    """
    groups = optimizer.param_groups
    if len(groups) != len(saved["param_groups"]):
        optimizer.load_state_dict(saved)  # torch names the mismatch
        return
    kernel_keys = ("fused", "foreach")
    saved_groups = [
        {**group, **{key: own[key] for key in kernel_keys if key in own}}
        for group, own in zip(saved["param_groups"], groups, strict=True)
    ]
    optimizer.load_state_dict({**saved, "param_groups": saved_groups})
    _match_parameter_layouts(optimizer)


def _match_parameter_layouts(optimizer: torch.optim.Optimizer) -> None:
    """Give every per-parameter state tensor of its parameter's shape the parameter's strides, values kept.

    torch's ``load_state_dict`` casts each state tensor to its parameter's dtype and device but keeps
    the checkpoint's strides. A run resumed with ``train.channels_last`` changed (or from a build
    without it) has channels_last convolution weights, and so gradients, against moments in the
    old layout: CUDA's fused AdamW refuses them ("params, grads, exp_avgs, and exp_avg_sqs must have
    same dtype, device, and layout"), and torch's CPU fused kernel pairs the wrong elements. The
    values are copied into a tensor laid out like the parameter (``empty_like`` keeps its strides).
    """
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == param.shape and value.stride() != param.stride():
                state[key] = torch.empty_like(param, dtype=value.dtype).copy_(value)


def lr_factor(step: int, total_steps: int, cfg: TrainConfig, anchor: tuple[int, float] | None = None) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a fraction of ``cfg.lr``.

    Linear warm-up over ``warmup_steps``, then ``schedule`` from 1 down to ``min_lr_fraction`` at
    ``total_steps`` (cosine or linear), or flat (constant).

    Args:
        anchor: ``(step, progress)``: the schedule stood at ``progress`` (0 to 1) at that step and
            runs on from there to 1 at ``total_steps``. A run resumed on another number of ranks
            has another number of steps to go; anchored, its rate goes on from where it was
            instead of jumping to where the new length would put that step.
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    floor = cfg.min_lr_fraction
    progress = schedule_progress(step, total_steps, cfg, anchor)
    if cfg.schedule == "cosine":
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + (1.0 - floor) * (1.0 - progress)


def schedule_progress(step: int, total_steps: int, cfg: TrainConfig, anchor: tuple[int, float] | None = None) -> float:
    """How far the decay of :func:`lr_factor` has gone at ``step``, from 0 to 1."""
    if anchor is not None and step >= anchor[0]:
        first, done = anchor
        return min(1.0, done + (1.0 - done) * (step - first) / max(1, total_steps - first))
    return min(1.0, max(0.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)))


def build_scheduler(
    optimizer: torch.optim.Optimizer, total_steps: int, cfg: TrainConfig, anchor: tuple[int, float] | None = None
):
    """A ``LambdaLR`` stepping :func:`lr_factor` once per optimizer step.

    Warns when the warm-up is as long as the schedule: the docs' ``warmup_steps: 500`` on a run of
    12 steps trained at 2.4% of ``lr`` at its last step, and nothing said so.
    """
    if cfg.warmup_steps >= total_steps:
        log.warning(
            "train.warmup_steps (%d) is not shorter than the run's %d steps: the rate rises to %.2g of train.lr "
            "(%g) at the last step and never decays; lower train.warmup_steps",
            cfg.warmup_steps,
            total_steps,
            lr_factor(total_steps - 1, total_steps, cfg),
            cfg.lr,
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg, anchor))


def resolve_amp(mode: str, device) -> torch.dtype | None:
    """The autocast dtype for ``train.amp`` on ``device`` (``None``: full float32).

    Raises:
        ConfigError: fp16 without a GPU, or bf16 on a GPU that lacks it.
    """
    if mode == "off":
        return None
    if not device.is_gpu:
        if mode == "fp16":
            raise ConfigError("train.amp", "fp16 needs a GPU and this run uses the CPU; use bf16, auto or off")
        return torch.bfloat16 if mode == "bf16" else None
    # Native bf16 only (compute capability 8.0+): torch's default also counts emulated bf16 (a T4, a V100).
    bf16_ok = torch.cuda.is_bf16_supported(including_emulation=False)
    if mode == "bf16" and not bf16_ok:
        raise ConfigError(
            "train.amp", f"bf16 is not supported by {torch.cuda.get_device_name(device.device_id)}; use fp16"
        )
    if mode == "auto":
        return torch.bfloat16 if bf16_ok else torch.float16
    return torch.bfloat16 if mode == "bf16" else torch.float16


def compile_model(model: nn.Module, mode: str) -> None:
    """Apply ``train.compile`` to ``model`` in place (``nn.Module.compile``; ``off`` leaves it eager).

    In place, not ``torch.compile(model)``: the module keeps its own state-dict keys (a wrapper's
    carry an ``_orig_mod.`` prefix), so checkpoints and the export read it as an eager model's, and
    DDP wraps it as it is.
    Compilation happens at the first forward pass (seconds to minutes) and again for evaluation
    mode, and once more for each other batch size: shapes are compiled static, so a partial last
    batch (evaluation keeps every sample) gets a graph of its own and the full batches keep theirs.
    ``reduce-overhead`` replays each step's kernels as CUDA graphs: the host launches a graph
    instead of every kernel, for a loop whose host launching is as long as the device's work
    (:class:`~gpufeed.train._step.Stepper` marks each step's start for it).

    Raises:
        ConfigError: ``reduce-overhead`` without a GPU (CUDA graphs need one).
    """
    if mode == "off":
        return
    if mode == "reduce-overhead" and next(model.parameters()).device.type != "cuda":
        raise ConfigError(
            "train.compile", "reduce-overhead replays CUDA graphs and this run uses the CPU; use default or off"
        )
    # dynamic=False: torch's default recompiles at the first batch of another size (the partial last
    # one) with a symbolic batch size, and that graph then takes the full batches too (torch 2.13
    # keeps no guard sending them back to their static graph): kernels for any size, and on a GPU
    # no channels_last layout choice by inductor. Static, a run compiles a graph per shape and mode,
    # a handful, below dynamo's recompile limit (8 per function; past it a call would run eagerly).
    model.compile(mode=None if mode == "default" else mode, dynamic=False)
