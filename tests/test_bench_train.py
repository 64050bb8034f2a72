"""``gpufeed bench train`` in CI size: both tasks run end to end, both loaders feed the same samples,
the DataLoader baselines do the same work as gpufeed's loaders, and every figure reaches the JSON.

No timing is asserted (the figures are for people to read); only what must hold on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICES

from gpufeed.bench._dense_feeds import dense_batch
from gpufeed.bench._train_feeds import PilTrainImages, PyAvSeekClips, clip_batch, copy_stream, image_batch
from gpufeed.bench.clips import make_bench_videos, prepared_bench_videos
from gpufeed.cli import main
from gpufeed.config import ImagePipelineConfig, LoaderConfig, SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ImageDataset, ImageLoader, VideoDataset
from gpufeed.synth import read_tag
from gpufeed.synth._photos import make_bench_images

pytestmark = pytest.mark.timeout(300)

STAGE_FIGURES = ("p50_s", "p95_s", "mean_s", "total_s", "share")
SIDE_FIGURES = (
    "steps",
    "samples",
    "samples_per_s",
    "samples_per_s_wall",
    "loader_wait_share",
    "steady_loader_wait_share",
    "median_wait_s",
    "median_data_s_per_sample",
    "median_data_share",
    "wall_s",
    "device_busy_share",
)
RATIOS = (
    "paired_samples_per_s",
    "median_data_s_per_sample",
    "samples_per_s",
    "samples_per_s_wall",
    "loader_wait_share",
    "steady_loader_wait_share",
    *(f"{stage}_{q}" for stage in ("loader_wait", "augment", "compute", "step") for q in ("p50", "p95")),
)


def _run(tmp_path, capsys, *args: str) -> tuple[dict, str]:
    out_json, out_png = tmp_path / "result.json", tmp_path / "plot.png"
    rc = main(["bench", "train", *args, "--rounds", "1", "--epochs", "2", "--workers", "2", "--json", str(out_json),
               "--plot", str(out_png), "--cache", str(tmp_path / "cache")])  # fmt: skip
    assert rc == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(out_json.read_text()), capsys.readouterr().out


def _check_figures(result: dict, samples_per_epoch: int, steps_per_epoch: int, on_cpu: bool = True) -> None:
    assert result["same_samples_per_epoch"] is True
    for side in ("gpufeed", "dataloader"):
        figures = result["loaders"][side]
        assert figures["samples_per_epoch"] == [[samples_per_epoch, samples_per_epoch]], side
        for name in SIDE_FIGURES:
            assert isinstance(figures[name], (int, float)), (side, name)
        assert figures["steps"] == 2 * steps_per_epoch and figures["samples"] == 2 * samples_per_epoch
        for stage in ("loader_wait_s", "augment_s", "compute_s", "step_s"):
            assert all(isinstance(figures["stages"][stage][k], float) for k in STAGE_FIGURES), (side, stage)
        assert len(figures["first_batch_wait_s"]) == 2 and len(figures["first_batch_wait_vs_median"]) == 2
        steps = figures["per_step"]
        assert [(s["epoch"], s["batch"]) for s in steps] == [(e, b) for e in range(2) for b in range(steps_per_epoch)]
        # The steps are back to back: they add up to the time the side trained (as gpufeed train's do).
        step_total_s, wall_s = figures["stages"]["step_s"]["total_s"], figures["wall_s"]
        assert abs(step_total_s - wall_s) <= 0.05 * wall_s, (side, step_total_s, wall_s)
        for s in steps if on_cpu else ():  # the CPU reads each step at once: its parts are timed inside it
            assert s["step_s"] >= s["loader_wait_s"] + s["augment_s"] + s["compute_s"] - 1e-6, s
        busy = sum(s["augment_s"] + s["compute_s"] for s in steps) / step_total_s
        assert figures["device_busy_share"] == pytest.approx(busy) and 0 < busy < 1 + 1e-9
        # Host launch time: timed on a GPU only (on the CPU launching a step runs it).
        assert all(("launch_s" in s) is not on_cpu for s in steps), side
        assert ("launch_s" in figures["stages"]) is not on_cpu and all(s.get("launch_s", 1) > 0 for s in steps)
        # Of it, the thread's CPU time: what queueing took less any wait for Python's lock.
        assert all(0 < s["launch_cpu_s"] <= s["launch_s"] + 1e-3 for s in steps if not on_cpu), side
        assert (figures["launch_cpu_p50_s"] is None) is on_cpu
    assert set(RATIOS) <= set(result["ratios"])
    assert all(isinstance(result["ratios"][k], float) for k in RATIOS)
    targets = {t["name"]: t for t in result["targets"]}
    assert set(targets) == {
        "cpu_wait_no_higher",
        "cpu_samples_per_s_1_2x",
        "cpu_epoch2_first_batch",
        "gpu_wait_under_5pct",
    }
    # Images and clips run one side's whole round, then the other's: one pair per round.
    pairs = result["pairs"]
    assert result["chunk_steps"] == 0 and pairs["pairs"] == len(pairs["each"]) == 1
    assert all(p["ratio"] > 0 for p in pairs["each"]) and pairs["p25"] <= pairs["median"] <= pairs["p75"]
    assert all(isinstance(t["holds"], bool) and isinstance(t["applies"], bool) for t in targets.values())


@pytest.mark.process
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_images_run_feeds_both_loaders_the_same_samples(tmp_path, capsys, device):
    result, out = _run(
        tmp_path, capsys, "--device", device.kind, "--images", "40", "--image-size", "96x72", "--batch-size", "8",
        "--size-px", "32", "--classes", "10",
    )  # fmt: skip
    _check_figures(result, samples_per_epoch=40, steps_per_epoch=5, on_cpu=not device.is_gpu)
    assert result["model"] == ("resnet18" if device.is_gpu else "smallcnn")
    assert result["pin_memory"] is device.is_gpu
    for line in ("loader wait, share of step time", "without each epoch's first batch", "epoch 2, first batch",
                 "step p50 / p95", "compute p50 / p95", "augment p50 / p95", "gpufeed / DataLoader", "measured: ",
                 "median of chunk pairs (or rounds)", "data time on the critical path",
                 "targets (measured verdicts", "next(): DALI outputs / schedule / copies / loader p50 (ms)",
                 "augment + compute (the device busy), share"):  # fmt: skip
        assert line in out, line
    assert ("host launch p50 / p95 (ms)" in out) is device.is_gpu
    assert ("host (wait + launch) vs device (augment + compute)" in out) is device.is_gpu
    assert ("host launch on the CPU p50 (ms)" in out) is device.is_gpu
    assert "next(): on the CPU / held off" in out
    pace = result["loaders"]["gpufeed"]["host_vs_device_p50_s"]
    assert pace is None if not device.is_gpu else (len(pace) == 2 and min(pace) > 0)
    phases = result["loaders"]["gpufeed"]["next_phases_p50_s"]
    assert set(phases) == {"dali_outputs", "dali_schedule", "copies", "loader_own", "loader_cpu", "held_off"}
    assert phases["dali_outputs"] > 0 and phases["loader_cpu"] > 0
    assert result["loaders"]["dataloader"]["next_phases_p50_s"] == {}, "a DataLoader has no DALI phases"


@pytest.mark.process
@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_clips_run_feeds_both_loaders_the_same_clips(tmp_path, capsys, device):
    result, out = _run(
        tmp_path, capsys, "--task", "clips", "--device", device.kind, "--videos", "1", "--seconds", "3",
        "--video-size", "128", "--batch-size", "4", "--size-px", "32",
    )  # fmt: skip
    # 90 frames hold 8 or 9 slots of 11-frame clips; last_batch drop keeps two full batches of 4.
    _check_figures(result, samples_per_epoch=8, steps_per_epoch=2, on_cpu=not device.is_gpu)
    assert result["model"] == "r3d_small" and result["clip_length_frames"] == 11
    assert "DataLoader+PyAV" in out


@pytest.mark.process
def test_no_baseline_trains_gpufeed_alone(tmp_path, capsys):
    result, out = _run(
        tmp_path, capsys, "--device", "cpu", "--no-baseline", "--images", "40", "--image-size", "96x72",
        "--batch-size", "8", "--size-px", "32", "--classes", "10",
    )  # fmt: skip
    assert result["sides"] == ["gpufeed"] and list(result["loaders"]) == ["gpufeed"]
    figures = result["loaders"]["gpufeed"]
    assert figures["steps"] == 10 and figures["samples_per_epoch"] == [[40, 40]]
    assert result["same_samples_per_epoch"] is None and result["pairs"]["pairs"] == 0
    assert all(value is None for value in result["ratios"].values())  # nothing to divide by
    targets = {t["name"]: t for t in result["targets"]}
    assert targets["gpu_wait_under_5pct"]["measured"].endswith("over 10 steps (no DataLoader in this run)")
    assert not any(t["applies"] for t in targets.values())  # a CPU run, and the CPU targets compare
    assert "DataLoader+PIL" not in out and "gpufeed / DataLoader" not in out and "--no-baseline" in out
    assert "loader wait, share of step time" in out


def _collated(device, rows: int = 2) -> tuple:
    """Collated batches as the DataLoader side's workers hand them over: pinned where ``device`` is a GPU."""
    pin = (lambda t: t.pin_memory()) if device.type == "cuda" else (lambda t: t)
    ids = pin(torch.arange(rows))
    image = (pin(torch.zeros(rows, 224, 224, 3, dtype=torch.uint8)), pin(torch.zeros(rows, dtype=torch.int64)), ids)
    clip = (
        pin(torch.zeros(rows, 11, 64, 64, 3, dtype=torch.uint8)),
        pin(torch.zeros(rows, 11, dtype=torch.int64)),
        ids,
        ids,
    )
    dense = (pin(torch.zeros(rows, 64, 64, 3, dtype=torch.uint8)), pin(torch.zeros(rows, 64, 64)), ids)
    return image, clip, dense


def _device_batches(device, rows: int = 2, collated: tuple | None = None) -> list:
    """The DataLoader side's three batch makers on ``device``, from pinned collated batches on a GPU."""
    image, clip, dense = collated or _collated(device, rows)
    valid = torch.ones(len(image[0]), dtype=torch.bool, device=device)
    return [
        image_batch(image, device, valid),
        clip_batch(clip, device, valid, ("walk",), centre=5),
        dense_batch(dense, device, valid),
    ]


def test_the_dataloader_sides_copies_do_not_wait_for_the_queued_step(monkeypatch):
    """The bench queues each step one ahead, so a blocking copy to the GPU (a copy, then a stream
    synchronise) would also wait for the previous step and count its compute as loader wait."""
    blocking = []
    real = torch.Tensor.to

    def to(self, *args, **kwargs):
        blocking.append(not kwargs.get("non_blocking", False))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    _device_batches(torch.device("cpu"))
    assert len(blocking) == 10 and not any(blocking)


@pytest.mark.gpu
def test_the_dataloader_sides_copies_do_not_synchronise_on_a_gpu():
    """Behind a queued kernel (the step launched ahead), no copy may wait for the stream, on the
    host or on the GPU: the copies land on their own stream while the step still runs."""
    cuda = torch.device("cuda", 0)
    # Pinned, and the copy stream's memory allocated, before the step is queued: allocating either
    # may synchronise the device, which is not what this test is about.
    collated = _collated(cuda, rows=64)
    _device_batches(cuda, collated=collated)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # a step still running on the stream (about a second)
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = _device_batches(cuda, collated=collated)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    copy_stream(cuda).synchronize()  # the copies are done...
    assert not torch.cuda.current_stream(cuda).query(), "...while the queued step still runs"
    torch.cuda.synchronize()
    images, clips, dense = batches
    assert images.images.is_cuda and clips.clips.is_cuda and dense.maps["depth"].is_cuda


@pytest.mark.parametrize("size", [48, [48, 32]], ids=["square", "48x32"])
def test_pil_baseline_crops_what_gpufeed_decodes(tmp_path, size):
    """The DataLoader's images show the same window and flip as gpufeed's (resamplers differ slightly)."""
    folder = make_bench_images(tmp_path, 16, 160, 120)
    dataset = ImageDataset.from_folder(folder)
    image_cfg = ImagePipelineConfig(size_px=size)
    loader_cfg = LoaderConfig(batch_size=8, num_threads=1, shuffle=True, last_batch="drop")
    cpu = DeviceChoice("cpu", None, "test")
    loader = ImageLoader(dataset, train=True, image_cfg=image_cfg, loader_cfg=loader_cfg, device=cpu, seed=3)
    baseline = PilTrainImages(dataset, image_cfg, seed=3)
    loader.set_epoch(1)
    batch = next(iter(loader))
    ours = batch.images.permute(0, 2, 3, 1).numpy().astype(np.float32)
    theirs = np.stack([baseline[(int(i), 1)][0].numpy() for i in batch.sample_ids]).astype(np.float32)
    assert ours.shape[1:3] == theirs.shape[1:3] == image_cfg.size_px.hw
    per_image = np.abs(ours - theirs).mean(axis=(1, 2, 3))
    assert per_image.max() < 1.0, per_image  # measured 0.13-0.18 levels: DALI's and PIL's bilinear differ
    # A window from another epoch is a different crop: the comparison can tell.
    other = np.stack([baseline[(int(i), 2)][0].numpy() for i in batch.sample_ids]).astype(np.float32)
    assert np.abs(ours - other).mean() > 5.0


@pytest.fixture(scope="module")
def bench_videos(tmp_path_factory) -> Path:
    """Two prepared 4 s videos, made once: both output sizes read the same files (making them is most of the cost)."""
    # As `gpufeed bench clips` makes them: on smaller frames h264 blurs the tag squares past reading.
    videos = make_bench_videos(tmp_path_factory.mktemp("bench"), count=2, seconds=4, fps=30, size=256, gop=250, seed=0)
    return prepared_bench_videos(videos, 11, 1)


@pytest.mark.parametrize("size", [SizePx(112, 112), SizePx(144, 112)], ids=["square", "144x112"])
def test_pyav_baseline_returns_exactly_the_frames_asked_for(bench_videos, size):
    dataset = VideoDataset.from_folder(bench_videos)
    reader = PyAvSeekClips(dataset, clip_length_frames=11, stride_frames=2, size_px=size)
    width = size.width_px
    for video, start in ((0, 0), (1, 37), (0, 98), (1, 5), (0, 60)):
        frames, labels, got_video, got_start = reader[(video, start)]
        assert (got_video, got_start) == (video, start) and tuple(frames.shape) == (11, 112, width, 3)
        tags = [read_tag(frames[t].numpy()) for t in range(11)]
        assert [(tag.ident, tag.aux) for tag in tags] == [(start + 2 * t, video) for t in range(11)]
        assert np.array_equal(labels.numpy(), dataset.labels[video][start : start + 21 : 2].astype(np.float32))


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "train", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for option in ("--task", "--device", "--model", "--batch-size", "--epochs", "--rounds", "--data", "--json",
                   "--plot", "--prefetch-factor", "--set", "--no-baseline"):  # fmt: skip
        assert option in text, option


def test_set_cannot_override_what_the_flags_decide(capsys):
    assert main(["bench", "train", "--device", "cpu", "--set", "loader.batch_size=3"]) == 2
    assert "config key 'loader.batch_size': this command sets it with --batch-size" in capsys.readouterr().err
