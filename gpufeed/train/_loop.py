"""The training loop: DALI batches in, augmentation, AMP steps, telemetry, checkpoints.

:class:`Loop` runs what :func:`gpufeed.train.train` (and ``gpufeed train``) asks, on a prepared
:class:`~gpufeed.train._session.Session`; per step: wait for the next batch (already
augmented in the loader's graph where ``augment`` puts ops there), augment it on the device, forward + backward + AdamW step under autocast, then records the three timings
(see :mod:`gpufeed.train._telemetry`) and the step's period (:mod:`gpufeed.train._timeline`:
the steps of an epoch add up to its wall time). Each epoch ends with an evaluation and a checkpoint; a
summary table of loader wait against compute is printed at the end.

Under ``torchrun`` each rank reads its own shard and DDP averages gradients; rank 0 writes the
checkpoints, every rank serves its own metrics and writes its own step log.

Run folder::

    RUN_DIR/config.yaml                the resolved config
    RUN_DIR/checkpoints/ckpt-<step>.pt see gpufeed.train._checkpoint
    RUN_DIR/steps.jsonl                rank 0's steps (steps-rank<r>.jsonl: rank r)
    RUN_DIR/eval.jsonl                 one line per evaluation
    RUN_DIR/summary.json               every rank's summary, written at the end
    RUN_DIR/metrics-rank<r>.addr       host:port of rank r's /metrics
    RUN_DIR/trace-steps<A>-<B>-rank<r>.json   with --profile-steps A:B
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gpufeed.config import Config
from gpufeed.core import progress_bar
from gpufeed.train._distributed import broadcast_buffers, broadcast_object
from gpufeed.train._errors import TrainError
from gpufeed.train._mask_ids import MaskIdError
from gpufeed.train._nonfinite import LossWatch, refuse_nonfinite_weights
from gpufeed.train._profiling import ProfileWindow, StageRanges
from gpufeed.train._resume import missed_evaluation
from gpufeed.train._skipped import empty_epoch
from gpufeed.train._stall import StallWatch
from gpufeed.train._step import PendingStep, Stepper
from gpufeed.train._stop import StopRequest
from gpufeed.train._summary import StepStats
from gpufeed.train._telemetry import StepRecord
from gpufeed.train._timeline import Finished, StepTimeline

__all__ = ["Loop", "TrainResult"]

log = logging.getLogger("gpufeed")


@dataclass
class TrainResult:
    """What a finished run leaves.

    Attributes:
        run_dir: The run folder.
        step: Optimizer steps completed in total.
        epoch: Epochs completed.
        checkpoint: The last checkpoint written (rank 0), or ``None`` on other ranks.
        summary: This rank's loader-vs-compute figures (:func:`gpufeed.train._summary.summarize`).
        evaluations: Every evaluation of this run, oldest first.
        device: Where it ran, in words.
        skipped: Training files left out (quarantined or unusable), path -> reason, over all ranks.
    """

    run_dir: Path
    step: int
    epoch: int
    checkpoint: Path | None
    summary: dict
    evaluations: list[dict] = field(default_factory=list)
    device: str = ""
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass
class _Launched:
    """What a queued step's record needs besides the device's figures and its period."""

    step: int
    epoch: int
    batch: int
    wait_s: float
    launch_s: float | None  # host time queueing the step (a GPU only: on the CPU launching runs it)
    ids: list[int] | torch.Tensor | None  # the batch's ids on their way to the host (telemetry.record_sample_ids)
    valid: list[int] | torch.Tensor | None = None  # and which of its rows are real (not padding)


def _ids_on_the_way(ids: torch.Tensor) -> list[int] | torch.Tensor:
    """A batch's ids on their way to the host: a copy that does not wait on a GPU, the list on the CPU.

    The GPU copy is queued before the step, so it is complete once the step's end has been read.
    """
    if ids.device.type == "cpu":
        return ids.tolist()
    return ids.to("cpu", non_blocking=True)


class _TargetFaults:
    """Evaluation's check of the batches' targets, kept on the device and read once, after the last batch.

    Reading each batch's :meth:`~gpufeed.train._tasks.Task.target_fault` made the host wait for the
    device before it could queue the batch's forward. Per batch, the ids of the rows whose targets
    the task cannot use (:meth:`~gpufeed.train._tasks.Task.row_faults`) are kept on the device with
    the batch's worst fault instead; :meth:`check` reads them and stops on the first batch that had
    one, naming its faulty rows as the per-batch check did. Such a batch's metrics are harmless
    meanwhile: the task's targets leave what it cannot use out (no device-side assert).
    """

    def __init__(self, task) -> None:
        self.task = task
        self._kept: list[tuple[torch.Tensor, torch.Tensor]] = []  # per batch: worst fault, ids of faulty rows (else -1)

    def add(self, batch) -> None:
        rows = self.task.row_faults(batch)
        if rows is not None and rows.numel():
            # The ids are picked out now, on the device: the batch's own tensors may be reused later.
            self._kept.append((rows.amax(), torch.where(rows >= 0, batch.sample_ids.view(-1), -1)))

    def check(self) -> None:
        """Raise the task's one-line error for the first batch with a fault (one read for all the batches)."""
        if not self._kept:
            return
        worst = torch.stack([fault for fault, _ in self._kept]).tolist()
        for fault, (_, ids) in zip(worst, self._kept, strict=True):
            if fault >= 0:
                raise self.task.fault_error(int(fault), [i for i in ids.tolist() if i >= 0])


class Loop:
    """The per-step and per-epoch mechanics, on top of a prepared :class:`~gpufeed.train._session.Session`."""

    def __init__(self, session) -> None:
        self.s = s = session
        self.cfg: Config = s.cfg
        self.on_gpu = s.device.is_gpu
        self.ranges = StageRanges(self.on_gpu)
        self.stepper = Stepper(
            s.model,
            s.data.task,
            s.optimizer,
            s.scheduler,
            s.augment,
            s.scaler,
            amp_dtype=s.amp_dtype,
            memory_format=s.input_format,
            grad_clip_norm=self.cfg.train.grad_clip_norm,
            on_gpu=self.on_gpu,
            padded=self.cfg.loader.last_batch == "pad",  # only padded batches weigh ranks by their real rows
            cudagraphs=self.cfg.train.compile == "reduce-overhead",
        )
        self.profile = ProfileWindow(s.profile_steps, s.run_dir, s.dist.rank, self.on_gpu)
        self.stats = StepStats()
        self.loss_watch = LossWatch(self.cfg.train.lr, scaled=s.scaler.is_enabled())
        self.stop = StopRequest(s.dist.world_size)  # with several ranks, they agree on the step (see _stop)
        self.stall = StallWatch(self.stop)  # a warning when the next batch takes a minute and more
        self.evaluations: list[dict] = []
        self._skipped_seen = 0  # counted from the start: files left out before the first step count too
        self._last_saved_step = s.step if s.resumed else -1
        self._last_eval_step = -1

    def launch(self, batch, wait_s: float, epoch: int, batch_index: int) -> tuple[PendingStep, _Launched]:
        """Queue one training step on ``batch``; :meth:`_record` turns it into its record once it is read."""
        ids = valid = None
        if self.cfg.telemetry.record_sample_ids:
            for name in ("sample_ids", "video_ids"):
                if getattr(batch, name, None) is not None:
                    # Copied before the step is queued: its end finds it done (no host wait on a GPU).
                    ids = _ids_on_the_way(getattr(batch, name))
                    break
            if getattr(batch, "valid", None) is not None:
                valid = _ids_on_the_way(batch.valid)
        started = time.perf_counter()
        pending = self.stepper.launch(batch)
        launch_s = time.perf_counter() - started if self.on_gpu else None
        return pending, _Launched(self.s.step + 1, epoch, batch_index, wait_s, launch_s, ids, valid)

    def _record(self, done: Finished[_Launched]) -> StepRecord:
        """The record of a step that has been read."""
        launched, outcome = done.info, done.outcome
        ids, valid = launched.ids, launched.valid
        valid = valid.tolist() if isinstance(valid, torch.Tensor) else valid
        padding = [row for row, real in enumerate(valid) if not real] if valid is not None else None
        return StepRecord(
            step=launched.step,
            epoch=launched.epoch,
            batch=launched.batch,
            rank=self.s.dist.rank,
            time_unix=time.time(),
            loader_wait_s=launched.wait_s,
            augment_s=outcome.augment_s,
            compute_s=outcome.compute_s,
            step_s=done.step_s,
            samples=outcome.samples,
            loss=outcome.loss,
            lr=outcome.lr,
            launch_s=launched.launch_s,
            sample_ids=ids.tolist() if isinstance(ids, torch.Tensor) else ids,
            padding_rows=padding or None,
        )

    # -- one epoch ----------------------------------------------------------------------------
    def run_epoch(self, epoch: int) -> bool:
        """Train until the epoch ends (True) or ``train.max_steps`` is reached (False)."""

        s = self.s
        loader = s.data.train
        if not (total := len(loader)):
            raise TrainError(empty_epoch(loader, epoch))
        batch_index = int(loader.state_dict().get("batch", 0))
        bar = progress_bar(
            total=total,
            initial=batch_index,
            desc=f"epoch {epoch + 1}/{self.cfg.train.epochs}",
            unit="step",
            disable=not (s.dist.is_main and self.cfg.train.progress),
            leave=False,
            dynamic_ncols=True,
        )
        waited = stepped = 0.0
        samples = 0
        iterator = iter(loader)
        # On a GPU each step is read once the next one is queued (or the epoch ends), so the host
        # never waits for the device with nothing queued behind it (see _telemetry, _timeline).
        timeline: StepTimeline[_Launched] = StepTimeline(launch_ahead=self.on_gpu)
        first = True

        def finish_queued() -> StepRecord | None:
            return show(timeline.finish())

        def show(done: Finished[_Launched] | None) -> StepRecord | None:
            nonlocal waited, stepped, samples
            if done is None:
                return None
            record = self._record(done)
            self._after_step(record)
            waited, stepped, samples = waited + record.loader_wait_s, stepped + record.step_s, samples + record.samples
            bar.update(1)
            bar.set_postfix_str(
                f"{samples * s.dist.world_size / max(stepped, 1e-9):,.0f} samples/s, "
                f"wait {waited / max(stepped, 1e-9):.0%}, loss {record.loss:.3f}",
                refresh=False,
            )
            return record

        try:
            while True:
                if s.max_steps_reached() and batch_index < total:
                    finish_queued()
                    return False
                self.profile.before_step(s.step + 1)
                started = time.perf_counter()
                if first:  # the epoch's first step runs from the start of its wait
                    timeline.begin(started)
                    first = False
                with self.ranges("loader_wait"), self.stall.watch(epoch, batch_index):
                    try:
                        batch = next(iterator)
                    except StopIteration:
                        finish_queued()
                        return True
                wait_s = time.perf_counter() - started
                pending, launched = self.launch(batch, wait_s, epoch, batch_index)
                s.step += 1
                batch_index += 1
                show(timeline.push(pending, launched))
                if self._checkpoint_due(s.step) or self.profile.stops_at(s.step) or s.max_steps_reached():
                    finish_queued()  # a checkpoint, a trace or the last step needs this step finished
                if self.stop.agreed():  # SIGINT or SIGTERM (any rank's): this step checkpointed, then out
                    finish_queued()
                    self.checkpoint()
                    s.finish_checkpoint()
                    written = broadcast_object(s.last_checkpoint)  # rank 0 wrote it
                    raise self.stop.stopped(s.step, epoch, batch_index, total, written, s.run_dir, s.dist.is_main)
        except MaskIdError as err:  # raised when a step is read: the loop knows the loader's files
            raise err.naming(loader.dataset, "training") from None
        finally:
            bar.close()

    def _checkpoint_due(self, step: int) -> bool:
        every = self.cfg.train.checkpoint_every_steps
        return bool(every) and step % every == 0

    def _after_step(self, record: StepRecord) -> None:
        s = self.s
        s.metrics.observe(record)
        s.step_log.write(record)
        self.stats.add(record)
        self._count_skipped()
        self.profile.after_step(record.step)
        self.loss_watch.check(record.step, record.epoch, record.loss, self._newest_checkpoint)  # logged first
        if self._checkpoint_due(record.step):
            self.checkpoint()

    def _count_skipped(self) -> None:
        """Bring ``gpufeed_train_skipped_samples_total`` up to the training loader's skipped files."""
        skipped = len(getattr(self.s.data.train, "skipped", {}))
        if skipped > self._skipped_seen:
            self.s.metrics.skipped.inc(skipped - self._skipped_seen)
            self._skipped_seen = skipped

    # -- evaluation and checkpoints -------------------------------------------------------------
    def evaluate(self, epoch: int) -> dict | None:
        """Evaluate on this rank's shard of the validation split; results summed over ranks."""
        s = self.s
        if s.data.val is None or self._last_eval_step == s.step:
            return None
        model = s.bare_model
        broadcast_buffers(model)  # every rank evaluates the model the checkpoint holds
        model.eval()
        metric = s.data.task.new_metric()
        faults = _TargetFaults(s.data.task)
        started = time.perf_counter()
        for batch in s.data.val:
            # inference_mode, not only predict's no_grad: nothing made here is kept for autograd. The
            # loader runs outside it: buffers it keeps must not become inference tensors.
            with torch.inference_mode():
                faults.add(batch)
                logits = self.stepper.predict(model, batch)
                metric.update(logits, s.data.task.targets(batch), s.data.task.valid(batch))
        try:
            faults.check()
        except MaskIdError as err:
            raise err.naming(s.data.val.dataset, "validation") from None
        result = {"epoch": epoch, "step": s.step, **metric.compute(), "seconds": time.perf_counter() - started}
        model.train()
        self._last_eval_step = s.step
        self.evaluations.append(result)
        if s.dist.is_main:
            s.eval_log.write(result)
            key = s.data.task.primary_metric
            value = result.get(key)
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            loss = result.get("loss")
            log.info(
                "eval after step %d (epoch %d): %s %s, loss %s on %d samples",
                s.step,
                epoch + 1,
                key,
                shown,
                f"{loss:.4f}" if loss is not None else "n/a",
                result["samples"],
            )
        return result

    def checkpoint(self) -> Path | None:
        """Write a checkpoint of the current step (rank 0 writes; every rank contributes its state)."""
        s = self.s
        if self._last_saved_step == s.step:
            return None
        refuse_nonfinite_weights(s.bare_model, s.step, self.cfg.train.lr, self._newest_checkpoint)
        path = s.save_checkpoint()
        self._last_saved_step = s.step
        return path

    def _newest_checkpoint(self) -> Path | None:
        """The newest checkpoint on disk, once the one being written (rank 0) is there or has failed."""
        self.s.finish_checkpoint(quiet=True)
        return self.s.newest_checkpoint()

    # -- the whole run --------------------------------------------------------------------------
    def run(self) -> tuple[dict, list[dict]]:
        """Train to the end (epochs or max_steps); returns this rank's summary and the evaluations."""
        s = self.s
        every = self.cfg.train.eval_every_epochs
        if s.resumed and (s.epoch >= self.cfg.train.epochs or s.max_steps_reached()):
            log.info(
                "nothing left to train: the run is at step %d, %d of %d epoch(s) done (raise train.epochs/max_steps)",
                s.step,
                s.epoch,
                self.cfg.train.epochs,
            )
        self._count_skipped()
        with self.stop:  # SIGINT and SIGTERM stop after a step, with its checkpoint
            return self._run_epochs(s, every)

    def _run_epochs(self, s, every: int) -> tuple[dict, list[dict]]:
        try:
            missed = missed_evaluation(s)
            if missed is not None:  # killed between an epoch's last checkpoint and its evaluation
                self.evaluate(missed)
            while s.epoch < self.cfg.train.epochs and not s.max_steps_reached():
                if not s.mid_epoch:
                    s.data.train.set_epoch(s.epoch)
                s.mid_epoch = False
                if not self.run_epoch(s.epoch):
                    break
                s.epoch += 1
                if every and s.epoch % every == 0:
                    self.evaluate(s.epoch - 1)
                self.checkpoint()
            if every and len(self.stats):
                self.evaluate(s.epoch_of_last_step())
            self.checkpoint()
        finally:
            self.profile.close()
        return self.stats.summary(), self.evaluations
