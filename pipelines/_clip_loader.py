"""The clip loader: random-seek clips with per-frame labels, the same surface as the image loader.

Usage::

    loader = ClipLoader("videos/train", batch_size=8, clip_length_frames=11, size_px=112)
    # or, for full control: ClipLoader(VideoDataset.from_folder(...), video_cfg=cfg.video,
    #     loader_cfg=cfg.loader, device=resolve_device("auto"), shard_id=rank, num_shards=world)
    for epoch in range(epochs):
        for batch in loader:            # one epoch per iteration over the loader
            batch.clips                 # (N, 3, T, H, W) uint8 on the device
            batch.frame_labels          # (N, T, K) float32; batch.centre_labels (N, K)
    state = loader.state_dict()         # resume exactly here with load_state_dict

Which clips an epoch holds is decided by :class:`gpufeed.pipelines._clips.ClipTable` and
:func:`gpufeed.pipelines._sampler.plan_epoch` (order, shards, last batch), so every decoder reads the same
clips for the same seed. How they are decoded is the loader's
:class:`~gpufeed.pipelines._clip_source.ClipSource`, picked from the videos' facts by
:func:`~gpufeed.pipelines._clip_sources.choose_clip_source`; the loader asks it for the pipeline over each
plan stream and for the order its rows come in. The pipeline (and its worker processes) is built once and
reads epoch after epoch (see :mod:`gpufeed.pipelines._epochs`); ``loader.pipeline_builds`` counts builds.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines._augment import LoaderAugment, StreamAugmentFeed
from gpufeed.pipelines._clip_batch import ClipBatch
from gpufeed.pipelines._clip_plan import ClipDraw, ClipPlan, PlanRows
from gpufeed.pipelines._clip_source import ClipJob, ClipSource, worker_pids
from gpufeed.pipelines._clip_sources import choose_clip_source
from gpufeed.pipelines._clips import ClipGeometry, ClipTable
from gpufeed.pipelines._deepethogram import videos_at
from gpufeed.pipelines._epochs import EpochLoader
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_stores import decode_store_frames
from gpufeed.pipelines._loader_args import loader_args, refuse_dataloader_arguments
from gpufeed.pipelines._nvdec import gpu_capability
from gpufeed.pipelines._nvdec_reader import ReaderBuild
from gpufeed.pipelines._once import first_time
from gpufeed.pipelines._pipeline_session import Session, pipeline_outputs
from gpufeed.pipelines._pyav import ClipDecodeError, ClipDecoder, VideoRef
from gpufeed.pipelines._quarantine import quarantined_ids
from gpufeed.pipelines._sampler import EpochPlan, PlanStream, StreamBatch
from gpufeed.pipelines._videos import VideoDataset

if TYPE_CHECKING:
    import torch

__all__ = ["ClipLoader"]

log = logging.getLogger("gpufeed")


class ClipLoader(EpochLoader):
    """Batches of decoded, resized clips and their labels from a :class:`VideoDataset`.

    Every argument but ``dataset`` has a default; shortcuts and config objects as for
    :class:`~gpufeed.pipelines.ImageLoader` (:mod:`gpufeed.pipelines._loader_args`).

    Args:
        dataset: The indexed videos (with labels), or a folder of them (or a DeepEthogram project,
            split by ``video_cfg.val_fraction``: its training records when ``train``, else the rest).
        batch_size, shuffle, num_threads: ``loader_cfg``'s fields (defaults 64, True, 0: from the cores).
        clip_length_frames, stride_frames, size_px: ``video_cfg``'s fields (defaults 11, 1, 112).
        train: Random starts (and shuffling) when True (default); every clip in order when False.
        seed: Seeds order, random starts and augmentation (and a DeepEthogram project's split).
        device: ``"auto"`` (default), ``"gpu"``, ``"cpu"`` or a :class:`gpufeed.device.DeviceChoice`.
        video_cfg: :class:`gpufeed.config.VideoConfig` (clip length, stride, size, fit, decoder).
        loader_cfg: :class:`gpufeed.config.LoaderConfig`. Evaluation keeps every clip, so ``drop``
            is read as ``partial`` there.
        shard_id, num_shards: This rank's shard of the clip slots; default: ``torch.distributed``'s
            rank and world size when it is initialised, else every clip.
        augment: Colour jitter, grayscale and flips applied inside the DALI graph when training, one
            draw per clip slot and epoch, the same on every frame; ``None`` or empty: none.
        num_workers, drop_last, pin_memory: torch ``DataLoader``'s; refused with gpufeed's
            equivalent, as by :class:`~gpufeed.pipelines.ImageLoader`.

    Attributes:
        clip_source: How the clips are decoded (:class:`~gpufeed.pipelines._clip_source.ClipSource`);
            ``source`` is its name (``dali``, ``pyav``, ``frames``), ``decoder_reason`` why it was picked.
        reader_builds: Each DALI video reader built: :class:`~gpufeed.pipelines._nvdec_reader.ReaderBuild`.

    Raises:
        ValueError: An argument is out of range or not allowed, or a shortcut disagrees with its
            config field (the message names the argument and what is allowed).
    """

    def __init__(
        self,
        dataset: VideoDataset | str | Path,
        batch_size: int | None = None,
        *,
        clip_length_frames: int | None = None,
        stride_frames: int | None = None,
        size_px: int | tuple[int, int] | None = None,
        train: bool = True,
        shuffle: bool | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        device: DeviceChoice | str = "auto",
        video_cfg: VideoConfig | None = None,
        loader_cfg: LoaderConfig | None = None,
        shard_id: int | None = None,
        num_shards: int | None = None,
        augment: LoaderAugment | None = None,
        num_workers: None = None,
        drop_last: None = None,
        pin_memory: None = None,
    ):
        refuse_dataloader_arguments("ClipLoader", num_workers=num_workers, drop_last=drop_last, pin_memory=pin_memory)
        args = loader_args(
            "ClipLoader",
            dataset,
            dataset_type=VideoDataset,
            index=lambda path: videos_at(
                path, train=train, val_fraction=(video_cfg or VideoConfig()).val_fraction, seed=seed
            ),
            train=train,
            device=device,
            loader_cfg=loader_cfg,
            loader_shortcuts={"batch_size": batch_size, "shuffle": shuffle, "num_threads": num_threads},
            media=(VideoConfig, video_cfg, "video_cfg"),
            media_shortcuts={
                "clip_length_frames": clip_length_frames,
                "stride_frames": stride_frames,
                "size_px": size_px,
            },
            shard_id=shard_id,
            num_shards=num_shards,
        )
        data: VideoDataset = args.dataset
        video_cfg, loader_cfg, device = args.media_cfg, args.loader_cfg, args.device
        shard_id, num_shards = args.shard_id, args.num_shards
        self.dataset = data
        self.video_cfg = video_cfg
        self.augment = augment if train and augment else None
        self._setup_epochs(
            train=train, loader_cfg=loader_cfg, device=device, shard_id=shard_id, num_shards=num_shards, seed=seed
        )
        self.geometry = ClipGeometry(video_cfg.clip_length_frames, video_cfg.stride_frames)
        self.reader_builds: list[ReaderBuild] = []
        self.behaviours = data.behaviours
        self.quarantined = quarantined_ids(data.paths, getattr(loader_cfg, "quarantine_file", None), data.source)
        usable = self._usable_videos()
        self.table = ClipTable.build(data.num_frames, np.asarray(usable, dtype=np.int64), self.geometry)
        self._draw = ClipDraw(self.table, train, seed)
        self._clip_plan: ClipPlan | None = None  # the running pipeline's plan
        self.clip_source: ClipSource = choose_clip_source(
            video_cfg.decoder,
            device.is_gpu,
            [data.infos[v] for v in usable],
            data.source,
            gpu_capability(device),
        )
        level = logging.WARNING if self.clip_source.fell_back else logging.INFO
        log.log(level, "clip decoder: %s (%s)", self.source, self.decoder_reason)
        vfr = tuple(data.paths[v] for v in usable if not data.infos[v].cfr)
        if vfr and first_time("variable frame rate", vfr):  # training's and evaluation's loaders may share videos
            log.warning(
                "%d video(s) have a variable frame rate (e.g. %s): frames are numbered in presentation order, "
                "which may not match how their labels were made; 'gpufeed prepare' makes the rate constant",
                len(vfr),
                vfr[0],
            )
        self._check_plan(self._plan(0))

    def _usable_videos(self) -> list[int]:
        """The videos read: the dataset's usable ones, less those too short for a clip and the quarantined."""
        data = self.dataset
        bad = {v: why for v, why in data.problems.items() if v not in self.quarantined}
        for vid in data.usable_ids:
            if int(vid) in self.quarantined:
                continue
            if self.geometry.max_start(data.infos[vid].num_frames) < 0:
                bad[int(vid)] = (
                    f"too short: {data.infos[vid].num_frames} frames, a clip spans {self.geometry.span_frames}"
                )
        self._leave_out(bad, "video")
        self.skipped.update(self.quarantined)
        return [v for v in data.usable_ids if int(v) not in bad and int(v) not in self.quarantined]

    # -- planning ---------------------------------------------------------------------------
    def _check_plan(self, plan: EpochPlan) -> None:
        if plan.num_batches == 0:
            raise DatasetError(
                f"shard {self.shard_id} of {self.num_shards} gets no batches: {len(self.table)} clip slots in "
                f"{self.dataset.source} (clip_length_frames {self.geometry.clip_length_frames}, stride_frames "
                f"{self.geometry.stride_frames}), batch_size {self.batch_size}, last_batch '{self.last_batch}'. "
                "Use a smaller batch_size, or a partial last batch: loader.last_batch: partial in a config, "
                'LoaderConfig(last_batch="partial") as loader_cfg in Python.'
            )

    # -- the public surface -----------------------------------------------------------------
    @property
    def source(self) -> str:
        """The clip source's name: ``dali``, ``pyav`` or ``frames``."""
        return self.clip_source.name

    @property
    def decoder_reason(self) -> str:
        """Why the clip source was picked."""
        return self.clip_source.reason

    @property
    def clip_shape(self) -> tuple[int, int, int, int]:
        """(3, T, H, W) of one clip."""
        return (3, self.geometry.clip_length_frames, *self.video_cfg.size_px.hw)

    def epoch_clips(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(video ids, start frames) this shard reads in ``epoch`` (default: the current one), in order.

        Padding rows (``last_batch: pad``) are included; the same clips the loader will yield.
        """
        saved = self.epoch
        self.epoch = saved if epoch is None else epoch
        try:
            plan = self._plan(0)
        finally:
            self.epoch = saved
        return self._draw.clips(plan.sample_ids, plan.epoch)

    # -- EpochLoader hooks --------------------------------------------------------------------
    # A parallel external_source prefetches a batch more than DALI's own queue.
    _lookahead_batches = 2

    def _plan_ids(self) -> np.ndarray:
        return np.arange(len(self.table))  # clip slots

    def _excluded_plan_ids(self) -> np.ndarray:
        return self.table.slots_of(self.read_failures)

    def _clip_job(self, stream: PlanStream) -> ClipJob:
        """What the pipeline over ``stream`` reads and how (the source builds it)."""
        plan = ClipPlan(stream, self._draw, self.batch_size)
        augment = None
        if self.augment is not None:  # one parameter row per clip (per frame of it where a clip is T samples)
            augment = StreamAugmentFeed(
                stream,
                self.augment,
                self.seed,
                fill_to=self.batch_size,
                row_order=self.clip_source.row_order(plan),
                repeat=self.geometry.clip_length_frames if self.clip_source.frames_flat else 1,
            )
        return ClipJob(
            plan=plan,
            paths=self.dataset.paths,
            infos=self.dataset.infos,
            geometry=self.geometry,
            size_px=self.video_cfg.size_px,
            fit=self.video_cfg.fit,
            device_id=self.device.device_id,
            num_threads=self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
            start_method=getattr(self.cfg, "worker_start_method", "auto"),
            max_pixels=self.dataset.max_pixels,
            fast_idct=self.video_cfg.jpeg_idct == "fast",
            augment=augment,
            reader_builds=self.reader_builds,
            hw_decoder_load=getattr(self.cfg, "hw_decoder_load", 0.9),
            train=self.train,
            executor=getattr(self.cfg, "executor", "auto"),
        )

    def _open_session(self, stream: PlanStream) -> Session:
        job = self._clip_job(stream)
        pipe, limit = self.clip_source.open(job)
        self._clip_plan = job.plan
        iterator = pipeline_outputs(pipe, ["clips", "tags"], self.device.torch_device)
        return Session(iterator, stream, limit=limit, resources=[self.clip_source], worker_pids=worker_pids(pipe))

    def _batch(self, out: dict, batch: StreamBatch, iteration: int) -> ClipBatch:
        import torch

        assert self._clip_plan is not None, "a batch comes from the session _open_session made"
        rows = self._clip_plan[iteration]
        videos, starts = rows.clips()
        clips = self._plan_order(out, rows)
        if tuple(clips.shape[1:]) != self.clip_shape:
            raise RuntimeError(f"clip pipeline produced {tuple(clips.shape)}; expected (N, *{self.clip_shape})")
        frames = starts[:, None] + np.arange(self.geometry.clip_length_frames) * self.geometry.stride_frames
        labels = np.stack([self._clip_labels(v, f) for v, f in zip(videos, frames, strict=True)])
        torch_device = self.device.torch_device

        def to_device(array, dtype):
            tensor = torch.as_tensor(array, dtype=dtype)
            if torch_device.type == "cuda":
                return tensor.pin_memory().to(torch_device, non_blocking=True)
            return tensor

        frame_labels = to_device(labels, torch.float32)
        return ClipBatch(
            clips=clips.to(torch_device),
            frame_labels=frame_labels,
            centre_labels=frame_labels[:, self.geometry.centre_offset].contiguous(),
            video_ids=to_device(videos, torch.int64),
            start_frames=to_device(starts, torch.int64),
            valid=to_device(batch.valid, torch.bool),
            behaviours=self.behaviours,
        )

    def _clip_labels(self, video: int, frames: np.ndarray) -> np.ndarray:
        """(T, K) labels of ``frames`` of ``video``: zeros for a video without (``require_labels=False``)."""
        rows = self.dataset.labels[video]
        if rows is None:
            return np.zeros((len(frames), len(self.behaviours)), dtype=np.uint8)
        return rows[frames]

    def _plan_order(self, out: dict, rows: PlanRows) -> torch.Tensor:
        """The batch's clips, (N, 3, T, H, W), in plan order, their tags checked against the plan.

        The source says how its rows come: in its read order (DALI's reader and the PyAV workers
        read a batch by (video, start), so each file is read forward), as ``T`` frames per clip
        (frame stores through one image decoder), or one clip per row in plan order.
        """
        import torch

        n, first, source = rows.count, rows.first_tag, self.clip_source
        if not source.in_plan_order:  # check the rows as they came, then put them in plan order
            order = source.read_order(rows)
            self._row_checks(out["tags"].view(-1), first + order)
            if np.array_equal(order[:n], np.arange(n)):  # already in plan order (evaluation): no gather
                clips = out["clips"][:n]
            elif out["clips"].is_cuda:  # one on-device gather; the small index copy is pinned, so it does not wait
                back = torch.as_tensor(np.argsort(order)[:n]).pin_memory().to(out["clips"].device, non_blocking=True)
                clips = out["clips"].index_select(0, back)
            else:  # NumPy's single-threaded copy: torch's CPU copies of a batch (index_select, stack) wait on
                # its intra-op threads, 15-140 ms a batch of 8 while the decoding workers hold the cores (1 ms here)
                clips = torch.from_numpy(np.take(out["clips"].numpy(), np.argsort(order)[:n], axis=0))
        elif source.frames_flat:  # clip j is frames j*T .. j*T+T-1: every frame's tag is its clip's
            t = self.geometry.clip_length_frames
            self._row_checks(out["tags"].view(-1)[: n * t], np.repeat(first + np.arange(n), t))
            frames = out["clips"]
            clips = frames.view(-1, t, *frames.shape[1:])[:n]  # (N*T, H, W, 3) -> (N, T, H, W, 3), a view
        else:
            self._row_checks(out["tags"].view(-1)[:n], first + np.arange(n))
            clips = out["clips"][:n]
        return clips.permute(0, 4, 1, 2, 3)  # (N, T, H, W, 3) -> (N, 3, T, H, W), channels_last_3d, no copy

    def _suspects(self, batches: list[StreamBatch]) -> list[tuple[int, str, int]]:
        suspects = []
        for batch in batches:
            videos, starts = self._draw.clips(batch.sample_ids, batch.epoch)
            suspects += [(int(v), self.dataset.paths[v], int(s)) for v, s in zip(videos, starts, strict=True)]
        return suspects

    def _recheck(self, suspects) -> dict[int, str]:
        """Decode each suspect clip outside DALI (PyAV; frame stores: their images)."""
        problems: dict[int, str] = {}
        decoder = ClipDecoder()
        try:
            for video_id, _, start in suspects:
                if video_id in problems:
                    continue
                info = self.dataset.infos[video_id]
                if info.store:
                    frames = self.geometry.frames(start)
                    size = (info.width, info.height)  # the clip's: a frame of another size is bad too
                    limit = self.dataset.max_pixels
                    _, why, _ = decode_store_frames(
                        info.path, info.store, info.frame_name, frames, size=size, max_pixels=limit
                    )
                    if why:
                        problems[video_id] = why
                    continue
                try:
                    decoder.read(VideoRef.from_info(info), self.geometry.frames(start))
                except ClipDecodeError as bad:
                    problems[video_id] = str(bad).split(": ", 1)[-1]
        finally:
            decoder.close()
        return problems
