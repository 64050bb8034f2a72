"""One served model: decoder, onnxruntime sessions and batcher, and the batch step that joins them.

A request becomes :class:`Item` rows (one per image or tensor row). The batcher hands up to N of
them to :meth:`ServedModel.run_batch`, which

1. drops the items whose callers have given up (a request that got its 504 while the batch
   waited to start): they are neither decoded nor run,
2. picks the smallest of the model's batch sizes that holds the k items left (1, 2, 4, 8: a
   batch of 3 runs at 4),
3. decodes the encoded images in one DALI call straight into rows ``0..`` of the model's input
   buffer (a CUDA tensor on a GPU, a numpy array on the CPU), copies already-decoded uint8 rows
   (KServe UINT8 tensors) after them and zeroes the padding rows up to that size,
4. runs onnxruntime once, on that size's session, and hands each item its own logits row;
   padding rows are discarded.

Rows of the model never interact (eval-mode batch norm), so an item's logits do not depend on
its neighbours, on padding or on the batch size it ran at: the tests check that against
one-at-a-time answers at every size. A served video's runs of windows are batches of their own
on the same lanes (:mod:`gpufeed.server._video_runs`).
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.models import ModelCard
from gpufeed.server._batcher import Batch, Batcher
from gpufeed.server._errors import RequestError
from gpufeed.server._items import Item, split_rows
from gpufeed.server._metrics import ServerMetrics
from gpufeed.server._preprocess import ImageDecoder
from gpufeed.server._runtime import OnnxRunner, served_batch_sizes
from gpufeed.server._threads import ThreadBudget
from gpufeed.server._video_runs import VideoRuns
from gpufeed.server._warmup import run_together, warmup_image

__all__ = ["ServedModel"]

log = logging.getLogger("gpufeed.server")


def _lane_stream(device):
    """A new CUDA stream for one lane; the device's pending work (its buffer's zeroing) done first."""
    import torch

    torch.cuda.synchronize(device.torch_device)
    return torch.cuda.Stream(device.torch_device)


@dataclass(frozen=True)
class _Lane:
    """What one batch in flight needs to itself: a DALI decoder (image models) and an input buffer."""

    decoder: ImageDecoder | None
    buffer: Any  # numpy array on the CPU, CUDA torch tensor on a GPU (torch is imported only on a GPU)
    # A CUDA stream of its own on a GPU: on torch's legacy default stream, which every thread
    # shares and which waits for all other work, one lane's synchronisation waited for the other's.
    stream: Any = None  # torch.cuda.Stream


class ServedModel:
    """Everything one model needs to serve, owned by its batcher's worker thread.

    Args:
        name: The served name (a repository folder name).
        model_dir: The model folder.
        card: Its card.
        cfg: :class:`gpufeed.config.ServeConfig`.
        device: :class:`gpufeed.device.DeviceChoice`.
        metrics: The server's metrics.
        budget: The server's thread budget, shared by its models (default: one of its own,
            :meth:`ThreadBudget.resolve` of ``cfg`` and ``device``).
        decoder_options: The image decoders' ``mixed`` arguments, the evaluation loader's
            (:func:`gpufeed.pipelines._image_pipeline.eval_decoder_options`); ``None``: those of
            the default config.
    """

    def __init__(
        self,
        name: str,
        model_dir: Path,
        card: ModelCard,
        cfg,
        device,
        metrics: ServerMetrics,
        budget: ThreadBudget | None = None,
        decoder_options=None,
    ) -> None:
        self.name, self.dir, self.card, self.cfg, self.metrics = name, Path(model_dir), card, cfg, metrics
        self.head = card.spec.head
        self.ready = False
        # One lane (decoder + input buffer) per batcher worker, so batches can overlap: on a GPU one
        # decodes while another runs the model; on the CPU each keeps to its share of the cores, and
        # a batch that starts alone takes every core (server/_threads.py).
        self.budget = budget = budget or ThreadBudget.resolve(cfg, device)
        self.workers = budget.workers
        threads, threads_alone = budget.inference_shared, budget.inference_alone
        self.decode_threads = budget.decode_shared
        decode_alone = budget.decode_alone
        self.runner = OnnxRunner(
            model_dir,
            card,
            device,
            cfg.execution_provider,
            threads,
            cfg.tensorrt_cache_dir,
            served_batch_sizes(card, cfg.batch_sizes),
            tf32=cfg.cuda_tf32,
            threads_alone=threads_alone,
            inferences=budget.inferences,
        )
        self.batch_sizes = self.runner.batch_sizes
        self.on_gpu = self.runner.on_gpu
        self._lanes: queue.SimpleQueue[_Lane] = queue.SimpleQueue()
        for _ in range(self.workers):
            decoder = None
            if self.head.accepts_encoded:  # image and dense models decode JPEG/PNG themselves
                decoder = ImageDecoder(
                    card.spec.size_px,
                    card.spec.eval_crop_fraction,
                    card.batch_size,
                    device.device_id if self.on_gpu else None,
                    self.decode_threads,
                    decoder_options,
                )
            self._lanes.put(_Lane(decoder, self.runner.new_batch(), _lane_stream(device) if self.on_gpu else None))
        self._decoder_alone = None  # used by one batch at a time: only one can start alone
        if self.head.accepts_encoded and not self.on_gpu and decode_alone > self.decode_threads:
            self._decoder_alone = ImageDecoder(
                card.spec.size_px,
                card.spec.eval_crop_fraction,
                max(card.batch_size, decode_alone),
                None,
                decode_alone,
                decoder_options,
            )
        self.batcher = Batcher(
            self.run_batch,
            batch_size=card.batch_size,
            batch_sizes=self.batch_sizes,
            max_delay_s=cfg.max_delay_ms / 1000.0,
            capacity=cfg.queue_capacity,
            on_batch=self._observe_batch,
            name=f"gpufeed-batcher-{name}",
            workers=self.workers,
        )
        metrics.track_queue_depth(name, lambda: self.batcher.depth)
        self.video_runs = VideoRuns.load(self)  # checked at warm-up

    @property
    def batch_size(self) -> int:
        return self.card.batch_size

    def describe(self) -> dict:
        """Where the work runs: decoder, input buffer and onnxruntime providers (for logs and tests)."""
        lane = self._lanes.get()
        try:
            if lane.decoder is None and self.head.accepts_video:
                # server/_video.py's sequential reader: NVDEC through DALI on a GPU, PyAV on a CPU
                where = "NVDEC through DALI where it takes the codec, else PyAV" if self.on_gpu else "PyAV on the CPU"
                decode = f"encoded videos in order with {where}; or decoded UINT8 clips"
            elif lane.decoder is None:
                decode = "none (decoded UINT8 tensors only)"
            elif lane.decoder.device_id is None:
                decode = "DALI on the CPU"
            else:
                decode = f"DALI nvJPEG (mixed) on cuda:{lane.decoder.device_id}"
            buffer = f"cuda:{lane.buffer.device.index}" if self.on_gpu else "host"
        finally:
            self._lanes.put(lane)
        return {
            "decode": decode,
            "input_buffer": buffer,
            "providers": list(self.runner.providers),
            "batch_size": self.batch_size,
            "batch_sizes": list(self.batch_sizes),
            "workers": self.workers,
            "video_window_runs": self.video_runs.windows if self.video_runs is not None else 0,
            "threads": {
                "decode_per_worker": self.decode_threads if lane.decoder is not None else 0,
                "decode_alone": self._decoder_alone.num_threads if self._decoder_alone is not None else 0,
                "inference_alone": self.runner.threads["alone"],
                "inference_shared": self.runner.threads["shared"],
            },
        }

    def _observe(self, stage: str, seconds: float) -> None:
        if self.ready:  # warm-up batches are not traffic
            self.metrics.observe_stage(self.name, stage, seconds)

    def _observe_batch(self, waits: list[float], rows: int) -> None:
        for wait in waits:
            self.metrics.observe_stage(self.name, "queue_wait", wait)

    def _copy_rows(self, buffer, start: int, rows: list) -> None:
        if any(not isinstance(row, np.ndarray) for row in rows):
            # A served video's windows on a GPU are CUDA tensors already (server/_video.py): copied on the
            # device, row by row, since a batch may also hold another request's numpy rows.
            import torch

            for k, row in enumerate(rows):
                source = row if isinstance(row, torch.Tensor) else torch.from_numpy(row)
                if self.on_gpu:
                    buffer[start + k].copy_(source, non_blocking=False)
                else:
                    buffer[start + k] = source.cpu().numpy()
            return
        block = np.stack(rows)
        if self.on_gpu:
            import torch

            buffer[start : start + len(rows)].copy_(torch.from_numpy(block), non_blocking=False)
        else:
            buffer[start : start + len(rows)] = block

    def run_batch(self, items: list[Item]) -> list[np.ndarray | BaseException]:
        """Logits row per item (or the item's error); at most N items (the batcher's promise).

        ``items`` may be the batcher's :class:`~gpufeed.server._batcher.Batch`: items whose callers
        gave up get :class:`concurrent.futures.CancelledError` and cost nothing further.
        """
        if len(items) > self.batch_size:
            raise ValueError(f"{len(items)} items exceed the batch size {self.batch_size}")
        lane = self._lanes.get()
        try:
            return self._run_in_lane(lane, items)
        finally:
            self._lanes.put(lane)

    @staticmethod
    def _wanted(items: list[Item]) -> list[int]:
        """Positions of the items whose callers still wait for them."""
        if isinstance(items, Batch):
            return [i for i, gone in enumerate(items.abandoned()) if not gone]
        return list(range(len(items)))

    @contextmanager
    def on_lane(self) -> Iterator[bool]:
        """Hold one lane and a place among the batches in inference, for work of the batch's kind (a
        video's run of windows); yields whether it started alone (no other batch in inference)."""
        lane = self._lanes.get()
        try:
            # Counted among the batches in onnxruntime too: a plain batch that starts beside a run
            # then takes its shared session, not every core.
            with self.budget.batches.one() as first, self.budget.inferences.one():
                yield first
        finally:
            self._lanes.put(lane)

    def _run_in_lane(
        self, lane: _Lane, items: list[Item], alone: bool | None = None, meet=None
    ) -> list[np.ndarray | BaseException]:
        """``meet``: called right before inference (warm-up's :func:`~gpufeed.server._warmup.run_together`)."""
        with self.budget.batches.one() as first:
            alone = first if alone is None else alone
            if lane.stream is None:
                return self._run_lane_items(lane, items, alone, meet)
            import torch

            with torch.cuda.stream(lane.stream):
                return self._run_lane_items(lane, items, alone, meet)

    def _run_lane_items(
        self, lane: _Lane, items: list[Item], alone: bool, meet=None
    ) -> list[np.ndarray | BaseException]:
        results: list[np.ndarray | BaseException] = [CancelledError("its caller gave up")] * len(items)
        live = self._wanted(items)
        if not live:
            return results
        size = self.runner.bucket_for(len(live))
        buffer = lane.buffer[:size]  # the first rows of the largest buffer: contiguous, no copy
        encoded, blobs, decoded, pixels = split_rows(items, live)
        order = encoded + decoded  # row r of the buffer holds items[order[r]]
        decode_s = None
        input_start = time.perf_counter()
        if encoded:
            start = input_start
            sizes = np.array([items[i].size for i in encoded], dtype=np.int64)
            decoder, bands = lane.decoder, 1
            if decoder is None:  # only image models accept encoded items, and they have decoders
                raise RuntimeError(f"model {self.name!r} has no image decoder for {len(encoded)} encoded image(s)")
            if alone and self._decoder_alone is not None:
                decoder = self._decoder_alone
                bands = decoder.band_count(len(encoded))
            outcome = decoder.decode_into(blobs, sizes, buffer[: len(encoded)], bands)
            for i, err in zip(encoded, outcome, strict=True):
                if err is not None:
                    results[i] = RequestError(
                        getattr(err, "reason", "corrupt_image"), f"{items[i].where}: {getattr(err, 'message', err)}"
                    )
            decode_s = time.perf_counter() - start
            self._observe("decode", decode_s)
        if decoded:
            self._copy_rows(buffer, len(encoded), pixels)
        input_s = time.perf_counter() - input_start
        if len(order) < size:
            buffer[len(order) :] = 0  # padding rows, discarded below
        if not self._wanted(items):  # every caller gave up while the batch decoded
            return results
        if meet is not None:
            meet()
        start = time.perf_counter()
        logits = self.runner.run(buffer)
        inference_s = time.perf_counter() - start
        self._observe("inference", inference_s)
        if self.ready:  # warm-up batches are not traffic
            self.metrics.observe_batch(self.name, len(order), size, decode_s=decode_s, inference_s=inference_s)
        for row, i in enumerate(order):
            items[i].times.update(input_s=input_s, inference_s=inference_s)
            if not isinstance(results[i], RequestError):
                results[i] = logits[row].copy()
        return results

    def warm_up(self) -> None:
        """Run ``serve.warmup_batches`` full batches of every batch size end to end, then mark the model ready."""
        if self.head.accepts_encoded:
            width, height = self.card.spec.size_px
            image, size = warmup_image(width, height)
            item = Item(encoded=image, size=size, where="warm-up image")
        else:
            item = Item(pixels=np.zeros(self.card.sample_shape, dtype=np.uint8), where="warm-up row")
        lanes = [self._lanes.get() for _ in range(self.workers)]
        repeats = range(self.cfg.warmup_batches)
        try:
            # Every lane's decoder, its batches in inference side by side (as under load: see
            # run_together), then the decoder and sessions of batches that run alone.
            outcomes = [
                outcome
                for n in self.batch_sizes
                for _ in repeats
                for outcome in run_together([partial(self._run_in_lane, lane, [item] * n, False) for lane in lanes])
            ]
            outcomes += [self._run_in_lane(lanes[0], [item] * n, True) for n in self.batch_sizes for _ in repeats]
        finally:
            for lane in lanes:
                self._lanes.put(lane)
        for outcome in outcomes:
            for result in outcome:
                if isinstance(result, BaseException):
                    raise RuntimeError(f"model {self.name} failed its warm-up batch: {result}")
        if self.video_runs is not None and not self.video_runs.check(self._plain_logits):
            self.video_runs = None  # the warning says why; windows go one by one
        self.batcher.start()
        self.ready = True
        self.metrics.set_ready(self.name, True)

    def _plain_logits(self, clips) -> np.ndarray:
        """Logits of decoded clips (N, 3, T, H, W) through the plain graph: the runs' warm-up check."""
        items = [Item(pixels=row, where="warm-up window") for row in clips.numpy()]
        rows = []
        for start in range(0, len(items), self.batch_size):  # a model may batch fewer than the check's windows
            for result in self.run_batch(items[start : start + self.batch_size]):
                if isinstance(result, BaseException):
                    raise RuntimeError(f"model {self.name} failed its warm-up windows: {result}")
                rows.append(result)
        return np.stack(rows)

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        self.ready = False
        self.metrics.set_ready(self.name, False)
        self.batcher.close(drain=drain, timeout=timeout)
