"""A new frame store kind is one class: a tar file of numbered frames (WebDataset's layout), registered here.

The kind is registered for the test only (the registry is restored after it). The index lists and
probes its files, the sequential reader and the clip loader read exactly their frames, ``gpufeed
check`` decodes every frame and names a bad one the kind's way, and ``gpufeed prepare --store``
writes it; none of them was changed for it.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from videohelp import frame_tags, write_tagged_store

from gpufeed.config import LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import (
    ClipLoader,
    PrepareOptions,
    VideoDataset,
    VideoFrameReader,
    _store_kinds,
    check_path,
    prepare_videos,
)
from gpufeed.pipelines._store_kinds import FrameStore, StoreFacts, store_kinds

CPU = DeviceChoice("cpu", None, "test")
FRAMES = (40, 33)
NAME = "{:09d}.png"


class _TarReader:
    def __init__(self) -> None:
        self._open: dict[str, tarfile.TarFile] = {}

    def read(self, path: str, frame_name: str, frames) -> list[np.ndarray]:
        if path not in self._open:
            self._open[path] = tarfile.open(path)  # noqa: SIM115  # kept open across reads; close() closes it
        tar = self._open[path]
        out = []
        for index in frames:
            member = tar.extractfile(frame_name.format(int(index)))
            if member is None:
                raise ValueError(f"{frame_name.format(int(index))} is not a file in the tar")
            out.append(np.frombuffer(bytearray(member.read()), dtype=np.uint8))
        return out

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


class TarStore(FrameStore):
    """Frames ``000000000.png`` ... as members of one tar file."""

    kind = "tar"
    described = "tar files"
    extensions = (".tar",)

    def probe(self, path: Path) -> StoreFacts:
        from gpufeed.pipelines import read_image_facts

        with tarfile.open(path) as tar:
            names = sorted({m.name for m in tar.getmembers() if m.isfile()})
            first = tar.extractfile(names[0]).read() if names else b""
        if names != [NAME.format(i) for i in range(len(names))] or not names:
            return StoreFacts(self.kind, problem="members are not 000000000.png, 000000001.png, ... without a gap")
        facts = read_image_facts(first)
        return StoreFacts(self.kind, facts.format.lower(), facts.width, facts.height, len(names), NAME)

    def open_reader(self, max_open: int) -> _TarReader:
        return _TarReader()

    def frame_label(self, frame_name: str, index: int) -> str:
        return f"member {frame_name.format(int(index))}"

    def write(self, dst: Path, encoded, ext: str) -> int:
        count = 0
        with tarfile.open(dst, "w") as tar:
            for data in encoded:
                member = tarfile.TarInfo(f"{count:09d}{ext}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                count += 1
        return count


@pytest.fixture
def tar_kind(monkeypatch):
    monkeypatch.setitem(_store_kinds._STORES, "tar", TarStore())
    assert store_kinds()[-1] == "tar"


def _tar_stores(root: Path) -> Path:
    """Two tagged videos (PNG frames) as tar files, their label CSVs beside them."""
    for video, count in enumerate(FRAMES):
        folder = root / "folders" / f"mouse_{video}"
        write_tagged_store(folder, video, count, by="hand", width=64, height=48)
        (root / "tars").mkdir(parents=True, exist_ok=True)
        with tarfile.open(root / "tars" / f"mouse_{video}.tar", "w") as tar:
            for frame in sorted(folder.iterdir()):
                tar.add(frame, arcname=frame.name)
        shutil.copy(root / "folders" / f"mouse_{video}.csv", root / "tars")
    return root / "tars"


def test_a_registered_kind_is_indexed_read_in_order_and_checked(tar_kind, tmp_path):
    tars = _tar_stores(tmp_path)
    dataset = VideoDataset.from_folder(tars)
    assert [(i.store, i.codec, i.num_frames, i.width) for i in dataset.infos] == [("tar", "png", n, 64) for n in FRAMES]
    assert not dataset.problems, dataset.problems
    for video, info in enumerate(dataset.infos):
        reader = VideoFrameReader(info, size_px=SizePx(64, 48), chunk_frames=16, device=CPU)
        assert reader.source == "frames" and "tar files" in reader.decoder_reason
        tags = [tag for chunk in reader for tag in frame_tags(chunk.frames, "TCHW")]
        assert tags == [(i, video) for i in range(info.num_frames)], "every frame once, in order, exactly"
    assert check_path(tars, progress=False).ok
    with tarfile.open(tars / "mouse_1.tar", "a") as tar:  # a later member of the same name wins
        member = tarfile.TarInfo(NAME.format(7))
        member.size = 19
        tar.addfile(member, io.BytesIO(b"not an image at all"))
    report = check_path(tars, progress=False)
    (bad,) = [f for f in report.findings if f.path.endswith("mouse_1.tar")]
    assert bad.reason.startswith("member 000000007.png is not an image"), bad.reason


def test_prepare_writes_the_new_kind(tar_kind, synth_dir, tmp_path):
    options = PrepareOptions(store="tar", image_format="png", probe_clips=2)
    assert options.frame_store is _store_kinds._STORES["tar"]
    report = prepare_videos(synth_dir / "videos", tmp_path / "out", options, False)
    assert report.ok, report.table()
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert [n for n in written if n.endswith(".tar")] == sorted(Path(v.source).stem + ".tar" for v in report.videos)
    dataset = VideoDataset.from_folder(tmp_path / "out")
    assert {i.store for i in dataset.infos} == {"tar"} and not dataset.problems
    assert [i.num_frames for i in dataset.infos] == [v.frames for v in report.videos]


@pytest.mark.process  # the clip loader reads frame stores in DALI's worker processes (forked: they see the kind)
def test_the_clip_loader_reads_exact_clips_of_the_new_kind(tar_kind, tmp_path):
    dataset = VideoDataset.from_folder(_tar_stores(tmp_path))
    loader = ClipLoader(
        dataset,
        train=True,
        video_cfg=VideoConfig(clip_length_frames=5, stride_frames=2, size_px=[64, 48]),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial", worker_start_method="fork"),
        device=CPU,
        seed=1,
    )
    clips = 0
    for batch in loader:
        for k in range(len(batch)):
            video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
            assert frame_tags(batch.clips[k], "CTHW") == [(start + 2 * t, video) for t in range(5)]
            clips += 1
    assert clips == len(loader.table) and loader.source == "frames"
