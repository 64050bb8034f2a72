"""``gpufeed bench clips``: random 11-frame clips, gpufeed against the readers video users pick.

Contenders (:mod:`gpufeed.bench._clip_readers`), each with the same number of processes, reading the
*same* random clips (the clip loader's own epoch plan) and producing the same thing (uint8 clips
resized to ``size``, laid out (N, 3, T, H, W), batched): gpufeed's :class:`~gpufeed.pipelines.ClipLoader`,
decoding every clip from the start, OpenCV's seek, torchcodec's exact and approximate seeks, and,
on its own random clips, torchcodec's ``clips_at_random_indices`` sampler. torchcodec runs where it
imports and decodes (``make peers`` builds a venv where it does, on a CPU too).

Sets (:mod:`gpufeed.bench._clip_sets`): generated h264 (long GOP, prepared, one GOP per video,
camera-like with B-frames) and JPEG frame stores, or the user's own (``data``). Every round opens,
times and closes each reader the same way (:mod:`gpufeed.bench._clip_rounds`); an untimed pass
checks that each returned exactly the frames asked for (:mod:`gpufeed.bench._clip_exact`).
Medians and paired ratios are reported, and the targets with what they were measured against.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed.bench._clip_exact import reference_share, sampler_tag_share, tag_share
from gpufeed.bench._clip_names import GENERATED_SETS
from gpufeed.bench._clip_readers import (
    CONTENDERS,
    DecodeFromStartClips,
    OpenCvSeekClips,
    TorchcodecClips,
    TorchcodecSamplerCalls,
    dataloader_reader,
    gpufeed_reader,
    unavailable_reason,
)
from gpufeed.bench._clip_report import print_clip_result, summarise
from gpufeed.bench._clip_rounds import RoundTime, interleaved, timed_round
from gpufeed.bench._clip_sets import BenchSet, generated_sets, user_sets
from gpufeed.bench._clip_videos import make_bench_videos, prepared_bench_videos
from gpufeed.bench._common import machine_facts
from gpufeed.bench._store_figures import store_figures
from gpufeed.config import VideoDecoder
from gpufeed.core import SizePx, progress_bar
from gpufeed.device import resolve_device
from gpufeed.pipelines import VideoRef, default_num_threads

__all__ = ["CONTENDERS", "make_bench_videos", "prepared_bench_videos", "print_clip_result", "run_clip_bench"]

DEFAULT_SETS = GENERATED_SETS
_VERIFY_EPOCH = 10_000  # the untimed exactness pass reads clips no timed round reads


@dataclass(frozen=True)
class _Settings:
    """What one run reads and how (the keyword arguments of :func:`run_clip_bench`, workers resolved)."""

    clip_length: int
    stride: int
    size: SizePx
    batch_size: int
    workers: int
    sampler_clips: int
    seed: int


def _opener(bench_set: BenchSet, contender: str, epoch: int, count: int, a: _Settings):
    """A function opening ``contender`` on round ``epoch``'s ``count`` clips of ``bench_set``."""
    if contender == "gpufeed":
        return functools.partial(gpufeed_reader, bench_set.loader, epoch)
    paths = bench_set.paths_of(bench_set.clips(epoch, count))
    batch = a.batch_size
    if contender == "decode_from_start":
        dataset: Any = DecodeFromStartClips(paths, a.clip_length, a.stride, a.size)
    elif contender == "opencv_seek":
        dataset = OpenCvSeekClips(paths, a.clip_length, a.stride, a.size)
    elif contender == "torchcodec_sampler":
        calls = -(-count // a.sampler_clips)
        dataset = TorchcodecSamplerCalls(
            list(bench_set.dataset.paths), calls, a.sampler_clips, a.clip_length, a.stride, a.size, a.seed + epoch
        )
        batch = max(1, a.batch_size // a.sampler_clips)
    else:
        dataset = TorchcodecClips(paths, a.clip_length, a.stride, a.size, contender.removeprefix("torchcodec_"))
    return functools.partial(dataloader_reader, dataset, batch, a.workers)


def _exact_share(bench_set: BenchSet, contender: str, count: int, a: _Settings) -> float | None:
    """Untimed: the share of clips with exactly the frames asked for (``None``: not checkable)."""
    _, batches = timed_round(_opener(bench_set, contender, _VERIFY_EPOCH, count, a), count, keep=True)
    clips = bench_set.clips(_VERIFY_EPOCH, count)
    videos = len(bench_set.dataset.paths)
    if contender == "torchcodec_sampler":
        if not bench_set.tagged:
            return None

        def video_of(c: int) -> int:
            return (c // a.sampler_clips) % videos

        return sampler_tag_share(batches, video_of, a.clip_length, a.stride)
    if bench_set.tagged:
        return tag_share(batches, clips, a.clip_length, a.stride)
    if bench_set.is_store or contender == "decode_from_start":
        return None  # stores: every frame is its own image; decoding from the start is the reference itself
    refs = {
        path: VideoRef.from_info(info)
        for path, info in zip(bench_set.dataset.paths, bench_set.dataset.infos, strict=True)
    }
    infos = dict(zip(bench_set.dataset.paths, bench_set.dataset.infos, strict=True))
    return reference_share(
        contender, batches, bench_set.paths_of(clips), refs, a.clip_length, a.stride, a.size, bench_set.loader, infos
    )


def _readers(sets: list[BenchSet], contenders: tuple[str, ...]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The contenders each set runs (stores: gpufeed only) and the unavailable ones with why."""
    probe = next((s.dataset.paths[0] for s in sets if not s.is_store), None)
    missing = {}
    for name in contenders:
        if name not in CONTENDERS:
            raise ValueError(f"bench clips contender {name!r} is not known; known: {', '.join(CONTENDERS)}")
        why = unavailable_reason(name, probe)
        if why:
            missing[name] = f"unavailable: {why}"
    run = [c for c in contenders if c not in missing]
    return {s.name: [c for c in run if c == "gpufeed" or not s.is_store] for s in sets}, missing


def _timed_rounds(jobs: list, rounds: int, counts: dict[str, int], a: _Settings):
    """Every (set, reader) job once a round, order reversed every other round; the load average around each."""
    times: dict[str, dict[str, list[RoundTime]]] = {}
    loads = [os.getloadavg()[0]]
    with progress_bar(total=rounds * len(jobs), desc="timed rounds", unit="round", leave=True) as bar:
        for r in range(rounds):
            for s, c in interleaved(jobs, r):
                opener = _opener(s, c, r, counts[c], a)
                times.setdefault(s.name, {}).setdefault(c, []).append(
                    timed_round(opener, counts[c], warm_batches=a.workers)[0]
                )
                bar.update(1)
            loads.append(os.getloadavg()[0])
    return times, loads


def run_clip_bench(
    *,
    data: Path | None = None,
    sets: tuple[str, ...] = DEFAULT_SETS,
    videos: int = 4,
    seconds: int = 120,
    video_size: int = 256,
    gop: int = 250,
    clip_length: int = 11,
    stride: int = 1,
    size: SizePx = SizePx(112, 112),
    batch_size: int = 8,
    clips: int = 256,
    naive_clips: int = 12,
    sampler_clips: int = 8,
    verify_clips: int = 24,
    rounds: int = 5,
    workers: int = 0,
    contenders: tuple[str, ...] = CONTENDERS,
    seed: int = 0,
    device: str = "auto",
    decoder: VideoDecoder = "auto",
    cache: Path = Path(".cache/bench"),
) -> dict:
    """Run every available contender on every set; return the figures (see the module docs).

    Each round runs every (set, contender) once, alternating the order between rounds; ratios are
    medians of per-round ratios, which cancels most of a shared machine's drift.

    Args:
        data: The user's folder of videos / frame stores, or DeepEthogram project; ``None``: the
            generated ``sets`` (of :data:`gpufeed.bench._clip_sets.GENERATED_SETS`).
        videos: Generated videos per set, long-GOP ones ``seconds`` long at 30 fps, ``video_size`` px
            square, a keyframe every ``gop`` frames (cached in ``cache``).
        clip_length: Frames per clip, ``stride`` apart, resized to ``size``.
        clips: Clips per timed round (``naive_clips`` for decode-from-start); ``verify_clips`` are
            checked for exact frames, untimed. ``sampler_clips``: clips per torchcodec sampler call.
        rounds: Timed rounds per reader, interleaved.
        workers: Processes per reader; 0 means one per core.
        contenders: Readers to run (of :data:`CONTENDERS`); those unavailable here are listed, not run.
        decoder: gpufeed's ``video.decoder`` for the video sets (on a GPU ``pyav`` times PyAV against NVDEC).
    """
    choice = resolve_device(device)
    cores = default_num_threads()
    a = _Settings(clip_length, stride, size, batch_size, workers or cores, sampler_clips, seed)
    left_out: dict[str, str] = {}
    if data is not None:
        specs, left_out = user_sets(Path(data))
    else:
        specs = generated_sets(sets, cache=cache, videos=videos, seconds=seconds, video_size=video_size, gop=gop,
                               seed=seed, clip_length=clip_length, stride=stride)  # fmt: skip
    bench_sets = [BenchSet(spec, clip_length=clip_length, stride=stride, size=size, batch_size=batch_size,
                           workers=a.workers, seed=seed, device=choice, decoder=decoder, round_clips=clips)
                  for spec in specs]  # fmt: skip
    readers, missing = _readers(bench_sets, tuple(contenders))
    counts = {c: naive_clips if c == "decode_from_start" else clips for c in CONTENDERS}
    jobs = [(s, c) for s in bench_sets for c in readers[s.name]]
    exact: dict[str, dict[str, float | None]] = {s.name: {} for s in bench_sets}
    for s, c in progress_bar(jobs, desc="exactness pass", unit="reader", leave=True):
        exact[s.name][c] = _exact_share(s, c, min(counts[c], verify_clips), a)
    times, loads = _timed_rounds(jobs, rounds, counts, a)
    settings = {
        "clip_length_frames": clip_length,
        "stride_frames": stride,
        "width_px": a.size.width_px,
        "height_px": a.size.height_px,
        "batch_size": batch_size,
        "workers": a.workers,
        "decoder": decoder,
        "sampler_clips_per_call": sampler_clips,
        "rounds": rounds,
        "clips_per_round": {c: counts[c] for c in {c for r in readers.values() for c in r}},
        "data": str(data) if data is not None else "generated",
        "left_out": left_out,
        "unavailable": missing,
        "machine": {**machine_facts(choice), "load_average_1min": loads},
    }
    stores = {s.name: store_figures(s.dataset, a.size) for s in bench_sets if s.is_store}
    return summarise(settings, bench_sets, times, exact, stores)
