"""Data as users keep it: class folders of other formats or none, and Windows editors' text files.

* A class folder holding no .jpg/.jpeg/.png image (WebP photos, or nothing) used to train as a
  class with no sample, silently: ``gpufeed check`` now reports it as a problem, a training
  loader refuses it naming the folder, and an evaluation loader warns. A class that
  ``classes`` names and a validation split lacks is allowed there.
* Files ignored for their extension are one warning line (count, extensions, a few examples),
  once for loaders sharing a root; hidden files stay silent.
* A UTF-8 byte-order mark at the start of a list file, ``classes.txt``, a paired list file or a
  quarantine list is not part of the first line (local disk and a bucket).

Every file is real: JPEGs and WebPs encoded with PIL.
"""

from __future__ import annotations

import codecs
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gpufeed.cli import main
from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import DatasetError, ImageDataset, ImageLoader, PairedDataset, check_path
from gpufeed.pipelines._quarantine import read_quarantine
from gpufeed.synth import write_paired_split

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")


def _images(folder: Path, count: int, fmt: str = "JPEG", ext: str = "jpg", start: int = 0) -> list[Path]:
    """``count`` small photo-like images of format ``fmt`` named ``<i>.<ext>`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(str(folder)) + start)
    out = []
    for i in range(start, start + count):
        path = folder / f"{i}.{ext}"
        Image.fromarray(rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)).save(path, fmt)
        out.append(path)
    return out


def _loader(dataset, train: bool) -> ImageLoader:
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=16),
        loader_cfg=LoaderConfig(batch_size=2, last_batch="partial", shuffle=train, num_threads=1),
        device=CPU,
    )


@pytest.fixture
def webp_class(tmp_path) -> Path:
    """``m/cat`` of JPEGs, ``m/dog`` of WebPs only (and the hidden files a Mac leaves)."""
    root = tmp_path / "m"
    _images(root / "cat", 3)
    _images(root / "dog", 4, "WEBP", "webp")
    (root / "dog" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (root / "dog" / "._0.webp").write_bytes(b"\0\5\26\7")  # AppleDouble
    return root


# -- a class with no image ------------------------------------------------------------------------


def test_check_reports_a_class_folder_of_webp_files_as_a_problem(webp_class, capsys):
    report = check_path(webp_class, progress=False)
    (finding,) = [f for f in report.findings if f.kind == "class"]
    assert finding.path == str(webp_class / "dog")
    assert (
        f"class folder {webp_class / 'dog'} holds no .jpg/.jpeg/.png image (4 other file(s) ignored: .webp)"
        in finding.reason
    )
    assert not report.ok and report.bad_paths() == [], "a folder fails the check but is never quarantined"
    assert "1 problem(s)" in report.table()
    assert not any(".DS_Store" in f.path or "._0" in f.path for f in report.findings), "hidden files stay silent"
    assert main(["check", str(webp_class)]) == 1
    assert f"[class] {webp_class / 'dog'}: class folder" in capsys.readouterr().out


def test_check_reports_an_empty_class_folder(tmp_path):
    _images(tmp_path / "cat", 2)
    (tmp_path / "emptyclass").mkdir()
    (finding,) = check_path(tmp_path, progress=False).findings
    assert finding.kind == "class" and finding.path == str(tmp_path / "emptyclass")
    assert "holds no .jpg/.jpeg/.png image (it is empty)" in finding.reason


def test_a_training_loader_refuses_a_class_with_no_image_in_one_line(webp_class):
    dataset = ImageDataset.from_folder(webp_class)
    assert dataset.classes == ("cat", "dog") and len(dataset) == 3
    with pytest.raises(DatasetError) as caught:
        _loader(dataset, train=True)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"class folders under {webp_class}: 1 class(es) with no image to train on: ")
    assert f"class folder {webp_class / 'dog'} holds no .jpg/.jpeg/.png image (4 other file(s) ignored: .webp)" in (
        message
    )


def test_an_evaluation_loader_warns_of_an_empty_class_folder_and_reads_the_rest(webp_class, caplog):
    caplog.set_level(logging.WARNING, logger="gpufeed")
    loader = _loader(ImageDataset.from_folder(webp_class), train=False)
    assert sum(len(batch) for batch in loader) == 3
    (empty,) = [r.getMessage() for r in caplog.records if "holds no" in r.getMessage()]
    assert empty.startswith("eval loader: ") and str(webp_class / "dog") in empty


def test_a_class_named_in_classes_may_be_absent_from_validation_but_not_from_training(tmp_path, caplog):
    _images(tmp_path / "cat", 2)
    _images(tmp_path / "dog", 2)
    dataset = ImageDataset.from_folder(tmp_path, classes=("cat", "dog", "bird"))
    with pytest.raises(
        DatasetError, match=re.escape(f"class 'bird' has no folder {tmp_path / 'bird'}; a class without")
    ):
        _loader(dataset, train=True)
    caplog.set_level(logging.WARNING, logger="gpufeed")
    caplog.clear()
    assert sum(len(batch) for batch in _loader(dataset, train=False)) == 4
    assert not caplog.records, "a validation split without one of the listed classes is no surprise"


# -- ignored files: one line ----------------------------------------------------------------------


def test_files_ignored_for_their_extension_are_one_warning_line(tmp_path, caplog):
    _images(tmp_path / "cat", 2)
    webps = _images(tmp_path / "cat", 2, "WEBP", "webp", start=2)
    _images(tmp_path / "dog", 2)
    _images(tmp_path / "dog", 1, "GIF", "gif", start=2)
    (tmp_path / "dog" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "dog" / "._0.jpg").write_bytes(b"\0\5\26\7")
    caplog.set_level(logging.WARNING, logger="gpufeed")
    _loader(ImageDataset.from_folder(tmp_path), train=True)
    _loader(ImageDataset.from_folder(tmp_path), train=False)  # a val split in the same root: said once
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"train loader: 3 file(s) in class folders under {tmp_path} are not .jpg/.jpeg/.png images and are "
        "ignored (.webp (2), .gif (1)): "
    ), line
    assert f"{webps[0]}, {webps[1]}, {tmp_path / 'dog' / '2.gif'}" in line
    assert ".DS_Store" not in line and "._0" not in line


# -- byte-order marks -----------------------------------------------------------------------------


def _bom_text(path: Path, text: str) -> None:
    path.write_bytes(codecs.BOM_UTF8 + text.encode("utf-8"))


def test_a_byte_order_mark_is_not_part_of_a_list_file_or_classes_txt(tmp_path):
    cats, dogs = _images(tmp_path / "train" / "cat", 2), _images(tmp_path / "train" / "dog", 2)
    _bom_text(tmp_path / "classes.txt", "cat\r\ndog\r\n")
    _bom_text(tmp_path / "by_name.txt", "train/cat/0.jpg cat\r\ntrain/dog/0.jpg dog\r\n")
    _bom_text(tmp_path / "by_index.txt", "train/cat/1.jpg 0\r\ntrain/dog/1.jpg 1\r\n")
    by_name = ImageDataset.from_list(tmp_path / "by_name.txt")
    assert by_name.paths == (str(cats[0]), str(dogs[0])) and by_name.classes == ("cat", "dog")
    assert by_name.labels.tolist() == [0, 1] and not by_name.problems
    by_index = ImageDataset.from_list(tmp_path / "by_index.txt")
    assert by_index.classes == ("cat", "dog"), "the labels a checkpoint, export and server would carry"
    assert by_index.labels.tolist() == [0, 1] and not by_index.problems
    assert check_path(tmp_path / "by_name.txt", progress=False).ok


def test_a_byte_order_mark_is_not_part_of_a_paired_list(tmp_path):
    root = write_paired_split(tmp_path / "split", 2, 32, 24, seed=5)
    _bom_text(root / "pairs.txt", "rgb/000000.jpg depth/000000.png\nrgb/000001.jpg depth/000001.png\n")
    pairs = PairedDataset.from_list(root / "pairs.txt")
    assert len(pairs) == 2 and not pairs.problems
    assert pairs.maps["depth"][0] == str(root / "depth" / "000000.png")


def test_a_byte_order_mark_is_not_part_of_a_quarantine_list(tmp_path):
    (image,) = _images(tmp_path / "cat", 1)
    _bom_text(tmp_path / "bad.txt", f"{image}\n")
    assert read_quarantine(tmp_path / "bad.txt").entries == (str(image),)


def test_a_class_list_that_is_not_utf8_is_one_line_naming_it_and_the_byte(tmp_path):
    _images(tmp_path / "cat", 1)
    (tmp_path / "list.txt").write_text("cat/0.jpg cat\n")
    (tmp_path / "classes.txt").write_bytes(codecs.BOM_UTF8 + b"cat\n\xffdog\n")
    with pytest.raises(DatasetError, match=r"^class list .*classes\.txt is not UTF-8 text \(byte 7\)$"):
        ImageDataset.from_list(tmp_path / "list.txt")


@pytest.mark.live
def test_a_byte_order_mark_in_a_bucket_list_file_and_classes_txt(tmp_path, s3_bucket):
    from _s3server import upload_tree

    _images(tmp_path / "cat", 1)
    _images(tmp_path / "dog", 1)
    _bom_text(tmp_path / "classes.txt", "cat\ndog\n")
    _bom_text(tmp_path / "list.txt", "cat/0.jpg cat\ndog/0.jpg 1\n")
    upload_tree(tmp_path, s3_bucket / "data")
    dataset = ImageDataset.from_list(s3_bucket / "data" / "list.txt")
    assert dataset.paths == (str(s3_bucket / "data" / "cat" / "0.jpg"), str(s3_bucket / "data" / "dog" / "0.jpg"))
    assert dataset.classes == ("cat", "dog") and dataset.labels.tolist() == [0, 1] and not dataset.problems


# -- the training command -------------------------------------------------------------------------


@pytest.mark.process
def test_gpufeed_train_stops_on_a_class_folder_of_webp_files(webp_class, tmp_path, capsys, monkeypatch):
    config = tmp_path / "train.yaml"
    config.write_text(
        f"data: {{train: {{root: {webp_class}}}, val: {{root: {webp_class}}}}}\n"
        "image: {size_px: 16}\nloader: {batch_size: 2}\nmodel: {name: smallcnn}\n"
        "train: {epochs: 1, progress: false}\ntelemetry: {metrics_port: 0}\n"
    )
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("gpufeed train: error:")]
    assert f"class folder {webp_class / 'dog'} holds no .jpg/.jpeg/.png image" in line
    assert not (tmp_path / "run").exists(), "the folder the failed start made is gone again"
    (tmp_path / "mine").mkdir()
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine").is_dir(), "a folder that was there before stays"
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # no --out: runs/<model>-<date>, and runs/ made for it
    assert main(["train", "--config", str(config)]) == 2
    assert not any((tmp_path / "work").iterdir()), "runs/, made by the failed start, is gone too"


def test_a_flat_folder_of_photos_says_where_the_classes_go(tmp_path):
    """A camera's folder (IMG_0001.jpg, ...): "no .jpg ... in class folders" while the images were right there."""
    for i in range(3):
        Image.new("RGB", (8, 8)).save(tmp_path / f"IMG_{i:04d}.jpg")
    with pytest.raises(DatasetError) as info:
        ImageDataset.from_folder(tmp_path)
    assert str(info.value) == (
        f"dataset is empty: no .jpg, .jpeg or .png files in class folders under {tmp_path}, but 3 lie in "
        f"{tmp_path} itself: the folder's sub-folders are the classes, so put each class's images in "
        f"{tmp_path}/<class>"
    )


def test_a_list_file_given_as_the_folder_says_where_it_goes(tmp_path):
    """``root: train.txt`` said the folder "does not exist or is not a folder", with the file right there."""
    listed = tmp_path / "train.txt"
    listed.write_text("a.jpg cat\n", encoding="utf-8")
    with pytest.raises(DatasetError) as info:
        ImageDataset.from_folder(listed)
    assert str(info.value) == (
        f"dataset folder {listed} is a file: a file of 'path label' lines goes in list_file "
        "(data.train.list_file), a folder of class folders in root"
    )
