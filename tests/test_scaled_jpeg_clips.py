"""Frame stores of JPEG frames on a CPU: DCT-scaled decodes in worker processes, what they guarantee.

On a CPU the clip loader decodes JPEG frames with libjpeg-turbo at 1/2, 1/4 or 1/8 of their size
when that still covers the output (see ``gpufeed.pipelines._store_feed``). These tests hold:

* the scale chosen is the one libjpeg-turbo decodes to (sizes computed here = sizes decoded);
* the same frames and crop window: every output pixel comes from the right block of a grid of
  flat blocks (as in ``test_non_square_clips.py``), for stretch and centre_crop, for frame folders
  and HDF5 files (whose reversed channels the decoder puts back);
* how far the pixels may move from DALI's full-size decode and resize (the GPU path's graph): a
  bound on the mean and the worst difference, measured on frames with edges and flat areas;
* a frame that is not a JPEG: a PNG among JPEGs still reads (Pillow), garbage is named by its file.
"""

from __future__ import annotations

import io
import shutil

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image
from videohelp import source_points

from gpufeed.bench._clip_videos import _camera_frame, _camera_scene
from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.core._size import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import BadSampleError, ClipLoader, VideoDataset
from gpufeed.pipelines._store_feed import jpeg_decode_sizes, jpeg_scale_eighths
from gpufeed.pipelines._store_sources import ScaledJpegSource, StoreSource
from gpufeed.synth import behaviour_labels
from gpufeed.synth._videos import write_label_csv

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

CPU = DeviceChoice("cpu", None, "test")
SRC_W, SRC_H, BLOCK = 384, 192, 32
OUT = (88, 56)  # width, height: 1/2 scale (192x96) covers it for stretch and centre_crop; 1/4 does not
FRAMES, LENGTH, STRIDE = 30, 5, 2
TOLERANCE = 10  # levels, within a block (JPEG quality 95, then the scaled IDCT and the resize)


def _frame(index: int) -> np.ndarray:
    """Flat 32x32 blocks: red says the column, green the row, blue the frame index."""
    rows, cols = np.mgrid[0:SRC_H, 0:SRC_W] // BLOCK
    return np.stack([20 * cols + 10, 35 * rows + 20, np.full_like(cols, 20 * (index % 12) + 10)], -1).astype(np.uint8)


def _jpeg(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="JPEG", quality=95)
    return out.getvalue()


def _write_stores(root) -> None:
    """Two grid videos as frame folders (``.jpg``) and as HDF5 files (channels reversed, as vidio's)."""
    import h5py

    for video_id in range(2):
        frames = [_frame(i + 3 * video_id) for i in range(FRAMES)]
        folder = root / "folder" / f"grid{video_id}"
        folder.mkdir(parents=True)
        for i, rgb in enumerate(frames):
            (folder / f"{i:09d}.jpg").write_bytes(_jpeg(rgb))
        write_label_csv(root / "folder" / f"grid{video_id}.csv", behaviour_labels(FRAMES, seed=video_id))
        (root / "hdf5").mkdir(exist_ok=True)
        with h5py.File(root / "hdf5" / f"grid{video_id}.h5", "w") as fh:
            data = fh.create_dataset("frame", (FRAMES,), dtype=h5py.vlen_dtype(np.uint8))
            for i, rgb in enumerate(frames):
                data[i] = np.frombuffer(_jpeg(np.ascontiguousarray(rgb[..., ::-1])), dtype=np.uint8)
        write_label_csv(root / "hdf5" / f"grid{video_id}.csv", behaviour_labels(FRAMES, seed=video_id))
        # Camera-like frames as vidio writes them (OpenCV's encoder, quality 95): the case the docs quote.
        camera = root / "camera" / f"camera{video_id}"
        camera.mkdir(parents=True)
        rng = np.random.default_rng([video_id, 9])
        scene = _camera_scene(SRC_W, rng)
        for i in range(FRAMES):
            frame = np.ascontiguousarray(_camera_frame(i, video_id, SRC_W, scene, rng)[:SRC_H])
            (camera / f"{i:09d}.jpg").write_bytes(cv2.imencode(".jpg", frame[..., ::-1])[1].tobytes())
        write_label_csv(root / "camera" / f"camera{video_id}.csv", behaviour_labels(FRAMES, seed=video_id))
        # The worst case for a scaled decode: per-pixel noise (the bench videos' texture), no flat area.
        noise = root / "noise" / f"noise{video_id}"
        noise.mkdir(parents=True)
        rng = np.random.default_rng(video_id)
        texture = np.clip(rng.normal(128, 40, (SRC_H, SRC_W, 3)), 0, 255)
        for i in range(FRAMES):
            frame = np.clip(texture + rng.integers(-6, 7, texture.shape), 0, 255).astype(np.uint8)
            (noise / f"{i:09d}.jpg").write_bytes(_jpeg(frame))
        write_label_csv(root / "noise" / f"noise{video_id}.csv", behaviour_labels(FRAMES, seed=video_id))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpeg_stores")
    _write_stores(root)
    return root


def _loader(dataset, fit: str, *, train=True, **loader_kw) -> ClipLoader:
    loader_kw.setdefault("last_batch", "partial")
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=LENGTH, stride_frames=STRIDE, size_px=list(OUT), fit=fit),
        loader_cfg=LoaderConfig(batch_size=3, num_threads=2, **loader_kw),
        device=CPU,
        seed=4,
    )


def _clips(loader) -> dict[tuple[int, int], np.ndarray]:
    """Every clip read, (video, start) -> (T, H, W, 3) uint8."""
    out = {}
    for batch in loader:
        clips = batch.clips.permute(0, 2, 3, 4, 1).cpu().numpy()
        for k in range(len(batch)):
            out[(int(batch.video_ids[k]), int(batch.start_frames[k]))] = clips[k]
    return out


def _check_frame(frame_hwc: np.ndarray, fit: str, frame_index: int, where: str) -> None:
    assert frame_hwc.shape == (OUT[1], OUT[0], 3), where
    xs, ys = source_points(fit, OUT, (SRC_W, SRC_H))
    keep_x = np.abs(xs - BLOCK * np.rint(xs / BLOCK)) > 8  # well inside a block: 8 source pixels from an edge
    keep_y = np.abs(ys - BLOCK * np.rint(ys / BLOCK)) > 8
    want = np.stack(
        np.broadcast_arrays(
            20 * (xs[None, :] // BLOCK) + 10, 35 * (ys[:, None] // BLOCK) + 20, 20 * (frame_index % 12) + 10
        ),
        -1,
    )
    diff = np.abs(frame_hwc[np.ix_(keep_y, keep_x)].astype(int) - want[np.ix_(keep_y, keep_x)])
    assert diff.max() <= TOLERANCE, f"{where}: {int((diff > TOLERANCE).any(-1).sum())} pixels off, worst {diff.max()}"


@pytest.mark.parametrize(
    ("width", "height", "out"),
    [(256, 256, (112, 112)), (384, 192, (88, 56)), (640, 480, (352, 224)), (250, 187, (60, 40)), (96, 64, (64, 48))],
)
def test_the_scale_chosen_is_the_size_libjpeg_turbo_decodes(width, height, out):
    data = _jpeg(np.full((height, width, 3), 90, dtype=np.uint8))
    ((dw, dh),) = jpeg_decode_sizes([(width, height)], [(width, height)], SizePx(*out))
    n = jpeg_scale_eighths(width, height, *out)
    assert n in (1, 2, 4, 8) and dw >= out[0] and dh >= out[1]
    if n > 1:  # the next smaller scale would not cover the output
        smaller = {8: 4, 4: 2, 2: 1}[n]
        assert -(-width * smaller // 8) < out[0] or -(-height * smaller // 8) < out[1]
    decoded = simplejpeg.decode_jpeg(data, min_width=dw, min_height=dh)
    assert decoded.shape == (dh, dw, 3), "simplejpeg decodes to the size the feed allocates"


def test_a_centre_crop_needs_the_whole_frame_decoded_larger():
    # A 1.57:1 crop of a 2:1 frame: the frame is decoded so that the crop, not the frame, covers the output.
    sizes = np.array([(384, 192)])
    region = np.array([(192 * 176 / 112, 192)])
    assert jpeg_decode_sizes(sizes, sizes, SizePx(176, 112)).tolist() == [[384, 192]]
    assert jpeg_decode_sizes(sizes, sizes, SizePx(176, 90)).tolist() == [[192, 96]]
    # Decoded at 192x96, the crop would be 151 wide for an output 176 wide: the full size it is.
    assert jpeg_decode_sizes(sizes, region, SizePx(176, 90)).tolist() == [[384, 192]]
    assert jpeg_decode_sizes(sizes, region, SizePx(88, 56)).tolist() == [[192, 96]]


@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
@pytest.mark.parametrize("form", ["folder", "hdf5"])
def test_scaled_clips_hold_the_right_frames_and_source_pixels(stores, form, fit):
    loader = _loader(VideoDataset.from_folder(stores / form), fit)
    assert isinstance(loader.clip_source, ScaledJpegSource) and "DCT-scaled" in loader.decoder_reason, (
        loader.decoder_reason
    )
    clips = _clips(loader)
    assert len(clips) >= 4
    for (video, start), clip in clips.items():
        for t in range(LENGTH):
            index = start + t * STRIDE + 3 * video
            _check_frame(clip[t], fit, index, f"{form} video {video} frame {start + t * STRIDE}")


# (mean, 99.9th percentile, worst) of |scaled - full| in levels. Measured here: grid 0.12-0.14 / 2 / 2,
# camera-like frames as vidio writes them 0.26 / 3-5 / 6-9, noise 1.4-1.8 / 6-7 / 8-10 (the bench's
# 256x256 noise frames to 112x112, less shrunk: 3.2 / 16 / 23).
BOUNDS = {"folder": (0.5, 4, 6), "camera": (0.6, 8, 12), "noise": (3.0, 12, 16)}


@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
@pytest.mark.parametrize("form", ["folder", "camera", "noise"])
def test_pixels_stay_close_to_the_full_size_decode(stores, form, fit):
    """Against DALI's full-size decode and resize (the graph the GPU path runs): same clips, close pixels."""
    dataset = VideoDataset.from_folder(stores / form)
    scaled = _clips(_loader(dataset, fit))
    full_loader = _loader(dataset, fit)
    full_loader.clip_source = StoreSource("the image-decoder graph, on DALI's CPU decoder")
    full = _clips(full_loader)
    assert scaled.keys() == full.keys()
    diff = np.abs(np.stack(list(scaled.values())).astype(int) - np.stack([full[k] for k in scaled]).astype(int))
    mean, p999, worst = BOUNDS[form]
    figures = (diff.mean(), np.percentile(diff, 99.9), diff.max())
    assert figures[0] < mean and figures[1] <= p999 and figures[2] <= worst, figures


def _png(rgb: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, format="PNG")
    return out.getvalue()


def test_a_png_frame_among_jpegs_reads_and_garbage_is_named(stores, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(stores / "folder", folder)
    (folder / "grid0" / "000000004.jpg").write_bytes(_png(_frame(4)))  # a PNG under a .jpg name
    dataset = VideoDataset.from_folder(folder)
    clips = _clips(_loader(dataset, "stretch", train=False))
    video = dataset.paths.index(str(folder / "grid0"))
    with_png = [(s, c) for (v, s), c in clips.items() if v == video and s <= 4 and (4 - s) % STRIDE == 0]
    assert with_png, "evaluation reads a clip holding frame 4"
    for start, clip in with_png:
        _check_frame(clip[(4 - start) // STRIDE], "stretch", 4, "the PNG frame")
    (folder / "grid1" / "000000008.jpg").write_bytes(b"not an image at all" * 40)
    dataset = VideoDataset.from_folder(folder)
    bad = dataset.paths.index(str(folder / "grid1"))
    loader = _loader(dataset, "stretch", train=False, on_bad_sample="skip")
    read = _clips(loader)
    assert "000000008.jpg" in loader.skipped[bad] and "not an image" in loader.skipped[bad], loader.skipped
    assert all(v != bad for v, _ in _clips(loader)), "the next epoch leaves it out"
    assert read
    with pytest.raises(BadSampleError, match=r"000000008\.jpg is not an image"):
        _clips(_loader(dataset, "stretch", train=False))


def test_the_clips_are_uint8_of_the_output_shape(stores):
    loader = _loader(VideoDataset.from_folder(stores / "hdf5"), "stretch")
    batch = next(iter(loader))
    assert batch.clips.dtype == torch.uint8 and tuple(batch.clips.shape[1:]) == (3, LENGTH, OUT[1], OUT[0])


def test_spawned_workers_read_the_same_clips(stores):
    """The feed travels to spawned workers by pickling (CUDA initialised in the parent forbids fork)."""
    dataset = VideoDataset.from_folder(stores / "hdf5")
    forked = _clips(_loader(dataset, "centre_crop", worker_start_method="fork"))
    spawned = _clips(_loader(dataset, "centre_crop", worker_start_method="spawn"))
    assert forked.keys() == spawned.keys()
    assert all(np.array_equal(forked[k], spawned[k]) for k in forked)


def test_folders_and_hdf5_files_together_each_get_their_channels(stores, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copytree(stores / "folder" / "grid0", mixed / "grid0")
    shutil.copy(stores / "folder" / "grid0.csv", mixed)
    for name in ("grid1.h5", "grid1.csv"):
        shutil.copy(stores / "hdf5" / name, mixed)
    dataset = VideoDataset.from_folder(mixed)
    loader = _loader(dataset, "stretch")
    assert isinstance(loader.clip_source, ScaledJpegSource) and sorted(i.store for i in dataset.infos) == [
        "folder",
        "hdf5",
    ]
    clips = _clips(loader)
    assert {v for v, _ in clips} == {0, 1}
    for (video, start), clip in clips.items():
        shift = 3 * (1 if dataset.paths[video].endswith(".h5") else 0)  # grid1's frames start at index 3
        for t in range(LENGTH):
            _check_frame(clip[t], "stretch", start + t * STRIDE + shift, f"{dataset.paths[video]} t={t}")
