"""The server's thread budget: the cores shared out once at start-up, handed to every served model.

Each model runs ``workers`` lanes (``serve.workers_per_model``, default 2), each with a DALI decoder
and an input buffer. On the CPU the cores are shared out: a lane's decoder gets ``cores / lanes``
DALI threads (``serve.decode_threads``) and a batch running beside another gets ``cores / lanes``
onnxruntime intra-op threads (``serve.inference_threads``); two batches side by side on their
shares cost less CPU per row than one split over all of them (ResNet-18 on two cores: about 10 %
less). The budget follows load: a batch that starts while no other batch of the server is decoding
or in inference decodes on every core (``serve.decode_threads_alone``; its images cut into bands,
:mod:`._preprocess`), and one that starts while no other is in inference runs on onnxruntime
sessions made with every core (``serve.inference_threads_alone``), so a lone client does not pay
the split in latency. Two counts of the server's batches (:class:`RunningCount`), held here and
shared by all its models, say which case a batch is in.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpufeed.pipelines import default_num_threads

__all__ = ["RunningCount", "ThreadBudget"]


class RunningCount:
    """How many units of some work the server is running now, over every thread that runs one.

    The thread budgets follow it: work that starts while nothing else of its kind runs may take
    every core (:meth:`~gpufeed.server._runtime.OnnxRunner.run`'s sessions, the model's decoder for
    lone batches).
    """

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def one(self) -> Iterator[bool]:
        """Count one unit while the block runs; yields True when no other was running (it is alone)."""
        with self._lock:
            alone = self._count == 0
            self._count += 1
        try:
            yield alone
        finally:
            with self._lock:
                self._count -= 1


@dataclass(frozen=True)
class ThreadBudget:
    """The threads every served model gets, resolved once from ``serve`` and the device (:meth:`resolve`).

    Attributes:
        cores: The cores the server may use.
        workers: Lanes (batches in flight) per model.
        inference_shared: onnxruntime intra-op threads of a batch beside others (0: onnxruntime's
            default, as on a GPU, where the threads only launch kernels).
        inference_alone: Intra-op threads of a batch that starts while no other is in inference (0: none).
        decode_shared: DALI threads of each lane's decoder.
        decode_alone: DALI threads of the decoder of a batch that starts alone (CPU only).
        batches: The server's batches between the start of their decode and the end of their inference.
        inferences: The server's batches in onnxruntime.
    """

    cores: int
    workers: int
    inference_shared: int
    inference_alone: int
    decode_shared: int
    decode_alone: int
    batches: RunningCount = field(default_factory=RunningCount, compare=False, repr=False)
    inferences: RunningCount = field(default_factory=RunningCount, compare=False, repr=False)

    @classmethod
    def resolve(cls, cfg, device, cores: int | None = None) -> ThreadBudget:
        """The budget ``serve`` asks for on ``device`` (0 in a ``*_threads`` key: the share, or every core alone).

        Args:
            cfg: :class:`gpufeed.config.ServeConfig`.
            device: :class:`gpufeed.device.DeviceChoice`.
            cores: The cores to share out (default: those this process may use).
        """
        cores = cores or default_num_threads()
        workers = cfg.workers_per_model or 2
        on_cpu = not device.is_gpu or cfg.execution_provider == "cpu"
        share = max(1, cores // workers)
        return cls(
            cores=cores,
            workers=workers,
            inference_shared=cfg.inference_threads or (share if on_cpu else 0),
            inference_alone=(cfg.inference_threads_alone or cores) if on_cpu else 0,
            decode_shared=cfg.decode_threads or share,
            decode_alone=cfg.decode_threads_alone or cores,
        )
