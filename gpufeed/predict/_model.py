"""The model ``gpufeed predict`` scores with: a checkpoint or an exported model folder, on onnxruntime or PyTorch.

Either way a :class:`Predictor` takes uint8 batches (``(N, 3, T, H, W)`` clips or ``(N, 3, H, W)``
images, on the reader's device) and gives float32 logits on the host; its head turns them into
probabilities. An exported model runs on the server's own onnxruntime runner
(:class:`~gpufeed.server._runtime.OnnxRunner`: one session per batch size of its card, a batch run
at the smallest size that holds it, padding rows discarded), so ``predict`` and ``gpufeed serve``
compute the same numbers from the same windows.

A checkpoint runs where ``runtime`` says (:data:`RUNTIMES`): ``torch``, PyTorch in evaluation mode;
``onnx``, its export (made once and cached, :mod:`._export_cache`) on that same runner; ``auto``
(the default), ``onnx`` on a CPU and ``torch`` on a GPU. On a CPU onnxruntime does the same
arithmetic in about 20 % less CPU time than PyTorch's eager mode, and its threads sleep rather than
spin while they wait, so on a busy machine it runs several times faster (docs/predict.md).

A stacked-frame clip model on onnxruntime's CPU provider scores a window at every frame in runs
that share its first convolution (:mod:`gpufeed.models._sliding_runner`, :meth:`Predictor.run_logits`).

From an export the first batch of the run is checked: its first two windows are scored by PyTorch
too and the two compared within the export's own tolerance (``parity_tolerance``), on a real
video's windows, not only the export's rendered frames. Beyond it, ``auto`` says so in one line
naming the checkpoint and scores in PyTorch; ``onnx`` stops with that line (:class:`ParityError`).
An export that cannot be made (an operator onnxruntime lacks, a cache folder that cannot be
written) is likewise one line and PyTorch under ``auto``, an error under ``onnx``.

The clip sampling (``video.stride_frames``, ``video.fit``) comes from where the model does: a
checkpoint's training config, or the card's ``extra.clip_sampling`` (written by export); models
without it read frames 1 apart, stretched. So does a checkpoint's ``loader.hw_decoder_load`` (evaluation's
JPEG decoder on a GPU); an exported model takes the default, as the server does by default.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufeed.config import LoaderConfig
from gpufeed.models import (
    CARD_FILE,
    ONNX_FILE,
    ClassifierHead,
    ClipSampling,
    ExportError,
    ModelCard,
    ModelSpec,
    SlidingRunner,
    TaskHead,
    find_checkpoint,
    load_model,
    parity_tolerance,
    read_checkpoint,
    read_model_card,
    sliding_runner,
)
from gpufeed.pipelines import DatasetError
from gpufeed.predict._cache_entries import export_cache_max_bytes
from gpufeed.predict._export_cache import CachedExport, held_export
from gpufeed.server import OnnxRunner

__all__ = ["RUNTIMES", "ParityError", "Predictor", "default_batch_size", "load_predictor"]

log = logging.getLogger("gpufeed.predict")

# Rows of the first batch PyTorch scores to check an export against: rows never interact, so two
# test the graph as well as eight, at a quarter of PyTorch's cost (a second of a short video's run).
PARITY_ROWS = 2
RUNTIMES = ("auto", "torch", "onnx")
"""What may run a checkpoint (:func:`load_predictor`'s ``runtime``, ``gpufeed predict --runtime``):
``auto`` (its cached export on onnxruntime on a CPU, PyTorch on a GPU), ``torch``, ``onnx``."""


class ParityError(ExportError):
    """A checkpoint's export disagrees with PyTorch on the first batch, and ``runtime`` ``onnx`` was asked for."""


@dataclass
class Predictor:
    """A loaded model: its facts and a batch -> logits function.

    Attributes:
        source: What was loaded (checkpoint file or model folder).
        kind: ``checkpoint`` or ``exported`` (a model folder).
        spec: The model's :class:`~gpufeed.models.ModelSpec`.
        labels: Class names in output order (``class_<i>`` where the model names none).
        sampling: How clips were read at training.
        batch_size: Samples per model call (the card's largest batch size when onnxruntime runs it).
        device: :class:`~gpufeed.device.DeviceChoice` the model runs on.
        card: The model card when onnxruntime runs the model (an exported folder, or a checkpoint's
            cached export), else ``None``.
        export: A checkpoint's cached export (:class:`~gpufeed.predict._export_cache.CachedExport`)
            when onnxruntime runs it, else ``None``.
        first_batch_max_diff: Max |onnxruntime - PyTorch| over the logits of the first batch's first
            windows, once a checkpoint's export has been checked on them (``None`` before, and for
            other models).
        hw_decoder_load: ``loader.hw_decoder_load`` of a checkpoint's training config (else the default).
    """

    source: Path
    kind: str
    spec: ModelSpec
    labels: tuple[str, ...]
    sampling: ClipSampling
    batch_size: int
    device: Any
    card: ModelCard | None = None
    export: CachedExport | None = None
    first_batch_max_diff: float | None = None
    hw_decoder_load: float = LoaderConfig().hw_decoder_load  # evaluation's JPEG decoder on a GPU
    _module: torch.nn.Module | None = None
    _runner: OnnxRunner | None = None
    _buffer: Any = None
    _reference: torch.nn.Module | None = None  # PyTorch, for the first batch's check of an export
    _strict: bool = False  # runtime "onnx": an export that disagrees stops the run
    _sliding: SlidingRunner | None = None  # runs of windows, sharing the first convolution
    _runs_agree: bool | None = None  # the first run against the plain graph (None: not yet compared)

    @property
    def head(self) -> TaskHead:
        return self.spec.head

    @property
    def runtime(self) -> str:
        """``onnx`` or ``torch``: what scores the batches now."""
        return "torch" if self._module is not None else "onnx"

    def class_scores(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities from logits, as the model's head makes them (sigmoid per class, or softmax).

        Raises:
            ValueError: The model is not a classifier (a depth or segmentation model).
        """
        head = self.spec.head
        if not isinstance(head, ClassifierHead):
            raise ValueError(f"{self.spec.name} is a {head.kind} model; predict scores classifiers")
        return head.class_scores(logits)

    def logits(self, batch: torch.Tensor) -> np.ndarray:
        """float32 logits ``(N, C)`` on the host for a uint8 batch (any N).

        Raises:
            ParityError: The first batch through a checkpoint's export disagrees with PyTorch under
                ``runtime`` ``onnx``.
        """
        if self._module is not None:
            return self._torch_logits(self._module, batch)
        if self._reference is not None:
            return self._first_batch(batch)
        rows = [self._run_onnx(batch[i : i + self.batch_size]) for i in range(0, len(batch), self.batch_size)]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def run_windows(self, hop_frames: int) -> int:
        """Windows per :meth:`run_logits` call for windows ``hop_frames`` apart; 0: windows go one by one.

        Runs are for a stacked-frame model on onnxruntime's CPU provider with a window at every frame
        (:mod:`gpufeed.models._sliding_runner`).
        """
        runner = self._sliding
        if runner is None or self._runs_agree is False or self._module is not None or hop_frames != 1:
            return 0
        return runner.windows

    def run_logits(self, run: torch.Tensor) -> np.ndarray:
        """float32 logits (F - span + 1, C) of the windows at each frame of ``run`` (F, 3, H, W) uint8.

        The first run's first :data:`PARITY_ROWS` windows also go through the plain graph (and so
        through the export's first-batch check against PyTorch); beyond the export's tolerance that
        run, and every later one, is scored window by window (one line says so). A short run (a
        video's last) costs a whole run's work in the sliding graph, so one of few windows goes
        window by window too (:meth:`~gpufeed.models.SlidingRunner.is_short`).

        Raises:
            RuntimeError: The predictor has no sliding-window graph (:meth:`run_windows` was 0).
        """
        sliding = self._sliding
        if sliding is None:
            raise RuntimeError(f"{self.source}: no sliding-window graph; windows go one by one")
        count = sliding.count(run)
        if self._runs_agree is None and not sliding.is_short(count):
            self._runs_agree = False  # until shown otherwise: a failure below leaves windows one by one
            want = self.logits(sliding.windows_of(run, min(count, PARITY_ROWS)))
            # Only an export that held against PyTorch is compared: else PyTorch scores from now on.
            got = sliding.first_run(run, want, str(self.source)) if self._module is None else None
            self._runs_agree = got is not None
            if got is not None:
                return got
        if not self._runs_agree or self._module is not None or sliding.is_short(count):
            return self.logits(sliding.windows_of(run, count))
        return sliding(run)

    def _torch_logits(self, module: torch.nn.Module, batch: torch.Tensor) -> np.ndarray:
        with torch.inference_mode():
            out = module(batch.to(self.device.torch_device, non_blocking=True))
        return out.float().cpu().numpy()

    def _first_batch(self, batch: torch.Tensor) -> np.ndarray:
        """The export's logits, once PyTorch's agree with them on this batch's first windows; else PyTorch's.

        Rows never interact (evaluation mode), so the first :data:`PARITY_ROWS` rows test the graph
        as well as the whole batch would, at a fraction of PyTorch's cost (see the module docs).
        """
        module, self._reference = self._reference, None
        assert module is not None
        got = self.logits(batch)
        rows = min(len(batch), PARITY_ROWS)
        with _full_fp32():
            want = self._torch_logits(module, batch[:rows])
        diff = float(np.abs(got[:rows] - want).max(initial=0.0))
        self.first_batch_max_diff = diff
        tolerance = parity_tolerance("fp32", want)
        if diff <= tolerance:  # NaN compares False: a NaN output disagrees
            log.info("predict: onnxruntime agrees with PyTorch on the first batch (max |diff| %.3g)", diff)
            return got
        message = (
            f"{self.source}: its onnxruntime export disagrees with PyTorch on the first batch "
            f"(max |diff| {diff:.3g} over {rows} windows, tolerance {tolerance:.3g})"
        )
        if self._strict:
            raise ParityError(f"{message}; --runtime torch scores it in PyTorch")
        log.warning("predict: %s; scoring it in PyTorch", message)
        self._module, self._runner, self._buffer, self.card, self.export = module, None, None, None, None
        return self._torch_logits(module, batch)

    def _run_onnx(self, batch: torch.Tensor) -> np.ndarray:
        runner = self._runner
        assert runner is not None
        n = len(batch)
        size = runner.bucket_for(n)
        buffer = self._buffer[:size]
        if runner.on_gpu:
            buffer[:n].copy_(batch.to(buffer.device))
        else:
            buffer[:n] = batch.cpu().numpy()
        if n < size:
            buffer[n:] = 0  # padding rows, discarded: rows never interact (evaluation-mode batch norm)
        return runner.run(buffer)[:n]

    def describe(self) -> str:
        """One line: what runs where (for the command's first line and logs)."""
        where = self.device.describe()
        if self._runner is not None:
            where += f", onnxruntime {self._runner.providers[0]}"
            if self.export is not None:
                where += f" (its export, cached in {self.export.folder})"
            if self._sliding is not None and self._runs_agree is not False:
                where += f"; a window at every frame: runs of {self._sliding.windows} share the first convolution"
        else:
            where += ", PyTorch"
        spec, sampling = self.spec, self.sampling
        clip = f", clips of {spec.clip_length_frames} frames {sampling.stride_frames} apart ({sampling.fit})"
        clip = clip if spec.clip_length_frames else ""
        return f"{spec.name} ({spec.head.kind}, {len(self.labels)} classes{clip}) from {self.source} on {where}"


@contextlib.contextmanager
def _full_fp32() -> Iterator[None]:
    """PyTorch without TF32 for a while: cuDNN's convolutions use it by default on a GPU, which would
    blur the check against an export that onnxruntime runs in full fp32 (as the export's own check does)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def default_batch_size(device) -> int:
    """Samples per call of a checkpoint's model when none is asked for: 32 on a GPU, 8 on a CPU."""
    return 32 if device.is_gpu else 8


def _labels(spec: ModelSpec) -> tuple[str, ...]:
    return spec.labels or tuple(f"class_{i}" for i in range(spec.num_classes))


def load_predictor(
    source: str | Path,
    device,
    batch_size: int = 0,
    threads: int = 0,
    runtime: str = "auto",
    export_cache: str | Path | None = None,
    export_cache_max_mb: float | None = None,
    window_runs: bool = True,
) -> Predictor:
    """Load a checkpoint (file or run folder) or an exported model folder (``model_card.json``) for scoring.

    Args:
        source: The checkpoint, run folder or model folder.
        device: :class:`~gpufeed.device.DeviceChoice`.
        batch_size: Samples per call of a checkpoint's model (0: 32 on a GPU, 8 on a CPU), and the
            largest batch size of its export; an exported model runs at its card's batch sizes.
        threads: onnxruntime intra-op threads (0: onnxruntime's default).
        runtime: What runs a checkpoint, one of :data:`RUNTIMES`: ``auto`` (its export on
            onnxruntime on a CPU, PyTorch on a GPU), ``torch`` or ``onnx`` (see the module docs).
            An exported model runs on onnxruntime whatever this says, except ``torch``: an error.
        export_cache: Where a checkpoint's exports are kept (default:
            :func:`~gpufeed.predict._export_cache.default_export_cache`).
        export_cache_max_mb: The bound on that cache after a new export, in MB of 10^6 bytes
            (``math.inf``: none; default: ``$GPUFEED_EXPORT_CACHE_MAX_MB``, else 2048).
        window_runs: With a window at every frame, score a stacked-frame clip model on
            onnxruntime's CPU provider in runs of windows that share its first convolution
            (:mod:`gpufeed.models._sliding_runner`; other models, and a GPU, score windows one by one).

    Raises:
        DatasetError: ``source`` is neither, or ``runtime`` cannot run it (one line naming it).
        ValueError: ``runtime`` is not one of :data:`RUNTIMES`.
    """
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} is not allowed; allowed: {', '.join(RUNTIMES)}")
    source = Path(source)
    if (source / CARD_FILE).is_file():
        if runtime == "torch":
            raise DatasetError(
                f"{source} is an exported model folder, which runs on onnxruntime; runtime torch needs a checkpoint"
            )
        return _load_exported(source, device, threads, window_runs)
    try:
        path = find_checkpoint(source)
    except FileNotFoundError as err:
        raise DatasetError(
            f"{err}; give a checkpoint (.pt), a training run folder or an exported model folder ({CARD_FILE})"
        ) from None
    try:
        state = read_checkpoint(path)
    except ValueError as err:  # not a checkpoint: one line naming the file and why
        raise DatasetError(str(err)) from None
    try:
        module = load_model(state).eval().to(device.torch_device)
    except Exception as err:  # a dict without the keys, or weights that do not fit its spec
        raise DatasetError(f"cannot load a gpufeed model from {path}: {str(err).splitlines()[0][:200]}") from None
    spec = module.spec
    size = batch_size or default_batch_size(device)
    config = state.get("config")
    sampling = ClipSampling.from_config(config)
    predictor = Predictor(path, "checkpoint", spec, _labels(spec), sampling, size, device, _module=module)
    loader = config.get("loader") if isinstance(config, dict) else None
    if isinstance(loader, dict) and isinstance(loader.get("hw_decoder_load"), (int, float)):
        predictor.hw_decoder_load = float(loader["hw_decoder_load"])
    # On a GPU predict keeps PyTorch, as it did: nothing measured yet says onnxruntime's CUDA provider is faster.
    if runtime == "onnx" or (runtime == "auto" and not device.is_gpu and spec.head.classifies):
        cache = (export_cache, export_cache_max_bytes(export_cache_max_mb))
        _run_export(predictor, module, runtime == "onnx", cache, threads, window_runs)
    return predictor


def _load_exported(source: Path, device, threads: int, window_runs: bool) -> Predictor:
    """An exported model folder on the server's onnxruntime runner (and its sliding-window graph)."""
    card = read_model_card(source)
    runner = OnnxRunner(source, card, device, "auto", threads)
    spec = card.spec
    predictor = Predictor(
        source,
        "exported",
        spec,
        card.labels,
        ClipSampling.from_card(card),
        card.batch_size,
        device,
        card=card,
        _runner=runner,
        _buffer=runner.new_batch(),
    )
    if window_runs:
        predictor._sliding = sliding_runner(runner.on_gpu, spec, predictor.sampling, source / ONNX_FILE, threads)
    return predictor


def _run_export(
    predictor: Predictor, module: torch.nn.Module, strict: bool, cache: tuple, threads: int, window_runs: bool
) -> None:
    """Point ``predictor`` at its checkpoint's cached export on onnxruntime, PyTorch kept for the first batch.

    Raises:
        DatasetError: ``strict`` and the export cannot be made or run (one line naming the checkpoint).
    """
    device = predictor.device
    try:
        folder, max_bytes = cache
        # Held until the sessions are made: they read the graph once, and then a prune may remove it.
        with held_export(predictor.source, predictor.batch_size, folder, device, max_bytes) as export:
            runner = OnnxRunner(export.folder, export.card, device, "auto", threads)
            if window_runs:
                sampling, path = predictor.sampling, export.folder / ONNX_FILE
                predictor._sliding = sliding_runner(runner.on_gpu, predictor.spec, sampling, path, threads)
    except (ExportError, OSError, RuntimeError) as err:  # RuntimeSetupError, onnxruntime's own errors
        why = str(err).splitlines()[0][:300] if str(err) else type(err).__name__
        if strict:
            raise DatasetError(f"{predictor.source}: runtime onnx: no usable export: {why}") from None
        log.warning("predict: %s cannot run on onnxruntime (%s); scoring it in PyTorch", predictor.source, why)
        return
    predictor.card, predictor.export, predictor.batch_size = export.card, export, export.card.batch_size
    predictor._runner, predictor._buffer = runner, runner.new_batch()
    predictor._module, predictor._reference, predictor._strict = None, module, strict
