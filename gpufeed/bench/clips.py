"""``gpufeed bench clips``: random 11-frame clips from h264, gpufeed against the usual readers.

Contenders, each with the same number of processes, reading the *same* random clips (the clip
loader's own epoch plan) and producing the same thing (uint8 clips resized to ``size``, laid out
(N, 3, T, S, S), batched; on a GPU machine, on the GPU):

* ``gpufeed``: :class:`gpufeed.pipelines.ClipLoader` (NVDEC on a GPU; PyAV keyframe seeks in DALI
  worker processes on a CPU).
* ``decode_from_start``: a torch DataLoader whose workers open the file and decode from frame 0 up
  to the clip for every clip (the naive approach).
* ``opencv_seek``: a torch DataLoader whose workers keep ``cv2.VideoCapture`` objects open and
  seek with ``CAP_PROP_POS_FRAMES`` (what many behaviour-video loaders do), one FFmpeg thread each
  like the other contenders.
* ``torchcodec``: torchcodec's CUDA decoder with exact seeks (GPU machines only; its registry
  wheel needs a CUDA build of torch).

Data: synthetic 2-minute, 30 fps, 256x256 h264 videos with a long GOP (250; textured, noisy, with
a moving blob, so decoding costs what camera video costs), generated once into a cache folder, and
the same videos after ``gpufeed prepare``, and (``--stores``) as frame folders and HDF5 files of
JPEG frames (``gpufeed prepare --store``), which only gpufeed reads: one image decode per frame.
Every frame carries its index in its pixels, so each
contender is also checked for returning exactly the frames asked for (an untimed pass).
Rounds are interleaved across contenders; medians and ratios are reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed._size import SizePx, parse_size_px, size_px_value
from gpufeed._text import format_table
from gpufeed.bench._clip_videos import make_bench_videos, prepared_bench_videos, stored_bench_videos
from gpufeed.bench._common import machine_facts, median
from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice, resolve_device
from gpufeed.pipelines import ClipLoader, VideoDataset
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.synth import TagError, read_tag

__all__ = ["make_bench_videos", "prepared_bench_videos", "run_clip_bench"]

_DEEPETHOGRAM_FRAMES_PER_SECOND = 1200  # the loading rate DeepEthogram's authors say training needs
_STORE_SETS = {"folder": "frame_folder", "hdf5": "hdf5"}
CONTENDERS = ("gpufeed", "decode_from_start", "opencv_seek", "torchcodec")


@dataclass(frozen=True)
class _Settings:
    """What one run reads and how (the keyword arguments of :func:`run_clip_bench`, workers resolved)."""

    clip_length: int
    stride: int
    size: int | tuple[int, int]  # as a config holds it (VideoConfig.size_px)
    batch_size: int
    workers: int
    seed: int


class DecodeFromStartClips:
    """Map-style dataset: every clip opens its file and decodes from frame 0 (the naive reader)."""

    def __init__(self, clips: list[tuple[str, int]], length: int, stride: int, size: SizePx | int) -> None:
        self.clips, self.length, self.stride, self.size = clips, length, stride, parse_size_px(size)

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> np.ndarray:
        import av
        from av.video.reformatter import VideoReformatter

        path, start = self.clips[i]
        wanted = set(range(start, start + self.length * self.stride, self.stride))
        out = []
        scale = VideoReformatter()
        with av.open(path) as container:
            stream = container.streams.video[0]
            stream.thread_count = 1
            for index, frame in enumerate(container.decode(stream)):
                if index in wanted:
                    out.append(
                        scale.reformat(
                            frame, width=self.size.width_px, height=self.size.height_px, format="rgb24"
                        ).to_ndarray()
                    )
                    if len(out) == self.length:
                        break
        return np.stack(out)


class OpenCvSeekClips:
    """Map-style dataset: ``cv2.VideoCapture`` kept open per worker, ``CAP_PROP_POS_FRAMES`` seeks."""

    def __init__(self, clips: list[tuple[str, int]], length: int, stride: int, size: SizePx | int) -> None:
        self.clips, self.length, self.stride, self.size = clips, length, stride, parse_size_px(size)
        self._captures: dict = {}

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int) -> np.ndarray:
        import cv2

        path, start = self.clips[i]
        capture = self._captures.get(path)
        if capture is None:
            # One decoding thread per process, as every other contender (OpenCV's default is one per core).
            capture = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
            self._captures[path] = capture
        capture.set(cv2.CAP_PROP_POS_FRAMES, start)
        out = []
        for k in range(self.length * self.stride - self.stride + 1):
            ok, frame = capture.read()
            if not ok:
                raise RuntimeError(f"{path}: OpenCV could not read frame {start + k}")
            if k % self.stride == 0:
                small = cv2.resize(frame, tuple(self.size), interpolation=cv2.INTER_AREA)
                out.append(cv2.cvtColor(small, cv2.COLOR_BGR2RGB))
        return np.stack(out)


def _dataloader_epoch(dataset, batch_size: int, workers: int, device) -> tuple[float, int, list]:
    import torch

    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, num_workers=workers, pin_memory=device.is_gpu, shuffle=False
    )
    start = time.perf_counter()
    count, batches = 0, []
    for batch in loader:
        clips = batch.permute(0, 4, 1, 2, 3).contiguous()  # (N, T, H, W, 3) -> (N, 3, T, H, W)
        if device.is_gpu:
            clips = clips.to(device.torch_device, non_blocking=True)
        count += int(clips.shape[0])
        batches.append(clips)
    if device.is_gpu:
        torch.cuda.synchronize(device.torch_device)
    return time.perf_counter() - start, count, batches


def _gpufeed_epoch(loader, epoch: int, clips: int) -> tuple[float, int, list]:
    import torch

    loader.set_epoch(epoch)
    start = time.perf_counter()
    count, batches = 0, []
    for batch in loader:
        count += len(batch)
        batches.append(batch.clips)
        if count >= clips:
            break
    if loader.device.is_gpu:
        torch.cuda.synchronize(loader.device.torch_device)
    return time.perf_counter() - start, count, batches


def _torchcodec_epoch(clips: list[tuple[str, int]], length: int, stride: int, size: SizePx | int, device):
    import torch
    from torchcodec.decoders import VideoDecoder

    decoders: dict = {}
    start = time.perf_counter()
    out = []
    for path, first in clips:
        decoder = decoders.get(path)
        if decoder is None:
            decoder = decoders[path] = VideoDecoder(path, device=str(device.torch_device), seek_mode="exact")
        frames = decoder.get_frames_at(indices=list(range(first, first + length * stride, stride))).data
        frames = torch.nn.functional.interpolate(
            frames.float(), size=parse_size_px(size).hw, mode="bilinear", antialias=True
        )
        out.append(frames.round().clamp(0, 255).to(torch.uint8).permute(1, 0, 2, 3))
    torch.cuda.synchronize(device.torch_device)
    return time.perf_counter() - start, len(clips), [torch.stack(out)]


def _as_square(frame):
    """A (3, H, W) frame resampled (nearest) to (3, H, H): the bench videos are square, and their
    tag's flat squares sit where :func:`read_tag` looks only when the frame has their proportions."""
    arr = frame.detach().cpu().numpy() if hasattr(frame, "detach") else np.asarray(frame)
    height, width = arr.shape[1:]
    if height == width:
        return arr
    return arr[:, :, (np.arange(height) * width + width // 2) // height]


def _exactness(batches: list, clips: list[tuple[int, int]], length: int, stride: int) -> float:
    """Share of clips whose every frame carries the (frame index, video id) asked for."""
    stacked = [c for b in batches for c in b]
    good = 0
    for clip, (video, start) in zip(stacked, clips, strict=False):
        try:
            tags = [read_tag(_as_square(clip[:, t]), "CHW") for t in range(length)]
        except TagError:
            continue
        good += all((tag.ident, tag.aux) == (start + t * stride, video) for t, tag in enumerate(tags))
    return good / max(1, min(len(stacked), len(clips)))


def _contenders(requested: tuple[str, ...], device) -> tuple[list[str], dict[str, str]]:
    available, missing = [], {}
    for name in requested:
        try:
            if name == "opencv_seek":
                try:
                    import cv2  # noqa: F401
                except ImportError:
                    raise RuntimeError("OpenCV is not installed: pip install 'gpufeed[bench]'") from None
            elif name == "torchcodec":
                if not device.is_gpu:
                    raise RuntimeError("needs a GPU machine (its registry wheel needs a CUDA build of torch)")
                import torchcodec  # noqa: F401
        except Exception as err:  # ImportError, or a native library failing to load
            missing[name] = f"unavailable: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
            continue
        available.append(name)
    return available, missing


class _BenchSet:
    """One folder of videos, its clip loader, and a runner per contender (same clips for all)."""

    def __init__(self, folder: Path, args: _Settings, choice: DeviceChoice) -> None:
        self.args, self.choice = args, choice
        self.dataset = VideoDataset.from_folder(folder, progress=True)
        video_cfg = VideoConfig(clip_length_frames=args.clip_length, stride_frames=args.stride, size_px=args.size)
        loader_cfg = LoaderConfig(batch_size=args.batch_size, num_threads=args.workers, last_batch="drop")
        self.loader = ClipLoader(
            self.dataset, train=True, video_cfg=video_cfg, loader_cfg=loader_cfg, device=choice, seed=args.seed
        )

    def clips(self, epoch: int, count: int) -> list[tuple[int, int]]:
        """The first ``count`` (video id, start) pairs the loader reads in ``epoch``."""
        videos, starts = self.loader.epoch_clips(epoch)
        return list(zip(videos[:count].tolist(), starts[:count].tolist(), strict=True))

    def run(self, contender: str, epoch: int, count: int) -> tuple[float, int, list]:
        """(seconds, clips, batches) for ``count`` clips of ``epoch``."""
        a = self.args
        if contender == "gpufeed":
            return _gpufeed_epoch(self.loader, epoch, count)
        paths = [(self.dataset.paths[v], s) for v, s in self.clips(epoch, count)]
        size = parse_size_px(a.size)
        if contender == "decode_from_start":
            naive = DecodeFromStartClips(paths, a.clip_length, a.stride, size)
            return _dataloader_epoch(naive, a.batch_size, a.workers, self.choice)
        if contender == "opencv_seek":
            seeking = OpenCvSeekClips(paths, a.clip_length, a.stride, size)
            return _dataloader_epoch(seeking, a.batch_size, a.workers, self.choice)
        return _torchcodec_epoch(paths, a.clip_length, a.stride, size, self.choice)

    def exactness(self, contender: str, count: int) -> float:
        """Untimed (also the warm-up): share of clips with exactly the frames asked for."""
        _, got, batches = self.run(contender, 10_000, count)
        return _exactness(batches, self.clips(10_000, got), self.args.clip_length, self.args.stride)


def _disk_bytes_per_frame(dataset) -> float:
    """Bytes the set's videos (files, or every file of a frame folder) take on disk, per frame."""
    total = 0
    for path in map(Path, dataset.paths):
        total += sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size
    return total / max(1, sum(int(info.num_frames) for info in dataset.infos))


def _paired_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[r] / b[r]: rounds run back to back share the machine's load."""
    return median([x / y for x, y in zip(a, b, strict=True) if y > 0])


def run_clip_bench(
    *,
    videos: int = 4,
    seconds: int = 120,
    video_size: int = 256,
    gop: int = 250,
    clip_length: int = 11,
    stride: int = 1,
    size: SizePx | int | tuple[int, int] = 112,
    batch_size: int = 8,
    clips: int = 256,
    naive_clips: int = 12,
    verify_clips: int = 24,
    stores: tuple[str, ...] = ("folder", "hdf5"),
    rounds: int = 5,
    workers: int = 0,
    contenders: tuple[str, ...] = CONTENDERS,
    seed: int = 0,
    device: str = "auto",
    cache: Path = Path(".cache/bench"),
) -> dict:
    """Run every available contender on the long-GOP and the prepared videos; return the figures.

    Each round runs every (video set, contender) once, alternating the order between rounds;
    ratios are medians of per-round ratios, which cancels most of a shared machine's drift.

    Args:
        videos: Generated videos, each ``seconds`` long at 30 fps, ``video_size`` px square, a
            keyframe every ``gop`` frames (cached in ``cache``).
        clip_length: Frames per clip, ``stride`` apart, resized to ``size`` (N or (width, height)).
        clips: Clips per timed round (``naive_clips`` for decode-from-start); ``verify_clips``
            are checked for exact frames, untimed.
        stores: Also read the videos as ``folder`` (frame folders) and ``hdf5`` files of JPEG frames.
        rounds: Timed rounds per reader, interleaved.
        workers: Processes/threads per reader; 0 means one per core.
        contenders: Readers to run (of :data:`CONTENDERS`); those unavailable here are listed, not run.
    """
    choice = resolve_device(device)
    args = _Settings(clip_length, stride, size_px_value(size), batch_size, workers or default_num_threads(), seed)
    contenders_run, missing = _contenders(tuple(contenders), choice)
    source = make_bench_videos(cache, videos, seconds, 30, video_size, gop, seed)
    prepared = prepared_bench_videos(source, clip_length, stride)
    sets = {"long_gop": _BenchSet(source, args, choice), "prepared": _BenchSet(prepared, args, choice)}
    # The same videos as frame folders and HDF5 files of JPEG frames: only gpufeed reads those.
    readers = {name: contenders_run for name in sets}
    for store in stores:
        sets[_STORE_SETS[store]] = _BenchSet(stored_bench_videos(source, store), args, choice)
        readers[_STORE_SETS[store]] = [c for c in contenders_run if c == "gpufeed"]
    counts = {c: naive_clips if c == "decode_from_start" else clips for c in contenders_run}
    exact = {name: {c: s.exactness(c, min(counts[c], verify_clips)) for c in readers[name]} for name, s in sets.items()}
    rates: dict[str, dict[str, list[float]]] = {name: {c: [] for c in readers[name]} for name in sets}
    jobs = [(name, c) for name in sets for c in readers[name]]
    for r in range(rounds):
        for name, contender in jobs if r % 2 == 0 else reversed(jobs):
            elapsed_s, got, _ = sets[name].run(contender, r, counts[contender])
            rates[name][contender].append(got / elapsed_s)
    result: dict[str, Any] = {
        "benchmark": "clips",
        "clip_length_frames": args.clip_length,
        "stride_frames": args.stride,
        "size_px": args.size,
        "width_px": parse_size_px(args.size).width_px,
        "height_px": parse_size_px(args.size).height_px,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "rounds": rounds,
        "clips_per_round": counts,
        "unavailable": missing,
        "machine": machine_facts(choice),
        "sets": {},
    }
    for name, bench_set in sets.items():
        cps = {c: median(v) for c, v in rates[name].items()}
        result["sets"][name] = {
            "videos": len(bench_set.dataset),
            "frames_per_video": int(bench_set.dataset.infos[0].num_frames),
            "gop_frames": bench_set.dataset.infos[0].gop_frames,
            "disk_bytes_per_frame": _disk_bytes_per_frame(bench_set.dataset),
            "decoder": f"{bench_set.loader.source} ({bench_set.loader.decoder_reason})",
            "clips_per_second": cps,
            "frames_per_second": {c: v * args.clip_length for c, v in cps.items()},
            "clips_per_second_rounds": rates[name],
            "exact_share": exact[name],
        }
    ratios = {}
    for other in ("decode_from_start", "opencv_seek", "torchcodec"):
        for name in sets:
            if other in rates[name]:
                ratios[f"gpufeed / {other} ({name})"] = _paired_ratio(rates[name]["gpufeed"], rates[name][other])
    ratios["gpufeed prepared / long GOP"] = _paired_ratio(rates["prepared"]["gpufeed"], rates["long_gop"]["gpufeed"])
    for name in sets:
        if name in _STORE_SETS.values() and "gpufeed" in rates[name]:
            ratios[f"gpufeed {name} / prepared"] = _paired_ratio(rates[name]["gpufeed"], rates["prepared"]["gpufeed"])
    result["ratios"] = ratios
    result["frames_per_second_vs_deepethogram_need"] = {
        name: figures["frames_per_second"]["gpufeed"] / _DEEPETHOGRAM_FRAMES_PER_SECOND
        for name, figures in result["sets"].items()
        if "gpufeed" in figures["frames_per_second"]
    }
    return result


def print_clip_result(result: dict) -> None:
    print(
        f"clip benchmark: {result['clip_length_frames']}-frame clips (stride {result['stride_frames']}) resized to "
        f"{result['width_px']}x{result['height_px']}px, batch {result['batch_size']}, {result['workers']} processes/threads each, "
        f"{result['rounds']} rounds of {result['clips_per_round']} clips, {result['machine']['device']}"
    )
    rows = []
    for name, figures in result["sets"].items():
        for contender, cps in figures["clips_per_second"].items():
            exact = f"{100 * figures['exact_share'][contender]:.0f}%"
            gop = f"{figures['gop_frames']:.0f}"
            disk = f"{figures['disk_bytes_per_frame'] / 1000:.1f}"
            rows.append([name, gop, disk, contender, cps, figures["frames_per_second"][contender], exact])
    headers = ["videos", "GOP", "kB/frame on disk", "reader", "clips/s (median)", "frames/s", "exact clips"]
    print(format_table(headers, rows))
    for name, why in result["unavailable"].items():
        print(f"{name}: {why}")
    print("ratios (median of per-round ratios; rounds interleave every reader and video set):")
    for name, value in result["ratios"].items():
        print(f"  {name}: {value:.2f}x")
    for name, share in result["frames_per_second_vs_deepethogram_need"].items():
        fps = result["sets"][name]["frames_per_second"]["gpufeed"]
        print(
            f"gpufeed on {name}: {fps:,.0f} frames/s, {share:.2f}x DeepEthogram's stated need of "
            f"{_DEEPETHOGRAM_FRAMES_PER_SECOND:,} frames/s"
        )
