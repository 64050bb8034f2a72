"""The hostile set of issue #32 through the real commands: no process over 1.5 GB, one line each, no secret.

Before the fixes, on this set: ``check`` of the alias-bomb project reached 8.1 GB and printed 2.1 GB,
``train`` on the frame-folder bomb 5.8 GB, on the 16-bit depth-map bomb 4.1 GB, on the 10-million-row
label CSV 2.4 GB (37 s). Each command runs under a small Python parent that reports its children's
peak resident size (``getrusage(RUSAGE_CHILDREN)``), so the figure is the command's own (and its
worker processes'), not the test session's.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml
from hostilehelp import SECRET, billion_laughs, bomb_png, secret_file
from train_support import gpufeed_cmd
from videohelp import make_deepethogram_project, write_tagged_store

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]

LIMIT_KB = 1_500_000  # 1.5 GB, as ru_maxrss counts (KiB on Linux)
_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n"
)


def _label_rows(path, frames: int, columns: int = 4) -> None:
    row = ",".join(["0"] * columns)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("," + ",".join(f"c{i}" for i in range(columns)) + "\n")
        for start in range(0, frames, 500_000):
            fh.write("".join(f"{i},{row}\n" for i in range(start, min(start + 500_000, frames))))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The set: projects (alias bomb, /proc/self/environ, paths out, a 10-million-row CSV), pixel bombs."""
    root = tmp_path_factory.mktemp("hostile")
    base = make_deepethogram_project(root / "base", "folder", (24, 24, 24), by="hand")
    made = {}
    for name in ("yaml_bomb", "environ", "csv_rows"):
        made[name] = shutil.copytree(base, root / name)
    (made["yaml_bomb"] / "project_config.yaml").write_text(billion_laughs())
    record = made["environ"] / "DATA" / "mouse00" / "record.yaml"
    data = yaml.safe_load(record.read_text())
    data["label"]["default"] = str(secret_file(root / "outside" / "secret.csv"))
    record.write_text(yaml.safe_dump(data))
    _label_rows(made["csv_rows"] / "DATA" / "mouse00" / "mouse00_labels.csv", 10_000_000)
    big = bomb_png(30000, 30000)  # 2.6 MB on disk, 2.7 GB decoded
    made["frames"] = root / "frames"
    for video in range(3):
        write_tagged_store(made["frames"] / f"v{video}", video, 24, by="hand")
        write_tagged_store(made["frames"] / f"h{video}.h5", video, 24, by="hand")
    (made["frames"] / "v1" / "000000005.png").write_bytes(big)
    with h5py.File(made["frames"] / "h1.h5", "a") as fh:
        fh["frame"][5] = np.frombuffer(big, np.uint8)
    made["depth"] = _depth_bomb(root / "depth")
    config = root / "bomb.yaml"
    config.write_text(billion_laughs(key="data: {classes: *%s}"))
    made["config_bomb"] = config
    return made


def _depth_bomb(root):
    from PIL import Image

    for split in ("train", "val"):
        for kind in ("rgb", "depth"):
            (root / split / kind).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(root / split / "rgb" / f"{i}.jpg")
            Image.fromarray(np.ones((24, 32), np.uint16)).save(root / split / "depth" / f"{i}.png")
    (root / "train" / "depth" / "2.png").write_bytes(bomb_png(30000, 30000, bits=16, colour=0))
    return root


def _measured(tmp_path, *args: str) -> tuple[int, int, str]:
    """(exit status, peak RSS of the command in KiB, its stdout and stderr)."""
    rss = tmp_path / "rss.txt"
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(rss), *gpufeed_cmd(*args)], capture_output=True, text=True, timeout=600
    )
    return done.returncode, int(rss.read_text()), done.stdout + done.stderr


def test_check_of_the_whole_set_stays_small_and_says_each_rule(hostile, tmp_path):
    paths = [str(hostile[name]) for name in ("yaml_bomb", "environ", "csv_rows", "frames")]
    code, peak_kb, out = _measured(tmp_path, "check", *paths, str(hostile["depth"] / "train"))
    assert code == 1 and peak_kb < LIMIT_KB, (peak_kb, out[-2000:])
    assert SECRET not in out and len(out) < 20_000
    for words in (
        "is refused: its aliases expand to more than 100,000 values",
        "an absolute path outside the project",
        "bytes, more than 24 rows of 4 label(s) can take",
        "000000005.png is refused: too many pixels: the header declares 30000x30000",
        "h1.h5: frame 5 is refused: too many pixels",
        "depth map",
    ):
        assert words in out, (words, out[-3000:])


def _train_config(tmp_path, hostile, case: str):
    common = {"device": "cpu", "seed": 0, "loader": {"batch_size": 2, "num_threads": 2}, "augment": {"ops": []}}
    common |= {"train": {"epochs": 1, "max_steps": 2, "progress": False}, "telemetry": {"metrics_port": 0}}
    clip = {"model": {"name": "clip_resnet18"}}
    cases = {
        "yaml_bomb": clip | {"video": {"deepethogram": str(hostile["yaml_bomb"]), "size_px": 32}},
        "csv_rows": clip | {"video": {"deepethogram": str(hostile["csv_rows"]), "size_px": 32}},
        # Evaluation reads every clip in order, so the run meets a bomb whatever training drew.
        "frames": clip | {"video": {"train": str(hostile["frames"]), "val": str(hostile["frames"]), "size_px": 32}},
        "depth": {
            "model": {"name": "unet_resnet18"},
            "data": {"train": {"root": str(hostile["depth"] / "train")}, "scale_maps": True},
            "image": {"size_px": 32},
        },
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(common | cases[case]))
    return path


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("yaml_bomb", "project_config.yaml is refused: its aliases expand to more than 100,000 values at line 6"),
        ("csv_rows", "mouse00_labels.csv is 158,888,903 bytes, more than 24 rows of 4 label(s) can take"),
        ("frames", "is refused: too many pixels: the header declares 30000x30000 = 900,000,000 pixels"),
        ("depth", "rgb/2.jpg): too many pixels: the header declares 30000x30000"),
        ("config_bomb", "bomb.yaml is refused: its aliases expand to more than 100,000 values"),
    ],
)
def test_train_refuses_each_case_in_one_line_and_small(hostile, tmp_path, case, words):
    config = hostile["config_bomb"] if case == "config_bomb" else _train_config(tmp_path, hostile, case)
    code, peak_kb, out = _measured(tmp_path, "train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert code == 2 and peak_kb < LIMIT_KB, (peak_kb, out[-2000:])
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and len(errors[0]) < 1200, out[-3000:]
    assert words in errors[0], errors[0]
