"""One training run's state: device, ranks, run folder, model, optimiser, loaders, telemetry, resume.

:func:`train` opens a :class:`Session`, which prepares everything :class:`~gpufeed.train._loop.Loop`
needs, writes its checkpoints and closes what it opened. What a checkpoint holds and how a resume
puts it back into the session are :mod:`gpufeed.train._run_state`'s.
"""

from __future__ import annotations

import errno
import logging
import time
from pathlib import Path
from typing import IO

import torch

from gpufeed.config import Config, ConfigError, save_config
from gpufeed.core import configure_storage, finite, write_json
from gpufeed.device import resolve_device
from gpufeed.models import CHECKPOINT_DIR, checkpoint_path, create_model, default_spec, list_checkpoints
from gpufeed.train._agreement import agree_on_data
from gpufeed.train._augment import plan_augmentation
from gpufeed.train._checkpoint import (
    CheckpointWriteFailed,
    CheckpointWriter,
    capture_rng,
    load_latest_checkpoint,
    param_digest,
    remove_stale_temp_files,
)
from gpufeed.train._data import build_data
from gpufeed.train._dense import refuse_device_geometry
from gpufeed.train._distributed import (
    all_gather_objects,
    broadcast_buffers,
    broadcast_object,
    group_dist_info,
    init_distributed,
    shutdown_distributed,
)
from gpufeed.train._errors import TrainError
from gpufeed.train._loop import Loop, TrainResult
from gpufeed.train._metrics_server import MetricsServer
from gpufeed.train._optim import build_optimizer, build_scheduler, compile_model, resolve_amp
from gpufeed.train._preflight import (
    STEP_LOG_LINE_BYTES,
    disk_full,
    ensure_writable,
    estimate_checkpoint_bytes,
    first_missing,
    hold_run_folder,
    remove_unstarted_run,
    space_problem,
    write_failure_message,
)
from gpufeed.train._run_state import checkpoint_payload, restore_run
from gpufeed.train._skipped import merge_skipped, report_skipped, skipped_files, skipped_line
from gpufeed.train._summary import format_job, format_summary, job_loader_wait_of_run
from gpufeed.train._tasks import to_channels_last
from gpufeed.train._telemetry import StepLog, TrainMetrics, cut_logs_of_missing_ranks, step_log_path

__all__ = ["Session", "train"]

log = logging.getLogger("gpufeed")


class Session:
    """Set up a run (``with Session(...) as s: s.run()``); see :func:`gpufeed.train.train`."""

    def __init__(self, cfg: Config, run_dir, *, resume: bool, profile_steps) -> None:
        self.cfg = cfg
        self.resume_requested = resume
        self.profile_steps = profile_steps
        # The launcher's variables, or the process group's rank and world size when one is running.
        self.dist = group_dist_info()
        if self.dist.enabled and cfg.loader.last_batch == "partial":
            raise ConfigError(
                "loader.last_batch",
                "'partial' gives ranks different step counts, which DDP cannot run; use drop or pad",
            )
        self.device = resolve_device(cfg.device, self.dist.local_rank, self.dist.world_size)
        if self.device.is_gpu:
            torch.cuda.set_device(self.device.device_id)  # events, RNG state and DDP use the current device
        self.amp_dtype = resolve_amp(cfg.train.amp, self.device)
        self._owns_group = self.dist.enabled and not torch.distributed.is_initialized()
        self._store = init_distributed(
            self.dist, self.device.is_gpu, device_index=self.device.device_id, device=self.device.describe()
        )
        self.dist = group_dist_info(self.dist)  # each rank's share of the data is the process group's
        self.run_dir = self._choose_run_dir(run_dir)
        self.step = 0
        self.epoch = 0
        self.mid_epoch = False
        self.resumed = False
        self.server: MetricsServer | None = None
        self.step_log: StepLog | None = None
        self.eval_log: StepLog | None = None
        self.last_checkpoint: Path | None = None  # the newest checkpoint written to the end (rank 0)
        self._writer = CheckpointWriter()
        self._run_lock: IO[str] | None = None

    # -- setup ----------------------------------------------------------------------------------
    def _choose_run_dir(self, run_dir) -> Path:
        if run_dir is None:
            run_dir = Path("runs") / f"{self.cfg.model.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(broadcast_object(str(Path(run_dir).resolve())))
        self._made_run_dir = first_missing(run_dir) if self.dist.is_main else None  # removed if the start fails
        # Before anything is written there (metrics address, config): fail in seconds, not at the first checkpoint.
        ensure_writable(run_dir)
        ensure_writable(run_dir / CHECKPOINT_DIR)
        return run_dir

    def __enter__(self) -> Session:
        try:
            self._run_lock = hold_run_folder(self.run_dir, self.dist.is_main)
            self._setup()
        except BaseException:
            self.close(linger=False)
            if self._made_run_dir is not None:
                remove_unstarted_run(self.run_dir, self._made_run_dir)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(linger=exc_type is None)

    def _setup(self) -> None:
        cfg, rank = self.cfg, self.dist.rank
        if not self.resume_requested and list_checkpoints(self.run_dir):
            raise TrainError(
                f"{self.run_dir} already holds checkpoints: pass --resume to continue that run, "
                "or choose another --out folder"
            )
        telemetry = cfg.telemetry
        self.metrics = TrainMetrics(rank)
        port = telemetry.metrics_port + self.dist.local_rank if telemetry.metrics_port else 0
        self.server = MetricsServer(self.metrics.registry, telemetry.metrics_host, port, self.run_dir, rank)
        try:
            head = default_spec(cfg.model.name).head  # the network's task, before the data may refine it
        except ValueError as err:
            raise ConfigError("model.name", str(err)) from None

        torch.manual_seed(cfg.seed)  # identical initial weights on every rank
        # One plan decides where each op runs, so none runs both in the loader and on the device.
        augment = plan_augmentation(cfg.augment, clips=head.takes_clips, dtype=self.amp_dtype)
        if head.dense:
            refuse_device_geometry(augment.placement)
        self.data = build_data(cfg, head.task, self.device, self.dist, augment=augment.loader)
        spec = dict(self.data.spec_overrides, mean=cfg.model.mean, std=cfg.model.std)
        model = create_model(cfg.model.name, **spec).to(self.device.torch_device)
        self.input_format = None
        if cfg.train.channels_last:
            model = to_channels_last(model)
            self.input_format = self.data.task.input_format(model)
        compile_model(model, cfg.train.compile)  # in place: its state-dict keys stay the model's own
        self.augment = augment.augmenter.to(self.device.torch_device)
        self.augment_placement = augment.placement
        self.optimizer = build_optimizer(model, cfg.train)
        self.total_steps = cfg.train.epochs * len(self.data.train)
        self.schedule_anchor: tuple[int, float] | None = None  # set by a resume with another length to go
        self.scheduler = build_scheduler(self.optimizer, self.total_steps, cfg.train)
        self.scaler = torch.amp.GradScaler(self.device.torch_device.type, enabled=self.amp_dtype == torch.float16)
        self.model: torch.nn.Module = model  # DistributedDataParallel wraps it on several ranks

        found = None
        if self.resume_requested:
            if rank == 0:
                remove_stale_temp_files(self.run_dir)
            found = load_latest_checkpoint(self.run_dir)
            if found is None:
                log.warning("--resume: no checkpoint in %s yet, starting from scratch", self.run_dir)
        if found is not None:
            restore_run(self, *found)
        else:
            torch.manual_seed(cfg.seed + 1 + rank)  # each rank draws its own augmentations
        self._check_space()
        # Every rank's view of the data and its share, compared before any step (after a resume:
        # the shares of what remains of the epoch).
        agree_on_data(self._store, self.dist, {"train": self.data.train, "val": self.data.val})
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.device_id] if self.device.is_gpu else None
            self.model = DistributedDataParallel(model, device_ids=ids)
        resume_step = self.step if self.resumed else None
        self.step_log = StepLog(step_log_path(self.run_dir, rank), resume_step)
        if rank == 0 and resume_step is not None:
            cut_logs_of_missing_ranks(self.run_dir, self.dist.world_size, resume_step)
        if rank == 0:
            self.eval_log = StepLog(self.run_dir / "eval.jsonl", resume_step)
            save_config(cfg, self.run_dir / "config.yaml")
        amp = str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "off"
        log.info(
            "training %s (%s task, %d classes) on %s, amp %s, %d rank(s), %d steps per epoch, run folder %s",
            cfg.model.name,
            self.data.task.name,  # the task trained (a dense model's spec says depth until its data decide)
            self.data.task.num_classes,
            self.device.describe(),
            amp,
            self.dist.world_size,
            len(self.data.train),
            self.run_dir,
        )
        if self.augment_placement:
            where = ", ".join(f"{op} in {place}" for op, place in self.augment_placement.items())
            log.info("augmentation: %s", where)

    def _check_space(self) -> None:
        """Refuse to start without room for two checkpoints and the step logs (rank 0 decides for all)."""
        problem = None
        if self.dist.is_main:
            cfg = self.cfg
            planned = self.total_steps if cfg.train.max_steps is None else min(self.total_steps, cfg.train.max_steps)
            per_line = STEP_LOG_LINE_BYTES + (8 * cfg.loader.batch_size if cfg.telemetry.record_sample_ids else 0)
            problem = space_problem(
                self.run_dir,
                estimate_checkpoint_bytes(self.model, self.optimizer),
                [p.stat().st_size for p in list_checkpoints(self.run_dir)],
                cfg.train.keep_checkpoints,
                log_bytes=max(0, planned - self.step) * per_line * self.dist.world_size,
            )
        # Every rank raises, so none is left waiting in a collective for rank 0.
        problem = broadcast_object(problem)
        if problem:
            raise TrainError(problem)

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self) -> Path | None:
        """Gather every rank's loader and RNG state; rank 0 copies the state and writes it in the background.

        Returns the path being written (rank 0; :meth:`finish_checkpoint` waits for it). Raises
        TrainError when the previous write failed or this checkpoint cannot fit on the disk.
        """
        position = self.data.train.state_dict()
        mine = {"loader": position, "rng": capture_rng(), "threads": torch.get_num_threads()}
        gathered = all_gather_objects(mine)  # the collective stays on the training thread
        if not self.dist.is_main:
            return None
        self.finish_checkpoint()  # one write at a time; a failed one stops the run here
        payload, started = checkpoint_payload(self, position, gathered), time.perf_counter()
        try:
            path = self._writer.submit(payload, self.run_dir, self.step, self.cfg.train.keep_checkpoints)
        except OSError as err:  # no room for it: refused before anything was written
            raise TrainError(self._write_failure(err, checkpoint_path(self.run_dir, self.step))) from err
        log.debug("checkpoint %s: copied in %.3f s, writing in the background", path, time.perf_counter() - started)
        return path

    def finish_checkpoint(self, *, quiet: bool = False) -> Path | None:
        """Wait until the checkpoint being written (rank 0) is on disk; it becomes ``last_checkpoint``.

        Args:
            quiet: Log a failed write rather than raise it (another error is ending the run).

        Raises:
            TrainError: The write failed, in one line naming it; the checkpoints on disk are untouched.
        """
        try:
            path = self._writer.wait()
        except CheckpointWriteFailed as failed:
            error = TrainError(self._write_failure(failed.error, failed.path))
            if not quiet:
                raise error from failed.error
            log.error("%s", error)
            return None
        self.last_checkpoint = path or self.last_checkpoint
        return path

    def _write_failure(self, err: BaseException, path: Path) -> str:
        # Written through a temporary file that is gone now: the checkpoints on disk are untouched.
        if isinstance(err, OSError):
            return write_failure_message(err, self.run_dir, self.newest_checkpoint(), f"checkpoint {path}")
        return str(CheckpointWriteFailed(path, err))

    # -- the run --------------------------------------------------------------------------------
    @property
    def bare_model(self) -> torch.nn.Module:
        return getattr(self.model, "module", self.model)

    def max_steps_reached(self) -> bool:
        return self.cfg.train.max_steps is not None and self.step >= self.cfg.train.max_steps

    def epoch_of_last_step(self) -> int:
        at_boundary = int(self.data.train.state_dict().get("batch", 0)) == 0
        return max(0, self.epoch - 1) if at_boundary else self.epoch

    def newest_checkpoint(self) -> Path | None:
        found = list_checkpoints(self.run_dir)
        return found[-1] if found else None

    def run(self) -> TrainResult:
        """Train to the end; a write that fails for lack of space (or a file system turned read-only) is a TrainError."""
        try:
            return self._run()
        except OSError as err:
            if not (disk_full(err) or err.errno == errno.EROFS):
                raise
            self.finish_checkpoint(quiet=True)  # the newest checkpoint named below is on disk
            what = f"to {err.filename}" if err.filename else f"to the run folder {self.run_dir}"
            raise TrainError(write_failure_message(err, self.run_dir, self.newest_checkpoint(), what)) from err

    def _run(self) -> TrainResult:
        self.last_checkpoint = None
        summary, evaluations = Loop(self).run()
        broadcast_buffers(self.model)  # the statistics rank 0's checkpoint holds, on every rank
        mine = {"rank": self.dist.rank, "summary": summary, "param_digest": param_digest(self.model)}
        everyone = all_gather_objects(mine)
        skipped = merge_skipped(all_gather_objects(skipped_files(self.data)))
        if self.dist.is_main:
            # After the last collective (a failed write stops rank 0 alone), before summary.json (the run is done).
            self.finish_checkpoint()
            report_skipped(skipped, clips=self.data.task.clips)
            # Every rank has logged its last step: the gathers above follow each rank's loop.
            job = job_loader_wait_of_run(self.run_dir)
            document = {
                "model": self.cfg.model.name,
                "device": self.device.describe(),
                "world_size": self.dist.world_size,
                "step": self.step,
                "epoch": self.epoch,
                "amp": str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else "off",
                "evaluations": evaluations,
                "skipped": skipped,
                "job": job,
                "ranks": everyone,
            }
            title = f"loader vs compute: {self.cfg.model.name} on {self.device.describe()}"
            for entry in everyone:
                heading = f"{title}, rank {entry['rank']}" if len(everyone) > 1 else title
                print("\n" + format_summary(entry["summary"], heading), flush=True)
            if len(everyone) > 1:
                print("\n" + format_job(job), flush=True)
            print(skipped_line(skipped, clips=self.data.task.clips), flush=True)
            # Written last: its presence tells watchers (and tests) the run has finished.
            write_json(self.run_dir / "summary.json", finite(document), allow_nan=False)
        return TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            epoch=self.epoch,
            checkpoint=self.last_checkpoint if self.dist.is_main else None,
            summary=summary,
            evaluations=evaluations,
            device=self.device.describe(),
            skipped=skipped["train"]["files"],
        )

    def close(self, linger: bool) -> None:
        """Wait for the checkpoint being written, then close the logs, the metrics and the process group.

        Args:
            linger: The run ended without an error: a failed write is raised (else logged: the run's
                own error goes on), or the metrics are served ``telemetry.linger_seconds`` more.
        """
        try:
            self.finish_checkpoint(quiet=not linger)
            linger_s = self.cfg.telemetry.linger_seconds
            if linger and self.server is not None and linger_s > 0:
                log.info("serving metrics at http://%s/metrics for %.0f s more", self.server.address, linger_s)
                time.sleep(linger_s)
        finally:
            for closable in (self.step_log, self.eval_log, self.server):
                if closable is None:
                    continue
                try:
                    closable.close()
                except OSError as err:  # a log's last flush on a full disk: the error that stopped the run says more
                    log.warning("closing %s failed: %s", getattr(closable, "path", closable), err)
            self.server = self.step_log = self.eval_log = None
            if self._owns_group:
                shutdown_distributed()
                self._owns_group = False
            if self._run_lock is not None:
                self._run_lock.close()


def train(
    cfg: Config,
    run_dir: str | Path | None = None,
    *,
    resume: bool = False,
    profile_steps: tuple[int, int] | None = None,
) -> TrainResult:
    """Train ``cfg.model`` on ``cfg.data`` into ``run_dir``.

    Args:
        cfg: The whole config (sections ``model``, ``train``, ``augment``, ``telemetry``,
            ``data``, ``image``, ``loader``).
        run_dir: The run folder; default ``runs/<model>-<date>-<time>``.
        resume: Continue from the newest loadable checkpoint in ``run_dir``, which must be given
            (start fresh if there is none). Without it, a ``run_dir`` that holds checkpoints is refused.
        profile_steps: ``(A, B)``: record a Chrome trace of steps A..B.

    Raises:
        ConfigError, TrainError, DatasetError, BadSampleError: Input problems, clearly named.
    """
    if resume and run_dir is None:  # each run gets a new folder: there would be nothing to continue
        raise TrainError("resume needs the run folder to continue: give it as --out RUN_DIR (run_dir= in Python)")
    configure_storage(cfg.storage)  # s3:// data: the cache and block size, for DALI's worker processes too
    with Session(cfg, run_dir, resume=resume, profile_steps=profile_steps) as session:
        return session.run()
