"""The loaders built like torch's DataLoader: a path, a few keywords, every other setting defaulted.

Real DALI pipelines on the CPU over the synthetic dataset: the short forms yield the batches they
promise, equal to those of the same loader built from config objects; wrong arguments fail naming
the argument and what is allowed; the shard comes from ``torch.distributed`` when it is initialised
(a real process group on torch's ``fake`` backend, which lets one process be rank 1 of 2).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gpufeed.config import ImagePipelineConfig, LoaderConfig, SizePx, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, DenseLoader, ImageDataset, ImageLoader

pytestmark = pytest.mark.timeout(300)
CPU = DeviceChoice("cpu", None, "test")


def test_an_image_loader_from_a_folder_with_three_keywords(synth_dir):
    loader = ImageLoader(synth_dir / "images" / "train", batch_size=8, size_px=32, num_threads=1)
    batch = next(iter(loader))
    assert tuple(batch.images.shape) == (8, 3, 32, 32) and batch.images.dtype == torch.uint8
    # device "auto" on this machine: the CPU unless CUDA and DALI's GPU operators work.
    assert batch.images.device == loader.device.torch_device
    ids = batch.sample_ids.cpu().numpy()
    assert batch.labels.cpu().tolist() == loader.dataset.labels[ids].tolist()
    assert loader.train and loader.cfg.shuffle and loader.num_shards == 1
    assert len(loader.dataset) == 96 and loader.dataset.source.startswith("class folders")


def test_every_other_setting_takes_the_config_default(synth_dir):
    loader = ImageLoader(synth_dir / "images" / "train.txt")  # a list file: ImageDataset.from_list
    assert loader.dataset.source.startswith("list file") and loader.dataset.classes[0] == "amber"
    assert loader.cfg == LoaderConfig() and loader.image_cfg == ImagePipelineConfig()
    assert (loader.batch_size, loader.image_cfg.size_px, loader.train, loader.seed) == (64, SizePx(224, 224), True, 0)
    assert loader.device.kind in ("cpu", "gpu") and "device: auto" in loader.device.reason


def test_the_shortcuts_give_the_batches_of_the_config_objects(synth_dir):
    folder = synth_dir / "images" / "train"
    short = ImageLoader(folder, 8, size_px=40, shuffle=False, num_threads=1, seed=3, device="cpu")
    full = ImageLoader(
        ImageDataset.from_folder(folder),
        train=True,
        image_cfg=ImagePipelineConfig(size_px=40),
        loader_cfg=LoaderConfig(batch_size=8, shuffle=False, num_threads=1),
        device=CPU,
        seed=3,
        shard_id=0,
        num_shards=1,
    )
    for a, b, _ in zip(short, full, range(3), strict=False):
        assert torch.equal(a.sample_ids, b.sample_ids) and torch.equal(a.images, b.images)
    assert short.cfg == full.cfg and short.image_cfg == full.image_cfg


def test_a_shortcut_and_its_config_field_may_agree_or_fill_a_default(synth_dir):
    folder = synth_dir / "images" / "train"
    same = ImageLoader(folder, batch_size=16, loader_cfg=LoaderConfig(batch_size=16, num_threads=1), device="cpu")
    assert same.batch_size == 16 and same.num_threads == 1
    # A config field left at its default gives way to the shortcut; the config's other fields stay.
    filled = ImageLoader(folder, batch_size=8, loader_cfg=LoaderConfig(last_batch="pad"), device="cpu")
    assert filled.batch_size == 8 and filled.last_batch == "pad"


BAD_IMAGE_ARGUMENTS = [
    ({"batch_size": 0}, ValueError, "ImageLoader: argument batch_size=0: value 0 is out of range: must be >= 1"),
    ({"batch_size": "8"}, ValueError, "argument batch_size='8': expected an integer"),
    ({"batch_size": True}, ValueError, "argument batch_size=True: expected an integer"),
    ({"num_threads": -1}, ValueError, "argument num_threads=-1: value -1 is out of range: must be >= 0"),
    ({"shuffle": "yes"}, ValueError, "argument shuffle='yes': expected true or false"),
    ({"size_px": 4}, ValueError, "argument size_px=4"),
    ({"device": "mps"}, ValueError, "argument device='mps' is not allowed; allowed: 'auto', 'gpu', 'cpu', 'cuda'"),
    ({"train": "val"}, ValueError, "argument train='val': expected True (training) or False (evaluation)"),
    ({"train": False, "shuffle": True}, ValueError, "argument shuffle=True applies to training only"),
    (
        {"batch_size": 8, "loader_cfg": LoaderConfig(batch_size=16)},
        ValueError,
        "argument batch_size=8 disagrees with loader_cfg.batch_size=16; give one of them",
    ),
    (
        {"size_px": 32, "image_cfg": ImagePipelineConfig(size_px=(64, 48))},
        ValueError,
        "argument size_px=32 disagrees with image_cfg.size_px=(64, 48)",
    ),
    ({"loader_cfg": {"batch_size": 8}}, TypeError, "loader_cfg must be a gpufeed.config.LoaderConfig, got dict"),
    (
        {"shard_id": 2, "num_shards": 2},
        ValueError,
        "argument shard_id=2 is out of range for num_shards=2: allowed 0..1",
    ),
    (
        {"shard_id": 1},
        ValueError,
        "only shard_id was given, so the loader takes this rank's shard from torch.distributed",
    ),
    ({"num_shards": "2"}, ValueError, "argument num_shards='2': expected an integer or None"),
]


@pytest.mark.parametrize(("kwargs", "error", "words"), BAD_IMAGE_ARGUMENTS)
def test_a_wrong_argument_is_named_with_what_is_allowed(synth_dir, kwargs, error, words):
    with pytest.raises(error) as info:
        ImageLoader(synth_dir / "images" / "train", **kwargs)
    assert words in str(info.value)


def test_a_dataset_of_the_wrong_kind_or_a_missing_folder_is_named(tmp_path):
    with pytest.raises(TypeError, match="ImageLoader: dataset must be a ImageDataset or the path of a folder"):
        ImageLoader(42)
    with pytest.raises(ValueError, match=f"dataset folder {tmp_path / 'nope'} does not exist"):
        ImageLoader(tmp_path / "nope", device="cpu")


def test_a_rank_of_torchrun_without_a_process_group_is_told_to_initialise_it(synth_dir, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"one of WORLD_SIZE=2 ranks.*torch\.distributed, which is not initialised"):
        ImageLoader(synth_dir / "images" / "train", batch_size=8)
    # Asking for the whole dataset explicitly is allowed.
    assert ImageLoader(synth_dir / "images" / "train", batch_size=8, shard_id=0, num_shards=1).num_shards == 1


def test_the_shard_comes_from_torch_distributed_when_it_is_initialised(synth_dir):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    folder = synth_dir / "images" / "train"
    plans = {}
    for rank in (0, 1):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        try:
            loader = ImageLoader(folder, batch_size=8, device="cpu")
            assert (loader.shard_id, loader.num_shards) == (rank, 2)
            plans[rank] = set(loader._plan(0).sample_ids.ravel().tolist())
            if rank == 1:
                with pytest.raises(
                    ValueError, match=r"num_shards=1 leaves torch\.distributed.s rank 1 without a shard"
                ):
                    ImageLoader(folder, batch_size=8, device="cpu", num_shards=1)
        finally:
            dist.destroy_process_group()
        explicit = ImageLoader(folder, batch_size=8, device="cpu", shard_id=rank, num_shards=2)
        assert set(explicit._plan(0).sample_ids.ravel().tolist()) == plans[rank]
    assert plans[0] and plans[1] and not plans[0] & plans[1]


@pytest.mark.process  # PyAV decodes h264 in DALI's worker processes on the CPU
def test_a_clip_loader_from_a_folder_of_videos(synth_dir):
    loader = ClipLoader(synth_dir / "videos", batch_size=2, clip_length_frames=5, size_px=32, num_threads=1)
    try:
        batch = next(iter(loader))
    finally:
        loader.close()
    assert tuple(batch.clips.shape) == (2, 3, 5, 32, 32) and batch.frame_labels.shape[:2] == (2, 5)
    assert loader.video_cfg == VideoConfig(clip_length_frames=5, size_px=32)
    assert batch.behaviours == loader.dataset.behaviours and len(loader.dataset) == 3


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"clip_length_frames": 0}, "ClipLoader: argument clip_length_frames=0: value 0 is out of range: must be >= 1"),
        ({"stride_frames": 1000}, "argument stride_frames=1000: value 1000 is out of range: must be <= 256"),
        (
            {"clip_length_frames": 5, "video_cfg": VideoConfig(clip_length_frames=9)},
            "argument clip_length_frames=5 disagrees with video_cfg.clip_length_frames=9",
        ),
    ],
)
def test_a_wrong_clip_argument_is_named(synth_dir, kwargs, words):
    with pytest.raises(ValueError) as info:
        ClipLoader(synth_dir / "videos", **kwargs)
    assert words in str(info.value)


def test_a_dense_loader_from_a_split_root(synth_dir):
    loader = DenseLoader(synth_dir / "dense" / "train", batch_size=4, size_px=32, num_threads=1, device="cpu")
    batch = next(iter(loader))
    assert tuple(batch.images.shape) == (4, 3, 32, 32) and set(batch.maps) == {"depth", "mask"}
    assert all(tuple(m.shape) == (4, 32, 32) for m in batch.maps.values())


def test_a_loop_that_stops_after_len_batches_gets_the_next_epoch_next(synth_dir):
    """Lightning's Trainer takes len(loader) batches and never asks for one more: no empty epoch follows."""
    loader = ImageLoader(synth_dir / "images" / "train", batch_size=32, size_px=32, device="cpu")
    epochs = []
    for _ in range(3):
        batches = iter(loader)
        epochs.append([next(batches).sample_ids.tolist() for _ in range(len(loader))])
        del batches  # left before StopIteration
    assert [len(e) for e in epochs] == [3, 3, 3] and epochs[0] != epochs[1] != epochs[2]
    # Every batch of the third epoch taken: a checkpoint now resumes at the fourth epoch's start.
    assert loader.state_dict()["epoch"] == 3 and loader.state_dict()["batch"] == 0
    assert loader.pipeline_builds == 1
