"""Which DALI executor a loader's pipeline runs on (``loader.executor``).

``auto`` (the default): the static executor on a GPU, the dynamic one on a CPU, for these reasons.
DALI 2's default, dynamic executor hands a GPU pipeline's CPU outputs (sample ids, rows, labels) to
``DALIGenericIterator`` in pinned host memory, which the iterator passes to ``torch.from_dlpack``
without a copy. torch refuses that memory (DLPack device ``kDLCUDAHost``: "BufferError: Unsupported
device_type: 3", seen with torch 2.11 and DALI 2.4 on an H200), so every GPU loader with a host
output failed at its first batch. On a GPU the loaders take the static executor, whose outputs the
iterator copies into torch's own tensors: one device-to-device copy of a batch (not measured; 256
images of 224x224 are 38.5 MB, some 0.03 ms at an H200's copy bandwidth of about 3 TB/s) and a
memcpy of its few host values. No loader graph moves data
from the GPU back to the CPU, the one thing the static executor cannot run. On a CPU the dynamic
executor stays: its outputs are plain host memory, handed over without a copy.

``static`` and ``dynamic`` force one executor, for an A/B of the host time a GPU run spends in each
``next(loader)`` (about 3 ms a batch on an H200, ResNet-18, batches of 256: ``gpufeed bench train
--device gpu --set loader.executor=dynamic``, ``gpufeed bench loader --vary
loader.executor=static,dynamic``). With the static executor ``share_outputs`` waits on the host for
the batch's GPU work, and the iterator then allocates torch tensors and copies into them. With the
dynamic one a GPU pipeline is read by
:class:`~gpufeed.pipelines._stream_outputs.StreamOutputs`: the training stream waits for DALI's work
on the GPU, the GPU outputs reach torch without a copy, and a pinned host output torch refuses is
handed over as plain host memory (DALI waits on the host for its ready event first, which is the
iteration's: the batch's GPU work). So the image and dense loaders' GPU graphs put their row tags
on the GPU only, checked a few batches later (:mod:`~gpufeed.pipelines._row_checks`), under both
executors.

``static`` on a CPU runs too: DALI's static executor runs CPU-only pipelines, and every CPU loader
graph (images, ``loader.pipelines: 2``, dense pairs, frame stores, PyAV clips, DALI's VP9 reader)
gives the same batches on it as on the dynamic one (``tests/test_loader_executor.py``); its
outputs are copied out before DALI reuses their buffers.

Every loader hands its ``loader.executor`` down to its pipeline's build (the clip loader's sources
through their :class:`~gpufeed.pipelines._clip_source.ClipJob`).
"""

from __future__ import annotations

__all__ = ["EXECUTORS", "executor_args"]

# loader.executor's values (gpufeed.config's LoaderConfig declares the same ones).
EXECUTORS = ("auto", "static", "dynamic")


def executor_args(on_gpu: bool, choice: str = "auto") -> dict:
    """DALI ``Pipeline`` keyword arguments choosing the executor (see the module docs).

    Args:
        on_gpu: Whether the pipeline has a device (``device_id`` set).
        choice: ``loader.executor``.

    Raises:
        ValueError: ``choice`` is not one of :data:`EXECUTORS` (naming ``loader.executor``).
    """
    if choice not in EXECUTORS:
        raise ValueError(f"loader.executor {choice!r} is not allowed; allowed: {', '.join(EXECUTORS)}")
    if choice == "auto":
        return {"exec_dynamic": not on_gpu}
    return {"exec_dynamic": choice == "dynamic"}
