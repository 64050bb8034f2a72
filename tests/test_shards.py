"""Tar shards (``gpufeed prepare --shards``): the layout, DALI's webdataset reader on it, and the loaders on it.

Images and clips written as shards read back exactly as their sources (the same bytes, the same
decoder); sample ids are the manifest's rows, so exact resume and every-sample-once hold at any
world size, as for files. The shards in object storage: ``test_shards_s3.py``.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from collections import Counter

import numpy as np
import pytest
import torch

from gpufeed.cli import main
from gpufeed.config import ImagePipelineConfig, LoaderConfig, VideoConfig
from gpufeed.core._storage import member_ref, split_member
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    ClipLoader,
    DatasetError,
    ImageDataset,
    ImageLoader,
    VideoDataset,
    check_path,
    read_image_facts,
)
from gpufeed.pipelines._frame_stores import probe_store
from gpufeed.pipelines._prepare_shards import write_clip_shards, write_image_shards
from gpufeed.pipelines._prepare_stores import store_choices
from gpufeed.pipelines._shards import read_manifest, tar_members
from gpufeed.pipelines._store_kinds import ShardStore, frame_store, store_kind

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")


@pytest.fixture(scope="module")
def image_shards(synth_dir, tmp_path_factory):
    source = ImageDataset.from_folder(synth_dir / "images" / "train")
    out = tmp_path_factory.mktemp("image-shards") / "shards"
    report = write_image_shards(source, out, shard_bytes=60_000)  # small shards: several of them
    return source, out, report


def test_image_shards_hold_every_image_with_its_label_in_order(image_shards):
    source, out, report = image_shards
    assert report.samples == len(source) and report.shards > 2 and not report.skipped
    manifest = read_manifest(out)
    assert manifest.kind == "images" and manifest.names == source.classes
    keys = []
    for shard in manifest.shards:
        with tarfile.open(out / shard) as tar:  # a plain POSIX tar any tool reads
            names = tar.getnames()
            keys += sorted({n.split(".")[0] for n in names})
            assert all(n.endswith((".jpg", ".png", ".cls")) for n in names)
    assert keys == [f"{i:08d}" for i in range(len(source))], "keys are the sample ids, in shard order"
    shards = ImageDataset.from_folder(out)
    assert shards.classes == source.classes
    assert np.array_equal(shards.labels, source.labels)  # exact: integer labels
    assert np.array_equal(shards.sizes, source.sizes)  # exact: integer sizes
    first = shards.paths[0]
    assert "shard-000000.tar#" in first and first.endswith(":00000000.jpg")


def test_an_image_loader_reads_shards_as_it_reads_the_files(image_shards):
    source, out, _ = image_shards
    args = {"batch_size": 16, "size_px": 40, "train": False, "device": CPU, "num_threads": 2}
    pairs = list(zip(ImageLoader(source, **args), ImageLoader(out, **args), strict=True))
    assert len(pairs) == 6
    for files, shards in pairs:
        assert torch.equal(files.sample_ids, shards.sample_ids)  # exact: integer ids
        assert torch.equal(files.labels, shards.labels)  # exact: integer labels
        assert torch.equal(files.images, shards.images)  # exact: the same decoder on the same bytes


def test_check_reads_each_shard_member_from_its_range_of_the_tar_and_finds_a_damaged_one(image_shards, tmp_path):
    _, out, _ = image_shards
    shards = shutil.copytree(out, tmp_path / "shards")
    rows = read_manifest(shards).rows
    whole = check_path(shards, progress=False)
    assert whole.checked == len(rows) and whole.findings == [], whole.table()
    facts = read_image_facts(read_manifest(shards).ref(0))  # the facts of the member's bytes, not of a missing file
    assert facts.problem is None and (facts.width, facts.height) == (rows[0]["width"], rows[0]["height"])
    # A JPEG member cut in half and given a new end marker, in place inside its tar (the manifest unchanged).
    sample = next(i for i, row in enumerate(rows) if row["ext"] == "jpg")
    row = rows[sample]
    tar = shards / read_manifest(shards).shards[row["shard"]]
    data = bytearray(tar.read_bytes())
    half = row["offset"] + row["size"] // 2
    data[half : row["offset"] + row["size"]] = b"\xff\xd9" + bytes(row["size"] - row["size"] // 2 - 2)
    tar.write_bytes(bytes(data))
    damaged = check_path(shards, progress=False)
    assert [f.path for f in damaged.findings] == [read_manifest(shards).ref(sample)], damaged.table()
    assert damaged.findings[0].kind == "image" and "unreadable" not in damaged.findings[0].reason
    assert main(["check", str(shards)]) == 1


def _image_loader(dataset, k: int, n: int) -> ImageLoader:
    return ImageLoader(
        dataset,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=16),
        loader_cfg=LoaderConfig(batch_size=5, last_batch="partial", num_threads=1),
        device=CPU,
        seed=3,
        shard_id=k,
        num_shards=n,
    )


def _resume_across(make, dataset, old: int, new: int, stop: int) -> Counter:
    """Read ``stop`` batches of epoch 1 on ``old`` ranks, resume on ``new`` from all their states, read the rest."""
    before = [make(dataset, k, old) for k in range(old)]
    read: Counter = Counter()
    for loader in before:
        loader.set_epoch(1)
        for i, batch in enumerate(loader):
            read.update(
                batch.sample_ids[batch.valid].tolist() if hasattr(batch, "sample_ids") else batch.video_ids.tolist()
            )
            if i + 1 == stop:
                break
    states = [loader.state_dict() for loader in before]
    for loader in before:
        loader.close()
    for k in range(new):
        after = make(dataset, k, new)
        after.load_state_dict(states)
        for batch in after:
            read.update(
                batch.sample_ids[batch.valid].tolist() if hasattr(batch, "sample_ids") else batch.video_ids.tolist()
            )
        after.close()
    return read


@pytest.mark.parametrize(("old", "new", "stop"), [(4, 2, 2), (2, 1, 3), (1, 2, 5)])
def test_image_shards_resumed_on_another_world_size_read_each_sample_once(image_shards, old, new, stop):
    _, out, _ = image_shards
    dataset = ImageDataset.from_folder(out)
    read = _resume_across(_image_loader, dataset, old, new, stop)
    assert sorted(read) == list(range(len(dataset))) and set(read.values()) == {1}


def test_dali_reads_the_shards_with_their_index_files(image_shards):
    """DALI's own webdataset reader on the layout: every sample, its label, its bytes, in shard order."""
    from nvidia.dali import fn, pipeline_def

    source, out, _ = image_shards
    manifest = read_manifest(out)
    tars = [str(out / s) for s in manifest.shards]
    count = len(manifest.rows)

    @pipeline_def(batch_size=count, num_threads=1, device_id=None)
    def graph():
        image, label = fn.readers.webdataset(
            paths=tars, index_paths=[t[: -len(".tar")] + ".idx" for t in tars], ext=["jpg;png", "cls"]
        )
        return image, label

    pipe = graph()
    pipe.build()
    images, labels = pipe.run()
    got = [int(bytes(np.array(labels[i])).decode()) for i in range(count)]
    assert got == source.labels.tolist()
    for i in (0, 7, count - 1):
        assert bytes(np.array(images[i])) == open(source.paths[i], "rb").read()  # noqa: SIM115  # exact: bytes


def test_prepare_shards_from_the_command_line_and_its_refusals(synth_dir, tmp_path, capsys):
    assert main(["prepare", str(synth_dir / "images" / "val.txt"), "--shards", str(tmp_path / "val")]) == 0
    assert "wrote 32 images sample(s) into 1 shard(s)" in capsys.readouterr().out
    assert main(["prepare", str(synth_dir / "images" / "val.txt"), "--shards", str(tmp_path / "val")]) == 2
    assert "already holds shards" in capsys.readouterr().err
    with pytest.raises(DatasetError, match="holds 'images' samples; expected clips"):
        VideoDataset.from_shards(tmp_path / "val")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "shards.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(DatasetError, match="is not a gpufeed shard manifest"):
        ImageDataset.from_folder(tmp_path / "bad")


def test_tar_members_refuses_a_span_cut_short():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("k.f0000.jpg")
        info.size = 1000
        tar.addfile(info, io.BytesIO(bytes(1000)))
    data = buffer.getvalue()
    assert tar_members(data, "x") == {"k.f0000.jpg": bytes(1000)}  # exact: bytes
    with pytest.raises(ValueError, match="runs 488 bytes past the span"):
        tar_members(data[:1024], "x")


# -- clips -------------------------------------------------------------------------------------------
FRAMES = (40, 33)


@pytest.fixture(scope="module")
def clip_shards(tmp_path_factory):
    from videohelp import encode_tagged_video

    root = tmp_path_factory.mktemp("clip-shards")
    for video, frames in enumerate(FRAMES):
        encode_tagged_video(root / "videos" / f"mouse_{video}.mp4", video, frames, options={"g": "15", "crf": "12"})
    source = VideoDataset.from_folder(root / "videos")
    report = write_clip_shards(source, root / "shards", clip_length_frames=11, stride_frames=1, shard_bytes=150_000)
    return source, root / "shards", report


def _clip_loader(dataset, k: int, n: int, train: bool = True) -> ClipLoader:
    return ClipLoader(
        dataset,
        train=train,
        video_cfg=VideoConfig(clip_length_frames=11, size_px=[48, 32]),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=2, last_batch="partial"),
        device=CPU,
        seed=5,
        shard_id=k,
        num_shards=n,
    )


@pytest.mark.process  # the frames are read in DALI's worker processes
def test_clip_shards_give_each_stored_clip_whole_with_its_labels(clip_shards):
    from videohelp import frame_tags

    source, out, report = clip_shards
    # Evaluation clips of 40 and 33 frames: starts 0, 11, 22, 29 and 0, 11, 22.
    assert report.samples == 7 and report.shards >= 2 and not report.skipped
    manifest = read_manifest(out)
    shards = VideoDataset.from_folder(out)
    assert shards.behaviours == source.behaviours and len(shards) == 7
    loader = _clip_loader(shards, 0, 1, train=False)
    assert loader.source == "frames" and len(loader.table) == 7, "one clip slot per stored clip"
    seen = []
    for batch in loader:
        for k in range(len(batch)):
            clip = int(batch.video_ids[k])
            row = manifest.rows[clip]
            video = int(row["source"].split("mouse_")[1][0])
            start = int(row["start"])
            assert int(batch.start_frames[k]) == 0
            assert frame_tags(batch.clips[k], "CTHW") == [(start + t, video) for t in range(11)], "exactly those frames"
            expected = source.labels[video][start : start + 11]
            assert np.array_equal(batch.frame_labels[k].numpy(), expected)  # exact: labels, not pixels
            seen.append(clip)
    assert seen == list(range(7))


@pytest.mark.process  # the frames are read in DALI's worker processes
@pytest.mark.parametrize(("old", "new", "stop"), [(2, 1, 1), (1, 2, 2)])
def test_clip_shards_resumed_on_another_world_size_read_each_clip_once(clip_shards, old, new, stop):
    _, out, _ = clip_shards
    dataset = VideoDataset.from_folder(out)
    read = _resume_across(_clip_loader, dataset, old, new, stop)
    assert sorted(read) == list(range(len(dataset))) and set(read.values()) == {1}


def test_a_clip_in_a_shard_is_a_frame_store_kind_probed_from_its_span(clip_shards):
    _, out, _ = clip_shards
    shards = VideoDataset.from_folder(out)
    for info in shards.infos:
        assert store_kind(info.path) == info.store and isinstance(frame_store(info.store), ShardStore)
        facts = probe_store(info.path)  # one ranged read of the span: what the manifest says
        assert facts.problem is None, facts.problem
        assert (facts.codec, facts.width, facts.height, facts.num_frames, facts.frame_name) == (
            info.codec,
            info.width,
            info.height,
            info.num_frames,
            info.frame_name,
        )
    tar, offset, size, _key = split_member(shards.infos[0].path)
    assert "without a gap" in probe_store(member_ref(tar, offset, size, "99999999")).problem
    assert "shard" not in store_choices(), "prepare --shards writes shards, not prepare --store"
