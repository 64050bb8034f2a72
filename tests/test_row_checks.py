"""Row tags checked against the plan (``pipelines/_row_checks.py``): at once on the host, and on a GPU
without a host wait for the batch, which is why the GPU graphs hand no host output over."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from dali_graph import output_devices

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DenseLoader, ImageDataset, ImageLoader
from gpufeed.pipelines._epochs import PlanStream
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._row_checks import _PENDING, RowChecks
from gpufeed.synth._pairs import write_paired_split

GPU = DeviceChoice("gpu", 0, "test")


def _rows(n: int, iteration: int) -> np.ndarray:
    return np.stack([np.full(n, iteration), np.arange(n)], axis=1)


def test_host_rows_are_checked_at_once_and_a_wrong_one_is_named():
    checks = RowChecks()
    checks(torch.as_tensor(_rows(4, 0)), _rows(4, 0))
    with pytest.raises(RuntimeError, match=r"out of step with the plan: rows \[\[1, 0\], .*expected \[\[0, 0\]"):
        checks(torch.as_tensor(_rows(4, 1)), _rows(4, 0))
    assert not checks.pending


@pytest.mark.parametrize("executor", ["static", "dynamic"])
def test_the_gpu_graphs_hand_no_host_output_over(synth_dir, tmp_path, executor):
    """Traced on the CPU: every output of the image and dense loaders' GPU graphs is on the GPU.

    DALI hands a pinned host output over only after waiting on the host for its iteration's event,
    which covers the batch's whole GPU work; a host output would put that wait back into every
    ``next(loader)`` under ``loader.executor: dynamic``.
    """
    loader_cfg = LoaderConfig(batch_size=4, num_threads=2, executor=executor)
    images = ImageLoader(
        ImageDataset.from_folder(synth_dir / "images" / "train"),
        train=True,
        image_cfg=ImagePipelineConfig(size_px=32),
        loader_cfg=loader_cfg,
        device=GPU,
    )
    pairs = PairedDataset.from_root(write_paired_split(tmp_path / "train", 4, 96, 72, seed=3))
    dense = DenseLoader(pairs, train=True, image_cfg=ImagePipelineConfig(size_px=32), loader_cfg=loader_cfg, device=GPU)
    for loader in (images, dense):
        pipe, _ = loader._pipeline(PlanStream(loader._spec(), 0, 0), build=False)
        assert set(output_devices(pipe)) == {"gpu"}, (type(loader).__name__, output_devices(pipe))


@pytest.mark.gpu
def test_gpu_rows_are_checked_a_few_batches_later_without_a_host_sync():
    checks = RowChecks()
    # The tags on the GPU before the checks start: a copy from pageable host memory is itself a sync.
    tags = [torch.as_tensor(_rows(8, k), device="cuda") for k in range(3 * _PENDING + 2)]
    tags[2 * _PENDING] = torch.as_tensor(_rows(8, 99), device="cuda")  # a batch out of step with the plan
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(2 * _PENDING):
            checks(tags[k], _rows(8, k))
        torch.cuda._sleep(int(1e8))  # the copies below stay queued a while: checked by a later call
        checks(tags[2 * _PENDING], _rows(8, 2 * _PENDING))
        with pytest.raises(RuntimeError, match="out of step with the plan"):
            for k in range(2 * _PENDING + 1, 3 * _PENDING + 2):
                checks(tags[k], _rows(8, k))
    finally:
        torch.cuda.set_sync_debug_mode("default")
