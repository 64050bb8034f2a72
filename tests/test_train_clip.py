"""The clip task on real frames: the synthetic h264 videos decoded with PyAV into ClipBatch tensors.

These tests feed the clip task, the real clip model and the real training step with tensors in
the ClipBatch layout, cut from the decoded videos and labelled from their CSVs, so the task and the
step are tested apart from the loader (``gpufeed.pipelines.ClipLoader``, tested in
``test_clip_loader.py``); nothing here pretends to be the loader.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import numpy as np
import pytest
import torch
from conftest import DEVICES

from gpufeed.config import AugmentConfig, SizePx, TrainConfig
from gpufeed.models import create_model
from gpufeed.synth import read_tag
from gpufeed.train._augment import build_augmenter
from gpufeed.train._optim import build_optimizer, build_scheduler
from gpufeed.train._step import Stepper
from gpufeed.train._tasks import ClipTask, to_channels_last

pytestmark = pytest.mark.timeout(300)

CLIP_FRAMES = 11
HEIGHT, WIDTH = 32, 48  # the 64x96 videos at half size: keeps a ResNet-18 step well under a second


@dataclass(frozen=True)
class ClipBatch:
    """The ClipBatch contract's fields (what ClipLoader yields)."""

    clips: torch.Tensor  # uint8 (N, 3, T, H, W)
    frame_labels: torch.Tensor  # float32 (N, T, K)
    centre_labels: torch.Tensor  # float32 (N, K)
    video_ids: torch.Tensor  # int64 (N,)
    start_frames: torch.Tensor  # int64 (N,)
    valid: torch.Tensor  # bool (N,)


@pytest.fixture(scope="module")
def videos(synth_dir):
    """Every synthetic video decoded: [(frames uint8 (F, H, W, 3), labels float32 (F, K))]."""
    out = []
    for path in sorted((synth_dir / "videos").glob("clip_*.mp4")):
        with av.open(str(path)) as container:
            frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        labels = np.loadtxt(path.with_suffix(".csv"), delimiter=",", skiprows=1)[:, 1:].astype(np.float32)
        assert len(frames) == len(labels)
        out.append((frames, labels))
    return out


def make_batch(videos, picks, device="cpu") -> ClipBatch:
    clips, frame_labels, video_ids, starts = [], [], [], []
    for video_id, start in picks:
        frames, labels = videos[video_id]
        window = torch.from_numpy(frames[start : start + CLIP_FRAMES]).permute(0, 3, 1, 2).float()
        small = torch.nn.functional.interpolate(window, size=(HEIGHT, WIDTH), mode="area").round().to(torch.uint8)
        clips.append(small.permute(1, 0, 2, 3))  # (3, T, H, W)
        frame_labels.append(torch.from_numpy(labels[start : start + CLIP_FRAMES]))
        video_ids.append(video_id)
        starts.append(start)
    frame_labels = torch.stack(frame_labels)
    return ClipBatch(
        clips=torch.stack(clips).to(device),
        frame_labels=frame_labels.to(device),
        centre_labels=frame_labels[:, CLIP_FRAMES // 2].to(device),
        video_ids=torch.tensor(video_ids, device=device),
        start_frames=torch.tensor(starts, device=device),
        valid=torch.ones(len(picks), dtype=torch.bool, device=device),
    )


def _picks(videos, rng, count, video_ids):
    return [(v, int(rng.integers(0, len(videos[v][0]) - CLIP_FRAMES))) for v in rng.choice(video_ids, count)]


def test_batches_hold_the_frames_they_claim(videos):
    batch = make_batch(videos, [(1, 40), (2, 7)])
    assert batch.clips.shape == (2, 3, CLIP_FRAMES, HEIGHT, WIDTH) and batch.clips.dtype == torch.uint8
    for row, (video_id, start) in enumerate([(1, 40), (2, 7)]):
        for t in range(CLIP_FRAMES):
            tag = read_tag(batch.clips[row, :, t], "CHW")
            assert (tag.ident, tag.aux) == (start + t, video_id), "frame index and video id drawn in the pixels"


@pytest.mark.parametrize("device", DEVICES)
def test_clip_task_learns_behaviours_from_real_frames(videos, device):
    torch_device = "cuda" if device == "gpu" else "cpu"
    torch.manual_seed(0)
    model = to_channels_last(create_model("clip_resnet18", num_classes=4, size_px=HEIGHT)).to(torch_device)
    task = ClipTask(4, ("background", "groom", "rear", "walk"))
    cfg = TrainConfig(lr=3e-3, warmup_steps=2, schedule="constant")
    optimizer = build_optimizer(model, cfg)
    augment = build_augmenter(AugmentConfig(ops=("color_jitter",)), clips=True).to(torch_device)
    stepper = Stepper(
        model,
        task,
        optimizer,
        build_scheduler(optimizer, 100, cfg),
        augment,
        torch.amp.GradScaler(torch_device, enabled=False),
        amp_dtype=torch.bfloat16 if device == "gpu" else None,
        memory_format=task.input_format(model),
        on_gpu=device == "gpu",
    )
    assert task.input_format(model) is None, "a 2-D network over stacked frames takes the clip as it is"
    rng = np.random.default_rng(0)
    train_picks = [_picks(videos, rng, 8, [0, 1]) for _ in range(16)]

    def f1_on(picks_list):
        metric = task.new_metric()
        model.eval()
        for picks in picks_list:
            batch = make_batch(videos, picks, torch_device)
            metric.update(stepper.predict(model, batch), batch.centre_labels, batch.valid)
        model.train()
        return metric.compute()

    before = f1_on(train_picks[:4])
    outcomes = [stepper(make_batch(videos, picks, torch_device)) for picks in train_picks]
    after = f1_on(train_picks[:4])
    losses = [o.loss for o in outcomes]
    assert all(o.samples == 8 and o.compute_s > 0 and o.augment_s > 0 for o in outcomes)
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    assert after["loss"] < before["loss"] and after["macro_f1"] > (before["macro_f1"] or 0.0) + 0.1, (before, after)
    assert set(after["f1"]) == {"background", "groom", "rear", "walk"} and after["samples"] == 32


def test_clip_loss_uses_the_centre_frame_and_ignores_padding(videos):
    batch = make_batch(videos, [(0, 0), (0, 30), (2, 50)])
    task = ClipTask(4)
    assert torch.equal(task.targets(batch), batch.frame_labels[:, CLIP_FRAMES // 2])
    logits = torch.randn(3, 4)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[:2], batch.centre_labels[:2])
    valid = torch.tensor([True, True, False])
    assert torch.allclose(task.loss(logits, task.targets(batch), valid), expected)
    with pytest.raises(ValueError, match="num_classes must equal the number of behaviours"):
        task.loss(torch.randn(3, 5), task.targets(batch))


@pytest.mark.process
@pytest.mark.parametrize("device", DEVICES)
def test_clip_model_trains_end_to_end_through_the_clip_loader(synth_dir, tmp_path, device):
    """`train()` with a clip model: the real ClipLoader on the synthetic h264 videos (NVDEC on a GPU), eval F1."""
    from train_support import assert_steps_partition, train_config

    from gpufeed.models import load_model
    from gpufeed.synth import BEHAVIOURS
    from gpufeed.train import train
    from gpufeed.train._telemetry import read_step_logs

    videos = str(synth_dir / "videos")
    cfg = train_config(
        synth_dir,
        [
            "model.name=clip_resnet18",
            f"video.train={videos}",
            f"video.val={videos}",
            "video.size_px=32",
            "loader.batch_size=8",
            "train.epochs=2",
            "augment.ops=[]",
        ],
        device=device,
    )
    result = train(cfg, tmp_path / "run")
    assert ("cuda" in result.device) == (device == "gpu")
    assert_steps_partition(read_step_logs(tmp_path / "run")[0], on_cpu=device == "cpu")
    assert result.step > 0 and result.checkpoint is not None
    model = load_model(result.checkpoint)
    assert model.spec.task == "clip" and model.spec.labels == BEHAVIOURS
    assert model.spec.clip_length_frames == 11 and model.spec.size_px == SizePx(32, 32)
    assert result.evaluations and "macro_f1" in result.evaluations[-1]
    steps = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == result.step, "one telemetry line per step"
