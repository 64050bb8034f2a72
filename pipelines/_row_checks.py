"""Each batch's row tags checked against the plan, without the host waiting for the GPU (:class:`RowChecks`).

Every loader tags its rows (iteration and row, or clip) and checks them against the plan batch it
hands over, so that a batch out of step with the plan stops the run instead of training on the
wrong labels. On a GPU the tags come out of the pipeline on the device: read at once they would
make the host wait for the batch's GPU work every step (DALI hands a pinned host output over only
after waiting for its iteration's event, which covers the whole batch: ``ToDLMTensor`` in DALI's
``backend_impl.cc``). Instead they are copied to pinned memory without a wait and checked once that
copy is done, at the latest :data:`_PENDING` batches on, which still stops such a run within a few
steps.
"""

from __future__ import annotations

import collections

import numpy as np

__all__ = ["RowChecks", "check_rows"]

# Tag copies outstanding before the host waits for the oldest. The copies are queued on the training
# stream, behind the steps queued before them; a host this many batches ahead of the GPU waits for
# it anyway (as the dynamic reader's held batches, pipelines/_stream_outputs.py).
_PENDING = 4


def check_rows(tags: np.ndarray, expected: np.ndarray) -> None:
    """Guard against an output that is not the plan batch the stream says it is."""
    if not np.array_equal(tags, expected):
        raise RuntimeError(
            f"pipeline output out of step with the plan: rows {tags[:4].tolist()}..., expected "
            f"{expected[:4].tolist()}... (a gpufeed bug; please report it)"
        )


class RowChecks:
    """Check a batch's tags against the plan (:func:`check_rows`): host tags at once, GPU tags when their copy is done."""

    def __init__(self) -> None:
        self.pending: collections.deque = collections.deque()  # (host copy, its event, expected)

    def __call__(self, tags, expected: np.ndarray) -> None:
        """Check ``tags`` (a torch tensor on the loader's device) against ``expected``."""
        if not tags.is_cuda:
            check_rows(tags.numpy().astype(np.int64), expected)
            return
        import torch

        host = torch.empty(tags.shape, dtype=tags.dtype, pin_memory=True)
        host.copy_(tags, non_blocking=True)  # queued on the tags' device's current stream
        copied = torch.cuda.Event(blocking=True)  # on that stream (not cuda:0's for a loader on cuda:1)
        copied.record(torch.cuda.current_stream(tags.device))
        self.pending.append((host, copied, expected))
        while self.pending and (len(self.pending) > _PENDING or self.pending[0][1].query()):
            self._check_oldest()

    def _check_oldest(self) -> None:
        host, copied, expected = self.pending.popleft()
        copied.synchronize()  # an event wait for an earlier batch, never the whole device
        check_rows(host.numpy().astype(np.int64), expected)
