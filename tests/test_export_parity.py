"""The export parity line in each task's terms, on the inputs the data has.

Before, a depth model's parity line said "top-1 agreement 100%" (the argmax of one channel always
agrees), and ``--parity-data`` on a paired split read ``rgb/``, ``depth/`` and ``mask/`` as three
classes of images, the maps fed as inputs, with padding rows of the last batch counted as images.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _serving import write_checkpoint

from gpufeed.models import export_model
from gpufeed.synth import SynthSpec, write_synthetic_dataset

pytestmark = pytest.mark.timeout(300)

SIZE = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """5 validation pairs (RGB, depth, mask) and 5 images in class folders: fewer than two batches of 4."""
    root = tmp_path_factory.mktemp("parity")
    spec = SynthSpec(num_classes=5, train_per_class=1, val_per_class=1, num_videos=0, paired_train=1, paired_val=5)
    write_synthetic_dataset(root, spec, False)
    return root


def _export(tmp_path, name: str, parity_data, **spec):
    ckpt = write_checkpoint(tmp_path / f"run-{name}", name, size_px=SIZE, eval_crop_fraction=1.0, **spec)
    return export_model(ckpt, tmp_path / "models" / name, batch_sizes=[1, 4], parity_data=parity_data)


def _line(capsys) -> str:
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("parity ")]
    return line


def test_a_depth_model_reports_its_relative_difference_on_the_split_rgb_images(data, tmp_path, capsys):
    card = _export(tmp_path, "unet_resnet18", data / "dense" / "val", task="depth", num_classes=1, map_fill=0)
    line = _line(capsys)
    assert "top-1" not in line and "top1_agreement" not in card.parity
    assert re.search(r", depth mean \|diff\| / mean \|depth\| [0-9.e-]+$", line), line
    assert f"on 5 RGB images of the paired split {data / 'dense' / 'val'} through the evaluation pipeline" in line
    assert card.parity["samples"] == 5, "the split's 5 RGB images: no maps, no padding rows"
    assert 0 <= card.parity["depth_rel_diff"] < 1e-3
    assert set(card.parity["per_batch_size"]["4"]) == {"max_abs_diff", "depth_rel_diff"}


def test_a_segmentation_model_reports_pixel_class_agreement(data, tmp_path, capsys):
    spec = {"task": "segmentation", "num_classes": 4, "map_fill": 255}
    card = _export(tmp_path, "unet_resnet18", data / "dense" / "val", **spec)
    line = _line(capsys)
    assert line.endswith(", pixel class agreement 100%") and card.parity["pixel_agreement"] == 1.0, line
    assert card.parity["samples"] == 5 and "top1_agreement" not in card.parity


def test_an_image_model_counts_only_the_images_the_data_has(data, tmp_path, capsys):
    card = _export(tmp_path, "smallcnn", data / "images" / "val", num_classes=5)
    line = _line(capsys)
    assert card.parity["samples"] == 5, "5 images, not two padded batches of 4"
    assert f"on 5 images from {data / 'images' / 'val'}" in line and line.endswith(", top-1 agreement 100%"), line
    assert card.parity["top1_agreement"] == 1.0


def test_parity_data_without_one_readable_image_is_named_in_one_error(tmp_path):
    """Before, a folder of damaged images failed in numpy (``need at least one array to concatenate``)."""
    from oddmedia import write_image_corpus

    from gpufeed.models import ExportError

    write_image_corpus(tmp_path / "odd")  # its bad/ folder: damaged, bombs, not images, cut short
    bad = tmp_path / "odd" / "bad"
    with pytest.raises(ExportError, match=f"parity data {bad}: none of its images could be read"):
        _export(tmp_path, "smallcnn", bad, num_classes=2)
