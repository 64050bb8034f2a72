"""A run that has gone non-finite stops, before its weights reach a checkpoint.

A learning rate too high for the model (``train.lr: 1e8`` on smallcnn) sent the loss to 1e30 in
four steps and to NaN in the fifth; the run went on to its last epoch, exit status 0, and wrote
every checkpoint after that with NaN weights over the good ones (``keep_checkpoints`` rotates
them out). Two checks stop it:

* :class:`LossWatch`, per step, on the loss the step log records (already on the host: no device
  read). Outside fp16 a step with a non-finite loss has non-finite gradients, and its optimizer
  step has written them into the weights: the run stops at that step. Under fp16,
  ``GradScaler`` skips such a step by design and the weights stay as they were, so one is
  allowed; :data:`FP16_NONFINITE_STEPS_IN_A_ROW` in a row stop the run (the loss itself, not an
  overflowing gradient the scale could fix, is non-finite: it does not recover).
* :func:`refuse_nonfinite_weights`, before each checkpoint: a step whose loss was still finite can write
  infinities (its update overflowed), which the next step's loss would show only after the
  checkpoint. One reduction per tensor and a single host read, once per checkpoint.

Both raise :class:`~gpufeed.train._errors.TrainError` naming the step, what is non-finite and
what to change. Each rank checks its own; under ``torchrun`` one rank's error ends the job, as
every training error does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import nn

from gpufeed.models import nonfinite_weights
from gpufeed.train._errors import TrainError

__all__ = ["FP16_NONFINITE_STEPS_IN_A_ROW", "LossWatch", "refuse_nonfinite_weights"]

# GradScaler halves its scale at each skipped step: from its 2**16 start, 30 skips take it to
# 2**-14, below which an fp16 gradient is all but zero; a run skipping that long is not training.
FP16_NONFINITE_STEPS_IN_A_ROW = 30

_ADVICE = "lower train.lr (now {lr:g}) or set train.grad_clip_norm"


class LossWatch:
    """Stops the run at a non-finite loss (see the module docs).

    Args:
        lr: The configured learning rate, for the message.
        scaled: The steps run under fp16's ``GradScaler``, which skips a non-finite step.
        in_a_row: Under fp16, how many non-finite steps in a row stop the run.
    """

    def __init__(self, lr: float, scaled: bool, in_a_row: int = FP16_NONFINITE_STEPS_IN_A_ROW) -> None:
        self.lr, self.scaled, self.in_a_row = lr, scaled, in_a_row
        self._first: tuple[int, int] | None = None  # (step, epoch) of the first of the current run of them
        self._count = 0

    def check(self, step: int, epoch: int, loss: float, newest_checkpoint: Callable[[], object]) -> None:
        """Note step ``step``'s loss; raise when the run must stop.

        Args:
            step, epoch: The step (1-based, as logged) and its epoch (0-based).
            loss: The step's loss, as recorded.
            newest_checkpoint: Called only to raise: the checkpoint the message names as the one to
                go back to (``None``: none written yet).

        Raises:
            TrainError: Outside fp16, at the first non-finite loss; under fp16, at the
                ``in_a_row``-th in a row.
        """
        if math.isfinite(loss):
            self._first, self._count = None, 0
            return
        if self._first is None:
            self._first = (step, epoch)
        self._count += 1
        if self.scaled and self._count < self.in_a_row:
            return
        kept, advice = _kept(newest_checkpoint()), _ADVICE.format(lr=self.lr)
        if not self.scaled:
            raise TrainError(
                f"step {step} (epoch {epoch + 1}): the loss is {loss}, so this step's update made the weights "
                f"non-finite; the run stops before they reach a checkpoint ({kept}): {advice}"
            )
        first, first_epoch = self._first
        raise TrainError(
            f"steps {first} to {step} (epoch {first_epoch + 1} to {epoch + 1}): the loss was non-finite "
            f"{self._count} steps in a row ({loss} last); fp16's GradScaler skipped their updates, so the "
            f"parameters are still those of step {first - 1} ({kept}), but the loss does not recover: {advice}, "
            "or train in bf16 (train.amp: bf16) where the GPU has it"
        )


def _kept(newest_checkpoint) -> str:
    return f"the newest on disk is {newest_checkpoint}" if newest_checkpoint else "none was written before it"


def refuse_nonfinite_weights(model: nn.Module, step: int, lr: float, newest_checkpoint: Callable[[], object]) -> None:
    """Raise before a checkpoint of step ``step`` would hold non-finite weights.

    Args:
        newest_checkpoint: As for :meth:`LossWatch.check`.

    Raises:
        TrainError: Naming the first tensors that hold NaN or inf, and what to change.
    """
    names, count = nonfinite_weights(model)
    if not count:
        return
    more = f" and {count - len(names)} more" if count > len(names) else ""
    raise TrainError(
        f"step {step}: {', '.join(names)}{more} hold NaN or inf; the checkpoint of "
        f"step {step} is not written ({_kept(newest_checkpoint())}): {_ADVICE.format(lr=lr)}"
    )
