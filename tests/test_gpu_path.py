"""The GPU path's costs (issue 25): steps without host syncs, and the parts testable on the CPU.

A queued step is read after the next one is queued (the loop's way); its loss and timings must be
its own, the same as when each step is waited for. On a GPU (``gpu`` mark) a few training steps
and NVDEC clip batches run under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any
host synchronisation torch makes, and the step's CUDA events are reused rather than made anew.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpufeed.config import AugmentConfig, LoaderConfig, TrainConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, VideoDataset
from gpufeed.train._augment import build_augmenter
from gpufeed.train._optim import build_optimizer, build_scheduler
from gpufeed.train._step import Stepper
from gpufeed.train._tasks import ImageTask

pytestmark = pytest.mark.timeout(300)


class _Net(nn.Module):
    """A tiny classifier on uint8 pixels, as gpufeed's models take them."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(3, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.layers(pixels.float() / 255.0)


def _stepper(device: str, amp_dtype=None) -> Stepper:
    torch.manual_seed(0)
    model = _Net().to(device)
    cfg = TrainConfig(lr=1e-2, warmup_steps=0, schedule="constant")
    optimizer = build_optimizer(model, cfg)
    return Stepper(
        model,
        ImageTask(4),
        optimizer,
        build_scheduler(optimizer, 100, cfg),
        build_augmenter(AugmentConfig(ops=("horizontal_flip",)), clips=False).to(device),
        torch.amp.GradScaler(device, enabled=False),
        amp_dtype=amp_dtype,
        on_gpu=device == "cuda",
    )


class _Batch:
    def __init__(self, seed: int, device: str) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8, generator=gen).to(device)
        self.labels = torch.randint(0, 4, (6,), generator=gen).to(device)
        self.valid = torch.ones(6, dtype=torch.bool, device=device)


def _queued_losses(device: str, amp_dtype=None) -> tuple[list[float], list[float]]:
    """Losses of 5 steps read one step late (as the loop does), and of the same steps waited for."""
    batches = [_Batch(k, device) for k in range(5)]
    late, queued = [], None
    stepper = _stepper(device, amp_dtype)
    for batch in batches:
        launched = stepper.launch(batch)
        if queued is not None:
            late.append(queued.result())
        queued = launched
    late.append(queued.result())
    stepper = _stepper(device, amp_dtype)
    waited = [stepper(batch) for batch in batches]
    assert all(o.samples == 6 and o.compute_s > 0 for o in late)
    return [o.loss for o in late], [o.loss for o in waited]


def test_a_step_read_late_reports_its_own_loss():
    late, waited = _queued_losses("cpu")
    assert late == waited and len(set(late)) == 5, "each step's own loss, not the next step's"


@pytest.mark.gpu
def test_training_steps_make_no_host_sync_and_reuse_events():
    late, waited = _queued_losses("cuda", torch.bfloat16)
    assert late == pytest.approx(waited, rel=1e-3, abs=1e-3)
    stepper = _stepper("cuda", torch.bfloat16)
    batches = [_Batch(k, "cuda") for k in range(6)]
    stepper(batches[0])  # warm: kernels, allocator and the first set of events
    torch.cuda.synchronize()
    queued = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            queued.append(stepper.launch(batch))  # raises if anything in a step waits for the GPU
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(p.result().loss > 0 for p in queued)
    before = stepper.clock.events_created
    for batch in batches:
        queued = stepper.launch(batch)
        queued.result()
    assert stepper.clock.events_created == before, "a step's events are reused, not made anew"


@pytest.mark.gpu
def test_nvdec_clip_batches_make_no_host_sync(synth_dir):
    loader = ClipLoader(
        VideoDataset.from_folder(synth_dir / "videos"),
        train=True,
        video_cfg=VideoConfig(clip_length_frames=5, stride_frames=1, size_px=32, decoder="dali"),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=2, last_batch="partial"),
        device=DeviceChoice("gpu", 0, "test"),
    )
    iterator = iter(loader)
    next(iterator)  # the pipeline's build and first run are allowed to wait
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = [next(iterator) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(b.clips.is_cuda and b.clips.shape[1:] == (3, 5, 32, 32) for b in batches)
