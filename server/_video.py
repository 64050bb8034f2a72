"""Encoded video into a clip model: the server decodes it, windows it, batches the windows, answers per frame.

A clip model (a head that :attr:`~gpufeed.models.TaskHead.accepts_video`) takes a whole encoded
video, as an image model takes a JPEG:

* REST: ``POST /v1/models/NAME/predict`` with a ``video/*`` body (``video/mp4``, ``video/x-msvideo``
  ...; the container is recognised from the bytes), query ``hop_frames=N`` and ``windows=true``;
* KServe v2 (HTTP and gRPC): one BYTES input named ``video``, shape ``[1]`` (raw binary data, or
  base64), request parameters ``hop_frames`` and ``window_scores``; the outputs a request names
  (``scores``, ``window_scores``, ``window_starts``) are the ones computed.

**Checks, before a frame is decoded** (on a parser thread, :func:`open_video`): the size against
``serve.max_video_bytes`` (413), the container from its first bytes (MP4/MOV, AVI, Matroska/WebM;
else 415), then the file is probed as the training index probes videos (demuxed, no decoding): an
unsupported codec is named (415), a damaged or truncated file is 400 ``corrupt_video``, and more
frames than ``serve.max_video_frames``, a duration over ``serve.max_video_seconds`` or frames over
``serve.max_image_pixels`` are 400 ``video_too_long`` / ``too_many_pixels``.

**Scoring** (:func:`score_video`, on one of ``serve.video_streams`` threads): the sequential reader
decodes the frames in order (NVDEC through DALI on a GPU, PyAV on a CPU; a chunk ahead on a thread
of its own), and :func:`gpufeed.models.score_frames` (the very function ``gpufeed predict`` runs)
cuts the windows (the card's clip length, its training's frame gap and fit, the request's hop) and
joins their scores into each frame's: the mean over the windows covering it. Each batch of windows
goes through the model's batcher as rows (so video windows and other requests share batches, the
limits and the accounting); on a GPU the windows stay CUDA tensors from the decoder to the model's
input buffer. With a window at every frame, a stacked-frame model on the CPU scores runs of
windows that share its first convolution instead, as ``gpufeed predict`` does, each run a batch
of its own on the model's lanes (:mod:`gpufeed.server._video_runs`). Memory is bounded by the
frames the next windows need, a batch of windows in flight and the answer (``max_video_frames``
rows). A video that fails mid-way is 400 ``corrupt_video`` naming
where decoding stopped; a request past ``serve.request_timeout_seconds`` is 504 and its windows
leave the queue.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpufeed.core import prefetch
from gpufeed.models import ClipSampling, ModelCard, WindowPlan, score_frames
from gpufeed.pipelines import CONTAINERS, SUPPORTED_CODECS, DatasetError, VideoBytes, VideoFrameReader, read_in_order
from gpufeed.server._errors import RequestError, shown
from gpufeed.server._items import Item

# The request's ``Inference`` (server/_dataplane.py) is typed loosely here: the data plane imports
# this module for the video facts of its metadata, and a type-only import back would be a cycle.
Inference = Any

__all__ = [
    "VIDEO_INPUT",
    "VideoJob",
    "VideoUpload",
    "is_video_type",
    "open_video",
    "score_video",
    "video_facts",
    "video_input_entry",
    "video_outputs",
]

VIDEO_INPUT = "video"
CHUNK_FRAMES = 64
_WINDOW_OUTPUTS = ("window_scores", "window_starts")


def is_video_type(kind: str | None) -> bool:
    """Whether a ``Content-Type`` (its media type, lower case) is a video body."""
    return bool(kind) and kind.startswith("video/")  # type: ignore[union-attr]


def video_input_entry() -> dict[str, Any]:
    """The KServe model-metadata entry of the video input: one encoded video per request."""
    return {"name": VIDEO_INPUT, "datatype": "BYTES", "shape": [1]}


def video_facts(card: ModelCard, cfg) -> dict[str, Any]:
    """What a video input takes, for the KServe metadata and Triton's configuration parameters."""
    sampling = ClipSampling.from_card(card)
    return {
        "video_input": VIDEO_INPUT,
        "video_containers": ", ".join(CONTAINERS),
        "video_codecs": ", ".join(SUPPORTED_CODECS),
        "video_max_bytes": cfg.max_video_bytes,
        "video_max_frames": cfg.max_video_frames,
        "video_max_seconds": cfg.max_video_seconds,
        "video_hop_frames": cfg.video_hop_frames,
        "video_stride_frames": sampling.stride_frames,
        "video_fit": sampling.fit,
        "video_outputs": "scores [frames, classes]: each frame's mean over the windows covering it; "
        "window_scores [windows, classes] and window_starts [windows] when asked",
    }


@dataclass(frozen=True)
class VideoUpload:
    """A request's encoded video, not yet checked: the bytes and how messages name them."""

    blob: bytes
    where: str


@dataclass
class VideoJob:
    """A checked video and how to score it.

    Attributes:
        video: The probed temporary file (:class:`~gpufeed.pipelines._video_bytes.VideoBytes`).
        where: How messages name the video (``"the request body"``, ``"input 'video'"``).
        plan: The windows.
        keep_windows: Answer each window's scores too.
    """

    video: VideoBytes
    where: str
    plan: WindowPlan
    keep_windows: bool

    @property
    def num_frames(self) -> int:
        return self.video.info.num_frames


def hop_of(raw: Any, default: int, where: str) -> int:
    """A request's hop (``?hop_frames=`` text or a parameter's value), ``default`` when absent."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise RequestError("malformed_request", f"{where} must be an integer, got {shown(raw, 40)}") from None
    if isinstance(raw, bool) or value < 1:
        raise RequestError("malformed_request", f"{where} must be an integer >= 1, got {shown(raw, 40)}")
    return value


def _problem_error(where: str, problem: str) -> RequestError:
    if problem.startswith("unsupported codec"):
        return RequestError("unsupported_media_type", f"{where}: {problem}")
    return RequestError("corrupt_video", f"{where}: {problem}")


def open_video(model, cfg, upload: VideoUpload, hop_frames: int, keep_windows: bool) -> VideoJob:
    """Check a video against the limits and probe it, decoding nothing (on a parser thread; see the module docs).

    Raises:
        RequestError: ``body_too_large``, ``unsupported_media_type``, ``corrupt_video``,
            ``video_too_long``, ``too_many_pixels``, or ``malformed_request`` (a hop the windows cannot take).
    """
    where, size = upload.where, len(upload.blob)
    if size > cfg.max_video_bytes:
        raise RequestError(
            "body_too_large", f"{where} is {size:,} bytes; the limit is {cfg.max_video_bytes:,} (serve.max_video_bytes)"
        )
    spec = model.card.spec
    try:
        plan = WindowPlan(spec.clip_length_frames, ClipSampling.from_card(model.card).stride_frames, hop_frames)
    except ValueError as err:
        raise RequestError("malformed_request", f"hop_frames: {err}") from None
    try:
        video = VideoBytes(upload.blob, where)
    except DatasetError as err:
        reason = "corrupt_video" if size == 0 else "unsupported_media_type"
        raise RequestError(reason, str(err)) from None
    try:
        _check_limits(video, cfg, where)
    except BaseException:
        video.close()
        raise
    return VideoJob(video, where, plan, keep_windows)


def _check_limits(video: VideoBytes, cfg, where: str) -> None:
    info = video.info
    if info.problem:
        raise _problem_error(where, info.problem)
    if info.num_frames > cfg.max_video_frames:
        raise RequestError(
            "video_too_long",
            f"{where} holds {info.num_frames:,} frames; the limit is {cfg.max_video_frames:,} (serve.max_video_frames)",
        )
    seconds = info.num_frames / info.fps if info.fps > 0 else info.declared_seconds
    if seconds > cfg.max_video_seconds:
        raise RequestError(
            "video_too_long",
            f"{where} lasts {seconds:,.1f} s; the limit is {cfg.max_video_seconds:g} s (serve.max_video_seconds)",
        )
    if info.width * info.height > cfg.max_image_pixels:
        raise RequestError(
            "too_many_pixels",
            f"{where}: frames of {info.width}x{info.height} hold more than {cfg.max_image_pixels:,} pixels "
            "(serve.max_image_pixels)",
        )


def score_video(call: Inference, job: VideoJob, device, stop: threading.Event) -> dict[str, np.ndarray]:
    """Decode, window and score a checked video (on a video thread): its output tensors by name.

    The windows go through the model's batcher (:meth:`~gpufeed.server._dataplane.Inference.infer_rows`);
    the temporary file is removed when this returns, whatever happened.

    Raises:
        RequestError: ``corrupt_video`` (decoding stopped: where and why), or the batcher's refusals.
    """
    model, info = call.model, job.video.info
    sampling = ClipSampling.from_card(model.card)
    answered: list[Item] = []

    def logits_of(clips) -> np.ndarray:
        if clips.is_cuda and model.on_gpu:  # the batch's lane reads them on its own stream: finish this thread's writes
            import torch

            torch.cuda.current_stream(clips.device).synchronize()
            rows = list(clips)
        else:  # a CPU lane on a GPU host: one copy of the batch, not a synchronous copy a window
            rows = list(clips.cpu().numpy())
        items = [Item(pixels=row, where=f"window {k} of {job.where}") for k, row in enumerate(rows)]
        logits = call.infer_rows(items, stop)
        answered.extend(Item(where=item.where, times=item.times) for item in items)  # no pixels kept
        return logits

    runs = model.video_runs
    run_windows = runs.windows_for(job.plan.hop_frames) if runs is not None else 0

    def logits_of_run(run) -> np.ndarray:
        if runs.is_short(run):  # a run of few windows costs less one by one, through the batcher
            return logits_of(runs.windows_of(run))
        call.raise_if_given_up(stop)
        logits, times = runs(run)
        answered.extend(Item(where=f"window {k} of {job.where}", times=times) for k in range(len(logits)))
        return logits

    try:
        reader = VideoFrameReader(
            info, size_px=model.card.spec.size_px, fit=sampling.fit, chunk_frames=CHUNK_FRAMES, device=device
        )
        chunks = prefetch(read_in_order(reader, job.where), name="gpufeed-video-decode")
        classes = model.card.spec.num_classes
        scores = np.zeros((info.num_frames, classes), dtype=np.float32)
        starts: list[np.ndarray] = []
        windows: list[np.ndarray] = []
        batch = run_windows or model.batch_size * model.workers  # every lane busy
        for block in score_frames(
            chunks,
            info.num_frames,
            job.plan,
            logits_of,
            model.head.class_scores,
            batch,
            job.keep_windows,
            score_run=logits_of_run if run_windows else None,
        ):
            scores[block.first_frame : block.first_frame + len(block)] = block.probabilities
            if job.keep_windows and block.window_probabilities is not None:
                starts.append(block.window_starts)
                windows.append(block.window_probabilities)
    except DatasetError as err:
        raise RequestError("corrupt_video", str(err)) from None
    finally:
        job.video.close()
    call.rows_answered(answered)
    tensors = {"scores": scores}
    if job.keep_windows:
        tensors["window_scores"] = np.concatenate(windows) if windows else np.zeros((0, scores.shape[1]), np.float32)
        tensors["window_starts"] = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    return tensors


async def video_outputs(call: Inference, job: VideoJob) -> dict[str, np.ndarray]:
    """Score ``job`` on a video thread and wait for it within the request's time (504 after it)."""
    stop = threading.Event()
    future = call.plane.video_pool().submit(score_video, call, job, call.plane.state.device, stop)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), max(call.seconds_left(), 0.001))
    except asyncio.TimeoutError:
        stop.set()
        raise RequestError(
            "timeout", f"no answer within {call.plane.cfg.request_timeout_seconds:g} s (serve.request_timeout_seconds)"
        ) from None
    except asyncio.CancelledError:  # the client left or the server stops: the thread stops at its next batch
        stop.set()
        raise
    finally:
        if future.cancel():  # never started: its file is still there
            job.video.close()


def wants_windows(requested, flag: Any) -> bool:
    """Whether a request asks for per-window scores: it names a window output, or sets the flag."""
    named = any(out.name in _WINDOW_OUTPUTS for out in requested or ())
    return named or flag is True or (isinstance(flag, str) and flag.strip().lower() in ("1", "true", "yes"))


async def kserve_video(call: Inference, request, upload: VideoUpload) -> dict[str, np.ndarray]:
    """A KServe request's video (HTTP or gRPC): checked, scored, its output tensors by name.

    ``parameters.hop_frames`` sets the hop; ``parameters.window_scores: true``, or an ``outputs``
    list naming ``window_scores`` or ``window_starts``, adds the per-window tensors.
    """
    cfg, params = call.plane.cfg, request.parameters
    hop = hop_of(params.get("hop_frames"), cfg.video_hop_frames, "parameters.hop_frames")
    keep = wants_windows(request.outputs, params.get("window_scores"))
    job = await call.validate(open_video, upload, hop, keep)
    return await video_outputs(call, job)


def video_document(name: str, card: ModelCard, job: VideoJob, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """The REST answer to a video: the facts of its windows and each frame's scores (per window when asked)."""
    info, plan = job.video.info, job.plan
    document: dict[str, Any] = {
        "model": name,
        "frames": info.num_frames,
        "fps": info.fps,
        "labels": list(card.labels),
        "multilabel": card.spec.multilabel,
        "clip_length_frames": plan.clip_length_frames,
        "stride_frames": plan.stride_frames,
        "hop_frames": plan.hop_frames,
        "windows": plan.window_count(info.num_frames),
        "rule": "each frame's scores are the mean over the windows covering it",
        "scores": tensors["scores"].tolist(),
    }
    if job.keep_windows:
        document["window_starts"] = tensors["window_starts"].tolist()
        document["window_scores"] = tensors["window_scores"].tolist()
    return document
