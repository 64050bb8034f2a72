"""What every gpufeed loader shares: one pipeline for many epochs, resume, and honest failures.

:class:`EpochLoader` runs the loop the image and clip loaders have in common. A loader builds its
DALI pipeline (and, for PyAV clips, its worker processes) once, over a :class:`PlanStream`: the
plan batches of consecutive epochs from where reading starts. Each ``for batch in loader`` takes
the current epoch's batches from that stream; the pipeline keeps prefetching across the epoch
boundary, so the next epoch's first batch is usually ready before it is asked for. The pipeline
is rebuilt only when it must be (``pipeline_builds`` counts builds):

* the position jumps: :meth:`~EpochLoader.load_state_dict`, :meth:`~EpochLoader.set_epoch` to an
  epoch other than the next, or a new epoch after one abandoned part-way;
* the plan changes: files found bad and skipped (``loader.on_bad_sample: skip``);
* DALI failed (a failed pipeline cannot go on);
* the pipeline's input is finite and used up (DALI's video reader takes its clip list once).

When the pipeline fails, the files of the batches it was working on are suspects: those DALI's
message names, or that fail a decode outside DALI, are bad files (:class:`BadSampleError`, or left
out of this rank's shard with ``skip``); when none is, the failure is reported as what it is, a
:class:`PipelineError` carrying DALI's own first message and the likely cause, never as bad data.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from typing import Any

import numpy as np

from gpufeed.core import OUTAGE_PATTERN
from gpufeed.pipelines._cores import cuda_initialised, default_num_threads, loader_num_threads, worker_start_method
from gpufeed.pipelines._errors import BAD_FILE_HINT, BadSampleError, DatasetError, PipelineError, dali_reason
from gpufeed.pipelines._next_phases import NEXT_PHASES
from gpufeed.pipelines._pipeline_session import Session
from gpufeed.pipelines._row_checks import RowChecks
from gpufeed.pipelines._sampler import EpochHistory, EpochPlan, PlanSpec, PlanStream, Segment, StreamBatch, plan_epoch
from gpufeed.pipelines._shares import own_state, position_state

__all__ = [
    "EpochLoader",
    "cuda_initialised",
    "default_num_threads",
    "error_reason",
    "loader_num_threads",
    "worker_start_method",
]

log = logging.getLogger("gpufeed")


def error_reason(message: str, path: str) -> str:
    """The part of a (worker) error message that says what is wrong with ``path``."""
    line = next((ln for ln in reversed(message.splitlines()) if path in ln), dali_reason(message))
    return line.split(path, 1)[-1].lstrip(": ") or "cannot be decoded"


class EpochLoader:
    """Base of :class:`ImageLoader` and :class:`ClipLoader` (see the module docs).

    Subclasses call :meth:`_setup_epochs` in ``__init__`` and implement the hooks below. Sample
    ids here are dataset positions (images or videos); ``skipped`` maps each left-out id to why,
    ``read_failures`` the subset found bad while decoding (it travels in :meth:`state_dict`).

    Attributes:
        pipeline_builds: DALI pipelines built so far (one per loader unless rebuilt, see above).
        build_times_s: Seconds each of those took to build and start (logged on a GPU, where the
            first one was most of an H100 run's first batch, 2.3 s: the nvJPEG buffers, NVDEC lists).
    """

    # How many batches past the failing one DALI may have been preparing (prefetch queue + 1).
    _lookahead_batches = 1
    # Whether the loader reads loader.pipelines (several pipelines in turn: the image loader).
    _reads_pipelines = False
    dataset: Any

    def _setup_epochs(self, *, train: bool, loader_cfg, device, shard_id: int, num_shards: int, seed: int) -> None:
        self.train = train
        self.cfg = loader_cfg
        self.device = device
        self.shard_id, self.num_shards, self.seed = shard_id, num_shards, seed
        self.batch_size = loader_cfg.batch_size
        # Evaluation keeps every sample: "drop" is read as "partial" there.
        self.last_batch = loader_cfg.last_batch if train or loader_cfg.last_batch == "pad" else "partial"
        self.num_threads = loader_cfg.num_threads or loader_num_threads(train)
        asked = getattr(loader_cfg, "pipelines", 1)
        self.parallel_pipelines = asked if self._reads_pipelines else 1
        if asked > self.parallel_pipelines:
            log.warning("loader.pipelines: %d is for the image loader; %s reads one", asked, type(self).__name__)
        self.epoch = 0
        self._start_batch = 0
        self._history: EpochHistory | None = None  # segments other world sizes read (a resharded resume)
        self._passes = 0  # iter() calls: an older iterator stops
        self._left_at: tuple[int, int] | None = None  # (epoch, batch) where the last pass stood, while part-way
        self.skipped: dict[int, str] = {}
        self.read_failures: dict[int, str] = {}
        self.pipeline_builds = 0
        self.build_times_s: list[float] = []
        self._session: Session | None = None

    def _leave_out(self, bad: dict[int, str], what: str) -> None:
        """Files unusable before reading: an error naming them, or skipped (``on_bad_sample``)."""
        if not bad:
            return
        if self.cfg.on_bad_sample == "error":
            first = "; ".join(f"{self.dataset.paths[i]}: {why}" for i, why in list(bad.items())[:5])
            raise DatasetError(
                f"{len(bad)} {what}(s) in {self.dataset.source} cannot be used: {first}"
                f"{' ...' if len(bad) > 5 else ''}. {BAD_FILE_HINT}"
            )
        for sample_id, why in bad.items():
            log.warning("skipping %s %s: %s (loader.on_bad_sample: skip)", what, self.dataset.paths[sample_id], why)
        self.skipped.update(bad)

    # -- hooks --------------------------------------------------------------------------------
    def _plan_ids(self) -> np.ndarray:
        """The units ``plan_epoch`` orders and shards (identical on every rank)."""
        raise NotImplementedError

    def _excluded_plan_ids(self) -> np.ndarray | list[int]:
        """Plan units to leave out because of ``read_failures``."""
        raise NotImplementedError

    def _open_session(self, stream: PlanStream) -> Session:
        """Build the pipeline over ``stream`` and the iterator around it."""
        raise NotImplementedError

    def _batch(self, out: dict, batch: StreamBatch, iteration: int):
        """The typed batch for one iterator output (iteration ``iteration``, plan batch ``batch``)."""
        raise NotImplementedError

    def _suspects(self, batches: list[StreamBatch]) -> list[tuple[int, str, Any]]:
        """(sample id, path, what :meth:`_recheck` needs) for the rows of the batches a failure may come from."""
        raise NotImplementedError

    def _recheck(self, suspects: list[tuple[int, str, Any]]) -> dict[int, str]:
        """Decode the suspects one by one outside DALI; id -> reason for those that fail."""
        raise NotImplementedError

    # -- the public surface -----------------------------------------------------------------
    def _spec(self) -> PlanSpec:
        return PlanSpec(
            self._plan_ids(),
            seed=self.seed,
            shuffle=self.train and self.cfg.shuffle,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
            batch_size=self.batch_size,
            last_batch=self.last_batch,
            excluded=self._excluded_plan_ids(),
            history=self._history,
        )

    def _plan(self, start_batch: int) -> EpochPlan:
        return plan_epoch(
            self._plan_ids(),
            epoch=self.epoch,
            seed=self.seed,
            shuffle=self.train and self.cfg.shuffle,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
            batch_size=self.batch_size,
            last_batch=self.last_batch,
            start_batch=start_batch,
            excluded=self._excluded_plan_ids(),
            history=self.history_of(self.epoch),
        )

    def history_of(self, epoch: int) -> tuple[Segment, ...]:
        """The segments of ``epoch`` read by other world sizes before this loader's (none unless resumed so)."""
        return self._history.of(epoch) if self._history is not None else ()

    def _epoch_plan(self, spec: PlanSpec, epoch: int) -> EpochPlan:
        """``spec``'s plan of ``epoch``, from the running pipeline's stream when it has it.

        Planning shuffles every sample id; at an epoch boundary the stream has already planned the
        new epoch (DALI was fed its first batches), so asking again would stall for nothing.
        """
        session = self._session
        if session is not None and session.stream.spec == spec:
            return session.stream.plan(epoch)
        return spec.plan(epoch)

    def __len__(self) -> int:
        """Batches in the current epoch (all of them, including any already consumed)."""
        return self._epoch_plan(self._spec(), self.epoch).num_batches

    def batches_left(self, epochs: int) -> int:
        """Batches this rank reads from where it stands to the end of epoch ``epochs - 1``: a run's steps to go.

        The rest of the current epoch (in a resharded resume, of what remains of it, split over
        this loader's shards), then whole epochs as they are planned now.
        """
        if self.epoch >= epochs:  # a finished run resumed: nothing to go, not another epoch
            return 0
        spec = self._spec()
        left = max(0, self._epoch_plan(spec, self.epoch).num_batches - self._start_batch)
        if self.epoch + 1 < epochs:
            left += spec.plan(self.epoch + 1).num_batches * (epochs - self.epoch - 1)
        return left

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch`` (of what remains of it, in a resharded resume)."""
        history = self.history_of(epoch)
        self.epoch, self._start_batch = epoch, history[-1].batch if history else 0
        self._left_at = None

    def state_dict(self) -> dict:
        """Where the loader is: resume with :meth:`load_state_dict` on an identically built loader.

        ``epoch`` and ``batch`` name the next batch to read. Once every batch of an epoch has been
        taken, that is the next epoch's first batch, even before the iterator has noticed the end
        (a checkpoint written right after an epoch's last step): a resume then starts the next epoch,
        never the finished one again.

        ``shard``, ``consumed`` and ``history`` say how far this rank's share of the epoch got
        (:mod:`gpufeed.pipelines._shares`): every rank's state together lets the epoch continue on
        another number of ranks.
        """
        epoch, batch = self.epoch, self._start_batch
        if batch and batch >= len(self):
            epoch, batch = epoch + 1, 0
        return {
            "epoch": epoch,
            "batch": batch,
            "seed": self.seed,
            "batch_size": self.batch_size,  # another batch size goes on from the samples read, not the batch
            "read_failures": sorted(self.read_failures),
            **position_state(self, epoch, batch),
        }

    def load_state_dict(self, state: dict | list[dict]) -> None:
        """Continue where :meth:`state_dict` said.

        Args:
            state: This rank's state (saved by the same shard of the same number of ranks), or
                every rank's state in rank order, saved on any number of ranks: the epoch then
                continues with each remaining sample read once across this loader's shards (see
                :mod:`gpufeed.pipelines._sampler`).

        Raises:
            ValueError: Another seed, another shard's state alone, or rank states that do not
                stand at one place.
        """
        state = own_state(self, state)
        self.epoch, self._start_batch = int(state["epoch"]), int(state["batch"])
        self._left_at = None  # the next pass goes on from here
        segments = tuple(Segment.from_dict(d) for d in state.get("history", []))
        self._history = EpochHistory(self.epoch, segments) if segments else None
        for sample_id in state.get("read_failures", []):
            why = "failed to decode before the resume"
            self.read_failures.setdefault(int(sample_id), why)
            self.skipped.setdefault(int(sample_id), why)

    def close(self) -> None:
        """Release the pipeline (and its worker processes) now; the next iteration builds a new one."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def _session_at(self, spec: PlanSpec) -> Session:
        """The pipeline whose next output is the current position under ``spec``: kept, or built."""
        session = self._session
        here = (self.epoch, self._start_batch)
        if session is not None and not session.exhausted and session.stream.spec == spec and session.position() == here:
            return session
        self.close()
        self.pipeline_builds += 1
        started = time.perf_counter()
        self._session = self._open_session(PlanStream(spec, *here, plan_ahead=True))
        self.build_times_s.append(time.perf_counter() - started)
        if self.device.is_gpu:
            log.info(
                "%s: pipeline %d built and started in %.2f s (epoch %d, batch %d)",
                type(self).__name__, self.pipeline_builds, self.build_times_s[-1], *here,
            )  # fmt: skip
        return self._session

    def __iter__(self):
        """One epoch's batches: the rest of the current epoch, or the next one after a pass left part-way.

        As a DataLoader's, each ``for`` is a new pass: one left part-way (a ``break``, an error in
        the loop) makes the next start the next epoch, except after :meth:`load_state_dict` or
        :meth:`set_epoch`, which say where to go on. An older iterator stops with an error.
        """
        self._passes += 1
        return self._pass(self._passes)

    def _pass(self, this_pass: int):
        total = self._epoch_plan(self._spec(), self.epoch).num_batches
        # Every batch was taken but the iterator was left before its end (a trainer that stops after
        # len(loader) batches, as Lightning's does), or the last pass was left part-way: the next epoch.
        if (self._start_batch and self._start_batch >= total) or self._left_at == (self.epoch, self._start_batch):
            self.set_epoch(self.epoch + 1)
        while True:
            spec = self._spec()
            total = self._epoch_plan(spec, self.epoch).num_batches
            failed, session = None, None
            while self._start_batch < total:
                if this_pass != self._passes:
                    raise RuntimeError(
                        f"{type(self).__name__}: this iterator was left for a newer iter() of the loader, "
                        "which reads one pass at a time"
                    )
                try:
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    if session is None or session.exhausted:
                        session = self._session_at(spec)
                    out, batch, k = session.next()
                except Exception as err:  # DALI raises RuntimeError, and plain Exception for worker errors
                    failed = err
                    break
                self._start_batch += 1
                handed = self._batch(out, batch, k)
                # A session's build counts towards it; the CPU time tells its work from its waits.
                NEXT_PHASES.finish(time.perf_counter() - started, time.thread_time() - started_cpu)
                self._left_at = (self.epoch, self._start_batch)  # where this pass stands if it is left here
                yield handed
            if failed is None:
                break
            self._left_at = None  # the loader's own error: the next pass retries from the failing batch
            self._handle_failure(failed, session)
        self.epoch += 1
        self._start_batch = 0
        self._left_at = None

    def _handle_failure(self, err: Exception, session: Session | None) -> None:
        """Name the file(s) behind a pipeline failure and skip them, or raise naming them or the real cause."""
        if session is not None and session is self._session:
            stream, first = session.stream, session.consumed
        else:
            stream, first = PlanStream(self._spec(), self.epoch, self._start_batch), 0
        self.close()  # a failed pipeline is invalid: the next iteration builds a new one
        # DALI may have been preparing a few batches ahead of the one that failed, past the epoch's end too.
        # Each of the loader's pipelines may have been that far ahead of its own turns.
        ahead = (self.cfg.prefetch_queue_depth + self._lookahead_batches + 1) * self.parallel_pipelines - 1
        suspects = self._suspects([stream[first + i] for i in range(ahead + 1)])
        message = str(err)
        if re.search(OUTAGE_PATTERN, message):  # the store or the machine failed, not the files it names
            raise PipelineError(message, where=f" at epoch {self.epoch}, batch {self._start_batch}") from err
        problems = {
            sample_id: error_reason(message, path)
            for sample_id, path, _ in suspects
            if re.search(re.escape(path) + r"\b", message)
        }
        if not problems:  # the message does not say which file: re-check them one by one
            problems = self._recheck(suspects)
        if not problems:
            where = f" at epoch {self.epoch}, batch {self._start_batch}"
            checked = list(dict.fromkeys(path for _, path, _ in suspects))
            raise PipelineError(message, checked=checked, where=where) from err
        if self.cfg.on_bad_sample == "error":
            raise BadSampleError([(self.dataset.paths[i], why) for i, why in problems.items()]) from err
        for sample_id, why in problems.items():
            self.skipped[sample_id] = self.read_failures[sample_id] = why
            log.warning("skipping bad sample %s: %s", self.dataset.paths[sample_id], why)

    @functools.cached_property
    def _row_checks(self) -> RowChecks:
        """The checks of each batch's row tags against the plan (on a GPU, without waiting for it)."""
        return RowChecks()
