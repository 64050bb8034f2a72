"""JPEG frame stores decode exactly as the reference decoders do, unless the fast IDCT is asked for.

"Reference" here: libjpeg(-turbo)'s default decode, the accurate integer IDCT with fancy chroma
upsampling, which is what Pillow and OpenCV give for a full-size decode; for a DCT-scaled decode
(1/8, 1/4, 1/2 of the stored size) it is Pillow's ``draft()``, which asks libjpeg for the same
scale. Frames are camera-like (a smooth scene, an animal, sensor noise) at a size that is not a
multiple of the 16-pixel MCU, written by DeepEthogram's ``vidio`` (OpenCV's encoder, quality 95),
as frame folders and HDF5 files. Held bit for bit: the CPU loader's scaled decode in its worker
callback, DALI's CPU image decoder (stores it cannot scale), and a whole ClipLoader whose output
is the scaled size. ``video.jpeg_idct: fast`` keeps libjpeg-turbo's fast IDCT as an option: its
pixels differ, and the bench prints by how much.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from gpufeed.bench._clip_videos import _camera_frame, _camera_scene
from gpufeed.config import SizePx
from gpufeed.pipelines import VideoDataset
from gpufeed.pipelines._frame_stores import FrameBytesReader
from gpufeed.pipelines._store_feed import ScaledJpegClips, StoreFrameFeed, StoreRef
from gpufeed.pipelines._store_pipeline import build_store_pipeline

WIDTH, HEIGHT, FRAMES, LENGTH = 200, 150, 12, 4


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same camera-like frames written by vidio as a frame folder and as an HDF5 file."""
    from vidio.write import DirectoryWriter, HDF5Writer

    root = tmp_path_factory.mktemp("jpeg_exact")
    rng = np.random.default_rng(3)
    scene = _camera_scene(256, rng)
    frames = [np.ascontiguousarray(_camera_frame(i, 0, 256, scene, rng)[:HEIGHT, :WIDTH]) for i in range(FRAMES)]
    for path, writer in ((root / "cam", DirectoryWriter), (root / "cam.h5", HDF5Writer)):
        with writer(str(path), codec=".jpg", asynchronous=False) as out:
            for frame in frames:
                out.write(frame)
    return root, VideoDataset.from_folder(root, require_labels=False)


def _reference(data: np.ndarray, scale_eighths: int) -> np.ndarray:
    """Pillow's decode (RGB as stored), at ``scale_eighths``/8 of the stored size through draft()."""
    with Image.open(io.BytesIO(data.tobytes())) as image:
        if scale_eighths != 8:
            image.draft("RGB", (WIDTH * scale_eighths // 8, HEIGHT * scale_eighths // 8))
        return np.asarray(image.convert("RGB"))


def _stored(info) -> list[np.ndarray]:
    reader = FrameBytesReader()
    try:
        return reader.read(info.path, info.store, info.frame_name, np.arange(FRAMES))
    finally:
        reader.close()


def _scaled_clips(info, scale_eighths: int, fast_idct: bool) -> np.ndarray:
    """Frames 0..LENGTH-1 as the CPU loader's worker callback decodes them at ``scale_eighths``/8."""
    size = (-(-WIDTH * scale_eighths // 8), -(-HEIGHT * scale_eighths // 8))
    source = ScaledJpegClips(
        lambda k: (np.array([0]), np.array([0])),
        [StoreRef.from_info(info)],
        np.array([size]),
        clip_length_frames=LENGTH,
        stride_frames=1,
        batch_size=1,
        fast_idct=fast_idct,
    )
    clip, _ = source(SimpleNamespace(iteration=0, idx_in_batch=0))
    source.close()
    return clip


@pytest.mark.parametrize("scale_eighths", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["folder", "hdf5"])
def test_the_scaled_decode_is_bit_exact_against_pillow_at_the_same_scale(stores, kind, scale_eighths):
    _, dataset = stores
    info = next(i for i in dataset.infos if i.store == kind)
    clip = _scaled_clips(info, scale_eighths, fast_idct=False)
    for t, data in enumerate(_stored(info)[:LENGTH]):
        want = _reference(data, scale_eighths)
        if kind == "hdf5":  # vidio's HDF5 frames hold reversed channels; the loader puts them back
            want = want[..., ::-1]
        assert clip[t].shape == want.shape and np.array_equal(clip[t], want), f"{kind} frame {t} at {scale_eighths}/8"


def test_the_fast_idct_is_an_option_and_differs(stores):
    _, dataset = stores
    info = next(i for i in dataset.infos if i.store == "folder")
    exact, fast = _scaled_clips(info, 8, False), _scaled_clips(info, 8, True)
    diff = np.abs(exact.astype(np.int16) - fast)
    assert 0 < diff.mean() < 3 and diff.max() > 2


@pytest.mark.parametrize("fast_idct", [False, True])
def test_dalis_cpu_decoder_is_exact_unless_asked_for_the_fast_idct(stores, fast_idct):
    """Stores the scaled path does not take (PNG among them) go through DALI's CPU image decoder.

    The loader's own store graph, at the stored size (a resize by 1 changes no pixel), its files
    read in this thread.
    """
    _, dataset = stores
    info = next(i for i in dataset.infos if i.store == "folder")
    feed = StoreFrameFeed(
        lambda k: (np.array([0]), np.array([0])),
        [StoreRef.from_info(info)],
        clip_length_frames=LENGTH,
        stride_frames=1,
        batch_size=1,
        mode="rgb",
        fast_idct=fast_idct,
    )
    pipe = build_store_pipeline(
        feed,
        size_px=SizePx(WIDTH, HEIGHT),
        fit="stretch",
        batch_size=1,
        device_id=None,
        num_threads=1,
        prefetch_queue_depth=1,
        seed=0,
        parallel=False,
    )
    clip = np.stack([np.asarray(frame) for frame in pipe.run()[0]])
    feed.close()
    want = np.stack([_reference(data, 8) for data in _stored(info)[:LENGTH]])
    assert np.array_equal(clip, want) != fast_idct


@pytest.mark.process
def test_a_clip_loader_at_the_scaled_size_returns_pillows_pixels(stores):
    """End to end on a CPU: output size = the 1/2-scaled decode, so the resize has nothing to change."""
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ClipLoader

    root, _ = stores
    dataset = VideoDataset.from_folder(root, require_labels=False)
    dataset = type(dataset)(
        dataset.paths,
        dataset.infos,
        tuple(np.zeros((FRAMES, 1), np.uint8) for _ in dataset.paths),
        ("none",),
        {},
        dataset.source,
    )
    loader = ClipLoader(
        dataset,
        train=False,
        video_cfg=VideoConfig(clip_length_frames=LENGTH, size_px=(WIDTH // 2, HEIGHT // 2)),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=1),
        device=DeviceChoice("cpu", None, "test"),
    )
    assert "DCT-scaled" in loader.decoder_reason
    stored = {info.path: _stored(info) for info in dataset.infos}
    checked = 0
    for batch in loader:
        for clip, video, start in zip(batch.clips, batch.video_ids, batch.start_frames, strict=True):
            info = dataset.infos[int(video)]
            for t in range(LENGTH):
                want = _reference(stored[info.path][int(start) + t], 4)
                want = want[..., ::-1] if info.store == "hdf5" else want
                assert np.array_equal(clip[:, t].permute(1, 2, 0).numpy(), want), f"{info.path} frame {int(start) + t}"
                checked += 1
    loader.close()
    assert checked == 2 * FRAMES
