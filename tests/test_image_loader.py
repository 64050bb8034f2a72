"""The DALI image pipeline and loader, on real JPEG/PNG files, on each available device."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import DEVICES
from PIL import Image

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.pipelines import BadSampleError, DatasetError, ImageDataset, ImageLoader
from gpufeed.pipelines._windows import train_windows
from gpufeed.synth import CLASS_WORDS, read_tag

pytestmark = pytest.mark.timeout(300)  # a pipeline that hangs fails instead of blocking CI


def _loader(dataset, device, train, size=64, batch=8, last_batch="partial", shuffle=True, seed=0, **kw):
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=size),
        loader_cfg=LoaderConfig(batch_size=batch, last_batch=last_batch, shuffle=shuffle, num_threads=2, **kw),
        device=device,
        seed=seed,
    )


def _sharded(dataset, device, train, shard, shards, **kw):
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=5, last_batch="partial", num_threads=2),
        device=device,
        shard_id=shard,
        num_shards=shards,
        **kw,
    )


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_eval_round_trip_is_exact(val_set, device):
    loader = _loader(val_set, device, train=False, batch=6)
    seen = []
    for batch in loader:
        assert batch.images.dtype == torch.uint8 and batch.labels.dtype == torch.int64
        assert batch.images.device.type == ("cuda" if device.is_gpu else "cpu")
        assert batch.images.shape[1:] == (3, 64, 64), "NCHW"
        assert batch.images.is_contiguous(memory_format=torch.channels_last)
        for image, sample_id, label in zip(batch.images, batch.sample_ids.tolist(), batch.labels.tolist(), strict=True):
            tag = read_tag(image, "CHW")
            assert tag.ident == sample_id, "the pixels are those of the named sample"
            assert tag.aux == CLASS_WORDS[label], "the label matches the pixels"
            assert label == val_set.labels[sample_id]
            seen.append(sample_id)
    assert seen == list(range(len(val_set))), "evaluation reads every sample once, in order"
    assert len(loader) == -(-len(val_set) // 6)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("train", [False, True])
def test_two_shards_see_each_sample_exactly_once_per_epoch(train_set, device, train):
    shards = [_sharded(train_set, device, train, k, 2) for k in range(2)]
    for _epoch in range(2):
        ids = [i for loader in shards for batch in loader for i in batch.sample_ids.tolist()]
        assert sorted(ids) == list(range(len(train_set)))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_same_seed_same_order_and_pixels(train_set, device):
    def run(seed):
        loader = _loader(train_set, device, train=True, seed=seed)
        batches = list(loader)
        return torch.cat([b.sample_ids.cpu() for b in batches]), torch.cat([b.images.cpu() for b in batches])

    ids_a, px_a = run(1)
    ids_b, px_b = run(1)
    ids_c, _ = run(2)
    # exact: one loader's setup run twice: the same batches decoded by the same decoder
    assert torch.equal(ids_a, ids_b) and torch.equal(px_a, px_b)
    assert not torch.equal(ids_a, ids_c)
    assert sorted(ids_a.tolist()) == list(range(len(train_set)))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_training_crop_flip_and_resize_match_a_pil_reference(train_set, device):
    loader = _loader(train_set, device, train=True, shuffle=False, size=40, batch=16)
    batch = next(iter(loader))
    ids = batch.sample_ids.cpu().numpy()
    windows = train_windows(train_set.sizes[ids], ids, seed=0, epoch=0)
    assert windows.flip.any() and not windows.flip.all(), "this batch exercises both flip states"
    errors = []
    for k, sample_id in enumerate(ids):
        (x, y), (w, h) = windows.anchor[k], windows.shape[k]
        ref = (
            Image.open(train_set.paths[sample_id])
            .convert("RGB")
            .crop((x, y, x + w, y + h))
            .resize((40, 40), Image.BILINEAR)
        )
        ref = np.asarray(ref.transpose(Image.FLIP_LEFT_RIGHT) if windows.flip[k] else ref, dtype=np.float32)
        got = batch.images[k].permute(1, 2, 0).cpu().numpy().astype(np.float32)
        mirrored = np.abs(got[:, ::-1] - ref).mean()
        errors.append((np.abs(got - ref).mean(), mirrored))
    mean_err = np.array(errors)
    # Same window and orientation: small resampling differences only; mirrored is far worse.
    assert mean_err[:, 0].max() < 6.0, mean_err
    assert (mean_err[:, 1] > mean_err[:, 0] + 3.0).all(), mean_err


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_last_batch_policies(train_set, device):
    n = len(train_set)
    drop = _loader(train_set, device, train=True, batch=10, last_batch="drop")
    assert [len(b) for b in drop] == [10] * (n // 10) and len(drop) == n // 10
    partial = _loader(train_set, device, train=True, batch=10, last_batch="partial")
    assert [len(b) for b in partial] == [10] * (n // 10) + [n % 10]
    pad = _loader(train_set, device, train=True, batch=10, last_batch="pad")
    batches = list(pad)
    assert [len(b) for b in batches] == [10] * -(-n // 10)
    valid_ids = torch.cat([b.sample_ids[b.valid].cpu() for b in batches])
    assert sorted(valid_ids.tolist()) == list(range(n))


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_resume_mid_epoch_continues_exactly(train_set, device):
    straight = _loader(train_set, device, train=True, seed=5)
    first = list(straight)
    second = list(straight)  # epoch 1
    reference = [(b.sample_ids.cpu(), b.images.cpu()) for b in first + second]

    stopped = _loader(train_set, device, train=True, seed=5)
    got = []
    for i, batch in enumerate(stopped):
        got.append((batch.sample_ids.cpu(), batch.images.cpu()))
        if i == 4:
            break
    state = stopped.state_dict()
    assert state["epoch"] == 0 and state["batch"] == 5

    resumed = _loader(train_set, device, train=True, seed=5)
    resumed.load_state_dict(state)
    got += [(b.sample_ids.cpu(), b.images.cpu()) for b in resumed]
    got += [(b.sample_ids.cpu(), b.images.cpu()) for b in resumed]
    assert len(got) == len(reference)
    for (ids_a, px_a), (ids_b, px_b) in zip(got, reference, strict=True):
        # exact: the resumed loader decodes the same batches as the reference, on the same decoder
        assert torch.equal(ids_a, ids_b) and torch.equal(px_a, px_b)


def _copy_split(synth_dir, tmp_path):
    root = tmp_path / "train"
    shutil.copytree(synth_dir / "images" / "train", root, ignore=shutil.ignore_patterns(".gpufeed"))
    return root


def _corrupt_png_body(path):
    from gpufeed.synth._damaged import png_with_damaged_data

    path.write_bytes(png_with_damaged_data(path.read_bytes()))  # the CRC still matches


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_corrupt_file_is_named_not_hung(synth_dir, tmp_path, device):
    root = _copy_split(synth_dir, tmp_path)
    victim = sorted(root.rglob("*.png"))[7]
    _corrupt_png_body(victim)  # header and IEND intact: only a full decode finds it
    dataset = ImageDataset.from_folder(root)
    assert not dataset.problems, "the index cannot see body corruption"
    loader = _loader(dataset, device, train=False, batch=8)
    with pytest.raises(BadSampleError) as info:
        for _ in loader:
            pass
    assert str(victim) in str(info.value)
    assert info.value.problems[0][0] == str(victim)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_skip_policy_drops_the_bad_file_and_keeps_the_rest(synth_dir, tmp_path, device):
    root = _copy_split(synth_dir, tmp_path)
    victim = sorted(root.rglob("*.png"))[3]
    _corrupt_png_body(victim)
    dataset = ImageDataset.from_folder(root)
    bad_id = dataset.paths.index(str(victim))
    loader = _loader(dataset, device, train=False, batch=8, on_bad_sample="skip")
    ids = [i for batch in loader for i in batch.sample_ids.tolist()]
    assert sorted(ids) == [i for i in range(len(dataset)) if i != bad_id]
    assert loader.skipped == {bad_id: loader.skipped[bad_id]} and "decode" in loader.skipped[bad_id]
    assert [i for batch in loader for i in batch.sample_ids.tolist()] == ids, "the next epoch skips it too"


def test_truncated_file_is_refused_before_reading(synth_dir, tmp_path):
    root = _copy_split(synth_dir, tmp_path)
    victim = sorted(root.rglob("*.jpg"))[2]
    victim.write_bytes(victim.read_bytes()[:-300])
    dataset = ImageDataset.from_folder(root)
    with pytest.raises(DatasetError, match="truncated JPEG") as info:
        _loader(dataset, device=None, train=True)
    assert str(victim) in str(info.value) and "gpufeed check" in str(info.value)


def test_empty_and_missing_datasets_are_clear_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        ImageDataset.from_folder(tmp_path / "missing")
    (tmp_path / "empty" / "cat").mkdir(parents=True)
    with pytest.raises(DatasetError, match="dataset is empty"):
        ImageDataset.from_folder(tmp_path / "empty")
    with pytest.raises(DatasetError, match="cannot read list file"):
        ImageDataset.from_list(tmp_path / "nope.txt")


def test_batch_larger_than_a_shard_is_explained(train_set):
    from gpufeed.device import DeviceChoice

    with pytest.raises(DatasetError, match="gets no batches"):
        _loader(train_set, DeviceChoice("cpu", None, "test"), train=True, batch=1000, last_batch="drop")


def test_index_is_cached_and_refreshed_when_a_file_changes(synth_dir, tmp_path):
    root = _copy_split(synth_dir, tmp_path)
    first = ImageDataset.from_folder(root)
    assert (root / ".gpufeed" / "images-index.json").is_file()
    victim = sorted(root.rglob("*.png"))[0]
    Image.new("RGB", (33, 21)).save(victim)
    again = ImageDataset.from_folder(root)
    sample_id = again.paths.index(str(victim))
    assert tuple(again.sizes[sample_id]) == (33, 21) != tuple(first.sizes[sample_id])


@pytest.mark.gpu
def test_the_loaders_copy_stream_is_none_of_the_shared_streams_nccl_and_the_server_take(train_set):
    """torch hands out 32 pooled streams in turn; NCCL's and each server lane's come from that pool."""
    from gpufeed.device import DeviceChoice

    loader = _loader(train_set, DeviceChoice("gpu", 0, "test"), train=True, batch=8, shuffle=False)
    next(iter(loader))
    copies = {s.stream.cuda_stream for s in _copy_streams(loader)}
    assert copies, "the GPU loader hands over through SideStreamCopies"
    shared = {torch.cuda.Stream(device=0).cuda_stream for _ in range(64)}  # every stream of the pool
    assert not copies & shared


def _copy_streams(loader):
    from gpufeed.pipelines._pipeline_session import SideStreamCopies

    found, seen, todo = [], set(), [loader]
    while todo:  # the loader's objects, a few levels down, without naming its private attributes
        obj = todo.pop()
        if id(obj) in seen or len(seen) > 5000:
            continue
        seen.add(id(obj))
        if isinstance(obj, SideStreamCopies):
            found.append(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("gpufeed"):
            todo.extend(vars(obj).values())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
    return found
