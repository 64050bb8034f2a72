"""``gpufeed bench train --task depth`` in CI size: both feeds run end to end on the same samples, and
the PIL DataLoader baseline crops the same windows as gpufeed's DenseLoader. No timing is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpufeed.bench._dense_feeds import PilDensePairs
from gpufeed.cli import main
from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DenseLoader, PairedDataset
from gpufeed.synth import write_paired_split

pytestmark = pytest.mark.timeout(300)


@pytest.mark.process
def test_bench_train_depth_runs_both_feeds_on_the_same_samples(tmp_path, capsys):
    out_json = tmp_path / "result.json"
    rc = main(["bench", "train", "--task", "depth", "--device", "cpu", "--images", "8", "--batch-size", "2",
               "--size-px", "32", "--image-size", "96x72", "--rounds", "1", "--epochs", "2", "--workers", "2",
               "--json", str(out_json), "--cache", str(tmp_path / "cache")])  # fmt: skip
    assert rc == 0
    result = json.loads(out_json.read_text())
    out = capsys.readouterr().out
    assert result["same_samples_per_epoch"] is True and result["task"] == "depth"
    assert result["model"] == "unet_resnet18" and "DataLoader+PIL" in out
    for side in ("gpufeed", "dataloader"):
        assert result["loaders"][side]["samples_per_epoch"] == [[8, 8]], side
        assert result["loaders"][side]["samples_per_s"] > 0
    assert "JPEG + 16-bit depth PNG pairs" in result["data"]
    # Interleaved every 4 steps: 8 steps per side are 2 chunk pairs, each side's steps in plan order.
    assert result["chunk_steps"] == 4 and result["pairs"]["pairs"] == 2
    assert all(p["ratio"] > 0 for p in result["pairs"]["each"])
    for side in ("gpufeed", "dataloader"):
        steps = result["loaders"][side]["per_step"]
        assert [(s["epoch"], s["batch"]) for s in steps] == [(e, b) for e in range(2) for b in range(4)]
    assert "interleaved every 4 steps" in out and "data time on the critical path" in out


def test_the_pil_baseline_crops_the_same_windows_as_the_dense_loader(tmp_path):
    root = write_paired_split(tmp_path / "pairs", 4, 96, 72, seed=0, kinds=("depth",))
    dataset = PairedDataset.from_root(root)
    image_cfg = ImagePipelineConfig(size_px=(40, 30), crop_area=(0.3, 1.0))
    loader = DenseLoader(
        dataset,
        train=True,
        image_cfg=image_cfg,
        loader_cfg=LoaderConfig(batch_size=4, shuffle=False),
        device=DeviceChoice("cpu", None, "test"),
        seed=7,
    )
    batch = next(iter(loader))
    pil = PilDensePairs(dataset, image_cfg, seed=7)
    for row, sample_id in enumerate(batch.sample_ids.tolist()):
        rgb, depth, _ = pil[(sample_id, 0)]
        ours = batch.maps["depth"][row].numpy()
        # Nearest neighbour picks the same source pixel except where PIL and DALI break a tie differently.
        assert (depth.numpy() == ours).mean() > 0.9, f"sample {sample_id}: the depth windows differ"
        diff = np.abs(rgb.numpy().astype(int) - batch.images[row].permute(1, 2, 0).numpy().astype(int))
        assert np.median(diff) <= 8, f"sample {sample_id}: the RGB windows differ"
