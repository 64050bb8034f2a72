"""One optimizer step, timed: augment, forward, backward, optimizer (task-agnostic).

:class:`Stepper` is what the loop calls once per batch; it is also usable on its own (tests train
the clip task with it on real decoded frames). It does not wait for data: the loop times that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gpufeed.train._profiling import StageRanges
from gpufeed.train._tasks import Task, global_mean_loss
from gpufeed.train._telemetry import StageClock

__all__ = ["PendingStep", "StepOutcome", "Stepper"]


class PendingStep:
    """A step queued on the device: :meth:`result` reads its timings and loss (waiting for it alone).

    Args:
        marks: The step's :class:`~gpufeed.train._telemetry.StageMarks`.
        lr: Learning rate the step used.
        samples: Rows in the batch.
        task, sample_ids: Where a target fault is explained (the task's message, the batch's ids);
            ``None`` for a task whose targets are always usable.
    """

    def __init__(
        self,
        marks,
        lr: float,
        samples: int,
        task: Task | None = None,
        sample_ids: torch.Tensor | None = None,
        evidence=None,
    ) -> None:
        self._marks, self.lr, self.samples = marks, lr, samples
        self._task, self._sample_ids, self._evidence = task, sample_ids, evidence

    def result(self) -> StepOutcome:
        """The step's outcome.

        Raises:
            ValueError: The task found targets in the batch it cannot train on (the task's
                :meth:`~gpufeed.train._tasks.Task.fault_error`, e.g. a
                :class:`~gpufeed.train._mask_ids.MaskIdError`); the step ignored them.
        """
        augment_s, compute_s, loss, fault = self._marks.read()
        self._evidence, evidence = None, self._evidence  # released once read: the masks held until now
        if fault >= 0 and self._task is not None:
            ids = self._sample_ids.tolist() if self._sample_ids is not None else []
            raise self._task.fault_error(fault, ids, evidence)
        return StepOutcome(loss, self.lr, augment_s, compute_s, self.samples)


@dataclass(frozen=True)
class StepOutcome:
    """What one step did: its loss, learning rate, timings (seconds) and batch rows."""

    loss: float
    lr: float
    augment_s: float
    compute_s: float
    samples: int


class Stepper:
    """Runs training steps of ``model`` on ``task`` batches.

    Args:
        model: The (possibly DDP-wrapped) model; takes uint8 pixels.
        task: Which batch fields are input and target, and the loss.
        optimizer, scheduler: Stepped once per call.
        augment: uint8 -> uint8 module applied before the forward pass (identity if empty).
        scaler: ``torch.amp.GradScaler``; disabled unless training in fp16.
        amp_dtype: autocast dtype, or ``None`` for float32.
        memory_format: The inputs' memory format (see :meth:`Task.input_format`), or
            ``None`` to leave inputs as they come.
        grad_clip_norm: Clip the gradient norm to this (``None``: no clipping).
        on_gpu: Time with CUDA events (read after the step is done) rather than ``perf_counter``.
        padded: Batches may hold padding rows (``last_batch: pad``). Under DDP each rank's loss is
            then weighted by its share of the global batch's real rows, at the cost of one
            all-reduce of a device scalar per step; ``False`` (every row real: ``drop``) skips it.
        cudagraphs: The model replays CUDA graphs (``train.compile: reduce-overhead``): each step
            and evaluation batch is marked as a new one, so the graphs' output buffers of the
            last are free to be reused (nothing here keeps a step's outputs past the step).
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        optimizer: torch.optim.Optimizer,
        scheduler,
        augment: nn.Module,
        scaler,
        *,
        amp_dtype: torch.dtype | None = None,
        memory_format: torch.memory_format | None = None,
        grad_clip_norm: float | None = None,
        on_gpu: bool = False,
        padded: bool = True,
        cudagraphs: bool = False,
    ) -> None:
        self.model, self.task, self.optimizer, self.scheduler = model, task, optimizer, scheduler
        # The group DDP averages gradients over, where ranks' real rows may differ (else None).
        self._ranks = _averaging_group(model) if padded else None
        self.augment, self.scaler = augment, scaler
        self.amp_dtype, self.memory_format, self.grad_clip_norm = amp_dtype, memory_format, grad_clip_norm
        self.device_type = "cuda" if on_gpu else "cpu"
        self.clock = StageClock(on_gpu)
        self.cudagraphs = cudagraphs
        self.ranges = StageRanges(on_gpu)

    def autocast(self):
        return torch.autocast(self.device_type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None)

    def prepare(self, pixels: torch.Tensor) -> torch.Tensor:
        """Inputs in the memory format the convolutions run fastest in (no copy if already so)."""
        return pixels.contiguous(memory_format=self.memory_format) if self.memory_format is not None else pixels

    def __call__(self, batch) -> StepOutcome:
        """One step, waited for: its outcome (benchmarks and tests; the loop uses :meth:`launch`)."""
        return self.launch(batch).result()

    def launch(self, batch) -> PendingStep:
        """Queue one step without waiting for the device (no host synchronisation on a GPU).

        Under fp16 too: the fused AdamW of a GPU takes ``GradScaler``'s inf check on the device
        (:func:`~gpufeed.train._optim.build_optimizer`).
        """
        task = self.task
        marks = self.clock.start()
        with self.ranges("augment"):
            pixels = self.prepare(self.augment(task.inputs(batch)))
        marks.mark(1)
        fault = task.target_fault(batch)  # read with the loss, after the step: no host wait here
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast(), self.ranges("forward"):
            logits = self.model(pixels)
            loss, shown = self._loss(logits, task.targets(batch), task.valid(batch))
        with self.ranges("backward"):
            self.scaler.scale(loss).backward()
        with self.ranges("optimizer"):
            if self.grad_clip_norm:
                self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()
        marks.mark(2)
        marks.keep_loss(shown, fault)
        if fault is None:
            return PendingStep(marks, lr, int(pixels.shape[0]))
        ids = getattr(batch, "sample_ids", None)
        return PendingStep(marks, lr, int(pixels.shape[0]), task, ids, task.fault_evidence(batch))

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None):
        """(the loss to backpropagate, the loss to report: this rank's mean over its real rows)."""
        if self._ranks is None or valid is None:
            loss = self.task.loss(logits, targets, valid)
            return loss, loss
        total, count = self.task.loss_terms(logits, targets, valid)
        shown = total.detach() / count.detach().clamp_min(1.0)
        return global_mean_loss(total, count, self._ranks), shown

    @torch.no_grad()
    def predict(self, model: nn.Module, batch) -> torch.Tensor:
        """Evaluation logits of ``batch`` (no augmentation), under the same autocast."""
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with self.autocast():
            return model(self.prepare(self.task.inputs(batch)))


def _averaging_group(model: nn.Module):
    """The process group a DDP ``model`` averages gradients over if it has several ranks, else ``None``.

    Taken from the model rather than from whether a group runs: only DDP averages gradients, so
    only then may a rank's loss be rescaled for it.
    """
    if not isinstance(model, DistributedDataParallel) or not dist.is_initialized():
        return None
    group = model.process_group
    return group if dist.get_world_size(group) > 1 else None
