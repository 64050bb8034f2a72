"""``gpufeed bench loader`` measures the loader as training runs it: one pipeline over every epoch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpufeed.bench.loader import EpochBatches, PilCropDataset, run_loader_bench
from gpufeed.config import SizePx
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
