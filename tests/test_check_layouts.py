"""``gpufeed check`` on what people point it at: one video, one image of another format, split folders,
a DeepEthogram store named directly, and ``check --help`` naming every kind it takes.

Before, one video or one GIF was parsed as an image list file ("list file ... is not UTF-8 text"),
a folder of train/ and val/ video folders was "no .jpg, .jpeg or .png files in class folders", a
folder of train/ and val/ image folders passed as a dataset of two classes, and a DeepEthogram
store named directly asked for ``<key>.csv`` where DeepEthogram writes ``<key>_labels.csv``.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import yaml
from PIL import Image
from videohelp import encode_tagged_video, make_deepethogram_project, write_tagged_store

from gpufeed.cli import build_parser, main
from gpufeed.pipelines import check_path
from gpufeed.synth import SynthSpec, write_synthetic_dataset

pytestmark = pytest.mark.timeout(300)

SPLIT_WARNING = (
    "holds the split folders train/, val/: each is checked as its own dataset. Point the config at each split "
    "(data.train.root / data.val.root for images, video.train / video.val for videos), not at this folder: read "
    "as one image dataset, its split folders would be its classes"
)


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layouts")
    spec = SynthSpec(num_classes=2, train_per_class=2, val_per_class=1, num_videos=0, paired_train=1, paired_val=1)
    write_synthetic_dataset(root, spec, False)
    return root


def _rows(report) -> list[tuple[str, str, str]]:
    return [(f.path, f.kind, f.reason) for f in report.findings if f.kind != "decoder"]


def test_one_video_file_is_checked_as_a_video(tmp_path):
    video = tmp_path / "cam.mp4"
    encode_tagged_video(video, 0, 20)  # with cam.csv beside it
    report = check_path(video, progress=False)
    assert report.ok and report.checked == 1 and report.sources == [f"video {video}"]
    (tmp_path / "cam.csv").unlink()
    assert _rows(check_path(video, progress=False)) == [
        (str(video), "label", "no label file: expected cam.csv (or DeepEthogram's cam_labels.csv) beside it")
    ]
    truncated = tmp_path / "cut.mp4"
    truncated.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    (path, kind, reason) = _rows(check_path(truncated, progress=False))[0]
    assert (path, kind) == (str(truncated), "video") and "not UTF-8" not in reason


@pytest.mark.parametrize(
    ("suffix", "fmt", "name"),
    [(".gif", "GIF", "GIF"), (".bmp", "BMP", "BMP"), (".webp", "WEBP", "WebP"), (".tiff", "TIFF", "TIFF")],
)
def test_an_image_of_another_format_is_named_as_unsupported(tmp_path, suffix, fmt, name):
    path = tmp_path / f"x{suffix}"
    Image.new("RGB", (20, 10), (1, 2, 3)).save(path, format=fmt)
    reason = f"a {name} image: gpufeed reads JPEG and PNG images only; convert it to one of those"
    report = check_path(path, progress=False)
    assert _rows(report) == [(str(path), "image", reason)] and not report.ok
    renamed = tmp_path / f"x{suffix}.bin"  # by its first bytes, whatever its name
    shutil.copy(path, renamed)
    assert _rows(check_path(renamed, progress=False)) == [(str(renamed), "image", reason)]


def test_a_gif_named_on_the_command_line_is_one_line_and_exit_1(tmp_path, capsys):
    path = tmp_path / "anim.gif"
    out = io.BytesIO()
    Image.new("RGB", (8, 8)).save(out, format="GIF")
    path.write_bytes(out.getvalue())
    assert main(["check", str(path)]) == 1
    captured = capsys.readouterr()
    assert f"  [image] {path}: a GIF image: gpufeed reads JPEG and PNG images only" in captured.out
    assert "not UTF-8" not in captured.out + captured.err


def test_split_folders_of_class_folders_are_checked_each_with_a_warning(synth, tmp_path):
    nested = tmp_path / "photos"
    for split in ("train", "val"):
        shutil.copytree(synth / "images" / split, nested / split)
    report = check_path(nested, progress=False)
    assert _rows(report) == [(str(nested), "warning", SPLIT_WARNING)]
    assert report.ok and report.sources == [
        f"class folders under {nested / 'train'}",
        f"class folders under {nested / 'val'}",
    ]
    assert report.checked == 6, "4 training and 2 validation images, each split with its own classes"


def test_split_folders_of_videos_are_checked_as_video_folders(tmp_path):
    nested = tmp_path / "videos"
    for split, video_id in (("train", 0), ("val", 1)):
        encode_tagged_video(nested / split / f"v{video_id}.mp4", video_id, 12)
    write_tagged_store(nested / "val" / "mouse", 2, 12)  # a frame folder among them
    report = check_path(nested, progress=False)
    assert _rows(report) == [(str(nested), "warning", SPLIT_WARNING)]
    assert report.sources == [f"videos in {nested / 'train'}", f"videos in {nested / 'val'}"] and report.checked == 3


def test_class_folders_named_like_splits_but_holding_images_are_classes(synth, tmp_path):
    classes = tmp_path / "trains"
    for name, source in (("train", "amber"), ("test", "birch")):
        shutil.copytree(synth / "images" / "train" / source, classes / name)
    report = check_path(classes, progress=False)
    assert report.findings == [] and report.sources == [f"class folders under {classes}"]


def test_synth_layout_with_list_files_is_not_called_split_folders(synth):
    report = check_path(synth / "images", progress=False)
    assert report.ok and not [f for f in report.findings if f.kind == "warning"]


@pytest.mark.parametrize("form", ["hdf5", "folder"])
def test_a_deepethogram_store_named_directly_finds_its_labels_file(tmp_path, form):
    project = make_deepethogram_project(tmp_path / "p_deepethogram", form, (12,), by="hand")
    record = project / "DATA" / "mouse00"
    store = record / ("mouse00.h5" if form == "hdf5" else "mouse00")
    report = check_path(store, progress=False)
    assert report.ok and report.sources == [f"frame store {store}"], _rows(report)
    # The record names another label file: that one is read (one row short here, so named).
    lines = (record / "mouse00_labels.csv").read_text().splitlines()
    (record / "edited_labels.csv").write_text("\n".join(lines[:-1]) + "\n")
    doc = yaml.safe_load((record / "record.yaml").read_text())
    doc["label"]["default"] = "edited_labels.csv"
    (record / "record.yaml").write_text(yaml.safe_dump(doc))
    assert _rows(check_path(store, progress=False)) == [
        (str(store), "label", "label file edited_labels.csv has 11 rows but the video has 12 frames")
    ]
    (record / "record.yaml").unlink()  # no record: DeepEthogram's file name
    assert check_path(store, progress=False).ok


def test_check_help_names_every_kind_it_takes():
    check = build_parser()._subparsers._group_actions[0].choices["check"]
    text = " ".join(check.format_help().split())
    for kind in (
        "class folders",
        "image list file",
        "paired (dense) split, rgb/ with depth/ and/or mask/",
        "video folder",
        "one video file, frame folder or .h5 frame file",
        "DeepEthogram project",
        "split folders",
        "'gpufeed synth' output",
        "single JPEG/PNG images",
        "GIF",
        "--num-classes",
        "--config",
    ):
        assert kind in text, kind


def test_training_on_the_folder_of_splits_warns_naming_them(synth, tmp_path, caplog):
    from gpufeed.config import parse_config
    from gpufeed.train._data import warn_split_folders

    nested = tmp_path / "photos"
    for split in ("train", "val"):
        shutil.copytree(synth / "images" / split, nested / split)
    cfg = parse_config({"data": {"train": {"root": str(nested)}, "val": {"root": str(nested / "val")}}})
    expected = (
        f"data.train.root {nested} holds the split folders train/, val/, which train as its classes; point "
        "data.train.root and data.val.root at the split folders themselves"
    )
    caplog.set_level("WARNING", logger="gpufeed")
    assert warn_split_folders(cfg) == [expected] and expected in caplog.text
    fixed = parse_config({"data": {"train": {"root": str(nested / "train")}, "val": {"root": str(nested / "val")}}})
    assert warn_split_folders(fixed) == []
