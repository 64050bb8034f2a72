"""Tar shards in object storage (moto's S3 server on 127.0.0.1): written there, read there as on disk."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _s3server import upload_tree

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.core import _s3
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, ImageDataset, ImageLoader, VideoDataset, check_path
from gpufeed.pipelines._prepare_shards import write_clip_shards, write_image_shards
from gpufeed.pipelines._shards import read_manifest

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

CPU = DeviceChoice("cpu", None, "test")


def test_image_shards_written_into_a_bucket_load_as_the_local_ones(synth_dir, tmp_path, s3_bucket):
    source = ImageDataset.from_folder(synth_dir / "images" / "val")
    local = tmp_path / "shards"
    write_image_shards(source, local, shard_bytes=40_000)
    report = write_image_shards(source, s3_bucket / "shards", shard_bytes=40_000)  # through a local folder, uploaded
    assert report.out == str(s3_bucket / "shards") and report.samples == len(source)
    with pytest.raises(FileExistsError, match=rf"^{s3_bucket}/shards already holds shards \(shards\.json\)"):
        write_image_shards(source, s3_bucket / "shards", shard_bytes=40_000)  # old readers would read new tars
    for name in [p.name for p in local.iterdir()]:
        assert _s3.read_object(s3_bucket / "shards" / name) == (local / name).read_bytes(), name  # exact: bytes
    remote = ImageDataset.from_folder(str(s3_bucket / "shards"))
    assert remote.paths[0].startswith(f"{s3_bucket}/shards/shard-000000.tar#")
    args = {"batch_size": 8, "size_px": 40, "train": True, "device": CPU, "num_threads": 2, "seed": 4}
    before = _s3.fetch_stats()
    pairs = list(zip(ImageLoader(local, **args), ImageLoader(remote, **args), strict=True))
    spent = _s3.fetch_stats() - before
    assert len(pairs) == 4
    for mine, theirs in pairs:
        assert torch.equal(mine.sample_ids, theirs.sample_ids)  # exact: integer ids
        assert torch.equal(mine.images, theirs.images)  # exact: the same decoder on the same bytes
    # One ranged read per image, never a whole shard (DALI prefetches into the next epoch: more than 32 reads).
    sizes = [row["size"] for row in read_manifest(local).rows]
    assert spent.requests >= 32 and sum(sizes) <= spent.bytes <= spent.requests * max(sizes)


def test_check_of_shards_in_a_bucket_reads_each_member_by_its_range(synth_dir, tmp_path, s3_bucket):
    source = ImageDataset.from_folder(synth_dir / "images" / "val")
    write_image_shards(source, tmp_path / "shards", shard_bytes=40_000)
    upload_tree(tmp_path / "shards", s3_bucket / "checked")
    report = check_path(str(s3_bucket / "checked"), progress=False)
    assert report.checked == len(source) and report.findings == [], report.table()
    assert report.sources == [f"image shards in {s3_bucket}/checked"]


def test_dali_reads_shards_in_a_bucket_with_local_index_files(synth_dir, tmp_path, s3_bucket):
    """DALI's webdataset reader takes s3:// shards (its AWS SDK build); its index files must be local."""
    from nvidia.dali import fn, pipeline_def

    source = ImageDataset.from_folder(synth_dir / "images" / "val")
    local = tmp_path / "shards"
    write_image_shards(source, local, shard_bytes=40_000)
    upload_tree(local, s3_bucket / "wds")
    manifest = read_manifest(local)
    count = len(manifest.rows)

    @pipeline_def(batch_size=count, num_threads=1, device_id=None)
    def graph():
        return fn.readers.webdataset(
            paths=[str(s3_bucket / "wds" / s) for s in manifest.shards],
            index_paths=[str((local / s).with_suffix(".idx")) for s in manifest.shards],
            ext=["cls"],
        )

    pipe = graph()
    pipe.build()
    (labels,) = pipe.run()
    assert [int(bytes(np.array(labels[i])).decode()) for i in range(count)] == source.labels.tolist()


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_clip_shards_in_a_bucket_give_the_clips_of_the_local_ones(tmp_path, s3_bucket, train):
    from videohelp import encode_tagged_video, frame_tags

    for video, frames in enumerate((30, 25)):
        encode_tagged_video(tmp_path / "videos" / f"m_{video}.mp4", video, frames, options={"g": "10"})
    write_clip_shards(VideoDataset.from_folder(tmp_path / "videos"), tmp_path / "shards", shard_bytes=100_000)
    upload_tree(tmp_path / "shards", s3_bucket / "clips")
    manifest = read_manifest(tmp_path / "shards")

    def clips(root) -> list:
        loader = ClipLoader(
            root,
            train=train,
            video_cfg=VideoConfig(clip_length_frames=11, size_px=[48, 32]),
            loader_cfg=LoaderConfig(batch_size=2, num_threads=2, last_batch="partial"),
            device=CPU,
            seed=1,
        )
        out = []
        for batch in loader:
            for k in range(len(batch)):
                row = manifest.rows[int(batch.video_ids[k])]
                video = int(row["source"].split("m_")[1][0])
                tags = [(row["start"] + t, video) for t in range(11)]
                assert frame_tags(batch.clips[k], "CTHW") == tags, "exactly the stored frames"
                out.append((int(batch.video_ids[k]), batch.frame_labels[k].tolist()))
        return out

    remote = clips(str(s3_bucket / "clips"))
    assert remote == clips(tmp_path / "shards") and len(remote) == len(manifest.rows)
