"""``gpufeed bench storage``: random clips from object storage against the same files on local disk, in one run.

The same videos are read twice by the same :class:`~gpufeed.pipelines.ClipLoader` settings: from a
local folder, and from an ``s3://`` prefix holding copies of them (``--local-server``: moto's S3
server on 127.0.0.1, the files uploaded by the run; or ``--url``: a bucket of your own that holds
them). Both loaders read the very same clips (the same epoch plan: same seed, same index order),
decoded by PyAV in the loader's worker processes: from disk, or through ranged reads
(:class:`gpufeed.core._ranged.RangedFile`) of the objects.

Rounds alternate the two sources (local first in even rounds, the bucket first in odd ones); the
ratio is the median of per-round ratios, so both sides of a ratio share the machine's load. The
target: clips/s from object storage at least 0.8x the local disk's. The load average is printed
beside the figures: on a shared machine they move with it.

**Bytes fetched per clip.** Untimed passes in this process decode the first clips of the plan
from the bucket with the loader's own clip decoder (:class:`~gpufeed.pipelines._pyav.ClipDecoder`)
and count the bytes its ranged reads received (:func:`gpufeed.core._s3.fetch_stats`), against the
mean file size: *cold*, every clip opening its file anew (the container's header and index read
each time, then the blocks around the clip's GOP), and *warm*, a video kept open between its
clips as in a worker process (blocks already in memory are not fetched again). The worker
processes of the timed rounds read the warm way. These passes run with the disk cache
(``--storage-cache``) off: blocks the timed rounds left there would be counted as free.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpufeed.bench._clip_readers import gpufeed_reader
from gpufeed.bench._clip_rounds import RoundTime, interleaved, paired_ratio, timed_round
from gpufeed.bench._clip_videos import make_bench_videos
from gpufeed.bench._common import machine_facts, median
from gpufeed.bench._s3_local import local_s3_server
from gpufeed.config import LoaderConfig, StorageConfig, VideoConfig
from gpufeed.core import (
    S3Path,
    SizePx,
    configure_storage,
    data_path,
    format_table,
    s3_client,
    s3_fetch_stats,
    s3_upload_file,
)
from gpufeed.device import DeviceChoice, resolve_device
from gpufeed.pipelines import ClipDecoder, ClipLoader, VideoDataset, VideoRef, default_num_threads

__all__ = ["TARGET_RATIO", "print_storage_result", "run_storage_bench"]

TARGET_RATIO = 0.8
_BUCKET = "gpufeed-bench-storage"


def _load() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def _upload(folder: Path, dest: S3Path) -> int:
    """Copy every file under ``folder`` to the same relative keys under ``dest``; bytes uploaded."""
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        s3_upload_file(path, dest / path.relative_to(folder).as_posix())
        total += path.stat().st_size
    return total


def _bytes_per_clip(loader: ClipLoader, clips: int, epoch: int) -> dict:
    """Ranged-read bytes and requests per clip for the plan's first ``clips`` clips (see the module docs).

    ``cold``: each clip from a file opened for it alone (its container header read again);
    ``warm``: as a worker reads them, a file kept open between its clips (blocks in memory reused).
    """
    videos, starts = loader.epoch_clips(epoch)
    plan = list(zip(videos.tolist(), starts.tolist(), strict=True))[:clips]
    refs = {video: VideoRef.from_info(loader.dataset.infos[video]) for video, _ in plan}
    out: dict = {"clips": len(plan)}
    for mode in ("cold", "warm"):
        decoder = ClipDecoder()
        before = s3_fetch_stats()
        try:
            for video, start in plan:
                decoder.read(refs[video], loader.geometry.frames(start))
                if mode == "cold":
                    decoder.close()
        finally:
            decoder.close()
        spent = s3_fetch_stats() - before
        out[mode] = {"bytes_per_clip": spent.bytes / len(plan), "requests_per_clip": spent.requests / len(plan)}
    sizes = [data_path(p).stat().st_size for p in loader.dataset.paths]
    out["mean_file_bytes"] = sum(sizes) / len(sizes)
    return out


@dataclass(frozen=True)
class _Settings:
    """What both loaders are built with (the keyword arguments of :func:`run_storage_bench`, resolved)."""

    clip_length: int
    size: SizePx
    batch_size: int
    workers: int
    seed: int
    device: DeviceChoice


def _loader(dataset: VideoDataset, a: _Settings) -> ClipLoader:
    # One decoder on both sides (PyAV): the storage is what differs.
    video_cfg = VideoConfig(clip_length_frames=a.clip_length, size_px=a.size, decoder="pyav")
    loader_cfg = LoaderConfig(batch_size=a.batch_size, num_threads=a.workers, last_batch="drop")
    return ClipLoader(dataset, train=True, video_cfg=video_cfg, loader_cfg=loader_cfg, device=a.device, seed=a.seed)


def _indexed(folder: Path, remote: S3Path) -> tuple[VideoDataset, VideoDataset, dict[str, float]]:
    """Both datasets, each indexed and timed, checked to hold the same videos; the seconds of each index."""
    started = time.perf_counter()
    local_set = VideoDataset.from_folder(folder)
    local_index_s = time.perf_counter() - started
    started = time.perf_counter()
    remote_set = VideoDataset.from_folder(remote)
    remote_index_s = time.perf_counter() - started
    names = [Path(p).name for p in local_set.paths]
    if [S3Path(p).name for p in remote_set.paths] != names:
        raise ValueError(f"{remote} does not hold the same videos as {folder}")
    return local_set, remote_set, {"local disk": local_index_s, "object storage": remote_index_s}


def _timed_rounds(
    loaders: dict[str, ClipLoader], rounds: int, clips: int, warm_batches: int
) -> dict[str, list[RoundTime]]:
    """``clips`` clips from each loader per round, the order of the two alternating (see the module docs)."""
    times: dict[str, list[RoundTime]] = {name: [] for name in loaders}
    for r in range(rounds):
        for name in interleaved(list(loaders), r):
            opener = functools.partial(gpufeed_reader, loaders[name], r)
            timed, _ = timed_round(opener, clips, size_of=len, warm_batches=warm_batches)
            times[name].append(timed)
    return times


def _round_figures(times: dict[str, list[RoundTime]]) -> dict:
    """Each source's rounds and medians, and the paired ratio against the target."""
    ratio = paired_ratio(
        [t.clips_per_second for t in times["object storage"]], [t.clips_per_second for t in times["local disk"]]
    )
    return {
        "rounds": {name: [t.__dict__ for t in rows] for name, rows in times.items()},
        "clips_per_s": {name: median([t.clips_per_second for t in rows]) for name, rows in times.items()},
        "steady_clips_per_s": {name: median([t.steady_clips_per_second for t in rows]) for name, rows in times.items()},
        "ratio": ratio,
        "target_ratio": TARGET_RATIO,
        "met": bool(ratio >= TARGET_RATIO),
    }


def run_storage_bench(
    *,
    data: str | Path | None = None,
    url: str | None = None,
    local_server: bool = True,
    videos: int = 4,
    seconds: int = 60,
    video_size: int = 256,
    gop: int = 30,
    clip_length: int = 11,
    size: SizePx = SizePx(112, 112),
    batch_size: int = 8,
    clips: int = 192,
    bytes_clips: int = 64,
    rounds: int = 3,
    workers: int = 0,
    seed: int = 0,
    device: str = "cpu",
    cache: str | Path = ".cache/bench",
    storage_cache_dir: str | Path | None = None,
    block_bytes: int = StorageConfig().block_bytes,
) -> dict:
    """Clips/s from object storage against local disk, and bytes fetched per clip (see the module docs).

    Args:
        data: A local folder of videos (default: generated long-GOP h264 videos, kept in ``cache``).
        url: An ``s3://`` prefix holding copies of ``data``'s files; with ``local_server``, the
            run uploads them to a local moto server instead.
        local_server: Start moto's S3 server on 127.0.0.1 and upload the videos there.
        storage_cache_dir: ``storage.cache_dir`` for the bucket's reads (default: none, every
            round reads the bucket).
        block_bytes: ``storage.block_bytes``, the unit of the ranged reads.

    Returns:
        The figures: per-source round times, the paired ratio, the bytes per clip, the load average.
    """
    if url is None and not local_server:
        raise ValueError("give url (an s3:// prefix holding the videos) or local_server=True")
    folder = Path(data) if data is not None else make_bench_videos(Path(cache), videos, seconds, 30, video_size, gop)
    choice = resolve_device(device)
    a = _Settings(clip_length, size, batch_size, workers or default_num_threads(), seed, choice)
    cache_dir = Path(storage_cache_dir) if storage_cache_dir else None
    configure_storage(StorageConfig(cache_dir=cache_dir, block_bytes=block_bytes))
    load_before = _load()
    server = local_s3_server() if local_server else None
    with server if server is not None else contextlib.nullcontext():
        remote = S3Path(url) if url else S3Path(f"s3://{_BUCKET}/videos")
        uploaded = 0
        if server is not None:
            s3_client().create_bucket(Bucket=remote.bucket)
            uploaded = _upload(folder, remote)
        local_set, remote_set, index_s = _indexed(folder, remote)
        loaders = {"local disk": _loader(local_set, a), "object storage": _loader(remote_set, a)}
        times = _timed_rounds(loaders, rounds, clips, a.workers)
        # Without the disk cache: the pass counts what a clip fetches from the store itself.
        configure_storage(StorageConfig(cache_dir=None, block_bytes=block_bytes))
        fetched = _bytes_per_clip(loaders["object storage"], bytes_clips, rounds)
    return {
        "facts": machine_facts(choice),
        "videos": len(local_set.paths),
        "data": str(folder),
        "url": str(remote),
        "server": "moto on 127.0.0.1" if server is not None else "the configured AWS endpoint",
        "uploaded_bytes": uploaded,
        "index_s": index_s,
        "workers": a.workers,
        "block_bytes": block_bytes,
        "storage_cache": str(cache_dir) if cache_dir else None,
        **_round_figures(times),
        "fetched": fetched,
        "load_average": {"before": load_before, "after": _load()},
    }


def print_storage_result(result: dict) -> None:
    """Print the figures, the ratio against the target, and the load average they were measured under."""
    rows = [
        [
            name,
            result["clips_per_s"][name],
            result["steady_clips_per_s"][name],
            median([r["first_batch_s"] for r in result["rounds"][name]]),
            f"{result['index_s'][name]:.2f}",
        ]
        for name in result["clips_per_s"]
    ]
    print(f"{result['videos']} videos from {result['data']}; object storage: {result['url']} ({result['server']})")
    cache = result["storage_cache"] or "none: every round reads the store"
    print(f"ranged reads of {result['block_bytes']:,}-byte blocks; storage cache: {cache}")
    print(format_table(["source", "clips/s", "steady clips/s", "first batch s", "index s"], rows))
    f = result["fetched"]
    for mode, what in (("cold", "each clip opening its file"), ("warm", "files kept open, as the workers read")):
        spent = f[mode]
        print(
            f"bytes fetched per clip ({what}): {spent['bytes_per_clip'] / 1024:,.1f} KiB in "
            f"{spent['requests_per_clip']:.2f} ranged read(s) = {spent['bytes_per_clip'] / f['mean_file_bytes']:.1%} "
            f"of a {f['mean_file_bytes'] / 1024:,.1f} KiB file ({f['clips']} clips)"
        )
    verdict = "met" if result["met"] else "NOT met"
    load = result["load_average"]
    print(
        f"object storage / local disk: {result['ratio']:.2f}x clips/s (median of per-round ratios, "
        f"{len(next(iter(result['rounds'].values())))} rounds, {result['workers']} worker(s)); target >= "
        f"{result['target_ratio']:.1f}x: {verdict}; load average {load['before']} before, {load['after']} after"
    )
