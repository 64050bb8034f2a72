"""Non-square clips (``video.size_px: [width, height]``): every output pixel comes from the right place.

Each frame is a grid of flat 32x32 blocks whose red and green say the block's column and row and
whose blue says the frame's index, so an output pixel names the source block and frame it came
from even through a lossy codec (neighbouring values are 20 or more apart; pixels within a few
source pixels of a block edge, where chroma subsampling blends, are not judged). Both clip paths
on a CPU are covered, PyAV seeks for h264 and DALI's reader for VP9, plus NVDEC on a GPU.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from videohelp import source_points

from gpufeed.config import LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, VideoDataset, VideoFrameReader
from gpufeed.synth import behaviour_labels
from gpufeed.synth._videos import write_label_csv

pytestmark = pytest.mark.timeout(300)

SRC_W, SRC_H, BLOCK = 384, 192, 32
OUT = (176, 112)  # width, height: aspect 1.57, the source's is 2
FRAMES, LENGTH, STRIDE = 36, 5, 2
TOLERANCE = 8

CASES = [
    pytest.param(("h264", "pyav", "cpu"), id="h264-pyav-cpu"),
    pytest.param(("vp9", "dali", "cpu"), id="vp9-dali-cpu"),
    pytest.param(("h264", "dali", "gpu"), id="h264-nvdec-gpu", marks=pytest.mark.gpu),
]


def _frame(index: int) -> np.ndarray:
    rows, cols = np.mgrid[0:SRC_H, 0:SRC_W] // BLOCK
    return np.stack([20 * cols + 10, 35 * rows + 20, np.full_like(cols, 20 * (index % 12) + 10)], -1).astype(np.uint8)


def _write(folder, codec: str) -> None:
    import av  # the video extra's PyAV; only the video tests need it

    folder.mkdir(parents=True)
    for video_id in range(2):
        path = folder / f"grid{video_id}.{'mp4' if codec == 'h264' else 'webm'}"
        with av.open(str(path), "w") as container:
            stream = container.add_stream("libx264" if codec == "h264" else "libvpx-vp9", rate=Fraction(30, 1))
            stream.width, stream.height, stream.pix_fmt = SRC_W, SRC_H, "yuv420p"
            stream.options = {"crf": "10", "g": "12"} if codec == "h264" else {"crf": "10", "b": "0", "g": "12"}
            for index in range(FRAMES):
                frame = av.VideoFrame.from_ndarray(_frame(index), format="rgb24")
                frame.pts = index
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        write_label_csv(path.with_suffix(".csv"), behaviour_labels(FRAMES, seed=video_id))


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory):
    codec, decoder, device = request.param
    folder = tmp_path_factory.mktemp(codec) / "videos"
    _write(folder, codec)
    choice = DeviceChoice("gpu", 0, "test") if device == "gpu" else DeviceChoice("cpu", None, "test")
    return VideoDataset.from_folder(folder), decoder, choice


def _check_frame(frame_hwc: np.ndarray, fit: str, frame_index: int, where: str) -> None:
    assert frame_hwc.shape == (OUT[1], OUT[0], 3), where
    xs, ys = source_points(fit, OUT, (SRC_W, SRC_H))
    # Judge only pixels well inside a block: 6 source pixels from any edge.
    keep_x = np.abs(xs - BLOCK * np.rint(xs / BLOCK)) > 6
    keep_y = np.abs(ys - BLOCK * np.rint(ys / BLOCK)) > 6
    want = np.stack(
        np.broadcast_arrays(
            20 * (xs[None, :] // BLOCK) + 10, 35 * (ys[:, None] // BLOCK) + 20, 20 * (frame_index % 12) + 10
        ),
        -1,
    )
    got = frame_hwc[np.ix_(keep_y, keep_x)].astype(int)
    diff = np.abs(got - want[np.ix_(keep_y, keep_x)])
    assert diff.max() <= TOLERANCE, f"{where}: {int((diff > TOLERANCE).any(-1).sum())} pixels off, worst {diff.max()}"


@pytest.mark.process
@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
@pytest.mark.parametrize("train", [False, True])
def test_clips_come_out_width_by_height_from_the_right_source_pixels(case, fit, train):
    dataset, decoder, device = case
    loader = ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(
            clip_length_frames=LENGTH, stride_frames=STRIDE, size_px=list(OUT), fit=fit, decoder=decoder
        ),
        loader_cfg=LoaderConfig(batch_size=3, num_threads=2, last_batch="partial"),
        device=device,
        seed=2,
    )
    assert loader.clip_shape == (3, LENGTH, OUT[1], OUT[0])
    seen = 0
    for batch in loader:
        assert tuple(batch.clips.shape[1:]) == loader.clip_shape and batch.clips.dtype == torch.uint8
        clips = batch.clips.permute(0, 2, 3, 4, 1).cpu().numpy()  # N, T, H, W, C
        for k in range(len(batch)):
            start = int(batch.start_frames[k])
            for t in range(LENGTH):
                _check_frame(clips[k, t], fit, start + t * STRIDE, f"clip {k} frame {start + t * STRIDE}")
            seen += 1
    assert seen >= 4


@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
def test_sequential_reader_gives_the_same_frames(case, fit):
    dataset, decoder, device = case
    reader = VideoFrameReader(
        dataset.infos[0], size_px=SizePx(*OUT), chunk_frames=16, device=device, decoder=decoder, fit=fit
    )
    count = 0
    for chunk in reader:
        assert tuple(chunk.frames.shape[1:]) == (3, OUT[1], OUT[0])
        for frames, index in zip(
            chunk.frames.permute(0, 2, 3, 1).cpu().numpy(), chunk.frame_indices.tolist(), strict=True
        ):
            _check_frame(frames, fit, index, f"frame {index}")
            count += 1
    assert count == FRAMES
