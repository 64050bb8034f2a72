"""The video sets ``gpufeed bench clips`` reads: generated ones, or the user's own (``--data DIR``).

Generated sets (every frame tagged with its index, so exactness is read from the pixels):

* ``long_gop``: noisy textured 256 px h264, a keyframe every 250 frames (``--gop``);
* ``prepared``: the same after ``gpufeed prepare`` (short GOP, ``fastdecode``);
* ``single_gop``: 5-second videos that are one GOP each (a keyframe at frame 0 only);
* ``camera``: camera-like video with B-frames and irregular GOPs (a pan, a moving animal, sensor noise);
* ``frame_folder``, ``hdf5``: the long-GOP videos as JPEG frame stores (``gpufeed prepare --store``).

``--data DIR`` reads a folder of the user's videos (label CSVs optional), frame folders and HDF5
files, or a DeepEthogram project; each kind found becomes one set (``videos``, ``frame_folder``,
``hdf5``) and files that cannot be read are listed and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from gpufeed.bench._clip_names import GENERATED_SETS, STORE_SETS
from gpufeed.bench._clip_videos import (
    make_bench_videos,
    make_camera_videos,
    prepared_bench_videos,
    stored_bench_videos,
)
from gpufeed.config import LoaderConfig, VideoConfig, VideoDecoder
from gpufeed.core import SizePx
from gpufeed.pipelines import ClipLoader, DatasetError, VideoDataset, is_project, project_dataset

__all__ = ["GENERATED_SETS", "STORE_SETS", "BenchSet", "SetSpec", "generated_sets", "user_sets"]

_SINGLE_GOP_SECONDS = 5  # 150 frames at 30 fps: one keyframe, every clip decodes from frame 0
_CAMERA_SECONDS = 60


@dataclass(frozen=True)
class SetSpec:
    """One set to read: its name, its videos, and whether their frames carry index tags."""

    name: str
    dataset: VideoDataset
    tagged: bool


def generated_sets(
    names,
    *,
    cache: Path,
    videos: int,
    seconds: int,
    video_size: int,
    gop: int,
    seed: int,
    clip_length: int,
    stride: int,
) -> list[SetSpec]:
    """The generated sets ``names`` (of :data:`GENERATED_SETS`), made once into ``cache``."""
    unknown = [n for n in names if n not in GENERATED_SETS]
    if unknown:
        raise ValueError(f"bench clips sets {unknown} are not known; allowed: {', '.join(GENERATED_SETS)}")
    folders: dict[str, Path] = {}
    source = make_bench_videos(cache, videos, seconds, 30, video_size, gop, seed)
    for name in names:
        if name == "long_gop":
            folders[name] = source
        elif name == "prepared":
            folders[name] = prepared_bench_videos(source, clip_length, stride)
        elif name == "single_gop":
            frames = _SINGLE_GOP_SECONDS * 30
            folders[name] = make_bench_videos(cache, videos, _SINGLE_GOP_SECONDS, 30, video_size, frames, seed)
        elif name == "camera":
            folders[name] = make_camera_videos(cache, videos, _CAMERA_SECONDS, 30, video_size, seed)
        else:
            folders[name] = stored_bench_videos(source, STORE_SETS[name])
    return [SetSpec(name, VideoDataset.from_folder(folder, progress=True), True) for name, folder in folders.items()]


def _with_labels(dataset: VideoDataset) -> VideoDataset:
    """The dataset with an all-zero label column where a video has no label file (the loader needs one)."""
    behaviours = dataset.behaviours or ("none",)
    labels = tuple(
        rows if rows is not None else np.zeros((int(info.num_frames), len(behaviours)), dtype=np.uint8)
        for rows, info in zip(dataset.labels, dataset.infos, strict=True)
    )
    return replace(dataset, labels=labels, behaviours=behaviours)


def _subset(dataset: VideoDataset, ids: list[int]) -> VideoDataset:
    return VideoDataset(
        tuple(dataset.paths[i] for i in ids),
        tuple(dataset.infos[i] for i in ids),
        tuple(dataset.labels[i] for i in ids),
        dataset.behaviours,
        {},
        dataset.source,
    )


def user_sets(data: Path) -> tuple[list[SetSpec], dict[str, str]]:
    """The sets in the user's ``data`` (see the module docs) and the files left out, with why.

    Raises:
        DatasetError: ``data`` holds nothing readable.
    """
    data = Path(data)
    if is_project(data):
        dataset = project_dataset(data, split="all", val_fraction=0.0, seed=0, progress=True)
    else:
        dataset = VideoDataset.from_folder(data, require_labels=False, progress=True)
    left_out = {dataset.paths[i]: why for i, why in dataset.problems.items()}
    dataset = _with_labels(dataset)
    kinds: dict[str, list[int]] = {}
    set_of_kind = {kind: name for name, kind in STORE_SETS.items()}  # a store kind without a set: its own name
    for i in dataset.usable_ids.tolist():
        store = dataset.infos[i].store
        kinds.setdefault(set_of_kind.get(store, store) if store else "videos", []).append(int(i))
    if not kinds:
        raise DatasetError(f"{data}: no readable video, frame folder or HDF5 file ({len(left_out)} left out)")
    return [SetSpec(name, _subset(dataset, ids), False) for name, ids in kinds.items()], left_out


class BenchSet:
    """One set, its clip loader (gpufeed), and the clips every reader reads in a round."""

    def __init__(
        self,
        spec: SetSpec,
        *,
        clip_length: int,
        stride: int,
        size: SizePx,
        batch_size: int,
        workers: int,
        seed: int,
        device,
        decoder: VideoDecoder = "auto",
        round_clips: int = 0,
    ) -> None:
        self.name, self.dataset, self.tagged = spec.name, spec.dataset, spec.tagged
        self.is_store = all(info.store for info in self.dataset.infos)
        video_cfg = VideoConfig(clip_length_frames=clip_length, stride_frames=stride, size_px=size, decoder=decoder)
        loader_cfg = LoaderConfig(batch_size=batch_size, num_threads=workers, last_batch="drop")
        self.loader = ClipLoader(
            self.dataset, train=True, video_cfg=video_cfg, loader_cfg=loader_cfg, device=device, seed=seed
        )
        if round_clips and hasattr(self.loader.clip_source, "list_lines"):  # DALI's reader
            # A round reads round_clips (and the pipeline runs its queue's depth ahead); a list of whole
            # epochs would have every round's build make a frame decoder per line (~8 ms each on an
            # H100), timed as reading.
            self.loader.clip_source.list_lines = round_clips + (loader_cfg.prefetch_queue_depth + 2) * batch_size

    def clips(self, epoch: int, count: int) -> list[tuple[int, int]]:
        """The first ``count`` (video id, start) pairs the loader reads from ``epoch`` on (epoch after epoch)."""
        out: list[tuple[int, int]] = []
        while len(out) < count:
            videos, starts = self.loader.epoch_clips(epoch)
            out += zip(videos.tolist(), starts.tolist(), strict=True)
            epoch += 1
        return out[:count]

    def paths_of(self, clips: list[tuple[int, int]]) -> list[tuple[str, int]]:
        return [(self.dataset.paths[v], s) for v, s in clips]

    def disk_bytes_per_frame(self) -> float:
        """Bytes the set's videos (files, or every file of a frame folder) take on disk, per frame."""
        total = 0
        for path in map(Path, self.dataset.paths):
            total += sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size
        return total / max(1, sum(int(info.num_frames) for info in self.dataset.infos))
