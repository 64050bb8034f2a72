"""``gpufeed bench predict``: frames/s of ``gpufeed predict`` against a careful user's PyAV + PyTorch loop.

The same video, the same model weights, the same windows (the model's clip every ``hop_frames``, one more
ending at the last frame, each frame the mean over its windows), the same output (one CSV), in the same run,
rounds interleaved. The contenders:

* **user loop**: what a careful user writes: PyAV decodes the file once in order (FFmpeg's own
  threads), each frame converted and resized by ``to_ndarray(width=, height=)`` (one swscale
  pass), a rolling buffer of the last ``span`` frames, windows stacked into batches, the PyTorch
  checkpoint in ``inference_mode`` on the device, probabilities summed per frame, a CSV written;
* **predict (checkpoint)**: :func:`gpufeed.predict.predict_videos` with the checkpoint as
  ``gpufeed predict`` loads it by default (``runtime`` ``auto``: on a CPU its export on onnxruntime,
  made once and cached, the first batch checked against PyTorch; on a GPU PyTorch): the figure the
  target is read on, since it is what a user who trained with gpufeed runs; with a window at every
  frame a stacked-frame model's windows go through its export in runs that share the first
  convolution (:mod:`gpufeed.models._sliding_runner`);
* **predict (checkpoint, one by one)**: the same with ``window_runs`` off, every window through
  the plain graph (what the runs save, in the same run);
* **predict (checkpoint, torch)**: the same with ``runtime`` ``torch`` (PyTorch eager);
* **predict (exported)**: the same with the checkpoint exported by ``gpufeed export`` (onnxruntime,
  as the server runs it);
* **served video (REST)**, and **served video (REST, one by one)** with ``serve.video_window_runs``
  off: that export served by ``gpufeed serve`` in this process, each video posted as an mp4 body
  and its answer written as a CSV (:mod:`gpufeed.bench._served_video`).

On a GPU the two "one by one" contenders are left out (:func:`contenders`): runs of windows are a graph for
onnxruntime's CPU provider, so there they would repeat their partners.

Each round times the whole call on one video with the model loaded before, as in the user's loop (the
checkpoint is loaded again before each round, from the export cache, so every round pays the first batch's
check against PyTorch): wall time, and the process's CPU time over all its threads, which a shared machine's
load moves less (though a thread that spins while it waits spends CPU time too). Each round starts one
contender later than the last, so none always runs right after another. The export itself is timed once per
run, into a fresh cache, and printed beside the figures with the time of a load from the cache. The CPU
verdict reads the median of the paired per-round ratios of **predict (checkpoint)**: the target is >= 1.5x on
a 2-core CPU; the GPU verdict reads **predict (exported)**: on an H100, >= 5,000 frames/s for a clip ResNet-18
at 112 px (not measured here: no GPU). The load average is printed beside the figures, since the machine may
be shared. ``--data`` scores the user's own videos instead (each contender over every video found, frames/s
over all of them).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpufeed.bench._clip_videos import make_camera_videos
from gpufeed.bench._common import machine_facts
from gpufeed.bench._served_video import SERVED, SERVED_ONE_BY_ONE, served_contenders
from gpufeed.core import format_table
from gpufeed.device import resolve_device
from gpufeed.models import WindowPlan, checkpoint_path, create_model, export_model, model_state
from gpufeed.predict import default_batch_size, find_videos, load_predictor, predict_videos, read_predictions_csv

__all__ = ["TARGET_CPU_RATIO", "TARGET_GPU_FPS", "contenders", "print_predict_result", "run_predict_bench", "user_loop"]

TARGET_CPU_RATIO = 1.5
TARGET_GPU_FPS = 5000.0
ONE_BY_ONE = "predict (checkpoint, one by one)"
CONTENDERS = (
    "user loop",
    "predict (checkpoint)",
    ONE_BY_ONE,
    "predict (checkpoint, torch)",
    "predict (exported)",
    SERVED,
    SERVED_ONE_BY_ONE,
)
VERDICT = "predict (checkpoint)"


def contenders(on_gpu: bool) -> tuple[str, ...]:
    """The contenders of a run on a GPU or not: runs of windows are a CPU-provider graph, so on a GPU
    the two "one by one" contenders would repeat ``predict (checkpoint)`` and the served video."""
    return tuple(name for name in CONTENDERS if not (on_gpu and name in (ONE_BY_ONE, SERVED_ONE_BY_ONE)))


@dataclass
class PredictBenchResult:
    """Figures of one run: per contender its rounds' frames/s, and the facts of the run."""

    frames: int
    videos: int
    model: str
    hop_frames: int
    device: str
    rounds: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)
    agreement: dict[str, float] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    load_before: str = ""
    load_after: str = ""
    export_s: float = float("nan")
    cached_load_s: float = float("nan")
    runtime: str = ""

    def median(self, name: str) -> float:
        values = self.rounds.get(name, [])
        return statistics.median(values) if values else float("nan")

    def paired(self, name: str) -> list[float]:
        """``name``'s frames/s over the user loop's, round by round (each pair measured back to back)."""
        return [a / b for a, b in zip(self.rounds.get(name, []), self.rounds.get("user loop", []), strict=True)]

    @property
    def ratio(self) -> float:
        """The verdict's ratio: the median of the checkpoint's paired ratios (a shared machine's
        load changes between rounds; a pair measured back to back shares it)."""
        paired = self.paired(VERDICT)
        return statistics.median(paired) if paired else float("nan")

    def to_json(self) -> dict:
        return {
            "frames": self.frames,
            "videos": self.videos,
            "model": self.model,
            "hop_frames": self.hop_frames,
            "device": self.device,
            "frames_per_second": {name: self.median(name) for name in self.rounds},
            "rounds": self.rounds,
            "cpu_ms_per_frame": self.cpu_ms,
            "ratio_checkpoint_vs_user": self.ratio,
            "checkpoint_runtime": self.runtime,
            "export_s": self.export_s,
            "cached_load_s": self.cached_load_s,
            "paired_ratios": {name: self.paired(name) for name in list(self.rounds)[1:]},
            "max_abs_diff_vs_user": self.agreement,
            "facts": self.facts,
            "loadavg": [self.load_before, self.load_after],
        }


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def user_loop(video: Path, model, plan: WindowPlan, size_px: int, batch_size: int, device, out: Path) -> int:
    """A careful user's scoring of one video (see the module docs); returns the frames scored.

    Written without gpufeed's scorer: PyAV, a deque of frames, numpy sums per frame, the csv module.
    """
    import av
    import torch

    span, length, stride = plan.span_frames, plan.clip_length_frames, plan.stride_frames
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        num_frames = stream.frames
        if not num_frames:
            raise ValueError(f"{video}: the container does not say how many frames it holds")
        last_start = max(0, num_frames - span)
        starts = list(range(0, last_start + 1, plan.hop_frames))
        if starts[-1] != last_start:
            starts.append(last_start)
        sums = np.zeros((num_frames, model.spec.num_classes), dtype=np.float64)
        counts = np.zeros(num_frames, dtype=np.int64)
        buffer: deque = deque(maxlen=span)
        pending: list[tuple[int, np.ndarray]] = []
        next_window = 0

        def run(batch: list[tuple[int, np.ndarray]]) -> None:
            clips = torch.from_numpy(np.stack([clip for _, clip in batch])).to(device)
            with torch.inference_mode():
                probs = torch.sigmoid(model(clips)).float().cpu().numpy()
            for (start, _), p in zip(batch, probs, strict=True):
                end = min(start + span, num_frames)
                sums[start:end] += p
                counts[start:end] += 1

        index = -1
        for index, frame in enumerate(container.decode(stream)):
            buffer.append(frame.to_ndarray(width=size_px, height=size_px, format="rgb24"))
            while next_window < len(starts) and min(starts[next_window] + span - 1, num_frames - 1) <= index:
                start = starts[next_window]
                picks = [min(start + k * stride, num_frames - 1) - (index - len(buffer) + 1) for k in range(length)]
                clip = np.stack([buffer[p] for p in picks]).transpose(3, 0, 1, 2)  # (3, T, H, W)
                pending.append((start, np.ascontiguousarray(clip)))
                next_window += 1
                if len(pending) == batch_size:
                    run(pending)
                    pending = []
        if pending:
            run(pending)
    frames = index + 1
    means = sums[:frames] / np.maximum(counts[:frames], 1)[:, None]
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(",".join(["frame", *model.spec.labels]) + "\n")
        for i, row in enumerate(means.astype(np.float32)):
            handle.write(f"{i}," + ",".join(f"{v:.9g}" for v in row) + "\n")
    return frames


def _model(work: Path, architecture: str, size_px: int, length: int, classes: int, batch_size: int):
    checkpoint = checkpoint_path(work / "run", 0)
    exported = work / "exported"
    if not (exported / "model_card.json").is_file():
        import torch

        torch.manual_seed(0)
        labels = tuple(f"behaviour_{i}" for i in range(classes))
        model = create_model(
            architecture, num_classes=classes, size_px=size_px, clip_length_frames=length, labels=labels
        )
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        torch.save({**model_state(model), "step": 0}, checkpoint)
        export_model(checkpoint, exported, batch_size=batch_size)
    return checkpoint, exported


def _predict_frames(videos: list[Path], predictor, out: Path, hop_frames: int) -> int:
    """``predict_videos`` over each video: the frames scored."""
    frames = 0
    for video in videos:
        report = predict_videos(video, predictor, out=out, hop_frames=hop_frames, overwrite=True, progress=False)
        if report.failed:
            raise RuntimeError(f"bench predict: {report.failed[0].error}")
        frames += report.frames
    return frames


def _encoded_videos(source: Path) -> list[Path]:
    """The encoded video files under ``source``: the user's loop reads them with PyAV (frame stores are predict's alone)."""
    videos = [
        t.path
        for t in find_videos(source)
        if t.problem is None and isinstance(t.path, Path) and t.path.is_file() and t.path.suffix != ".h5"
    ]
    if not videos:
        raise ValueError(f"bench predict: no encoded video file in {source}")
    return videos


def _agreement(outs: dict[str, Path], videos: list[Path]) -> dict[str, float]:
    """Per contender, the max |diff| of its CSVs against the user loop's."""
    reference = {v.stem: read_predictions_csv(outs["user loop"] / f"{v.stem}.csv")[1] for v in videos}
    agreement = {}
    for name in list(outs)[1:]:
        diffs = []
        for path in outs[name].rglob("*_predictions.csv"):
            stem = path.name.removesuffix("_predictions.csv")
            diffs.append(float(np.abs(read_predictions_csv(path)[1] - reference[stem]).max()))
        agreement[name] = max(diffs) if diffs else float("nan")
    return agreement


def run_predict_bench(
    *,
    data: Path | None = None,
    seconds: int = 8,
    video_size: int = 256,
    architecture: str = "clip_resnet18",
    size_px: int = 112,
    clip_length: int = 11,
    classes: int = 5,
    hop_frames: int = 1,
    batch_size: int | None = None,
    rounds: int = 3,
    device: str = "auto",
    cache: Path = Path(".cache/bench"),
) -> PredictBenchResult:
    """Run the benchmark (see the module docs) and return its figures (``batch_size`` None: predict's own)."""
    import torch

    choice = resolve_device(device)
    batch_size = batch_size or default_batch_size(choice)
    work = Path(cache) / f"predict-{architecture}-{size_px}px-{clip_length}f-{classes}c-b{batch_size}"
    checkpoint, exported = _model(work, architecture, size_px, clip_length, classes, batch_size)
    source = Path(data) if data is not None else make_camera_videos(cache, count=1, seconds=seconds, size=video_size)
    videos = _encoded_videos(source)
    by_torch = load_predictor(checkpoint, choice, batch_size=batch_size, runtime="torch")
    by_export = load_predictor(exported, choice)
    plan = WindowPlan(clip_length, 1, hop_frames)
    user_model = by_torch._module
    result = PredictBenchResult(
        0, len(videos), f"{architecture} {size_px} px, {clip_length} frames", hop_frames, choice.describe()
    )
    result.facts, result.load_before = machine_facts(choice), _loadavg()
    result.facts["torch_threads"] = torch.get_num_threads()
    names = contenders(choice.is_gpu)
    result.rounds = {name: [] for name in names}
    result.cpu_ms = {name: [] for name in names}
    with (
        tempfile.TemporaryDirectory(prefix="gpufeed-bench-predict-") as tmp,
        served_contenders(exported, choice, hop_frames, [name for name in names if "served" in name]) as served,
    ):
        exports = Path(tmp) / "exports"  # a fresh cache: the first load exports, and is timed
        started = time.perf_counter()
        result.runtime = load_predictor(checkpoint, choice, batch_size=batch_size, export_cache=exports).runtime
        result.export_s = time.perf_counter() - started
        outs = {name: Path(tmp) / f"out{k}" for k, name in enumerate(names)}
        for out in outs.values():
            out.mkdir()

        def prepare(name: str):
            """The timed call of ``name`` (frames scored), whatever it loads loaded first, untimed."""
            if name == "user loop":
                device = choice.torch_device
                return lambda: sum(
                    user_loop(v, user_model, plan, size_px, batch_size, device, outs[name] / f"{v.stem}.csv")
                    for v in videos
                )
            if name in served:
                return lambda: served[name](videos, outs[name])
            if name == VERDICT:  # loaded as predict loads it, from the cache: each round checks its first batch
                started = time.perf_counter()
                predictor = load_predictor(checkpoint, choice, batch_size=batch_size, export_cache=exports)
                result.cached_load_s = time.perf_counter() - started
            elif name == ONE_BY_ONE:
                predictor = load_predictor(
                    checkpoint, choice, batch_size=batch_size, export_cache=exports, window_runs=False
                )
            else:
                predictor = by_torch if name == "predict (checkpoint, torch)" else by_export
            return lambda: _predict_frames(videos, predictor, outs[name], hop_frames)

        _time_rounds(result, prepare, rounds)
        result.agreement = _agreement(outs, videos)
    result.load_after = _loadavg()
    return result


def _time_rounds(result: PredictBenchResult, prepare, rounds: int) -> None:
    """``rounds`` rounds of every contender (``prepare(name)`` -> its timed call), into ``result``."""
    for round_number in range(rounds):
        # Each round starts one contender later, so none always runs right after another.
        names = list(result.rounds)
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            call = prepare(name)
            wall_s, cpu_s = time.perf_counter(), time.process_time()
            frames = call()
            wall_s, cpu_s = time.perf_counter() - wall_s, time.process_time() - cpu_s
            result.rounds[name].append(frames / wall_s)
            result.cpu_ms[name].append(1000 * cpu_s / frames)
            result.frames = frames


def print_predict_result(result: PredictBenchResult) -> None:
    """The table, the ratios and the verdicts."""
    rows = []
    for name, values in result.rounds.items():
        rows.append(
            [
                name,
                f"{result.median(name):,.1f}",
                ", ".join(f"{v:,.1f}" for v in values),
                f"{statistics.median(result.paired(name)):.2f}x ({', '.join(f'{r:.2f}' for r in result.paired(name))})",
                f"{statistics.median(result.cpu_ms[name]):,.1f}" if result.cpu_ms.get(name) else "-",
                f"{result.agreement[name]:.2g}" if name in result.agreement else "-",
            ]
        )
    print(
        f"bench predict: {result.videos} video(s), {result.frames:,} frames, {result.model}, hop {result.hop_frames}, "
        f"on {result.device}; {result.facts.get('cpu_cores')} cores, torch threads {result.facts.get('torch_threads')}"
    )
    header = ["contender", "frames/s (median)", "rounds", "vs user loop (median of paired rounds)"]
    header += ["CPU ms/frame (median)", "max |diff| vs user"]
    print(format_table(header, rows))
    print(f"load average before / after: {result.load_before} / {result.load_after}")
    # runtime auto on a GPU (or an export that failed its check) runs PyTorch: nothing is exported
    onnx = result.runtime == "onnx"
    loads = "the first load exported it in {:.1f} s (a fresh cache), a load from the cache took {:.1f} s"
    loads = loads if onnx else "a load took {:.1f} s, {:.1f} s in the timed rounds"
    runtime = "onnxruntime" if onnx else "PyTorch (no export)"
    print(f"predict (checkpoint) ran on {runtime}: " + loads.format(result.export_s, result.cached_load_s))
    on_gpu = "gpu" in result.facts and "cuda" in result.device
    if on_gpu:
        fps = result.median("predict (exported)")
        verdict = "met" if fps >= TARGET_GPU_FPS else "not met"
        print(f"target: >= {TARGET_GPU_FPS:,.0f} frames/s on an H100 ({result.facts['gpu']}): {fps:,.0f}, {verdict}")
    else:
        verdict = "met" if result.ratio >= TARGET_CPU_RATIO else "not met"
        print(
            f"target: predict with the checkpoint >= {TARGET_CPU_RATIO}x the user loop on a CPU: {result.ratio:.2f}x, "
            f"{verdict} (windows one by one: {statistics.median(result.paired(ONE_BY_ONE)):.2f}x; "
            f"in PyTorch: {statistics.median(result.paired('predict (checkpoint, torch)')):.2f}x; "
            f"exported: {statistics.median(result.paired('predict (exported)')):.2f}x; "
            f"served: {statistics.median(result.paired(SERVED)):.2f}x, one by one "
            f"{statistics.median(result.paired(SERVED_ONE_BY_ONE)):.2f}x); the GPU target (>= {TARGET_GPU_FPS:,.0f} frames/s on an H100) is not measured on this machine"
        )
    cores = os.cpu_count() or 0
    if result.load_before != "unknown" and float(result.load_before.split()[0]) > cores:
        print(
            f"note: the load average was above the {cores} cores: other work shared the machine; read the ratio, not the rates"
        )
