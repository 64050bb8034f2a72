"""The sequential reader: every frame of a video exactly once, in order, on each path."""

from __future__ import annotations

import pytest
import torch
from videohelp import frame_tags

from gpufeed.config import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, PrepareOptions, VideoDataset, VideoFrameReader, prepare_videos

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def vp9_video(synth_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vp9frames")
    report = prepare_videos(synth_dir / "videos", out, PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0), False)
    assert report.ok, report.table()
    return out / "clip_001.webm"


CASES = [
    pytest.param(("h264", "pyav", "cpu"), id="h264-pyav-cpu"),
    pytest.param(("vp9", "dali", "cpu"), id="vp9-dali-cpu"),
    pytest.param(("vp9", "pyav", "cpu"), id="vp9-pyav-cpu"),
    pytest.param(("h264", "dali", "gpu"), id="h264-nvdec-gpu", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("chunk", [32, 500])
def test_every_frame_once_in_order(synth_dir, vp9_video, case, chunk):
    codec, decoder, device = case
    path = vp9_video if codec == "vp9" else synth_dir / "videos" / "clip_001.mp4"
    choice = DeviceChoice("gpu", 0, "test") if device == "gpu" else DeviceChoice("cpu", None, "test")
    reader = VideoFrameReader(path, size_px=SizePx(40, 40), chunk_frames=chunk, device=choice, decoder=decoder)
    assert reader.source == decoder
    seen = []
    for part in reader:
        assert part.frames.shape[1:] == (3, 40, 40) and part.frames.dtype == torch.uint8
        assert part.frames.device.type == ("cuda" if choice.is_gpu else "cpu")
        assert part.frame_indices.device.type == "cpu", "read by the scorer per chunk: never a GPU sync"
        assert len(part) <= min(chunk, 120)
        tags = frame_tags(part.frames, "TCHW")
        assert [i for i, _ in tags] == part.frame_indices.tolist() and {v for _, v in tags} == {1}
        seen += part.frame_indices.tolist()
    assert seen == list(range(120))
    assert len(reader) == -(-120 // min(chunk, 120))


def test_a_bad_video_is_refused_with_its_path(tmp_path):
    path = tmp_path / "broken.mp4"
    path.write_bytes(b"not a video at all")
    with pytest.raises(DatasetError, match=r"broken\.mp4: not an mp4"):
        VideoFrameReader(path, device=DeviceChoice("cpu", None, "test"))


@pytest.mark.process
def test_frames_match_the_clip_loader(synth_dir):
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.pipelines import ClipLoader

    dataset = VideoDataset.from_folder(synth_dir / "videos")
    cpu = DeviceChoice("cpu", None, "test")
    reader = VideoFrameReader(dataset.infos[0], size_px=SizePx(40, 40), chunk_frames=11, device=cpu, decoder="pyav")
    first = next(iter(reader)).frames
    loader = ClipLoader(
        dataset,
        train=False,
        video_cfg=VideoConfig(size_px=40, decoder="pyav"),
        loader_cfg=LoaderConfig(batch_size=16, num_threads=1),
        device=cpu,
    )
    batch = next(iter(loader))
    assert (int(batch.video_ids[0]), int(batch.start_frames[0])) == (0, 0)
    assert torch.equal(batch.clips[0].permute(1, 0, 2, 3), first), "same decoder, same resize, same pixels"


@pytest.mark.parametrize(
    ("starts", "span", "lines"),
    [
        ([0, 32, 64, 88], 32, ([0, 88], [96, 32])),  # 120 frames: the last range ends at the end
        ([0, 40, 80], 40, ([0], [120])),  # ranges end to end: one line
        ([0], 120, ([0], [120])),
        ([0, 10, 15, 25], 10, ([0, 15], [20, 20])),
    ],
)
def test_ranges_that_follow_end_to_end_share_a_list_line(starts, span, lines):
    from gpufeed.pipelines._clip_pipeline import range_lines

    firsts, spans = range_lines(starts, span)
    assert (firsts.tolist(), spans.tolist()) == lines
    # The reader's samples of those lines (a sample every span frames, while one fits) are the ranges.
    samples = [int(f) + k * span for f, s in zip(firsts, spans, strict=True) for k in range(int(s) // span)]
    assert samples == starts


def test_a_pass_of_dalis_reader_lists_at_most_two_lines(vp9_video, tmp_path):
    """DALI builds a frame decoder per list line, holding Python's lock (an NVDEC session, ~8 ms, on a
    GPU): a line per range of a long video stalled every thread of a server for most of a second."""
    cpu = DeviceChoice("cpu", None, "test")
    reader = VideoFrameReader(vp9_video, size_px=SizePx(40, 40), chunk_frames=8, device=cpu, decoder="dali")
    assert len(reader) == 15
    reader._pipeline(tmp_path, build=False)
    (listed,) = tmp_path.glob("*.txt")
    assert [line.split()[1:] for line in listed.read_text().splitlines()] == [["0", "0", "120"]]
    reader = VideoFrameReader(vp9_video, size_px=SizePx(40, 40), chunk_frames=50, device=cpu, decoder="dali")
    seen = [part.frame_indices.tolist() for part in reader]
    assert [chunk[0] for chunk in seen] == [0, 50, 100]
    assert [i for chunk in seen for i in chunk] == list(range(120))


@pytest.mark.gpu
def test_the_next_chunk_does_not_wait_for_work_queued_on_the_current_stream(synth_dir):
    """NVDEC's chunks are copied, and their tags read, on a stream of the reader's own: a model's
    second of work queued on the current stream does not hold the next chunk."""
    import time

    gpu = DeviceChoice("gpu", 0, "test")
    reader = VideoFrameReader(synth_dir / "videos" / "clip_001.mp4", size_px=SizePx(40, 40), chunk_frames=8, device=gpu)
    chunks = iter(reader)
    next(chunks)
    torch.cuda.synchronize()
    queued = time.perf_counter()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on an H100 (cycles)
    part = next(chunks)
    took = time.perf_counter() - queued
    torch.cuda.synchronize()
    waited = time.perf_counter() - queued
    assert waited > 0.3, f"the queued work took {waited:.2f} s: too short to tell"
    assert took < 0.5 * waited, f"the next chunk took {took:.2f} s of the queued {waited:.2f} s"
    assert part.frame_indices.tolist() == list(range(8, 16))
