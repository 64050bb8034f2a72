"""Hostile projects and configs (issue #32): bounded YAML and CSV, contained paths, no file content in any message.

Each case is the file the issue describes, made small: the 369-byte alias bomb, a record naming
``/proc/self/environ``, paths out of the project by absolute path, ``..`` and symbolic link, two
records naming one video, a label file far longer than its video. Each expects its one-line
message, and that no secret written into a file outside the project reaches any output.
"""

from __future__ import annotations

import json
import os
import shutil

import h5py
import numpy as np
import pytest
import yaml
from hostilehelp import SECRET, billion_laughs, secret_file
from videohelp import make_deepethogram_project, write_tagged_store

from gpufeed.config import ConfigError, load_config, parse_config
from gpufeed.core._yaml import YAML_MAX_BYTES, YamlError, parse_yaml, read_yaml
from gpufeed.pipelines import DatasetError, check_path
from gpufeed.pipelines._deepethogram import project_dataset
from gpufeed.pipelines._label_csv import read_label_csv
from gpufeed.pipelines._pairs import PairedDataset

FRAMES = (12, 12, 12)


# -- YAML ------------------------------------------------------------------------------------------


def test_the_369_byte_alias_bomb_is_refused_before_it_expands(tmp_path):
    path = tmp_path / "project_config.yaml"
    path.write_text(billion_laughs())
    assert path.stat().st_size == 369
    with pytest.raises(YamlError) as info:
        read_yaml(path, "DeepEthogram project config")
    assert str(info.value) == (
        f"DeepEthogram project config {path} is refused: its aliases expand to more than 100,000 values "
        "at line 6, column 4"
    )


def test_a_gpufeed_config_bomb_and_an_override_bomb_are_one_line_config_errors(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text(billion_laughs(key="data: {classes: *%s}"))
    with pytest.raises(ConfigError, match=r"config file .*train\.yaml is refused: its aliases expand") as info:
        load_config(path)
    assert len(str(info.value)) < 200
    levels = ["&l0 [" + ",".join(["x"] * 9) + "]"]
    levels += [f"&l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, 9)]
    bomb = "[" + ",".join(levels) + "]"  # the same bomb on one command line: 72 aliases, 9**9 strings
    with pytest.raises(ConfigError, match=r"data\.classes': the value of override data\.classes is refused: its alias"):
        parse_config(None, [f"data.classes={bomb}"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &a [1, *a]\n", "is refused: an alias refers to a node that contains it (a cycle) at line 1, column 4"),
        ("[" * 10_000, "is refused: nested deeper than 64 levels at line 1, column 65"),
        ("token: sk-live-SECRET\n  bad: [1\n", "is not valid YAML: mapping values are not allowed here at line 2"),
        ("x: \x07\n", "is not valid YAML: special characters are not allowed: character #x0007 at offset 3"),
    ],
)
def test_yaml_refusals_name_the_rule_and_line_never_the_text(text, message):
    with pytest.raises(YamlError) as info:
        parse_yaml(text, "config file t.yaml")
    assert str(info.value).startswith(f"config file t.yaml {message}")
    assert "SECRET" not in str(info.value) and "\n" not in str(info.value)


def test_yaml_files_are_bounded_in_size_and_must_be_utf8(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" + b" " * YAML_MAX_BYTES)
    with pytest.raises(YamlError, match=r"is larger than 1,048,576 bytes, the limit for a YAML file; refused unread"):
        read_yaml(big, "record")
    latin = tmp_path / "record.yaml"
    latin.write_bytes(b"key: m\xe4use\n")
    with pytest.raises(YamlError) as info:
        read_yaml(latin, "record")
    assert str(info.value) == f"record {latin} is not UTF-8 text: byte 0xe4 at offset 6 (line 1)"
    assert parse_yaml("a: &x {k: 1}\nb: *x\n", "t") == {"a": {"k": 1}, "b": {"k": 1}}, "a few aliases are fine"


def test_config_errors_quote_a_long_value_cut():
    with pytest.raises(ConfigError) as info:
        parse_config({"loader": {"batch_size": "9" * 1_000_000}})
    assert "expected an integer, got '99999" in str(info.value) and len(str(info.value)) < 120


# -- DeepEthogram projects ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project_source(tmp_path_factory):
    return make_deepethogram_project(tmp_path_factory.mktemp("deg") / "project", "folder", FRAMES, by="hand")


@pytest.fixture
def project(project_source, tmp_path):
    copy = tmp_path / "project"
    shutil.copytree(project_source, copy, symlinks=True)
    return copy


def _set_default(project, key: str, entry: str, value: str) -> None:
    path = project / "DATA" / key / "record.yaml"
    record = yaml.safe_load(path.read_text())
    record[entry]["default"] = value
    path.write_text(yaml.safe_dump(record))


def _findings(project, **kw) -> dict[str, str]:
    report = check_path(project, progress=False, **kw)
    assert SECRET not in report.to_json() and SECRET not in report.table(), "no secret in any output"
    return {f.path.split("/DATA/")[1].split("/")[0] if "/DATA/" in f.path else "": f.reason for f in report.findings}


def test_a_project_config_bomb_and_a_record_bomb_are_named(project):
    (project / "project_config.yaml").write_text(billion_laughs())
    found = _findings(project)
    assert found[
        ""
    ] == f"DeepEthogram project config {project / 'project_config.yaml'} is refused: its aliases expand " + (
        "to more than 100,000 values at line 6, column 4"
    )
    (project / "project_config.yaml").write_text("project: {class_names: [background, groom, rear, walk]}\n")
    (project / "DATA" / "mouse01" / "record.yaml").write_text(billion_laughs(key="rgb: {default: *%s}"))
    reason = _findings(project)["mouse01"]
    assert reason.startswith("record mouse01 (DATA/mouse01/record.yaml): record ") and "aliases expand" in reason
    assert len(reason) < 300


def test_class_names_of_any_size_are_quoted_cut(project):
    (project / "project_config.yaml").write_text(json.dumps({"project": {"class_names": "x" * 1_000_000}}))
    with pytest.raises(DatasetError) as info:
        project_dataset(project, split="all", val_fraction=0.0, seed=0)
    assert "'project.class_names' must list at least two class names" in str(info.value)
    assert len(str(info.value)) < 300


def test_a_record_naming_proc_self_environ_is_refused_by_its_rule(project):
    _set_default(project, "mouse00", "label", "/proc/self/environ")
    reason = _findings(project)["mouse00"]
    assert reason == (
        "record mouse00 (DATA/mouse00/record.yaml): key 'label.default' names '/proc/self/environ', an absolute path "
        f"outside the project; files must be inside {project} (more folders can be named in data.allowed_roots)"
    )
    assert "PATH=" not in reason


def test_absolute_parent_and_symlinked_paths_out_of_the_project_are_refused(project, tmp_path):
    outside = tmp_path / "outside"
    write_tagged_store(outside / "stolen", 7, FRAMES[0], by="hand", labels=True)
    secret = secret_file(outside / "secret.csv")
    _set_default(project, "mouse00", "rgb", str(outside / "stolen"))
    _set_default(project, "mouse01", "label", "../../../outside/secret.csv")
    os.symlink(secret, project / "DATA" / "mouse02" / "labels.csv")
    _set_default(project, "mouse02", "label", "labels.csv")
    found = _findings(project)
    assert (
        "key 'rgb.default' names '" in found["mouse00"] and "an absolute path outside the project" in found["mouse00"]
    )
    assert "names '../../../outside/secret.csv', a path whose '..' steps lead outside the project" in found["mouse01"]
    assert "names 'labels.csv', a path whose symbolic link leads outside the project" in found["mouse02"]
    allowed = project_dataset(project, split="all", val_fraction=0.0, seed=0, allowed_roots=(outside,))
    stolen = allowed.paths.index(str(project / "DATA" / "mouse00" / str(outside / "stolen")))
    assert stolen not in allowed.problems, "a folder of data.allowed_roots may be named"
    assert SECRET not in json.dumps(allowed.problems)


def test_two_records_naming_one_video_are_one_problem_naming_both(project):
    dup = project / "DATA" / "mouse03"
    dup.mkdir()
    shutil.copy(project / "DATA" / "mouse01" / "record.yaml", dup / "record.yaml")
    _set_default(project, "mouse03", "rgb", "../mouse01/mouse01")
    _set_default(project, "mouse03", "label", "../mouse01/mouse01_labels.csv")
    found = _findings(project)
    assert found == {
        "mouse03": "record mouse03 (DATA/mouse03/record.yaml): key 'rgb.default' names the video of record mouse01 "
        "(DATA/mouse01/mouse01); records mouse01, mouse03 all name it, and a video may belong to one record only"
    }


def test_a_store_reaching_out_of_the_project_is_refused(project, tmp_path):
    outside = tmp_path / "outside"
    write_tagged_store(outside / "other", 5, FRAMES[0], by="hand", labels=False)
    write_tagged_store(outside / "other.h5", 5, FRAMES[0], by="hand", labels=False)
    frame = project / "DATA" / "mouse00" / "mouse00" / "000000003.png"
    frame.unlink()
    os.symlink(outside / "other" / "000000003.png", frame)
    store = project / "DATA" / "mouse01" / "mouse01.h5"
    with h5py.File(store, "w") as fh:
        fh["frame"] = h5py.ExternalLink(str(outside / "other.h5"), "frame")
    _set_default(project, "mouse01", "rgb", "mouse01.h5")
    found = _findings(project)
    assert (
        "key 'rgb.default' (mouse00): frame '000000003.png' is a symbolic link that leads outside" in found["mouse00"]
    )
    assert "key 'rgb.default' (mouse01.h5): its 'frame' dataset is an external link to '" in found["mouse01"]
    assert "outside the project" in found["mouse01"]


# -- label CSVs --------------------------------------------------------------------------------------


def test_a_label_csv_longer_than_its_video_is_refused_unread(tmp_path):
    path = tmp_path / "labels.csv"
    rows = "".join(f"{i},0,1\n" for i in range(100_000))
    path.write_bytes(b",a,b\n" + rows.encode() + b"\xff\x00" * 1000)  # a body that would fail to parse if read
    with pytest.raises(ValueError) as info:
        read_label_csv(path, max_rows=40)
    assert str(info.value) == (
        f"label file {path} is {path.stat().st_size:,} bytes, more than 40 rows of 2 label(s) can take (1,285 bytes): "
        "it cannot "
        "label the video's 40 frames; refused unread"
    )
    path.write_text(",a,b\n" + "".join(f"{i},0,1\n" for i in range(45)))  # within the byte budget
    names, labels = read_label_csv(path, max_rows=40)
    assert names == ("a", "b") and labels.shape == (41, 2), "reading stops one row past the video's frames"


def test_a_file_that_is_not_a_label_csv_is_described_never_quoted(tmp_path):
    secret = secret_file(tmp_path / "secret.csv")
    with pytest.raises(ValueError) as info:
        read_label_csv(secret, max_rows=40)
    assert str(info.value) == (
        f"label file {secret}: the header must be 'frame,<behaviour>,...' (or DeepEthogram's ',<behaviour>,...'), "
        "got a first line of 2 column(s) whose first column is not 'frame' or empty"
    )
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(ValueError, match=r"is not UTF-8 text: byte 0x89 at offset 0 of line 1$"):
        read_label_csv(binary)
    long_cell = tmp_path / "long.csv"
    long_cell.write_text(",a\n0," + "7" * 10_000 + "\n")
    with pytest.raises(ValueError) as info:
        read_label_csv(long_cell)
    assert "labels must be 0 or 1, got ['77777" in str(info.value) and len(str(info.value)) < len(str(long_cell)) + 120


# -- paired list files -------------------------------------------------------------------------------


def test_a_paired_list_names_only_files_inside_its_folder(tmp_path):
    from PIL import Image

    root, outside = tmp_path / "split", tmp_path / "elsewhere"
    for folder in (root / "rgb", root / "depth", outside / "depth"):
        folder.mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "rgb" / "a.jpg")
    for folder in (root / "depth", outside / "depth"):
        Image.fromarray(np.ones((8, 8), np.uint16)).save(folder / "a.png")
    os.symlink(outside / "depth" / "a.png", root / "depth" / "b.png")
    cases = {
        "abs.txt": (f"rgb/a.jpg {outside / 'depth' / 'a.png'}", "an absolute path outside the list file's folder"),
        "up.txt": ("rgb/a.jpg ../elsewhere/depth/a.png", "a path whose '..' steps lead outside the list file's folder"),
        "link.txt": ("rgb/a.jpg depth/b.png", "a path whose symbolic link leads outside the list file's folder"),
    }
    for name, (line, rule) in cases.items():
        (root / name).write_text(f"# rgb depth\n{line}\n")
        with pytest.raises(DatasetError) as info:
            PairedDataset.from_list(root / name)
        assert str(info.value).startswith(f"{root / name}:2: names '") and rule in str(info.value)
    allowed = PairedDataset.from_list(root / "abs.txt", allowed_roots=(outside,))
    assert not allowed.problems and allowed.maps["depth"] == (str(outside / "depth" / "a.png"),)
