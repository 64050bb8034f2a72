"""Frame stores through one image decoder per pipeline, their files read beside the training thread.

A clip of ``T`` frames used to be ``T`` outputs of the feed, each with its own ``fn.decoders.image``:
on a GPU each ``mixed`` decoder owns a thread pool and nvJPEG's per-thread device and pinned buffers,
so an 11-frame clip built 11 of them, and the feed read its files on the thread that runs the
pipeline, the training thread. Now a plan batch's clips are ``batch_size x T`` samples of one
decoder, regrouped by the loader (a view), and the clip loader's feed runs in DALI's worker processes.

The GPU graphs are traced here on the CPU, defined for ``device_id=0`` but not built
(``tests/dali_graph.py``); the CPU graphs run. The frames are tagged (``videohelp``), so every clip
read is checked to be exactly its frames.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DEVICES
from dali_graph import external_sources, image_decoders, operators
from videohelp import frame_tags, write_tagged_store

from gpufeed.config import LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, VideoDataset, VideoFrameReader, _clip_loader
from gpufeed.pipelines._image_facts import read_image_facts
from gpufeed.pipelines._image_pipeline import eval_decoder_options
from gpufeed.pipelines._sampler import PlanStream
from gpufeed.pipelines._store_feed import StoreFrameFeed

pytestmark = pytest.mark.timeout(300)

GPU = DeviceChoice("gpu", 0, "test")
FRAMES = (40, 33)
T = 11


@pytest.fixture(scope="module")
def jpeg_stores(tmp_path_factory):
    """Two frame folders of tagged JPEG frames and an HDF5 file of PNG frames, with labels."""
    root = tmp_path_factory.mktemp("jpeg_stores")
    for video, count in enumerate(FRAMES):
        write_tagged_store(root / "folders" / f"mouse_{video}", video, count, ext=".jpg", by="hand")
    write_tagged_store(root / "mixed" / "mouse_0", 0, FRAMES[0])
    write_tagged_store(root / "mixed" / "mouse_1.h5", 1, FRAMES[1])
    return root


def _loader(dataset, device, *, batch=4, fit="stretch", **kw):
    return ClipLoader(
        dataset,
        train=True,
        video_cfg=VideoConfig(clip_length_frames=T, stride_frames=1, size_px=[48, 32], fit=fit),
        loader_cfg=LoaderConfig(batch_size=batch, num_threads=2, last_batch="partial", **kw),
        device=device,
        seed=1,
    )


@pytest.mark.parametrize("fit", ["stretch", "centre_crop"])
@pytest.mark.parametrize("form", ["folders", "mixed"])
def test_a_gpu_store_graph_has_one_decoder_and_a_parallel_source(jpeg_stores, monkeypatch, form, fit):
    """Traced on the CPU: one nvJPEG decoder for all ``batch x T`` frames, fed by DALI's worker processes."""
    monkeypatch.setattr(_clip_loader, "gpu_capability", lambda device: (9, 0))  # an H100, as the GPU would say
    loader = _loader(VideoDataset.from_folder(jpeg_stores / form), GPU, fit=fit, hw_decoder_load=0.7)
    assert loader.source == "frames" and loader.clip_source.frames_flat
    stream = PlanStream(loader._spec(), 0, 0)
    pipe = loader.clip_source.open(loader._clip_job(stream), build=False).pipe
    (decoder,) = image_decoders(pipe)
    assert decoder.device == "mixed" and decoder.schema == "decoders__Image"
    # The image loader's options: threads unpinned (DALI pins thread i to core i on every rank), the
    # configured hardware share in training (DALI's own is 0.65), buffers for the frames.
    assert decoder.args["affine"] is False and decoder.args["hw_decoder_load"] == 0.7
    assert decoder.args["preallocate_width_hint"] > 0
    assert pipe.max_batch_size == 4 * T, "a batch's clips, frame by frame"
    (source,) = [op for op in external_sources(pipe) if isinstance(op.callback, StoreFrameFeed)]
    assert source.parallel is True and source.batch is False, "the files are read in DALI's worker processes"
    assert [op.device for op in operators(pipe) if op.schema == "Resize"] == ["gpu"]


@pytest.mark.parametrize(("share", "routed"), [(0.9, 1.0), (0.3, 1.0), (0.0, 0.0)])
def test_the_sequential_reader_decodes_a_range_with_one_decoder(jpeg_stores, monkeypatch, tmp_path, share, routed):
    """One pass over one video: a range of 16 frames is one batch of one decoder, read in this thread."""
    from gpufeed.pipelines import _frames

    monkeypatch.setattr(_frames, "gpu_capability", lambda device: (9, 0))
    info = VideoDataset.from_folder(jpeg_stores / "folders").infos[0]
    reader = VideoFrameReader(info, size_px=SizePx(32, 32), chunk_frames=16, device=GPU, hw_decoder_load=share)
    pipe = reader._pipeline(tmp_path, build=False)
    (decoder,) = image_decoders(pipe)
    assert decoder.device == "mixed" and pipe.max_batch_size == 16
    # Evaluation's all-or-nothing share: a frame takes evaluation's decoder, whatever else is in its range.
    assert decoder.args["hw_decoder_load"] == routed == eval_decoder_options(share)["hw_decoder_load"]
    assert decoder.args["affine"] is False
    (source,) = [op for op in external_sources(pipe) if isinstance(op.callback, StoreFrameFeed)]
    assert source.parallel is False, "worker processes for one pass over one video would cost more than its reads"


def test_the_feed_lays_a_batch_out_frame_by_frame_and_reads_a_clip_once(jpeg_stores):
    """Sample ``j T + t`` is frame ``t`` of clip ``j``, with its clip's tag; a clip's files are read once."""
    from types import SimpleNamespace

    from gpufeed.pipelines._store_feed import StoreRef

    dataset = VideoDataset.from_folder(jpeg_stores / "folders")
    starts = np.array([3, 0, 20])
    feed = StoreFrameFeed(
        lambda k: (np.array([0, 1, 0]), starts + k),
        [StoreRef.from_info(i) for i in dataset.infos],
        clip_length_frames=T,
        stride_frames=1,
        batch_size=3,
        mode="rgb",
    )
    reads = []
    original = feed._read_clip
    feed._read_clip = lambda k, j: reads.append((k, j)) or original(k, j)
    for k in (0, 1):
        for i in range(3 * T):
            encoded, tag = feed(SimpleNamespace(iteration=k, idx_in_batch=i))
            j, t = divmod(i, T)
            assert int(tag[0]) == k * 3 + j
            video, frame = [0, 1, 0][j], int(starts[j]) + k + t
            path = dataset.infos[video].path + "/" + dataset.infos[video].frame_name.format(frame)
            with open(path, "rb") as stored:
                assert encoded.tobytes() == stored.read(), (k, i)
    assert reads == [(k, j) for k in (0, 1) for j in range(3)], "each clip read once, when its first frame is asked"
    state = feed.__getstate__()
    assert state["_reader"] is None and state["_clip"][0] is None, "no open file or cached frames travel to a worker"


def test_a_frame_whose_header_cannot_be_parsed_is_named_before_dali_sees_it(jpeg_stores, tmp_path):
    """DALI 2.4's decoder crashed the process on such a header in a large batch; the feed names it instead."""
    import shutil
    from types import SimpleNamespace

    from gpufeed.pipelines._store_feed import StoreRef

    folder = tmp_path / "mouse_0"
    shutil.copytree(jpeg_stores / "folders" / "mouse_0", folder)
    (folder / "000000007.jpg").write_bytes(b"not an image at all")
    data = (jpeg_stores / "folders" / "mouse_0" / "000000008.jpg").read_bytes()
    cut = data[: data.index(b"\xff\xda") + 30]  # inside the scan data: DALI fails such a file cleanly
    assert read_image_facts(cut, header_only=True).problem is None and read_image_facts(cut).problem is not None
    ref = StoreRef(str(folder), "folder", "{:09d}.jpg", FRAMES[0])
    feed = StoreFrameFeed(
        lambda k: (np.zeros(1, dtype=np.int64), np.array([0])),
        [ref],
        clip_length_frames=T,
        stride_frames=1,
        batch_size=1,
        mode="rgb",
    )
    with pytest.raises(RuntimeError, match=r"mouse_0: 000000007\.jpg is not an image: .*not a JPEG or PNG"):
        feed(SimpleNamespace(iteration=0, idx_in_batch=0))


@pytest.mark.process  # the clip loader's frame-store files are read in DALI's worker processes
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_store_clips_are_exactly_their_frames_and_the_loader_thread_reads_no_file(jpeg_stores, device):
    """Folders and HDF5 (PNG frames: the image-decoder graph on either device): one decoder, regrouped exactly."""
    dataset = VideoDataset.from_folder(jpeg_stores / "mixed")
    loader = _loader(dataset, device, fit="centre_crop")
    assert loader.clip_source.frames_flat
    clips = 0
    for epoch in range(2):
        for batch in loader:
            assert batch.clips.shape[1:] == (3, T, 32, 48) and batch.clips.device.type == device.torch_device.type
            for k in range(len(batch)):
                video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
                assert frame_tags(batch.clips[k], "CTHW") == [(start + t, video) for t in range(T)], (epoch, k)
                clips += 1
        iterator = loader._session.iterator  # on a CPU the loader's HostOutputs, on a GPU DALI's iterator
        pipe = iterator.pipe if hasattr(iterator, "pipe") else iterator.iterator._pipes[0]  # SideStreamCopies
        (decoder,) = image_decoders(pipe)
        assert decoder.device == ("mixed" if device.is_gpu else "cpu")
        (source,) = [op for op in external_sources(pipe) if isinstance(op.callback, StoreFrameFeed)]
        assert source.parallel and source.callback._reader is None, "this process read no frame"
    assert clips == 2 * len(loader.table) and loader.pipeline_builds == 1


@pytest.mark.process  # spawned worker processes
def test_store_clips_read_through_spawned_workers(jpeg_stores):
    """On a GPU, CUDA makes DALI spawn its workers: the feed and its plan travel pickled, and read the same clips."""
    dataset = VideoDataset.from_folder(jpeg_stores / "mixed")
    cpu = DeviceChoice("cpu", None, "test")
    loader = _loader(dataset, cpu, worker_start_method="spawn")
    seen = []
    for batch in loader:
        for k in range(len(batch)):
            video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
            assert frame_tags(batch.clips[k], "CTHW") == [(start + t, video) for t in range(T)]
            seen.append((video, start))
    assert seen == list(zip(*(a.tolist() for a in loader.epoch_clips(0)), strict=True))
