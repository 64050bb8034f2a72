"""Frame folders and HDF5 frame files as videos: the same clips, frames and labels as encoded videos.

The same tagged videos (every frame carries (frame index, video id) in its pixels) are stored as
h264 mp4, as frame folders and as HDF5 files, written with DeepEthogram's own ``vidio`` writers and
by hand; for the same seed every form gives the very same clips, each exactly the frames it names.
A channel mix-up fails the tag checksum, so HDF5's reversed channels are checked too.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from videohelp import encode_tagged_video, frame_tags, write_tagged_store

from gpufeed.config import LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import BadSampleError, ClipLoader, DatasetError, VideoDataset, VideoFrameReader, check_path
from gpufeed.pipelines._frame_stores import decode_store_frames

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
FRAMES = (60, 45, 33)  # frames of videos 0, 1, 2
FORMATS = ("mp4", "folder", "hdf5", "folder_jpg_hand", "hdf5_hand")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """One folder per storage form, each holding videos 0-2 with their label CSVs."""
    root = tmp_path_factory.mktemp("stores")
    for video, frames in enumerate(FRAMES):
        name = f"mouse_{video}"
        encode_tagged_video(
            root / "mp4" / f"{name}.mp4", video, frames, options={"crf": "12", "g": "15", "sc_threshold": "0"}
        )
        write_tagged_store(root / "folder" / name, video, frames)
        write_tagged_store(root / "hdf5" / f"{name}.h5", video, frames)
        write_tagged_store(root / "folder_jpg_hand" / name, video, frames, ext=".jpg", by="hand")
        write_tagged_store(root / "hdf5_hand" / f"{name}.h5", video, frames, by="hand")
    return root


def _loader(dataset, train, *, seed=0, stride=1, size=(64, 48), device=CPU, shard_id=0, num_shards=1, **kw):
    kw.setdefault("last_batch", "partial")
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=11, stride_frames=stride, size_px=list(size)),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=2, **kw),
        device=device,
        seed=seed,
        shard_id=shard_id,
        num_shards=num_shards,
    )


def _read(loader, stride):
    """(video, start) of every clip read, after checking each clip's frames and labels exactly."""
    clips = []
    for batch in loader:
        assert batch.clips.shape[1:] == (3, 11, 48, 64) and batch.clips.dtype == torch.uint8
        for k in range(len(batch)):
            video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
            frames = start + np.arange(11) * stride
            assert frame_tags(batch.clips[k], "CTHW") == [(int(f), video) for f in frames], "exactly those frames"
            expected = torch.as_tensor(loader.dataset.labels[video][frames], dtype=torch.float32)
            # exact: labels read from the CSV, not pixels
            assert torch.equal(batch.frame_labels[k].cpu(), expected)
            clips.append((video, start))
    return clips


@pytest.mark.process
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_every_storage_form_gives_the_same_clips_and_frames(stores, train):
    read = {}
    for form in FORMATS:
        dataset = VideoDataset.from_folder(stores / form)
        assert not dataset.problems, (form, dataset.problems)
        assert dataset.num_frames.tolist() == list(FRAMES)
        loader = _loader(dataset, train, seed=7, stride=2)
        assert loader.source == ("pyav" if form == "mp4" else "frames"), form
        read[form] = _read(loader, stride=2) + _read(loader, stride=2)  # two epochs
    assert len(read["mp4"]) == 2 * len(loader.table)
    for form in FORMATS[1:]:
        assert read[form] == read["mp4"], f"{form} reads other clips than the mp4"


def test_frame_stores_decode_to_the_frames_vidio_wrote(stores):
    from vidio.read import VideoReader  # DeepEthogram's reader: the frames a user's labels were made on

    for form, name in (("folder", "mouse_1"), ("hdf5", "mouse_1.h5")):
        path = stores / form / name
        info = VideoDataset.from_folder(stores / form).infos[1]
        _, problem, ours = decode_store_frames(str(path), info.store, info.frame_name, [0, 7, 44], pixels=True)
        assert problem is None
        with VideoReader(str(path)) as reader:
            for got, index in zip(ours, (0, 7, 44), strict=True):
                assert np.array_equal(got, reader.read(index)), f"{form} frame {index}"


def test_frames_numbered_from_one_as_ffmpeg_writes_them_say_how_to_number_them(stores, tmp_path):
    """``ffmpeg -i v.mp4 f/%06d.jpg`` numbers from 1: "missing frame number 0" did not say why or what to do."""
    folder = tmp_path / "mouse"
    folder.mkdir()
    frames = sorted((stores / "folder" / "mouse_2").glob("*.png"))
    for number, frame in enumerate(frames, start=1):
        shutil.copy(frame, folder / f"{number:06d}.png")
    (finding,) = check_path(folder, progress=False).findings
    assert finding.reason == (
        f"frames are numbered 1..{len(frames)}, as ffmpeg numbers them by default, but frame 0 is file number 0: "
        "extract with ffmpeg -i VIDEO -start_number 0 FOLDER/%06d.jpg (or rename each file to its number minus 1)"
    )


@pytest.mark.process  # frame-store files are read in DALI's worker processes
def test_resume_mid_epoch_continues_exactly(stores):
    dataset = VideoDataset.from_folder(stores / "hdf5")

    def clips(batches):
        return [(b.video_ids.tolist(), b.start_frames.tolist(), b.clips.sum().item()) for b in batches]

    straight = _loader(dataset, True, seed=5)
    reference = clips(list(straight)) + clips(list(straight))
    stopped = _loader(dataset, True, seed=5)
    got = []
    for i, batch in enumerate(stopped):
        got += clips([batch])
        if i == 2:
            break
    state = stopped.state_dict()
    resumed = _loader(dataset, True, seed=5)
    resumed.load_state_dict(state)
    got += clips(list(resumed)) + clips(list(resumed))
    assert got == reference


@pytest.mark.process  # frame-store files are read in DALI's worker processes
def test_two_shards_split_the_clips(stores):
    dataset = VideoDataset.from_folder(stores / "folder")
    shards = [_read(_loader(dataset, False, shard_id=k, num_shards=2), stride=1) for k in range(2)]
    assert not set(shards[0]) & set(shards[1])
    assert len(shards[0]) + len(shards[1]) == len(_loader(dataset, False).table)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("form", ["folder", "hdf5", "folder_jpg_hand"])
def test_the_sequential_reader_reads_every_frame_in_order(stores, form, device):
    dataset = VideoDataset.from_folder(stores / form)
    choice = DeviceChoice("gpu", 0, "test") if device == "gpu" else CPU
    reader = VideoFrameReader(dataset.infos[2], size_px=SizePx(64, 48), chunk_frames=16, device=choice)
    assert reader.source == "frames"
    tags, indices = [], []
    for chunk in reader:
        assert chunk.frames.shape[1:] == (3, 48, 64)
        tags += frame_tags(chunk.frames, "TCHW")
        indices += chunk.frame_indices.tolist()
    assert tags == [(i, 2) for i in range(FRAMES[2])] and indices == list(range(FRAMES[2]))


@pytest.mark.process  # frame-store files are read in DALI's worker processes
def test_mixed_folders_and_hdf5_read_with_the_right_channels(stores, tmp_path):
    shutil.copytree(stores / "folder" / "mouse_0", tmp_path / "mouse_0")
    shutil.copy(stores / "folder" / "mouse_0.csv", tmp_path)
    for name in ("mouse_1.h5", "mouse_1.csv"):
        shutil.copy(stores / "hdf5" / name, tmp_path)
    dataset = VideoDataset.from_folder(tmp_path)
    clips = _read(_loader(dataset, True, seed=1), stride=1)
    assert {video for video, _ in clips} == {0, 1}


@pytest.mark.process
def test_encoded_videos_beside_frame_stores_read_exactly_through_pyav(stores, tmp_path):
    shutil.copytree(stores / "folder" / "mouse_0", tmp_path / "mouse_0")
    shutil.copy(stores / "folder" / "mouse_0.csv", tmp_path)
    for name in ("mouse_1.mp4", "mouse_1.csv"):
        shutil.copy(stores / "mp4" / name, tmp_path)
    for name in ("mouse_2.h5", "mouse_2.csv"):
        shutil.copy(stores / "hdf5" / name, tmp_path)
    dataset = VideoDataset.from_folder(tmp_path)
    loader = _loader(dataset, True, seed=7, stride=2)
    assert loader.source == "pyav" and "mixes encoded videos and frame stores" in loader.decoder_reason
    assert _read(loader, stride=2) == _read(
        _loader(VideoDataset.from_folder(stores / "mp4"), True, seed=7, stride=2), 2
    )
    with pytest.raises(DatasetError, match=r"decoder: dali cannot read .* mixes encoded videos and frame stores"):
        ClipLoader(
            dataset,
            train=True,
            video_cfg=VideoConfig(decoder="dali"),
            loader_cfg=LoaderConfig(batch_size=4),
            device=CPU,
        )


def _bad_copy(stores, tmp_path):
    folder = tmp_path / "videos"
    shutil.copytree(stores / "folder", folder, ignore=shutil.ignore_patterns(".gpufeed"))
    for name in ("mouse_1.h5", "mouse_1.csv", "mouse_2.h5", "mouse_2.csv"):
        shutil.copy(stores / "hdf5" / name, folder / name.replace("mouse", "h5mouse"))
    (folder / "mouse_0" / "000000017.png").unlink()  # a missing frame number
    (folder / "mouse_1" / "000000030.png").write_bytes(b"")  # a zero-byte frame
    import h5py

    with h5py.File(folder / "h5mouse_1.h5", "a") as fh:
        fh["frame"][20] = np.frombuffer(b"not an image at all", dtype=np.uint8)  # an HDF5 frame that is not an image
    lines = (folder / "h5mouse_2.csv").read_text().splitlines()
    (folder / "h5mouse_2.csv").write_text("\n".join(lines[:-1]) + "\n")  # a label CSV one row short
    return folder


def test_check_names_each_bad_store_and_frame(stores, tmp_path):
    folder = _bad_copy(stores, tmp_path)
    report = check_path(folder, progress=False)
    found = {f.path.rsplit("/", 1)[-1]: f.reason for f in report.findings}
    assert "missing frame number 17" in found["mouse_0"]
    assert "zero-byte frame 000000030.png" in found["mouse_1"]
    assert "frame 20 is not an image" in found["h5mouse_1.h5"]
    assert "has 32 rows but the video has 33 frames" in found["h5mouse_2.h5"]
    assert "mouse_2" not in found, "the good store is not reported"
    assert report.checked == 5
    for one, words in (("mouse_0", "missing frame number 17"), ("h5mouse_1.h5", "frame 20 is not an image")):
        alone = check_path(folder / one, progress=False)  # one store named directly
        assert alone.checked == 1 and [f.reason for f in alone.findings if words in f.reason], alone.findings
    assert check_path(folder / "mouse_2", progress=False).ok


@pytest.mark.process  # frame-store files are read in DALI's worker processes
def test_a_bad_frame_met_while_loading_is_named_or_skipped(stores, tmp_path):
    folder = _bad_copy(stores, tmp_path)
    dataset = VideoDataset.from_folder(folder)
    ids = {p.rsplit("/", 1)[-1]: i for i, p in enumerate(dataset.paths)}
    assert set(dataset.problems) == {ids["mouse_0"], ids["mouse_1"], ids["h5mouse_2.h5"]}, "seen by the index"
    with pytest.raises(DatasetError, match=r"3 video\(s\) .* cannot be used: .*missing frame number 17"):
        _loader(dataset, False)
    loader = _loader(dataset, False, on_bad_sample="skip")
    list(loader)  # evaluation reads every clip, so it meets frame 20 of h5mouse_1.h5
    assert "frame 20 is not an image" in loader.skipped[ids["h5mouse_1.h5"]]
    assert {int(v) for b in loader for v in b.video_ids} == {ids["mouse_2"]}, "the next epoch leaves it out"
    good = tmp_path / "one_bad"
    good.mkdir()
    for name in ("h5mouse_1.h5", "h5mouse_1.csv"):
        shutil.copy(folder / name, good)
    with pytest.raises(BadSampleError) as info:
        list(_loader(VideoDataset.from_folder(good), False))
    assert (
        info.value.problems[0][0].endswith("h5mouse_1.h5") and "frame 20 is not an image" in info.value.problems[0][1]
    )


@pytest.mark.gpu
@pytest.mark.process  # frame-store files are read (CPU: JPEGs decoded) in DALI's worker processes
def test_nvjpeg_reads_the_same_clips_as_the_cpu_decoder(stores):
    for form in ("folder", "hdf5", "folder_jpg_hand"):
        dataset = VideoDataset.from_folder(stores / form)
        gpu = _loader(dataset, True, seed=3, device=DeviceChoice("gpu", 0, "test"))
        assert _read(gpu, stride=1) == _read(_loader(dataset, True, seed=3), stride=1), form


@pytest.mark.process
@pytest.mark.parametrize(("store", "image_format"), [("folder", "jpeg"), ("hdf5", "png"), ("hdf5", "jpeg")])
def test_prepare_writes_frame_stores_that_read_exactly(stores, tmp_path, store, image_format):
    from vidio.read import VideoReader

    from gpufeed.pipelines import PrepareOptions, prepare_videos

    options = PrepareOptions(store=store, image_format=image_format, probe_clips=3)
    report = prepare_videos(stores / "mp4", tmp_path / "out", options, progress=False)
    assert report.ok, report.table()
    assert [v.gop_after for v in report.videos] == [1.0] * 3, "every frame stands alone"
    assert all(v.ms_per_clip_before > 0 and v.ms_per_clip_after > 0 for v in report.videos)
    assert "ms/clip after" in report.table()
    dataset = VideoDataset.from_folder(tmp_path / "out")
    assert not dataset.problems and [i.store for i in dataset.infos] == [store] * 3
    assert {i.codec for i in dataset.infos} == {image_format}
    clips = _read(_loader(dataset, True, seed=7, stride=2), stride=2)
    assert clips == _read(_loader(VideoDataset.from_folder(stores / "mp4"), True, seed=7, stride=2), stride=2)
    with VideoReader(dataset.paths[0]) as reader:  # DeepEthogram reads what prepare wrote
        assert frame_tags(torch.as_tensor(reader.read(12)).permute(2, 0, 1)[None], "TCHW") == [(12, 0)]


def test_label_columns_are_matched_by_name_and_the_odd_video_is_the_one_named(stores, tmp_path):
    """The first video's columns were the reference: one reordered CSV, listed first, blamed every other video."""
    shutil.copytree(stores / "folder", tmp_path / "v")
    straight = VideoDataset.from_folder(tmp_path / "v")
    assert not straight.problems and len(straight.behaviours) > 1
    odd, last = tmp_path / "v" / "mouse_0.csv", tmp_path / "v" / "mouse_2.csv"
    odd.write_text(odd.read_text().replace(straight.behaviours[0], "sniff", 1))
    rows = [line.split(",") for line in last.read_text().splitlines()]
    last.write_text("\n".join(",".join([r[0], *r[1:][::-1]]) for r in rows) + "\n")  # frame, columns reversed
    data = VideoDataset.from_folder(tmp_path / "v")
    assert data.behaviours == straight.behaviours
    np.testing.assert_array_equal(data.labels[2], straight.labels[2])  # read by name
    assert list(data.problems) == [0], data.problems
    assert (
        data.problems[0].startswith("label columns ['sniff', ") and "differ from 2 other video(s)'" in data.problems[0]
    )
