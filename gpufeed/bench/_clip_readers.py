"""The readers ``gpufeed bench clips`` times: gpufeed's clip loader and its peers.

Each is opened as a context manager that yields batches of uint8 clips laid out (N, 3, T, H, W)
and stops everything it started when left (see :mod:`gpufeed.bench._clip_rounds`):

* ``gpufeed``: :class:`gpufeed.pipelines.ClipLoader`, epoch after epoch from the round's first;
* ``decode_from_start``: a torch DataLoader whose workers decode every clip from frame 0;
* ``opencv_seek``: DataLoader workers seeking ``cv2.VideoCapture`` with ``CAP_PROP_POS_FRAMES``;
* ``torchcodec_exact`` / ``torchcodec_approximate``: DataLoader workers with a torchcodec
  ``VideoDecoder`` per file (``seek_mode`` exact or approximate, resized by the decoder's own
  ``Resize`` transform, one FFmpeg thread), ``get_frames_at`` on the same clips gpufeed reads;
* ``torchcodec_sampler``: torchcodec's ``clips_at_random_indices``, ``sampler_clips`` random clips
  of one video per call (its own clips, so decoding is shared between the clips of a call).

Every DataLoader reader uses as many worker processes as gpufeed has, and one decoding thread
per process, like gpufeed's workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from gpufeed.bench._clip_names import CONTENDERS, TORCHCODEC_READERS
from gpufeed.core import SizePx

__all__ = [
    "CONTENDERS",
    "TORCHCODEC_READERS",
    "DecodeFromStartClips",
    "OpenCvSeekClips",
    "TorchcodecClips",
    "TorchcodecSamplerCalls",
    "dataloader_reader",
    "gpufeed_reader",
    "unavailable_reason",
]

_PEERS_HINT = "'make peers' builds .venv-peers, whose gpufeed runs it (its wheel needs the CUDA build of torch)"


class DecodeFromStartClips:
    """Map-style dataset: every clip opens its file and decodes from frame 0 (the naive reader)."""

    def __init__(self, clips: list[tuple[str, int]], length: int, stride: int, size: SizePx) -> None:
        self.clips, self.length, self.stride, self.size = clips, length, stride, size

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

    def __init__(self, clips: list[tuple[str, int]], length: int, stride: int, size: SizePx) -> None:
        self.clips, self.length, self.stride, self.size = clips, length, stride, size
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


def _torchcodec_decoder(path: str, seek_mode: str, size: SizePx):
    """A CPU ``VideoDecoder`` as a careful user makes one for clips: NHWC, one thread, resized while decoding."""
    from torchcodec.decoders import VideoDecoder
    from torchcodec.transforms import Resize

    return VideoDecoder(
        path,
        seek_mode=seek_mode,
        dimension_order="NHWC",
        num_ffmpeg_threads=1,
        device="cpu",
        transforms=[Resize(size.hw)],
    )


class TorchcodecClips:
    """Map-style dataset: the given clips read by torchcodec, one ``VideoDecoder`` per file and worker."""

    def __init__(self, clips: list[tuple[str, int]], length: int, stride: int, size: SizePx, seek_mode: str) -> None:
        self.clips, self.length, self.stride, self.size = clips, length, stride, size
        self.seek_mode = seek_mode
        self._decoders: dict = {}

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, i: int):
        path, start = self.clips[i]
        decoder = self._decoders.get(path)
        if decoder is None:
            decoder = self._decoders[path] = _torchcodec_decoder(path, self.seek_mode, self.size)
        return decoder.get_frames_at(indices=list(range(start, start + self.length * self.stride, self.stride))).data


class TorchcodecSamplerCalls:
    """Map-style dataset: item ``i`` is one ``clips_at_random_indices`` call on video ``i % videos``.

    Each call returns ``clips_per_call`` clips of that video, (K, T, H, W, 3); the random starts
    come from torch's generator, seeded per item, so a round is reproducible.
    """

    def __init__(
        self, paths: list[str], calls: int, clips_per_call: int, length: int, stride: int, size: SizePx, seed: int
    ) -> None:
        self.paths, self.calls, self.clips_per_call = paths, calls, clips_per_call
        self.length, self.stride, self.size, self.seed = length, stride, size, seed
        self._decoders: dict = {}

    def __len__(self) -> int:
        return self.calls

    def __getitem__(self, i: int):
        import torch
        from torchcodec.samplers import clips_at_random_indices

        path = self.paths[i % len(self.paths)]
        decoder = self._decoders.get(path)
        if decoder is None:
            decoder = self._decoders[path] = _torchcodec_decoder(path, "exact", self.size)
        torch.manual_seed(self.seed * 1_000_003 + i)
        return clips_at_random_indices(
            decoder,
            num_clips=self.clips_per_call,
            num_frames_per_clip=self.length,
            num_indices_between_frames=self.stride,
        ).data


@contextmanager
def dataloader_reader(dataset, batch_size: int, workers: int) -> Iterator[Iterator]:
    """A torch DataLoader over ``dataset``: batches as (N, 3, T, H, W) uint8; its workers stop on leaving."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False)
    iterator = iter(loader)

    def batches():
        for batch in iterator:
            batch = torch.as_tensor(batch)
            if batch.ndim == 6:  # sampler calls: (calls, K, T, H, W, 3) -> (calls * K, T, H, W, 3)
                batch = batch.flatten(0, 1)
            yield batch.permute(0, 4, 1, 2, 3)  # (N, T, H, W, 3) -> (N, 3, T, H, W), a view

    try:
        yield batches()
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


@contextmanager
def gpufeed_reader(loader, epoch: int) -> Iterator[Iterator]:
    """``loader``'s batches from the start of ``epoch`` on, epoch after epoch; closed (workers stopped) on leaving."""
    loader.set_epoch(epoch)

    def batches():
        while True:
            for batch in loader:
                yield batch.clips

    stream = batches()
    try:
        yield stream
    finally:
        stream.close()
        loader.close()


def unavailable_reason(name: str, probe_video: str | None) -> str | None:
    """Why reader ``name`` cannot run here (``None``: it can): it must import, and decode a frame of ``probe_video``."""
    try:
        if name == "opencv_seek":
            try:
                import cv2  # noqa: F401
            except ImportError:
                return "OpenCV is not installed: pip install 'gpufeed[bench]'"
        elif name in TORCHCODEC_READERS:
            try:
                from torchcodec.decoders import VideoDecoder
            except ImportError as err:
                return f"torchcodec does not import ({str(err).splitlines()[0]}); {_PEERS_HINT}"
            if probe_video is not None:
                VideoDecoder(probe_video, seek_mode="approximate", device="cpu").get_frame_at(0)
    except Exception as err:  # a native library failing to load, a decode failing
        return f"cannot decode here: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
    return None
