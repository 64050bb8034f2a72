"""``gpufeed bench loader`` measures the loader as training runs it: one pipeline over every epoch."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gpufeed.bench.loader import (
    EpochBatches,
    PilCropDataset,
    parse_vary,
    print_sweep_result,
    run_loader_bench,
    run_loader_sweep,
)
from gpufeed.config import ConfigError, SizePx
from gpufeed.pipelines import ImageDataset
from gpufeed.pipelines._windows import train_windows
from gpufeed.synth._photos import make_bench_images

pytestmark = pytest.mark.timeout(300)


@pytest.mark.process
def test_loader_bench_keeps_one_pipeline_and_feeds_both_sides_the_same_windows(tmp_path):
    data = make_bench_images(tmp_path, 12, 64, 48)
    result = run_loader_bench(data, batch_size=4, rounds=2, size_px=SizePx(32, 32), device="cpu", workers=1)
    assert result["pipeline_builds"] == 1, "no rebuild inside the timed rounds"
    assert len(result["images_per_second_rounds"]["gpufeed"]) == 2 and result["ratio"] > 0
    # The baseline's items for epoch e are the crops of epoch e's windows, not epoch 0's.
    dataset = ImageDataset.from_folder(data)
    ids = dataset.usable_ids
    windows = []
    for epoch in range(2):
        w = train_windows(dataset.sizes[ids], ids, 0, epoch, (0.08, 1.0), (3 / 4, 4 / 3))
        windows.append((w.anchor, w.shape, w.flip))
    assert not np.array_equal(windows[0][0], windows[1][0])
    baseline = PilCropDataset([dataset.paths[i] for i in ids], windows, SizePx(32, 32))
    batches = EpochBatches(len(ids), 5)
    assert [len(b) for b in batches] == [5, 5, 2] and next(iter(batches))[0] == (0, 0)
    batches.epoch = 1
    assert next(iter(batches))[1] == (1, 1)
    assert torch.equal(baseline[(0, 3)], baseline[3]) and not torch.equal(baseline[(1, 3)], baseline[(0, 3)])


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (["image.size_px=64,96"], "--vary takes loader.KEY=V1,V2"),
        (["loader.hw_decoder_load"], "--vary takes loader.KEY=V1,V2"),
        (["loader.num_threads=1", "loader.num_threads=2"], "given to --vary twice"),
        (["loader.hw_decoder_load=0.5,1.5"], r"loader\.hw_decoder_load"),
        (["loader.no_such_key=1"], r"unknown key"),
        (["loader.num_threads=1,2,3,4", "loader.prefetch_queue_depth=1,2,3,4"], "16 combinations; at most 12"),
    ],
)
def test_a_sweep_refuses_what_is_not_a_loader_setting_naming_it(items, words):
    assert parse_vary([]) == [], "no --vary: the DataLoader comparison, not a sweep"
    with pytest.raises(ConfigError, match=words):
        parse_vary(items)


def test_a_sweep_times_every_combination_on_its_own_pipeline_against_the_first(tmp_path, capsys):
    """Two keys of two values: four variants, each one pipeline for the whole run, each round timing one
    epoch's batches after the ones prepared while the others ran; the first is the reference."""
    variants = parse_vary(["loader.prefetch_queue_depth=1,3", "loader.num_threads=1,2"])
    assert variants[0] == {"loader.prefetch_queue_depth": "1", "loader.num_threads": "1"} and len(variants) == 4
    data = make_bench_images(tmp_path, 12, 64, 48)
    result = run_loader_sweep(data, variants, batch_size=4, rounds=2, size_px=SizePx(32, 32), device="cpu")
    assert result["batches_per_round"] == 3 and list(result["variants"])[1] == "prefetch_queue_depth=1, num_threads=2"
    for name, figures in result["variants"].items():
        assert len(figures["images_per_second"]) == 2 and all(v > 0 for v in figures["images_per_second"]), name
        assert all(busy > 0 for busy in figures["cores_busy"])
        # No GPU here: the engines' summary says why instead of a figure.
        assert all(summary == {"unavailable": "no GPU"} for summary in figures["engines"])
    assert result["variants"]["prefetch_queue_depth=1, num_threads=1"]["paired"] == [1.0, 1.0]
    print_sweep_result(result)
    out = capsys.readouterr().out
    assert "vs first (paired)" in out and "prefetch_queue_depth=3, num_threads=2" in out and "JPEG %" in out


def test_the_engine_sampler_names_its_gpu_by_uuid_not_by_cuda_index(monkeypatch):
    """NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES: CUDA device 0 may be NVML's 3."""
    import uuid

    import torch

    from gpufeed.bench._gpu_engines import EngineSampler, nvml_uuids

    card = uuid.UUID("6b1b2d6e-0b1c-4f5e-9a8b-7c6d5e4f3a2b")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(uuid=card))
    assert nvml_uuids(1) == (f"GPU-{card}", f"MIG-{card}")
    with EngineSampler(None) as off_gpu:
        pass
    assert off_gpu.summary() == {"unavailable": "no GPU"}
    missing = EngineSampler(nvml_uuids(1), library="libnvidia-ml-absent.so.1")
    assert missing.summary()["unavailable"].startswith("NVML is not usable here:")


# An NVML whose engines are idle for the first 0.3 s after nvmlInit_v2 and 80 % busy after, with a
# 0.3 s sample period: a read sooner than a period into a block mostly covers the time before it.
_TIMED_NVML = r"""
#include <time.h>
static double t0;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static unsigned busy(void) { return now() - t0 >= 0.3 ? 80 : 0; }
int nvmlInit_v2(void) { t0 = now(); return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) { *h = (void *)1; return 0; }
int nvmlDeviceGetUtilizationRates(void *h, unsigned *rates) { rates[0] = busy(); rates[1] = 0; return 0; }
int nvmlDeviceGetDecoderUtilization(void *h, unsigned *u, unsigned *p) { *u = busy(); *p = 300000; return 0; }
int nvmlDeviceGetJpgUtilization(void *h, unsigned *u, unsigned *p) { *u = busy(); *p = 300000; return 0; }
"""


@pytest.mark.process  # the compiler
def test_engine_figures_count_only_reads_whose_window_lies_inside_the_block(tmp_path):
    import time

    from _fake_nvml import compile_nvml

    from gpufeed.bench._gpu_engines import EngineSampler

    library = compile_nvml(tmp_path, _TIMED_NVML)
    with EngineSampler(("GPU-x",), period_s=0.05, library=library) as engines:
        time.sleep(1.0)
    summary = engines.summary()
    assert summary["window_s"] == pytest.approx(0.3)
    assert summary["kernels"] == summary["nvdec"] == summary["jpeg"] == 80.0, summary
    with EngineSampler(("GPU-x",), period_s=0.05, library=library) as short:
        time.sleep(0.15)
    assert "shorter than NVML's 0.30 s window" in str(short.summary()["jpeg"])


@pytest.mark.gpu
def test_the_engine_sampler_reads_the_gpus_jpeg_engines_while_they_decode(tmp_path):
    """On a GPU, NVML answers for the kernels and the JPEG engines while the loader decodes with the
    hardware decoder for over a second (a GPU without one would say which query failed, not a number)."""
    import time

    from gpufeed.bench._gpu_engines import EngineSampler, nvml_uuids
    from gpufeed.config import ImagePipelineConfig, LoaderConfig
    from gpufeed.device import DeviceChoice
    from gpufeed.pipelines import ImageLoader

    data = make_bench_images(tmp_path, 64, 640, 480)
    loader = ImageLoader(
        ImageDataset.from_folder(data),
        train=True,
        image_cfg=ImagePipelineConfig(size_px=224),
        loader_cfg=LoaderConfig(batch_size=32, hw_decoder_load=1.0),
        device=DeviceChoice("gpu", 0, "test"),
    )
    for _ in loader:  # the pipeline's build (about 2 s on an H100) and first epoch, outside the sampled time
        pass
    with EngineSampler(nvml_uuids(0)) as engines:
        until = time.monotonic() + 3.0  # three of NVML's windows (at most 1 s each) of decoding
        while time.monotonic() < until:
            for _ in loader:
                pass
    loader.close()
    summary = engines.summary()
    assert "unavailable" not in summary and 0 < summary["window_s"] <= 1.0, summary
    assert isinstance(summary["kernels"], float) and 0 <= summary["kernels"] <= 100
    assert isinstance(summary["jpeg"], float) and 0 < summary["jpeg"] <= 100, summary


@pytest.mark.process  # the DataLoader's worker
@pytest.mark.parametrize("vary", [[], ["--vary", "loader.pipelines=1,2"]], ids=["dataloader", "sweep"])
def test_the_command_compares_with_the_dataloader_unless_asked_to_vary(tmp_path, capsys, vary):
    from gpufeed.cli import main

    args = ["bench", "loader", "--images", "8", "--image-size", "64x48", "--batch-size", "4", "--rounds", "1"]
    assert main([*args, "--workers", "1", "--size-px", "32", "--device", "cpu", "--cache", str(tmp_path), *vary]) == 0
    out = capsys.readouterr().out
    if vary:
        assert "loader sweep:" in out and "pipelines=2" in out and "DataLoader" not in out
    else:
        assert "ratio gpufeed / DataLoader+PIL" in out and "loader sweep" not in out
