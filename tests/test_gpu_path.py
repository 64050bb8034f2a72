"""The GPU path's costs (issue 25): steps without host syncs, threads and nvJPEG memory per rank.

A queued step is read after the next one is queued (the loop's way); its loss and timings must be
its own, the same as when each step is waited for. On a GPU (``gpu`` mark) a few training steps
and NVDEC clip batches run under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any
host synchronisation torch makes, and the step's CUDA events are reused rather than made anew.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from gpufeed.config import AugmentConfig, LoaderConfig, TrainConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, VideoDataset
from gpufeed.pipelines._epochs import loader_num_threads
from gpufeed.pipelines._image_pipeline import gpu_decoder_options
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
def test_reading_a_step_sleeps_while_the_gpu_works():
    """The training thread waits for a step's end on a blocking event: it sleeps, not spins a core."""
    import time

    from gpufeed.train._telemetry import StageClock

    clock = StageClock(on_gpu=True)
    marks = clock.start()
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on an H100 (cycles)
    marks.mark(1)
    marks.mark(2)
    marks.keep_loss(torch.zeros((), device="cuda"))
    wall, cpu = time.perf_counter(), time.thread_time()
    marks.read()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    assert wall > 0.2, f"the wait took {wall:.3f} s: the GPU's sleep was too short to tell"
    assert cpu < 0.25 * wall, f"{cpu:.3f} s of CPU in a {wall:.3f} s wait: the thread spun"


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


def test_loader_threads_are_divided_by_local_ranks_and_split_train_val(monkeypatch):
    assert (loader_num_threads(True, 64, 8), loader_num_threads(False, 64, 8)) == (6, 2), "8 ranks, 8 cores each"
    assert (loader_num_threads(True, 16, 1), loader_num_threads(False, 16, 1)) == (12, 4)
    assert loader_num_threads(True, 2, 1) == loader_num_threads(False, 2, 1) == 2, "too few cores to split"
    assert loader_num_threads(True, 4, 8) == loader_num_threads(False, 4, 8) == 1, "never below one"
    # A real loader under torchrun's LOCAL_WORLD_SIZE (this process may use every core of the machine).
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)))
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert loader_num_threads(True) == 6 and loader_num_threads(False) == 2
    # A launcher that bound this process to 8 of 32 cores already divided them.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert loader_num_threads(True) == 6 and loader_num_threads(False) == 2


def test_nvjpeg_buffers_follow_a_high_percentile_not_the_outlier():
    sizes = np.array([(640, 480)] * 199 + [(7296, 5472)])  # one 40 MP outlier among VGA images
    options, reserved = gpu_decoder_options(sizes, 0.9, train=True, num_threads=16)
    assert options["affine"] is False and options["hw_decoder_load"] == 0.9
    assert (options["preallocate_width_hint"], options["preallocate_height_hint"]) == (640, 480)
    assert options["device_memory_padding"] == 16 << 20 and options["host_memory_padding"] == 8 << 20
    assert "256 MiB device (16 thread(s) x 16 MiB) and 256 MiB pinned (2 x 16 x 8 MiB)" in reserved
    assert "640x480 (largest: 39.9 MP)" in reserved
    # Mostly large images: the percentile image sets the size, capped at 4096 x 4096.
    big = np.array([(6000, 4000)] * 50 + [(1000, 1000)] * 50)
    options, reserved = gpu_decoder_options(big, 0.9, train=True, num_threads=4)
    assert options["preallocate_width_hint"] * options["preallocate_height_hint"] <= 4096 * 4096
    assert options["device_memory_padding"] == 48 << 20 and "192 MiB device" in reserved
    # Evaluation keeps DALI's defaults and makes no hardware-decoder preallocation.
    options, reserved = gpu_decoder_options(sizes, 0.9, train=False, num_threads=16)
    assert set(options) == {"hw_decoder_load", "affine"} and "DALI's defaults (evaluation)" in reserved


@pytest.mark.gpu
def test_nvjpeg_memory_with_an_outlier_image(tmp_path):
    """One 40 MP JPEG among small ones: buffers sized for the small ones, the outlier still decodes."""
    from PIL import Image

    from gpufeed.config import ImagePipelineConfig
    from gpufeed.pipelines import ImageDataset, ImageLoader

    for k in range(40):
        folder = tmp_path / ("a" if k % 2 else "b")
        folder.mkdir(exist_ok=True)
        Image.new("RGB", (320, 240), (k * 5, 80, 160)).save(folder / f"{k:02d}.jpg", quality=90)
    Image.new("RGB", (7296, 5472), (200, 30, 30)).save(tmp_path / "a" / "outlier.jpg", quality=80)
    dataset = ImageDataset.from_folder(tmp_path)
    free_before, _ = torch.cuda.mem_get_info()
    loader = ImageLoader(
        dataset,
        train=True,
        image_cfg=ImagePipelineConfig(size_px=64),
        loader_cfg=LoaderConfig(batch_size=8, num_threads=16, last_batch="partial"),
        device=DeviceChoice("gpu", 0, "test"),
    )
    seen = sum(len(batch) for batch in loader)
    used_mib = (free_before - torch.cuda.mem_get_info()[0]) / (1 << 20)
    assert seen == 41 and loader.skipped == {}
    assert "sized for the 99th-percentile image, 320x240" in loader.decoder_memory
    # Sized for the outlier, 16 threads would hold ~1.9 GiB of device buffers before any growth.
    assert used_mib < 1024, f"{used_mib:.0f} MiB of device memory for a 41-image pipeline"


def test_the_cuda_provider_runs_without_tf32_unless_asked():
    from gpufeed.config import parse_config
    from gpufeed.server._runtime import execution_providers

    gpu = DeviceChoice("gpu", 0, "test")
    (name, options), _ = execution_providers("auto", gpu, "fp32", None)
    assert name == "CUDAExecutionProvider" and options["use_tf32"] == 0
    assert execution_providers("cuda", gpu, "fp32", None, tf32=True)[0][1]["use_tf32"] == 1
    trt = execution_providers("tensorrt", gpu, "fp32", None)
    assert trt[1] == ("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0}), "the fallback behind TensorRT too"
    assert parse_config({}).serve.cuda_tf32 is False and parse_config({"serve": {"cuda_tf32": True}}).serve.cuda_tf32


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_augment_op_runs_in_the_amp_dtypes(device, dtype):
    """Every op (Kornia's blur, rotation and erasing included) in bf16/fp16 (bf16 needs Kornia >= 0.9)."""
    from gpufeed.config import AUGMENT_OPS

    torch.manual_seed(0)
    for clips in (False, True):
        shape = (4, 3, 5, 32, 32) if clips else (4, 3, 32, 32)
        augment = build_augmenter(AugmentConfig(ops=AUGMENT_OPS), clips=clips, dtype=dtype).to(device)
        pixels = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
        out = augment(pixels)
        assert out.dtype == torch.uint8 and out.shape == pixels.shape and out.device.type == device
        assert not torch.equal(out, pixels), "the ops changed the pixels"


def test_colour_on_channels_last_3d_clips_matches_and_keeps_the_layout():
    from gpufeed.train._augment import apply_colour

    gen = torch.Generator().manual_seed(0)
    fhwc = torch.randint(0, 256, (3, 5, 8, 8, 3), dtype=torch.uint8, generator=gen)
    clips = fhwc.permute(0, 4, 1, 2, 3)  # what the clip loader hands over
    matrices = torch.rand((3, 3, 4), generator=gen) * torch.tensor([1.2, 1.2, 1.2, 20.0])
    out = apply_colour(clips, matrices)
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(out, apply_colour(clips.contiguous(), matrices))


@pytest.mark.process
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_3d_clip_model_takes_loader_clips_without_a_copy(synth_dir, device):
    """ClipLoader's clips are already channels_last_3d: the 3-D model's input needs no transpose."""
    from gpufeed.models import create_model
    from gpufeed.train._tasks import ClipTask, to_channels_last

    choice = DeviceChoice("gpu", 0, "test") if device == "gpu" else DeviceChoice("cpu", None, "test")
    dataset = VideoDataset.from_folder(synth_dir / "videos")
    loader = ClipLoader(
        dataset,
        train=True,
        video_cfg=VideoConfig(clip_length_frames=11, stride_frames=1, size_px=32),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=2, last_batch="drop"),
        device=choice,
    )
    batch = next(iter(loader))
    torch_device = choice.torch_device
    model = to_channels_last(create_model("r3d_small", num_classes=len(dataset.behaviours), size_px=32))
    model = model.to(torch_device)
    task = ClipTask(len(dataset.behaviours))
    assert task.input_format(model) == torch.channels_last_3d
    cfg = TrainConfig(lr=1e-3, warmup_steps=0, schedule="constant")
    optimizer = build_optimizer(model, cfg)
    stepper = Stepper(
        model,
        task,
        optimizer,
        build_scheduler(optimizer, 10, cfg),
        nn.Identity(),
        torch.amp.GradScaler(torch_device.type, enabled=False),
        amp_dtype=torch.bfloat16 if device == "gpu" else None,
        memory_format=task.input_format(model),
        on_gpu=device == "gpu",
    )
    assert stepper.prepare(batch.clips).data_ptr() == batch.clips.data_ptr(), "no copy into channels_last_3d"
    outcome = stepper(batch)
    assert outcome.samples == 2 and outcome.loss > 0
