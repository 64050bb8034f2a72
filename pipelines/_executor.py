"""Which DALI executor a loader's pipeline runs on.

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
"""

from __future__ import annotations


def executor_args(on_gpu: bool) -> dict:
    """DALI ``Pipeline`` keyword arguments choosing the executor (see the module docs).

    Args:
        on_gpu: Whether the pipeline has a device (``device_id`` set).
    """
    return {"exec_dynamic": not on_gpu}
