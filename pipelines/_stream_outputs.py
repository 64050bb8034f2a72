"""A GPU pipeline of the dynamic executor read without a host wait for its GPU work or a copy (``loader.executor``).

On a GPU the loaders run the static executor by default (:mod:`gpufeed.pipelines._executor`), read by
``DALIGenericIterator``: ``share_outputs`` waits on the host for the batch's GPU work, then the
iterator allocates torch tensors and copies into them. A GPU training run spent about 3 ms of host
time in each ``next(loader)`` (an H200, ResNet-18, batches of 256); ``loader.executor: dynamic``
reads the pipeline with :class:`StreamOutputs` instead, so that a run can compare the two. What it
relies on: DALI 2.4's ``nvidia/dali/pipeline.py`` as installed, and from DALI's repository
``backend_impl.cc`` (a 2026 revision whose messages the installed ``backend_impl`` carries
word for word), ``exec2.cc`` (a 2024 revision) and ``buffer.h``:

* ``Pipeline.share_outputs(cuda_stream=s)`` (the dynamic executor only: the static one raises)
  waits on the host until the iteration's operators have been *launched*, then makes ``s`` wait for
  the iteration's GPU event, on the GPU (``Executor2::PopOutputs``: ``output_order.wait(ws.event())``);
  without a stream the host waits for the GPU work. ``s`` is the stream the tensors are used on,
  torch's current stream: the training stream. Nothing is copied, so no side stream is needed
  (:class:`~gpufeed.pipelines._pipeline_session.SideStreamCopies` keeps its copies off the training
  stream), and DALI's own streams never wait for the training stream.
* A GPU output goes to torch through DLPack without a copy: ``torch.from_dlpack`` passes torch's
  current stream to ``TensorGPU.__dlpack__(stream=...)``, which makes that stream wait for the
  tensor's ready event, on the GPU (``ToDLMTensor``). The capsule holds a reference to DALI's
  buffer, which the dynamic executor keeps for as long as it is referenced.
* A pinned host output (``kDLCUDAHost``, which torch refuses: see :mod:`gpufeed.pipelines._executor`)
  is asked for as plain host memory, ``__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0))``: DALI hands
  pinned memory over as ``kDLCPU`` after waiting on the host for its ready event. That event is the
  iteration's (``OutputTask::Run`` in ``exec2.cc`` gives it to every pinned output, recorded once
  every output's producer is done), so the host would wait for the batch's GPU work after all, in
  the handover (NEXT_PHASES' ``copies``). The loaders' GPU graphs therefore have no host output: their
  row tags go out on the GPU and are checked a few batches later
  (:mod:`gpufeed.pipelines._row_checks`). The device must be DALI's ``DLDeviceType``, not an int.
  Should a DALI refuse it, the output is copied through numpy instead (logged once).
* Lifetime: DALI frees an output's GPU buffer when its last reference goes, stream-ordered on the
  stream that allocated it (``buffer.h``: ``deletion_order``), and so free for DALI's next work there
  while the training stream may still read it. ``Tensor.record_stream`` cannot hold it, since torch's
  caching allocator skips memory it did not allocate, so each batch's tensors are kept here until
  an event recorded on the stream it was handed over on, at the next ``next()`` (after the step that
  read them was queued), has completed: a query, not a wait. Should the host run more than :data:`_HELD_BATCHES`
  batches ahead of the GPU, the oldest is waited for; the batches held when the reader goes (its
  session closes) are waited for then. A batch the caller keeps past the next call is its own.

None of this has run on a GPU yet (none was lent to this work): the tests marked ``gpu`` in
``tests/test_loader_executor.py`` compare its batches with the static executor's, check that
``next()`` asks torch for no host sync and does not wait for a step queued on the training stream,
and that a batch read after later ones were taken still holds its pixels.
"""

from __future__ import annotations

import collections
import logging
import weakref

import numpy as np

from gpufeed.pipelines._next_phases import timed_pipeline

__all__ = ["StreamOutputs", "host_tensor"]

log = logging.getLogger("gpufeed")

# Batches kept for the training stream before the host waits for the oldest (see the module docs):
# a host this far ahead of the GPU is waiting for the GPU anyway.
_HELD_BATCHES = 4


def host_tensor(tensor):
    """A DALI ``TensorCPU`` as a torch tensor, and whether it had to be copied (see the module docs)."""
    import torch
    from nvidia.dali.backend import DLDeviceType

    if tensor.__dlpack_device__()[0] == DLDeviceType.kDLCPU:
        return torch.from_dlpack(tensor), False
    try:  # pinned (kDLCUDAHost): the same memory, described to torch as plain host memory
        return torch.from_dlpack(tensor.__dlpack__(dl_device=(DLDeviceType.kDLCPU, 0))), False
    except (TypeError, ValueError, RuntimeError, BufferError):
        return torch.from_numpy(np.asarray(tensor).copy()), True


class _HeldBatches:
    """The tensors of the batches handed over, each kept until the stream that reads it is done with it.

    Every output is held, host ones too: a pinned host output goes back to DALI on its own stream
    when its last reference goes, as a GPU one does, while a copy queued from it may still read it.
    """

    def __init__(self) -> None:
        self.done: collections.deque = collections.deque()  # (event on the reading stream, tensors)
        self.last: tuple | None = None  # (reading stream, tensors): handed over last, its step not yet queued

    def keep(self, tensors: list, stream) -> None:
        """Hold ``tensors``, the batch handed over to be read on ``stream``, until the next :meth:`mark`."""
        self.last = (stream, tensors)

    def mark(self) -> None:
        """The previous batch's step is queued on its stream: hold it to an event there; drop finished ones."""
        import torch

        while self.done and self.done[0][0].query():  # a query: the host does not wait
            self.done.popleft()
        if self.last is not None:
            stream, tensors = self.last
            # Blocking: a wait below sleeps instead of spinning a core DALI's threads and the feed need.
            event = torch.cuda.Event(blocking=True)
            event.record(stream)  # the stream it went out on, whatever stream is current now
            self.done.append((event, tensors))
            self.last = None
        while len(self.done) > _HELD_BATCHES:
            self.done.popleft()[0].synchronize()

    def drain(self) -> None:
        """Wait for the reading streams' uses of every held batch, then let them go (the reader is gone)."""
        self.mark()  # the last batch's step is queued by now, if it ever will be
        while self.done:
            self.done.popleft()[0].synchronize()


class StreamOutputs:
    """A GPU pipeline's outputs (dynamic executor) as torch tensors on the caller's stream, without copies.

    Runs are scheduled as ``DALIGenericIterator`` schedules them: the first ``next()`` (or
    :meth:`start`) fills the prefetch queue, and each call queues the next run after handing its batch
    over. Yields ``[{name: tensor}]`` as the iterator does; every DALI call is timed into
    :data:`~gpufeed.pipelines._next_phases.NEXT_PHASES`. The GPU tensors handed over are held until
    the training stream is done with them, and waited for when this reader goes (module docs).

    Args:
        pipe: A built GPU pipeline (``device_id`` set) of the dynamic executor (``exec_dynamic``).
        names: A name for each of its outputs.
        device: Its torch device.
    """

    def __init__(self, pipe, names: list[str], device) -> None:
        if pipe.device_id is None or not pipe.exec_dynamic:
            raise ValueError("StreamOutputs reads GPU pipelines of the dynamic executor only")
        timed_pipeline(pipe)  # its calls below are timed into NEXT_PHASES, as DALI's iterator's are
        self.pipe, self.names, self.device = pipe, list(names), device
        self.started = False
        self.copied: set[str] = set()  # host outputs DALI would not hand over as plain host memory
        self.held = _HeldBatches()
        # Dropped with its session (no cycle holds it): wait then for what the training stream still reads.
        weakref.finalize(self, self.held.drain).atexit = False  # at exit the process, and its GPU work, ends

    def __iter__(self):
        return self

    def start(self) -> None:
        """Fill the pipeline's prefetch queue, as the first ``next()`` would (``loader.pipelines``)."""
        if not self.started:
            self.started = True
            self.pipe.schedule_run()  # the first run fills the prefetch queue

    def __next__(self) -> list[dict]:
        import torch

        consumer = torch.cuda.current_stream(self.device)
        self.held.mark()  # the previous batch's step was queued on its stream before this call
        self.start()
        outputs = self.pipe.share_outputs(cuda_stream=consumer)  # consumer waits for the batch, on the GPU
        batch = {name: self._tensor(name, out.as_tensor()) for name, out in zip(self.names, outputs, strict=True)}
        self.held.keep(list(batch.values()), consumer)
        # As DALI's iterator: the next run queued after the handover. The dynamic executor keeps the
        # buffers the tensors hold after release_outputs.
        self.pipe.release_outputs()
        self.pipe.schedule_run()
        return [batch]

    def _tensor(self, name: str, tensor):
        import torch
        from nvidia.dali.tensors import TensorGPU

        if isinstance(tensor, TensorGPU):
            return torch.from_dlpack(tensor)  # DALI makes torch's current stream (the consumer) wait
        out, copied = host_tensor(tensor)
        if copied and name not in self.copied:
            self.copied.add(name)
            log.warning("loader.executor dynamic: DALI's host output %r was copied (no plain host DLPack)", name)
        return out
