"""``loader.pipelines``: several DALI pipelines decode alternate batches, and the loader hands over
exactly what one pipeline hands over: the same batches, pixels and order, over epochs, after a
resume, and around a bad file, which is still named and skipped alone."""

from __future__ import annotations

import logging
import shutil
import zlib

import pytest
import torch
from conftest import DEVICES

from gpufeed.config import ConfigError, ImagePipelineConfig, LoaderConfig, VideoConfig, parse_config
from gpufeed.pipelines import BadSampleError, ClipLoader, ImageDataset, ImageLoader, VideoDataset
from gpufeed.pipelines._alternate import RoundRobin, StreamSlice

pytestmark = pytest.mark.timeout(300)


def _images(dataset, device, pipelines: int, *, train=True, **kw):
    kw.setdefault("last_batch", "partial")
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=40),
        loader_cfg=LoaderConfig(batch_size=6, num_threads=2, pipelines=pipelines, **kw),
        device=device,
        seed=5,
    )


def _epoch(loader) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    return [(b.sample_ids.cpu(), b.labels.cpu(), b.images.cpu(), b.valid.cpu()) for b in loader]


def _same(got, want) -> None:
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        # exact: the same graph on the same device decodes the same batch, whichever pipeline runs it
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"batch {k}"


def test_a_slice_and_turns_take_every_pth_batch_in_order():
    stream = list(range(10))
    assert [StreamSlice(stream, 1, 3)[k] for k in range(3)] == [1, 4, 7]
    with pytest.raises(ValueError, match=r"offset 3 is not in \[0, 3\)"):
        StreamSlice(stream, 3, 3)
    turns = RoundRobin([iter("ace"), iter("bdf")])
    assert "".join(turns) == "abcdef"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("pipelines", [2, 3])
def test_several_pipelines_hand_over_one_pipelines_batches(train_set, device, pipelines):
    """Three epochs (a short last batch each) from P pipelines equal one pipeline's, batch for batch."""
    one, several = _images(train_set, device, 1), _images(train_set, device, pipelines)
    for epoch in range(3):
        one.set_epoch(epoch)
        several.set_epoch(epoch)
        _same(_epoch(several), _epoch(one))
    assert several.pipeline_builds == 1 and several.parallel_pipelines == pipelines
    several.close()
    one.close()


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_every_pipeline_starts_decoding_with_the_first_batch(train_set, device):
    # DALI calls a feed when it schedules that pipeline's runs: every feed was called for batch 0.
    loader = _images(train_set, device, 3)
    iterator = iter(loader)
    next(iterator)
    feeds = loader._session.resources
    assert len(feeds) == 3
    assert all(feed._ahead is not None for feed in feeds), "a pipeline waited for its first turn to start"
    loader.close()


def test_a_resume_continues_as_one_pipeline_would(train_set):
    """Stopped after three batches, a loader of two pipelines resumed from its state (or from a
    one-pipeline loader's) gives the rest of the epoch as an unbroken one-pipeline loader does."""
    want = _epoch(_images(train_set, "cpu", 1))
    for before in (1, 2):
        first = _images(train_set, "cpu", before)
        batches = iter(first)
        head = [next(batches) for _ in range(3)]
        state = first.state_dict()
        resumed = _images(train_set, "cpu", 2)
        resumed.load_state_dict(state)
        got = [(b.sample_ids, b.labels, b.images, b.valid) for b in head] + _epoch(resumed)
        _same(got, want)


def test_a_bad_file_is_named_and_skipped_alone(synth_dir, tmp_path):
    root = tmp_path / "train"
    shutil.copytree(synth_dir / "images" / "train", root)
    victim = sorted(root.rglob("*.png"))[9]  # in the second pipeline's first batch
    data = bytearray(victim.read_bytes())
    # Damaged pixels behind a right CRC: the index passes it, the decoder fails on it.
    kind = data.index(b"IDAT")
    end = kind + 4 + int.from_bytes(data[kind - 4 : kind], "big")
    data[kind + 8 : kind + 48] = bytes(b ^ 0x5A for b in data[kind + 8 : kind + 48])
    data[end : end + 4] = zlib.crc32(bytes(data[kind:end])).to_bytes(4, "big")
    victim.write_bytes(bytes(data))
    dataset = ImageDataset.from_folder(root)
    bad = dataset.paths.index(str(victim))
    with pytest.raises(BadSampleError) as info:
        list(_images(dataset, "cpu", 2, train=False))
    assert [path for path, _ in info.value.problems] == [str(victim)], "only the bad file is named"
    skipping = _images(dataset, "cpu", 2, train=False, on_bad_sample="skip")
    ids = [i for batch in skipping for i in batch.sample_ids[batch.valid].tolist()]
    assert sorted(ids) == [i for i in range(len(dataset)) if i != bad] and list(skipping.skipped) == [bad]


def test_the_key_is_checked_and_the_clip_loader_says_it_reads_one(synth_dir, caplog):
    with pytest.raises(ConfigError, match=r"loader\.pipelines"):
        parse_config({"loader": {"pipelines": 0}})
    caplog.set_level(logging.WARNING, "gpufeed")
    ClipLoader(
        VideoDataset.from_folder(synth_dir / "videos"),
        train=False,
        video_cfg=VideoConfig(clip_length_frames=5, size_px=32, decoder="pyav"),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=1, pipelines=2),
        device="cpu",
    ).close()
    assert "loader.pipelines: 2 is for the image loader; ClipLoader reads one" in caplog.text
