"""``gpufeed predict``: per-frame class probabilities for every frame of every video, written as they come.

For each video (:mod:`._inputs`): kept when its output is already there (a finished output is
renamed into place only when complete, :mod:`._outputs`) and this model wrote it with the same
settings (the manifest beside the outputs says which model wrote each, :mod:`._manifest`); else
read once, in order, by the sequential reader (NVDEC on a GPU, PyAV on a CPU, frame stores through their decoder), a chunk
ahead on a thread of its own (:mod:`gpufeed.core._prefetch`), scored window batch by window batch through
:func:`~gpufeed.models.score_frames` (the server's video input runs the same function), and
streamed to its output. A video that cannot be read is one line naming it and why; the others are
still scored, and the report says which failed (``gpufeed predict`` then exits 1).

One progress display counts frames over every video (a bar on a terminal, a line every few seconds
in a log: :func:`gpufeed.core._progress.progress_bar`), with frames per second.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.core import prefetch, progress_bar
from gpufeed.models import WindowPlan, score_frames
from gpufeed.pipelines import (
    DatasetError,
    VideoFrameReader,
    VideoInfo,
    first_line,
    index_videos,
    label_path,
    labels_for,
    read_in_order,
)
from gpufeed.predict._inputs import FORMATS, Target, find_videos, output_path
from gpufeed.predict._manifest import Manifests, log_rescored, model_identity, output_key
from gpufeed.predict._model import ParityError, Predictor
from gpufeed.predict._outputs import csv_sink, h5_sink, holds_groups, is_done
from gpufeed.predict._plot import EthogramBins, plot_path

__all__ = ["PredictReport", "VideoResult", "predict_videos", "window_plan"]

log = logging.getLogger("gpufeed.predict")


@dataclass(frozen=True)
class VideoResult:
    """What happened to one video.

    Attributes:
        name: The video as messages name it.
        status: ``scored``, ``skipped`` (kept: its output was already there, written by this model with
            the same settings) or ``failed``.
        output: Its output file.
        frames: Frames scored (0 when skipped or failed).
        windows: Windows scored.
        seconds: Wall time spent on it.
        error: Why it failed (one line), else ``None``.
    """

    name: str
    status: str
    output: Path
    frames: int = 0
    windows: int = 0
    seconds: float = 0.0
    error: str | None = None


@dataclass
class PredictReport:
    """Every video's result, and the totals.

    Attributes:
        results: One :class:`VideoResult` per video, in source order.
        seconds: Wall time of the whole run.
        unit: What :attr:`frames` counts in the summary: ``frames``, or ``images`` (an image model's run).
    """

    results: list[VideoResult] = field(default_factory=list)
    seconds: float = 0.0
    unit: str = "frames"

    @property
    def failed(self) -> list[VideoResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def frames(self) -> int:
        return sum(r.frames for r in self.results)

    @property
    def frames_per_second(self) -> float:
        busy = sum(r.seconds for r in self.results if r.status == "scored")
        return self.frames / busy if busy > 0 else 0.0

    def summary(self) -> str:
        """One line: counts by status, frames, frames per second."""
        counts = {s: sum(r.status == s for r in self.results) for s in ("scored", "skipped", "failed")}
        again = "; --overwrite scores them again" if counts["skipped"] else ""
        return (
            f"{counts['scored']} scored, {counts['skipped']} kept (already done by this model{again}), "
            f"{counts['failed']} failed; "
            f"{self.frames:,} {self.unit} in {self.seconds:.1f} s ({self.frames_per_second:,.1f} {self.unit}/s while "
            "scoring)"
        )


def window_plan(predictor: Predictor, hop_frames: int | None) -> WindowPlan:
    """The windows of ``predictor``'s clip model: its clip length, its training's frame gap, ``hop_frames``.

    ``hop_frames`` ``None``: 1 (a window at every frame; see :mod:`gpufeed.models._frame_scores`).

    Raises:
        ValueError: The model is not a clip model, or ``hop_frames`` is out of range.
    """
    length = predictor.spec.clip_length_frames
    if not predictor.head.takes_clips or not length:
        raise ValueError(f"{predictor.spec.name} is a {predictor.head.kind} model; windows are for clip models")
    return WindowPlan(length, predictor.sampling.stride_frames, 1 if hop_frames is None else hop_frames)


def _group_name(predictor: Predictor, latent_name: str | None) -> str:
    return latent_name or predictor.spec.name


def predict_videos(
    source: str | Path,
    predictor: Predictor,
    *,
    out: str | Path | None = None,
    fmt: str = "csv",
    hop_frames: int | None = None,
    chunk_frames: int = 64,
    decoder: str = "auto",
    overwrite: bool = False,
    latent_name: str | None = None,
    allowed_roots: tuple = (),
    progress: bool = True,
    plot: bool = False,
) -> PredictReport:
    """Score every frame of every video under ``source`` with a clip model (see the module docs).

    Args:
        source: A video, a folder of videos or a DeepEthogram project.
        predictor: The model (:func:`~gpufeed.predict.load_predictor`).
        out: Output folder (``None``: beside each video).
        fmt: ``csv`` or ``hdf5`` (DeepEthogram's output layout).
        hop_frames: Frames between window starts (default 1).
        chunk_frames: Frames the reader decodes per step.
        decoder: ``auto``, ``dali`` or ``pyav``, as ``video.decoder``.
        overwrite: Score videos whose output this model already wrote too.
        latent_name: The HDF5 group (default: the model's architecture name).
        allowed_roots: Folders outside a DeepEthogram project its records may name.
        progress: Show the progress display.
        plot: Also draw each scored video's ``<name>_predictions.png`` beside its output
            (:mod:`gpufeed.predict._plot`: the probabilities along the video and the most probable
            class; a picture that cannot be drawn is one warning, the output stays).

    Returns:
        The :class:`PredictReport`; failures are in it, not raised.

    Raises:
        DatasetError: ``source`` holds no video, or is not there.
        ValueError: ``fmt``, ``hop_frames`` or the model's kind is not allowed.
        ParityError: A checkpoint's export disagrees with PyTorch on the first batch under
            ``runtime`` ``onnx`` (the run stops: it is the model's fault, not a video's).
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not allowed; allowed: {', '.join(FORMATS)}")
    plan = window_plan(predictor, hop_frames)
    started = time.perf_counter()
    targets = find_videos(source, out, allowed_roots)
    group = _group_name(predictor, latent_name)
    sampling = predictor.sampling.to_dict()
    manifests = Manifests(model_identity(predictor, **sampling, hop_frames=plan.hop_frames), predictor.source)
    report = PredictReport()
    todo = _resume(targets, fmt, group, overwrite, manifests, report)
    # Every video's facts (frames for the progress total): demuxed on threads, cached beside the data
    # as the training index caches them, so a resumed run over hundreds of hours does not demux again.
    probe = [t for t, _ in todo if t.problem is None]
    root = Path(source) if Path(source).is_dir() else Path(source).parent
    probed = dict(zip((t.name for t in probe), index_videos(root, [str(t.path) for t in probe], progress), strict=True))
    infos = [probed.get(t.name) or VideoInfo(str(t.path), problem=t.problem) for t, _ in todo]
    total = sum(info.num_frames for info in infos if not info.problem)
    bar = progress_bar(total=total, desc="predict", unit="frame", disable=not progress, leave=True)
    try:
        for (target, path), info in zip(todo, infos, strict=True):
            key = output_key(path, group if holds_groups(fmt) else None)
            result = _forget(manifests, key, target, path, info, bar) or _score_one(
                target, path, info, predictor, plan, fmt, group, chunk_frames, decoder, bar, plot
            )
            if result.status == "scored":
                manifests.record(path, key)
            report.results.append(result)
    except KeyboardInterrupt:
        # The outputs finished so far are in place and recorded: say so, and how to go on.
        raise KeyboardInterrupt(_interrupted(report, len(targets))) from None
    finally:
        bar.close()
    order = {t.name: i for i, t in enumerate(targets)}
    report.results.sort(key=lambda r: order[r.name])
    report.seconds = time.perf_counter() - started
    return report


def _interrupted(report: PredictReport, videos: int) -> str:
    """What an interrupted run leaves: the videos with their output, and how to score the rest."""
    done = sum(r.status in ("scored", "skipped") for r in report.results)
    return (
        f"{done} of {videos} video(s) have their output; the same command again keeps them and scores the "
        f"other {videos - done}"
    )


def _resume(
    targets: list[Target], fmt: str, group: str, overwrite: bool, manifests: Manifests, report: PredictReport
) -> list[tuple[Target, Path]]:
    """The videos to score, with their outputs; those kept are added to ``report`` as ``skipped``.

    A video is kept when its output is finished and its manifest entry holds this run's identity;
    an output there without it is scored again, one line per reason (:func:`._manifest.log_rescored`).
    """
    todo: list[tuple[Target, Path]] = []
    reasons: dict[str, list[str]] = {}
    for target in targets:
        path = output_path(target, fmt)
        if not overwrite and target.problem is None and is_done(path, fmt, group):
            why = manifests.problem(path, output_key(path, group if holds_groups(fmt) else None))
            if why is None:
                report.results.append(VideoResult(target.name, "skipped", path))
                continue
            reasons.setdefault(why, []).append(target.name)
        todo.append((target, path))
    log_rescored(reasons)
    return todo


def _forget(manifests: Manifests, key: str, target: Target, path: Path, info: VideoInfo, bar) -> VideoResult | None:
    """Drop another identity's entry for ``path`` before it is rewritten (a kill then leaves no record,
    not a wrong one); a manifest that cannot be written fails the video (``None``: go on)."""
    try:
        manifests.forget(path, key)
    except OSError as err:
        error = f"{target.name}: cannot update the manifest in {path.parent}: {err.strerror or err}"
        log.error("predict: %s", error)
        bar.update(0 if info.problem else info.num_frames)  # the bar still ends at its total
        return VideoResult(target.name, "failed", path, error=error)
    return None


def _score_one(
    target: Target,
    path: Path,
    info: VideoInfo,
    predictor: Predictor,
    plan: WindowPlan,
    fmt: str,
    group: str,
    chunk_frames: int,
    decoder: str,
    bar,
    plot: bool = False,
) -> VideoResult:
    """One video, start to end; any failure becomes its result's one-line error."""
    started = time.perf_counter()
    if info.problem:
        error = info.problem if target.problem else f"{target.name}: {info.problem}"
        log.error("predict: %s", error)
        return VideoResult(target.name, "failed", path, error=error)
    bar.set_postfix_str(target.name[-60:], refresh=False)
    frames = windows = 0
    try:
        reader = VideoFrameReader(
            info,
            size_px=predictor.spec.size_px,
            fit=predictor.sampling.fit,
            chunk_frames=chunk_frames,
            device=predictor.device,
            decoder=decoder,
            hw_decoder_load=predictor.hw_decoder_load,
        )
        chunks = prefetch(read_in_order(reader, target.name))
        run_windows = predictor.run_windows(plan.hop_frames)
        blocks = score_frames(
            chunks,
            info.num_frames,
            plan,
            predictor.logits,
            predictor.class_scores,
            run_windows or predictor.batch_size,
            score_run=predictor.run_logits if run_windows else None,
        )
        if fmt == "csv":
            sink_context = csv_sink(path, predictor.labels, info.num_frames)
        else:
            attrs = {"source": "gpufeed predict", "model": str(predictor.source), "hop_frames": plan.hop_frames}
            sink_context = h5_sink(path, group, predictor.labels, info.num_frames, attrs)
        bins = EthogramBins(info.num_frames, len(predictor.labels)) if plot else None
        with sink_context as sink:
            for block in blocks:
                sink.write(block.first_frame, block.probabilities, block.logits)
                if bins is not None:
                    bins.add(block.first_frame, block.probabilities)
                frames += len(block)
                bar.update(len(block))
        windows = plan.window_count(info.num_frames)
        if bins is not None:
            _draw(bins, path, predictor.labels, target, info)
    except ParityError:  # the model's, not the video's: no later video would fare better
        raise
    except (DatasetError, RuntimeError, ValueError, OSError) as err:
        error = str(err) if isinstance(err, DatasetError) else f"{target.name}: {first_line(str(err))}"
        log.error("predict: %s", error)
        bar.update(info.num_frames - frames)  # its frames are accounted for: the bar still ends at its total
        return VideoResult(target.name, "failed", path, error=error, seconds=time.perf_counter() - started)
    return VideoResult(target.name, "scored", path, frames, windows, time.perf_counter() - started)


def _draw(bins: EthogramBins, output: Path, classes: tuple[str, ...], target: Target, info: VideoInfo) -> None:
    """The video's picture beside its output, with its labels where it has a label file (``<name>.csv``
    beside it, or its project record's); a failure is a warning (the output is written)."""
    try:
        label_file = target.labels or label_path(target.path)
        labels, why, names = labels_for(target.path, info, target.labels)
        if labels is not None:
            bins.set_labels(names, labels, classes, label_file.name)
        elif why and label_file.is_file():  # a video without a label file has no strip to miss
            log.warning("predict: %s: picture without its label strip: %s", target.name, why)
        bins.draw(plot_path(output), classes, target.name, info.fps)
    except Exception as err:  # matplotlib's errors, a full disk: the predictions themselves are safe
        log.warning("predict: %s: no picture: %s", target.name, first_line(str(err)))
