"""What every gpufeed loader shares: epochs, resume, and turning a failed batch into named files.

:class:`EpochLoader` runs the loop the image and clip loaders have in common: plan the epoch
(:func:`plan_epoch`), build that epoch's DALI pipeline behind a ``DALIGenericIterator``, yield
batches while counting them (the resume position), and, when the pipeline fails, find which
files caused it and either raise :class:`BadSampleError` naming them or leave them out of this
rank's shard and carry on (``loader.on_bad_sample``). A subclass says what a plan unit is, how to
build the pipeline, how to assemble a batch and how to re-check a suspect file.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import numpy as np

from gpufeed.pipelines._errors import BAD_FILE_HINT, BadSampleError, DatasetError
from gpufeed.pipelines._sampler import EpochPlan, plan_epoch

__all__ = ["EpochLoader", "default_num_threads", "error_reason", "last_line"]

log = logging.getLogger("gpufeed")


def default_num_threads() -> int:
    """One DALI thread per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def last_line(message: str) -> str:
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else message


def error_reason(message: str, path: str) -> str:
    """The part of a (worker) error message that says what is wrong with ``path``."""
    line = next((ln for ln in reversed(message.splitlines()) if path in ln), last_line(message))
    return line.split(path, 1)[-1].lstrip(": ") or "cannot be decoded"


class EpochLoader:
    """Base of :class:`ImageLoader` and :class:`ClipLoader` (see the module docs).

    Subclasses call :meth:`_setup_epochs` in ``__init__`` and implement the hooks below. Sample
    ids here are dataset positions (images or videos); ``skipped`` maps each left-out id to why,
    ``read_failures`` the subset found bad while decoding (it travels in :meth:`state_dict`).
    """

    # How many batches past the failing one DALI may have been preparing (prefetch queue + 1).
    _lookahead_batches = 1
    dataset: Any

    def _setup_epochs(self, *, train: bool, loader_cfg, device, shard_id: int, num_shards: int, seed: int) -> None:
        self.train = train
        self.cfg = loader_cfg
        self.device = device
        self.shard_id, self.num_shards, self.seed = shard_id, num_shards, seed
        self.batch_size = loader_cfg.batch_size
        # Evaluation keeps every sample: "drop" is read as "partial" there.
        self.last_batch = loader_cfg.last_batch if train or loader_cfg.last_batch == "pad" else "partial"
        self.num_threads = loader_cfg.num_threads or default_num_threads()
        self.epoch = 0
        self._start_batch = 0
        self.skipped: dict[int, str] = {}
        self.read_failures: dict[int, str] = {}

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

    def _excluded_plan_ids(self) -> list[int]:
        """Plan units to leave out because of ``read_failures``."""
        raise NotImplementedError

    def _open_epoch(self, plan: EpochPlan) -> Any:
        """Per-epoch state for :meth:`_iterator` and :meth:`_batch`."""
        return None

    def _close_epoch(self, ctx: Any) -> None:
        """Release what :meth:`_open_epoch` made."""

    def _iterator(self, plan: EpochPlan, ctx: Any):
        """A fresh ``DALIGenericIterator`` over ``plan``'s remaining batches."""
        raise NotImplementedError

    def _batch(self, out: dict, plan: EpochPlan, ctx: Any):
        """The typed batch for one iterator output."""
        raise NotImplementedError

    def _suspects(self, plan: EpochPlan, ctx: Any, rows: slice) -> list[tuple[int, str, Any]]:
        """(sample id, path, what :meth:`_recheck` needs) for the plan rows a failure may come from."""
        raise NotImplementedError

    def _recheck(self, suspects: list[tuple[int, str, Any]]) -> dict[int, str]:
        """Decode the suspects one by one outside DALI; id -> reason for those that fail."""
        raise NotImplementedError

    # -- the public surface -----------------------------------------------------------------
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
        )

    def __len__(self) -> int:
        """Batches in the current epoch (all of them, including any already consumed)."""
        return self._plan(0).num_batches

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch``."""
        self.epoch, self._start_batch = epoch, 0

    def state_dict(self) -> dict:
        """Where the loader is: resume with :meth:`load_state_dict` on an identically built loader."""
        return {
            "epoch": self.epoch,
            "batch": self._start_batch,
            "seed": self.seed,
            "read_failures": sorted(self.read_failures),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"loader state was saved with seed {state['seed']}, this loader uses seed {self.seed}")
        self.epoch, self._start_batch = int(state["epoch"]), int(state["batch"])
        for sample_id in state.get("read_failures", []):
            why = "failed to decode before the resume"
            self.read_failures.setdefault(int(sample_id), why)
            self.skipped.setdefault(int(sample_id), why)

    def __iter__(self):
        """Yield the rest of the current epoch, then advance to the next epoch."""
        while True:
            plan = self._plan(self._start_batch)
            if len(plan.sample_ids) == 0:
                break
            ctx = self._open_epoch(plan)
            iterator, failed = None, None
            batch_index = self._start_batch
            try:
                while True:
                    try:
                        # DALIGenericIterator runs the first batch in its constructor, so build it here.
                        iterator = iterator or self._iterator(plan, ctx)
                        out = next(iterator)[0]
                    except StopIteration:
                        break
                    except Exception as err:  # DALI raises RuntimeError, and plain Exception for worker errors
                        failed = err
                        break
                    batch_index += 1
                    self._start_batch = batch_index
                    yield self._batch(out, plan, ctx)
            finally:
                del iterator
                self._close_epoch(ctx)
            if failed is None:
                break
            self._handle_failure(failed, plan, ctx, batch_index)
        self.epoch += 1
        self._start_batch = 0

    def _handle_failure(self, err: Exception, plan: EpochPlan, ctx: Any, batch_index: int) -> None:
        """Name the file(s) behind a pipeline failure; skip them or raise :class:`BadSampleError`."""
        first = (batch_index - plan.start_batch) * self.batch_size
        # DALI may have been preparing a few batches ahead when it failed.
        rows = slice(first, first + self.batch_size * (self.cfg.prefetch_queue_depth + self._lookahead_batches))
        suspects = self._suspects(plan, ctx, rows)
        message = str(err)
        problems = {
            sample_id: error_reason(message, path)
            for sample_id, path, _ in suspects
            if re.search(re.escape(path) + r"\b", message)
        }
        if not problems:  # the message does not say which file: re-check them one by one
            problems = self._recheck(suspects)
        if not problems:
            raise BadSampleError(
                [(path, "in the failing batch") for path in dict.fromkeys(path for _, path, _ in suspects)],
                detail=f" DALI said: {last_line(message)}",
            ) from err
        if self.cfg.on_bad_sample == "error":
            raise BadSampleError([(self.dataset.paths[i], why) for i, why in problems.items()]) from err
        for sample_id, why in problems.items():
            self.skipped[sample_id] = self.read_failures[sample_id] = why
            log.warning("skipping bad sample %s: %s", self.dataset.paths[sample_id], why)
        self._start_batch = batch_index
