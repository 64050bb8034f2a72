"""Every dataset root at ``s3://bucket/prefix`` (moto's server on 127.0.0.1) reads as the same files on local disk.

The synthetic dataset is uploaded once per module; each test indexes or loads the bucket copy and
the local copy through the code users call, and compares them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _s3server import upload_tree

from gpufeed.config import SizePx
from gpufeed.core._storage import S3Path
from gpufeed.pipelines import ImageDataset, ImageLoader

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def s3_synth(s3_server, synth_dir) -> S3Path:
    """The session's synthetic dataset, copied into a bucket of its own (``s3://.../synth``)."""
    from gpufeed.core import _s3

    bucket = S3Path("s3://gpufeed-synth-datasets")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    upload_tree(synth_dir, bucket / "synth")
    return bucket / "synth"


def _relative(paths, root) -> list[str]:
    return [str(p)[len(str(root)) + 1 :] for p in paths]


@pytest.mark.parametrize("kind", ["folder", "list"])
def test_an_image_index_of_a_bucket_is_the_index_of_the_same_files(kind, synth_dir, s3_synth):
    if kind == "folder":
        local = ImageDataset.from_folder(synth_dir / "images" / "train")
        remote = ImageDataset.from_folder(str(s3_synth / "images" / "train"))
    else:
        local = ImageDataset.from_list(synth_dir / "images" / "train.txt")
        remote = ImageDataset.from_list(s3_synth / "images" / "train.txt")
    assert remote.paths[0].startswith("s3://gpufeed-synth-datasets/synth/images/")
    assert _relative(remote.paths, s3_synth) == _relative(local.paths, synth_dir)
    assert remote.classes == local.classes
    assert np.array_equal(remote.labels, local.labels)  # exact: integer labels
    assert np.array_equal(remote.sizes, local.sizes)  # exact: integer sizes from the same headers
    assert remote.problems == local.problems


def test_an_image_loader_reads_a_bucket_through_dali_as_it_reads_the_folder(synth_dir, s3_synth):
    """DALI's own S3 reading (fn.io.file.read on s3:// URLs): the same batches, pixel for pixel."""
    args = {"batch_size": 16, "size_px": 48, "train": False, "device": "cpu", "num_threads": 2}
    local = ImageLoader(synth_dir / "images" / "val", **args)
    remote = ImageLoader(f"{s3_synth}/images/val", **args)
    try:
        batches = list(zip(local, remote, strict=True))
    finally:
        local.close()
        remote.close()
    assert len(batches) == 2
    for mine, theirs in batches:
        assert torch.equal(mine.sample_ids, theirs.sample_ids)  # exact: integer ids
        assert torch.equal(mine.images, theirs.images)  # exact: the same decoder on the same bytes


FRAMES = (40, 33)  # frames of videos 0 and 1


@pytest.fixture(scope="module")
def s3_stores(s3_server, tmp_path_factory):
    """Tagged videos as h264 mp4, frame folders (PNG, JPEG) and HDF5 files: local, and copied into a bucket."""
    from videohelp import encode_tagged_video, write_tagged_store

    from gpufeed.core import _s3

    root = tmp_path_factory.mktemp("s3stores")
    for video, frames in enumerate(FRAMES):
        name = f"mouse_{video}"
        encode_tagged_video(root / "mp4" / f"{name}.mp4", video, frames, options={"g": "15", "sc_threshold": "0"})
        write_tagged_store(root / "folder" / name, video, frames)
        write_tagged_store(root / "folder_jpg" / name, video, frames, ext=".jpg", by="hand")
        write_tagged_store(root / "hdf5" / f"{name}.h5", video, frames)
    bucket = S3Path("s3://gpufeed-synth-stores")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    upload_tree(root, bucket / "stores")
    return root, bucket / "stores"


def _clips(loader) -> list[tuple[int, int, list]]:
    from videohelp import frame_tags

    out = []
    for batch in loader:
        for k in range(len(batch)):
            video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
            assert frame_tags(batch.clips[k], "CTHW") == [(start + t, video) for t in range(11)], "exactly those frames"
            out.append((video, start, batch.frame_labels[k].tolist()))
    return out


@pytest.mark.parametrize("form", ["mp4", "folder", "folder_jpg", "hdf5"])
def test_videos_and_frame_stores_in_a_bucket_give_the_clips_of_the_same_files(form, s3_stores):
    """Encoded videos through PyAV's ranged reads, frame folders and HDF5 files (h5py on a ranged-read file)."""
    from gpufeed.config import LoaderConfig, VideoConfig
    from gpufeed.pipelines import ClipLoader, VideoDataset

    local_root, remote_root = s3_stores
    local = VideoDataset.from_folder(local_root / form)
    remote = VideoDataset.from_folder(remote_root / form)
    assert not remote.problems, remote.problems
    assert remote.paths[0].startswith(str(remote_root / form))
    assert remote.num_frames.tolist() == list(FRAMES) == local.num_frames.tolist()
    assert [i.keyframes for i in remote.infos] == [i.keyframes for i in local.infos]
    args = {
        "train": True,
        "seed": 3,
        "device": "cpu",
        "video_cfg": VideoConfig(clip_length_frames=11, size_px=[48, 32]),
        "loader_cfg": LoaderConfig(batch_size=4, num_threads=2, last_batch="partial"),
    }
    read_remote = ClipLoader(remote, **args)
    assert read_remote.source == ("pyav" if form == "mp4" else "frames")
    assert _clips(read_remote) == _clips(ClipLoader(local, **args))


def test_a_deepethogram_project_in_a_bucket_reads_as_on_disk_and_its_records_stay_inside(s3_server, tmp_path):
    from videohelp import make_deepethogram_project

    from gpufeed.core import _s3
    from gpufeed.pipelines import DatasetError
    from gpufeed.pipelines._deepethogram import project_dataset, read_project

    project = make_deepethogram_project(tmp_path / "proj_deepethogram", "hdf5", (30, 24, 28))
    bucket = S3Path("s3://gpufeed-deg-project")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    upload_tree(project, bucket / "proj")
    for split in ("train", "val"):
        local = project_dataset(project, split=split, val_fraction=0.4, seed=1)
        remote = project_dataset(bucket / "proj", split=split, val_fraction=0.4, seed=1)
        assert not remote.problems and remote.behaviours == local.behaviours
        assert _relative(remote.paths, bucket / "proj") == _relative(local.paths, project)
        for mine, theirs in zip(remote.labels, local.labels, strict=True):
            assert np.array_equal(mine, theirs)  # exact: labels from the CSVs
    # A record naming a key outside the project's prefix is a problem naming the rule, never read.
    record = (project / "DATA" / "mouse00" / "record.yaml").read_text()
    for name, outside in (
        ("up", "../../../elsewhere/secret.h5"),
        ("absolute", "/proc/self/environ"),
        ("url", "s3://gpufeed-deg-project/other/x.h5"),
    ):
        bad = record.replace("mouse00.h5", outside)
        _s3.put_bytes(bucket / "proj" / "DATA" / "mouse00" / "record.yaml", bad.encode())
        found = {r.key: r.problem for r in read_project(bucket / "proj").records}
        assert "outside the project" in (found["mouse00"] or ""), (name, found["mouse00"])
        assert found["mouse01"] is None
    with pytest.raises(DatasetError, match="not a DeepEthogram project"):
        read_project(bucket / "nothing-here")


def test_dense_pairs_in_a_bucket_load_as_the_same_files(synth_dir, s3_synth):
    from gpufeed.pipelines import DenseLoader, PairedDataset

    local = PairedDataset.from_root(synth_dir / "dense" / "val")
    remote = PairedDataset.from_root(s3_synth / "dense" / "val")
    assert _relative(remote.paths, s3_synth) == _relative(local.paths, synth_dir)
    assert remote.kinds == local.kinds and remote.problems == local.problems
    args = {"batch_size": 4, "size_px": 32, "train": False, "device": "cpu", "num_threads": 2}
    pairs = list(zip(DenseLoader(local, **args), DenseLoader(remote, **args), strict=True))
    assert pairs
    for mine, theirs in pairs:
        assert torch.equal(mine.images, theirs.images)  # exact: the same decoder on the same bytes
        for kind in local.kinds:
            assert torch.equal(mine.maps[kind], theirs.maps[kind])  # exact: the same decoder


def test_check_of_a_bucket_finds_what_check_of_the_folder_finds(synth_dir, s3_synth):
    from gpufeed.pipelines import check_path

    local = check_path(synth_dir, progress=False)
    remote = check_path(str(s3_synth), progress=False)
    assert remote.checked == local.checked > 0
    assert sorted(f.path[len(str(s3_synth)) :] for f in remote.findings) == sorted(
        f.path[len(str(synth_dir)) :] for f in local.findings
    )


def test_the_sequential_reader_reads_a_video_in_a_bucket_frame_for_frame(s3_stores):
    """VideoFrameReader (whole videos in order: inference, feature extraction) on an s3:// video."""
    from gpufeed.device import resolve_device
    from gpufeed.pipelines import VideoFrameReader

    local_root, remote_root = s3_stores
    args = {"size_px": SizePx(48, 32), "chunk_frames": 16, "device": resolve_device("cpu")}
    local = list(VideoFrameReader(local_root / "mp4" / "mouse_1.mp4", **args))
    remote_reader = VideoFrameReader(f"{remote_root}/mp4/mouse_1.mp4", **args)
    assert remote_reader.source == "pyav"
    remote = list(remote_reader)
    assert len(remote) == len(local) == 3
    for mine, theirs in zip(remote, local, strict=True):
        assert torch.equal(mine.frame_indices, theirs.frame_indices)  # exact: integer frame indices
        assert torch.equal(mine.frames, theirs.frames)  # exact: the same decoder on the same bytes
