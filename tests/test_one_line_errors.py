"""One-line errors instead of tracebacks: YAML that is not UTF-8, and mask ids past the class count.

Each case has its expected message: the file, what is wrong with it and what is allowed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from videohelp import make_deepethogram_project

from gpufeed.cli import main
from gpufeed.config import ConfigError, load_config
from gpufeed.pipelines import DatasetError, PairedDataset, check_path
from gpufeed.pipelines._deepethogram import project_dataset, read_project
from gpufeed.pipelines._mask_check import check_mask_ids
from gpufeed.synth import write_paired_split
from gpufeed.train._dense import SegmentationTask
from gpufeed.train._errors import TrainError
from gpufeed.train._mask_ids import MaskIdError, find_bad_mask_ids

pytestmark = pytest.mark.timeout(300)


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"one line, no traceback: {err[-2000:]}"
    return lines[0]


# -- YAML that is not UTF-8 -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return make_deepethogram_project(tmp_path_factory.mktemp("deg") / "p_deepethogram", "hdf5", (12, 12), by="hand")


def _with_byte(project: Path, tmp_path: Path, relative: str, data: bytes) -> tuple[Path, Path, int]:
    copy = tmp_path / project.name
    shutil.copytree(project, copy)
    target = copy / relative
    offset = len(target.read_bytes())
    target.write_bytes(target.read_bytes() + data)
    return copy, target, offset


def test_a_project_config_that_is_not_utf8_is_named_with_its_byte_offset(project, tmp_path, capsys):
    copy, config, offset = _with_byte(project, tmp_path, "project_config.yaml", b"# caf\xff\n")
    line = config.read_bytes().count(b"\n")  # the byte is on the file's last line
    expected = f"DeepEthogram project config {config} is not UTF-8 text: byte 0xff at offset {offset + 5} (line {line})"
    with pytest.raises(DatasetError) as err:
        read_project(copy)
    assert str(err.value) == expected
    report = check_path(copy, progress=False)
    assert [(f.path, f.reason) for f in report.findings] == [(str(copy), expected)]
    assert main(["check", str(copy)]) == 1
    capsys.readouterr()


def test_a_record_that_is_not_utf8_is_a_problem_of_its_record(project, tmp_path):
    copy, record, offset = _with_byte(project, tmp_path, "DATA/mouse01/record.yaml", b"\x80\n")
    dataset = project_dataset(copy, split="all", val_fraction=0.0, seed=0)
    line = record.read_bytes().count(b"\n")  # the byte is on the file's last line
    assert dataset.problems == {
        1: f"record mouse01 (DATA/mouse01/record.yaml): record {record} is not UTF-8 text: byte 0x80 at offset "
        f"{offset} (line {line})"
    }


def test_a_training_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_bytes(b"model: {name: smallcnn}\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^config key '<root>': config file {path} is not UTF-8 text: byte 0xe9 at"):
        load_config(path)
    assert main(["config", str(path)]) == 2
    assert _stderr_line(capsys) == (
        f"gpufeed config: error: config key '<root>': config file {path} is not UTF-8 text: byte 0xe9 at offset 29 (line 2)"
    )


# -- mask ids past the class count ----------------------------------------------------------------


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """6 pairs with masks of ids 1..3; mask 2 gets id 9 and mask 4 id 7 in a corner."""
    root = write_paired_split(tmp_path_factory.mktemp("masks") / "train", 6, 48, 32, seed=0, kinds=("mask",))
    for ident, value in ((2, 9), (4, 7)):
        path = root / "mask" / f"{ident:06d}.png"
        mask = np.array(Image.open(path))
        mask[:3, :3] = value
        Image.fromarray(mask).save(path)
    return root


def test_find_bad_mask_ids_names_the_rows_holding_one():
    mask = torch.zeros(4, 5, 5, dtype=torch.long)
    mask[1, 0, 0], mask[2, 1, 1], mask[3] = 7, 255, 3
    ids = torch.tensor([10, 11, 12, 13])
    assert find_bad_mask_ids(mask, ids, num_classes=8, ignore_id=255) is None, "255 is the ignore id"
    bad = find_bad_mask_ids(mask, ids, num_classes=3, ignore_id=255)
    assert isinstance(bad, MaskIdError) and (bad.mask_id, bad.sample_ids) == (7, [11, 13])


def test_a_mask_id_past_the_classes_names_the_mask_files(split):
    dataset = PairedDataset.from_root(split)
    mask = torch.zeros(3, 4, 4, dtype=torch.uint8)
    mask[1, 0, 0] = 9
    batch = type("Batch", (), {"maps": {"mask": mask}, "sample_ids": torch.tensor([0, 2, 5])})()
    task = SegmentationTask(4, ignore_id=255)
    fault = int(task.target_fault(batch))
    assert fault == 9
    err = task.fault_error(fault, batch.sample_ids.tolist(), task.fault_evidence(batch))
    assert isinstance(err, MaskIdError) and err.sample_ids == [2], "only the row holding the id is named"
    named = err.naming(dataset, "training")
    assert isinstance(named, TrainError) and "\n" not in str(named)
    assert str(named) == (
        f"mask id 9 in {split / 'mask' / '000002.png'} (the training split) is outside the 4 classes 0..3 "
        "(ignore id 255, data.mask_ignore_id); set model.num_classes or data.classes to cover every id, or "
        "data.mask_ignore_id. 'gpufeed check DATA --num-classes 4' lists every mask with such an id"
    )


def test_check_names_every_mask_with_an_id_past_num_classes(split):
    report = check_mask_ids(split, 4, progress=False)
    found = sorted((f.path, f.reason) for f in report.findings)
    allowed = "outside the 4 classes 0..3 (ignore id 255)"
    assert found == [
        (
            str(split / "rgb" / "000002.jpg"),
            f"{split / 'mask' / '000002.png'} (paired with it): mask id(s) 9 {allowed}",
        ),
        (
            str(split / "rgb" / "000004.jpg"),
            f"{split / 'mask' / '000004.png'} (paired with it): mask id(s) 7 {allowed}",
        ),
    ]
    assert not check_mask_ids(split, 10, progress=False).findings
    # The synthetic masks hold the ignore id 255 too: with another ignore id, 255 is out of range everywhere.
    moved = check_mask_ids(split, 10, ignore_id=9, progress=False).findings
    assert len(moved) == 6 and all(
        f.reason.endswith("mask id(s) 255 outside the 10 classes 0..9 (ignore id 9)") for f in moved
    )
    assert check_path(split, progress=False).ok, "without a class count the split is fine"


def test_gpufeed_check_takes_the_class_count_from_the_option_or_the_config(split, tmp_path, capsys):
    assert main(["check", str(split), "--num-classes", "8"]) == 1
    out = capsys.readouterr().out
    assert (
        f"[pair] {split / 'rgb' / '000002.jpg'}: {split / 'mask' / '000002.png'} (paired with it): mask id(s) 9" in out
    )
    assert "000004" not in out
    config = tmp_path / "seg.yaml"
    config.write_text("model: {name: unet_resnet18, num_classes: 4}\ndata: {mask_ignore_id: 255}\n")
    assert main(["check", str(split), "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "000002.png (paired with it): mask id(s) 9 outside the 4 classes 0..3 (ignore id 255)" in out
    assert "000004.png (paired with it): mask id(s) 7 outside the 4 classes 0..3 (ignore id 255)" in out
    assert main(["check", str(split), "--num-classes", "10"]) == 0
    capsys.readouterr()
    assert main(["check", str(split), "--num-classes", "0"]) == 2
    assert _stderr_line(capsys) == "gpufeed check: error: --num-classes 0 must be >= 1"


@pytest.mark.process
def test_training_stops_with_one_line_naming_the_mask_and_the_task(split, tmp_path, caplog):
    """The whole run (its metrics endpoint listens): a segmentation run is logged as one, and stops naming the file."""
    from gpufeed.config import parse_config
    from gpufeed.train import train

    val = write_paired_split(tmp_path / "val", 2, 48, 32, seed=1, kinds=("mask",))
    cfg = parse_config(
        {
            "device": "cpu",
            "data": {"train": {"root": str(split)}, "val": {"root": str(val)}},
            "image": {"size_px": 32, "crop_area": [1.0, 1.0]},
            "loader": {"batch_size": 6, "num_threads": 2},
            "model": {"name": "unet_resnet18", "num_classes": 8},
            "train": {"epochs": 1, "progress": False},
            "augment": {"ops": []},
            "telemetry": {"metrics_port": 0},
        }
    )
    caplog.set_level("INFO", logger="gpufeed")
    with pytest.raises(TrainError) as err:
        train(cfg, tmp_path / "run")
    assert str(err.value).startswith(
        f"mask id 9 in {split / 'mask' / '000002.png'} (the training split) is outside the 8 classes 0..7"
    )
    assert "(segmentation task, 8 classes)" in caplog.text and "depth task" not in caplog.text


# -- paths of the wrong kind ----------------------------------------------------------------------


def test_a_path_of_the_wrong_kind_is_one_line_naming_it(tmp_path, capsys):
    """A folder given where a file goes, or a file where a folder goes: before, a traceback."""
    images = tmp_path / "images" / "a"
    images.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "0.png")
    assert main(["check", str(tmp_path / "images"), "--json", str(tmp_path)]) == 2
    assert "Is a directory" in (line := _stderr_line(capsys)) and str(tmp_path) in line
    (tmp_path / "notes").write_text("not a folder")
    assert main(["check", str(tmp_path / "notes" / "images")]) == 2
    assert str(tmp_path / "notes") in _stderr_line(capsys)
