"""`gpufeed check`: every bad file is listed with its path and reason, before any training."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from gpufeed.pipelines import DatasetError, ImageDataset, check_path
from gpufeed.synth._damaged import declare_size, png_with_damaged_data


@pytest.fixture
def damaged(synth_dir, tmp_path):
    """A copy of the training split with one of each kind of damage."""
    root = tmp_path / "train"
    shutil.copytree(synth_dir / "images" / "train", root, ignore=shutil.ignore_patterns(".gpufeed"))
    jpgs, pngs = sorted(root.rglob("*.jpg")), sorted(root.rglob("*.png"))
    cases = {}
    jpgs[0].write_bytes(b"")
    cases[jpgs[0]] = "zero-byte"
    jpgs[1].write_bytes(jpgs[1].read_bytes()[:-200])
    cases[jpgs[1]] = "truncated JPEG"
    pngs[0].write_bytes(pngs[0].read_bytes()[:-100])
    cases[pngs[0]] = "truncated PNG"
    jpgs[2].write_text("this is not an image")
    cases[jpgs[2]] = "not an image"
    pngs[1].write_bytes(png_with_damaged_data(pngs[1].read_bytes()))
    cases[pngs[1]] = "cannot be decoded"
    body = bytearray(pngs[2].read_bytes())
    body[body.index(b"IDAT") + 10] ^= 0x01
    pngs[2].write_bytes(bytes(body))
    cases[pngs[2]] = "fails its CRC check"
    whole = jpgs[3].read_bytes()
    scan = whole.index(b"\xff\xda")
    jpgs[3].write_bytes(whole[: scan + (len(whole) - scan) // 2] + b"\xff\xd9")  # cut inside the scan data
    cases[jpgs[3]] = "premature end of data segment"
    jpgs[4].write_bytes(declare_size(jpgs[4].read_bytes(), 65500, 65500))
    cases[jpgs[4]] = "too many pixels"
    # Not problems: bytes after the end marker.
    jpgs[5].write_bytes(jpgs[5].read_bytes() + b"\x00\x00\x00\x18ftypmp42" + bytes(3000))
    pngs[3].write_bytes(pngs[3].read_bytes() + b"padding")
    notes = root / "amber" / "notes.txt"
    notes.write_text("hello")
    return root, cases, notes


def test_check_lists_every_problem_with_path_and_reason(damaged):
    root, cases, notes = damaged
    report = check_path(root, progress=False)
    found = {f.path: f for f in report.findings}
    for path, words in cases.items():
        assert str(path) in found, f"{path} ({words}) not reported"
        assert words in found[str(path)].reason
    assert found[str(notes)].kind == "ignored"
    assert not report.ok
    assert report.bad_paths() == sorted(str(p) for p in cases)
    assert report.checked == sum(1 for p in root.rglob("*") if p.suffix in (".jpg", ".png"))


def test_unknown_labels_in_a_list_file(synth_dir, tmp_path):
    images = synth_dir / "images"
    lines = (images / "val.txt").read_text().splitlines()
    lines[2] = lines[2].rsplit(" ", 1)[0] + " 17"
    lines[3] = lines[3].rsplit(" ", 1)[0] + " zebra"
    lst = tmp_path / "val.txt"
    lst.write_text("\n".join(f"{images / line.split()[0]} {line.split()[1]}" for line in lines) + "\n")
    shutil.copy(images / "classes.txt", tmp_path / "classes.txt")
    report = check_path(lst, progress=False)
    reasons = {f.reason for f in report.findings if f.kind == "label"}
    assert any("'17'" in r and "out of range" in r and f"{lst}:3" in r for r in reasons), reasons
    assert any("'zebra'" in r and f"{lst}:4" in r for r in reasons), reasons


def test_synthetic_dataset_is_clean(synth_dir):
    report = check_path(synth_dir, progress=False)
    assert report.ok, report.table()
    assert report.checked >= 128


def test_missing_and_empty(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        check_path(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="empty folder"):
        check_path(tmp_path / "empty")


def test_one_image_file_is_checked_alone(damaged):
    """A user checking one suspect file gets that file's verdict, not a list-file parse error."""
    root, cases, _ = damaged
    for path, words in cases.items():
        report = check_path(path, progress=False)
        assert report.checked == 1 and report.bad_paths() == [str(path)], (path, report.table())
        assert words in report.findings[0].reason
    fine = sorted(p for p in root.rglob("*.jpg") if p not in cases)[0]
    assert check_path(fine, progress=False).table().endswith("no problems found")


@pytest.mark.process
def test_cli_exit_status_json_and_quarantine(damaged, tmp_path):
    root, cases, _ = damaged
    out_json, quarantine = tmp_path / "report.json", tmp_path / "quarantine.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "check", str(root), "--json", str(out_json), "--quarantine", str(quarantine)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    for path in cases:
        assert str(path) in proc.stdout
    report = json.loads(out_json.read_text())
    assert report["ok"] is False and len(report["findings"]) >= len(cases)
    assert quarantine.read_text().split() == sorted(str(p) for p in cases)


def test_a_hash_inside_a_list_file_path_is_part_of_the_path(synth_dir, tmp_path):
    images = synth_dir / "images"
    source = sorted((images / "val").rglob("*.jpg"))[:3]
    folder = tmp_path / "photos #2"
    folder.mkdir()
    names = ["#1 best.jpg", "shot#2.jpg", "plain.jpg"]
    for src, name in zip(source, names, strict=True):
        shutil.copy(src, folder / name)
    lst = tmp_path / "list.txt"
    lst.write_text(
        "# a comment line\n"
        "   # an indented comment line\n"
        "\n"
        f"photos #2/{names[0]} 1\n"
        f"{folder / names[1]} amber\n"
        f"photos #2/{names[2]} 2\n"
    )
    shutil.copy(images / "classes.txt", tmp_path / "classes.txt")
    dataset = ImageDataset.from_list(lst)
    assert dataset.paths == tuple(str(folder / name) for name in names)
    assert dataset.labels.tolist() == [1, 0, 2] and not dataset.problems
    report = check_path(lst, progress=False)
    assert report.ok and report.checked == 3, report.table()


def test_a_comment_after_an_entry_is_explained(synth_dir, tmp_path):
    images = synth_dir / "images"
    first = sorted((images / "val").rglob("*.jpg"))[0]
    lst = tmp_path / "list.txt"
    lst.write_text(f"{first} 1  # blurry\n")
    shutil.copy(images / "classes.txt", tmp_path / "classes.txt")
    report = check_path(lst, progress=False)
    (finding,) = [f for f in report.findings if f.kind == "label"]
    assert "'blurry'" in finding.reason and "comments go on lines of their own" in finding.reason
