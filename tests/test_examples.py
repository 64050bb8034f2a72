"""Every script in examples/ runs as a user runs it, on the CPU, over small synthetic data.

Each example is a subprocess started from a folder outside the checkout, reading images and
videos written by :func:`gpufeed.synth.write_synthetic_dataset` (2 classes of 16 training images,
2 labelled videos); each test checks what the script printed against what the data holds. The
DDP example runs under torchrun with two ranks (gloo); the client example classifies photos
through a real ``gpufeed serve`` of a freshly exported model.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _serving import write_checkpoint

from gpufeed.models import export_model
from gpufeed.synth import SynthSpec, write_synthetic_dataset

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TRAIN_IMAGES = 32  # 2 classes x 16
SPEC = SynthSpec(
    num_classes=2,
    train_per_class=16,
    val_per_class=3,
    num_videos=2,
    video_frames=(24, 20),
    paired_train=0,
    paired_val=0,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_synthetic_dataset(tmp_path_factory.mktemp("examples-data"), SPEC, progress=False)


def _example(script: str, *args, cwd: Path, launcher: tuple = (), timeout: float = 240) -> str:
    cmd = [sys.executable, *launcher, str(EXAMPLES / script), *map(str, args)]
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_example_is_short_and_tested_here():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == [
        "classify_folder.py",
        "score_video_own_loop.py",
        "train_clips_own_loop.py",
        "train_ddp.py",
        "train_lightning.py",
        "train_own_loop.py",
    ]
    for name in scripts:
        lines = (EXAMPLES / name).read_text().splitlines()
        assert len(lines) <= 62, f"examples/{name} has {len(lines)} lines"


def test_train_own_loop(data, tmp_path):
    out = _example(
        "train_own_loop.py", data / "images" / "train", "--epochs", 2, "--batch-size", 8, "--size", 32, cwd=tmp_path
    )
    assert f"{TRAIN_IMAGES} images, 2 classes ['amber', 'birch']" in out, out
    losses = [float(x) for x in re.findall(rf"^epoch \d: {TRAIN_IMAGES} images, mean loss ([\d.]+)", out, re.M)]
    assert len(losses) == 2 and all(0 < loss < 5 for loss in losses), out


def test_train_clips_own_loop(data, tmp_path):
    args = ("--batch-size", 2, "--clip-length", 4, "--size", 32)
    out = _example("train_clips_own_loop.py", data / "videos", *args, cwd=tmp_path)
    assert "2 videos, behaviours ['background', 'groom', 'rear', 'walk'], clip shape (3, 4, 32, 32)" in out, out
    clips = re.search(r"^epoch 0: (\d+) clips, mean loss [\d.]+$", out, re.M)
    assert clips and int(clips.group(1)) >= 8, out


def test_train_lightning_gets_every_epoch(data, tmp_path):
    out = _example(
        "train_lightning.py", data / "images" / "train", "--epochs", 2, "--batch-size", 8, "--size", 32, cwd=tmp_path
    )
    steps = TRAIN_IMAGES // 8
    assert f"{TRAIN_IMAGES} images, {steps} batches an epoch" in out, out
    # The second epoch is as long as the first: the loader starts a new epoch when Lightning stops at len(loader).
    assert re.findall(r"^epoch (\d): (\d+) steps", out, re.M) == [("0", str(steps)), ("1", str(steps))], out
    assert f"trained {2 * steps} steps with Lightning" in out, out


def test_train_ddp_two_ranks_read_disjoint_shards(data, tmp_path):
    launcher = ("-m", "torch.distributed.run", "--nproc-per-node", "2")
    args = (data / "images" / "train", "--epochs", 2, "--batch-size", 4, "--size", 32)
    out = _example("train_ddp.py", *args, cwd=tmp_path, launcher=launcher)
    for rank in (0, 1):
        assert out.count(f"rank {rank} of 2, shard {rank}/2: {TRAIN_IMAGES // 2} images") == 2, out
    summary = re.findall(r"^epoch (\d): 2 ranks read (\d+) images, (\d+) distinct", out, re.M)
    assert summary == [(str(e), str(TRAIN_IMAGES), str(TRAIN_IMAGES)) for e in (0, 1)], out


def _wait_ready(url: str, server: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"gpufeed serve exited {server.returncode}"
        try:
            with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"gpufeed serve at {url} not ready after {timeout_s} s")


def test_classify_folder_through_gpufeed_serve(data, tmp_path):
    classes = ("amber", "birch")
    checkpoint = write_checkpoint(tmp_path / "run", "smallcnn", num_classes=2, size_px=48, labels=classes)
    export_model(checkpoint, tmp_path / "models" / "shapes", batch_size=4)
    cmd = [sys.executable, "-m", "gpufeed", "serve", "--model", str(tmp_path / "models" / "shapes"), "--port", "0"]
    cmd += ["--set", "device=cpu", "--set", "serve.warmup_batches=1"]
    server = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        for line in server.stdout:
            seen.append(line)
            if match := re.search(r"listening on (http://\S+)", line):
                break
        assert match, "".join(seen)
        url = match.group(1)
        _wait_ready(url, server)
        photos = tmp_path / "photos"
        shutil.copytree(data / "images" / "val", photos)
        (photos / "0-cut.jpg").write_bytes(b"\xff\xd8\xff\xe0 a JPEG cut after its first marker")
        cmd = [sys.executable, str(EXAMPLES / "classify_folder.py"), str(photos), "--url", url, "--top-k", "2"]
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    finally:
        server.terminate()
        server.wait(timeout=60)
    out = done.stdout
    assert done.returncode == 1, f"a refused photo sets the exit status: {done.returncode}\n{out}\n{done.stderr}"
    assert re.search(r"^0-cut\.jpg: refused: HTTP 400: \S", out, re.M), out  # and the others went on
    files = sorted(p.relative_to(photos).as_posix() for p in photos.rglob("*") if p.suffix in (".jpg", ".png"))
    answered = re.findall(r"^(\S+): (amber|birch) ([\d.]+), (amber|birch) ([\d.]+)$", out, re.M)
    assert sorted(a[0] for a in answered) == [f for f in files if f != "0-cut.jpg"] and len(files) == 7, out
    for _, first, p1, second, p2 in answered:  # top-2 of two classes: both, best first, softmax scores
        assert {first, second} == set(classes) and float(p1) >= float(p2) and abs(float(p1) + float(p2) - 1) < 0.02
    summary = re.search(r"^classified 6 photos with shapes: (\{.*\}); 1 refused$", out, re.M)
    assert summary and sum(json.loads(summary.group(1)).values()) == 6, out


def test_score_video_own_loop_writes_what_predict_writes(data, tmp_path):
    """The example's per-frame top classes are those of ``gpufeed predict``'s CSV for the same checkpoint."""
    import numpy as np

    from gpufeed.predict._outputs import read_predictions_csv

    labels = ("background", "groom", "rear", "walk")
    checkpoint = write_checkpoint(
        tmp_path / "run", "r3d_small", num_classes=4, size_px=32, clip_length_frames=4, labels=labels
    )
    video = sorted((data / "videos").glob("*.mp4"))[0]
    out = _example("score_video_own_loop.py", checkpoint, video, "--hop-frames", 2, cwd=tmp_path)
    rows = re.findall(r"^frame (\d+): (\w+) ([\d.]+)$", out, re.M)
    command = [sys.executable, "-m", "gpufeed", "predict", str(checkpoint), str(video), "--out", str(tmp_path / "p")]
    done = subprocess.run(
        [*command, "--hop-frames", "2", "--quiet", "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    names, values = read_predictions_csv(tmp_path / "p" / f"{video.stem}_predictions.csv")
    assert [int(r[0]) for r in rows] == list(range(len(values))) and len(values) == 24, out
    assert [r[1] for r in rows] == [names[i] for i in values.argmax(1)]
    np.testing.assert_allclose([float(r[2]) for r in rows], values.max(1), atol=2e-6)
    assert re.search(r"^scored 24 frames in 11 windows of 4: \{", out, re.M), out
