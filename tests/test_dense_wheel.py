"""Dense targets as a user runs them from the installed wheel: train, evaluate, export, serve.

Two paired datasets written by the tests' generator: 640x480 RGB JPEGs with 16-bit depth PNGs,
and RGB JPEGs with 8-bit masks. Each trains ``unet_resnet18`` for one epoch at 64x48 through the
wheel's ``gpufeed train`` (evaluation at the epoch's end writes the dense metrics), is exported
by ``gpufeed export`` (onnxruntime checked against PyTorch) and served, both models by one
``gpufeed serve`` process, all from the session's runtime-only venv (``installed``, in
``conftest.py``) and a folder outside the checkout. One request per model checks the answer's
shape, dtype and values.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from _serving import kserve_image_outputs
from _wheel_venv import ok, run_cmd
from PIL import Image

from gpufeed.config import parse_config
from gpufeed.pipelines._windows import eval_windows
from gpufeed.synth import write_paired_split
from gpufeed.synth._pairs import SYNTH_IGNORE_ID

pytestmark = [pytest.mark.process, pytest.mark.timeout(900)]
WIDTH, HEIGHT = 640, 480  # the source pairs
SIZE = (64, 48)  # the model's width and height: 4:3 like the source, so the window is a centre crop
DEPTH_SCALE = 0.001  # the maps hold millimetres
CLASSES = 4  # the synthetic masks' ids 0..3, 255 ignored


def _train_and_export(installed, work: Path, name: str, kinds: tuple[str, ...], extra: dict) -> dict:
    """Write the pairs into ``work``, then train and export with the wheel's CLI; the run's evaluations."""
    cwd = installed["cwd"]
    data = work / f"{name}-pairs"
    write_paired_split(data / "train", 16, WIDTH, HEIGHT, seed=0, kinds=kinds)
    write_paired_split(data / "val", 4, WIDTH, HEIGHT, seed=1, kinds=kinds)
    config = {
        "device": "cpu",
        "seed": 0,
        "data": {"train": {"root": str(data / "train")}, "val": {"root": str(data / "val")}, **extra.get("data", {})},
        "image": {"size_px": list(SIZE)},
        "loader": {"batch_size": 4, "num_threads": 2},
        "model": {"name": "unet_resnet18", **extra.get("model", {})},
        "train": {"epochs": 1, "progress": False},
        "augment": {"ops": ["color_jitter", "horizontal_flip"]},
        "telemetry": {"metrics_port": 0},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run = work / f"run-{name}"
    trained = ok(run_cmd([installed["gpufeed"], "train", "--config", path, "--out", run], cwd, installed["env"], 600))
    exported = run_cmd([installed["gpufeed"], "export", run, "--out", work / "repo" / name, "--batch-sizes", "1", "2"],
                    cwd, installed["env"], 600)  # fmt: skip
    ok(exported)
    steps = (run / "steps.jsonl").read_text().splitlines()
    evaluations = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    return {"stdout": trained.stdout + trained.stderr, "steps": steps, "eval": evaluations, "export": exported.stdout}


@pytest.fixture(scope="module")
def served(installed, tmp_path_factory):
    """Both models trained and exported from the wheel, then served by one ``gpufeed serve``.

    Their pairs, runs and exports (about 800 MB, mostly checkpoints) are removed with the module:
    a session fixture's folder would hold them to the session's end.
    """
    work = tmp_path_factory.mktemp("dense-wheel")
    try:
        yield from _serve(installed, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _serve(installed, work: Path):
    """Train, export and serve both models from ``work``; yields what the tests read."""
    depth = _train_and_export(installed, work, "depth", ("depth",), {"data": {"depth_scale": DEPTH_SCALE}})
    seg = _train_and_export(
        installed, work, "seg", ("mask",), {"model": {"task": "segmentation", "num_classes": CLASSES}}
    )
    cmd = [installed["gpufeed"], "serve", "--model-repo", work / "repo", "--port", "0"]
    cmd += ["--set", "device=cpu", "--set", "serve.warmup_batches=1"]
    proc = subprocess.Popen(
        [str(c) for c in cmd], cwd=installed["cwd"], env=installed["env"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        seen, url = [], None
        for line in proc.stdout:
            seen.append(line)
            match = re.search(r"listening on (http://\S+) ", line)
            if match:
                url = match.group(1)
                break
        assert url, "".join(seen)
        for _ in range(600):
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "".join(seen)
            time.sleep(0.5)
        val_image = (work / "depth-pairs" / "val" / "rgb" / "000000.jpg").read_bytes()
        yield {"url": url, "depth": depth, "seg": seg, "image": val_image}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _png(url: str, model: str, image: bytes) -> np.ndarray:
    answer = httpx.post(
        f"{url}/v1/models/{model}/predict?size=input",
        content=image,
        headers={"content-type": "image/jpeg", "accept": "image/png"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    return np.asarray(Image.open(io.BytesIO(answer.content)))


def _split_window(mapped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inside, outside) of the evaluation window (the default centre crop) in a map at the input's size."""
    fraction = parse_config({}).image.eval_crop_fraction
    window = eval_windows(np.array([[WIDTH, HEIGHT]]), fraction, SIZE[0] / SIZE[1])
    (x, y), (w, h) = window.anchor[0].tolist(), window.shape[0].tolist()
    outside = np.ones(mapped.shape, dtype=bool)
    outside[y : y + h, x : x + w] = False
    return mapped[y : y + h, x : x + w], mapped[outside]


def test_depth_pairs_train_evaluate_export_and_serve_from_the_wheel(served):
    depth = served["depth"]
    assert len(depth["steps"]) == 4, "16 pairs in batches of 4, one epoch"
    last = depth["eval"][-1]
    assert {"abs_rel", "rmse", "delta1"} <= set(last) and last["samples"] == 4 and last["pixels"] > 0
    assert 0 <= last["delta1"] <= 1 and np.isfinite([last["abs_rel"], last["rmse"]]).all()
    assert "abs_rel" in depth["stdout"] and "parity max |diff|" in depth["export"]

    datatype, values = kserve_image_outputs(served["url"], "depth", served["image"])["depth"]
    assert datatype == "FP32" and values.shape == (1, SIZE[1], SIZE[0])
    assert np.isfinite(values).all() and values.std() > 0, "a map, not a constant"
    png = _png(served["url"], "depth", served["image"])
    assert png.dtype == np.uint16 and png.shape == (HEIGHT, WIDTH), "a 16-bit map at the input's size"
    # Metres back to the maps' millimetres, as the REST route writes them: the same values resized back.
    want = np.clip(np.rint(values[0] / DEPTH_SCALE), 0, 65535)
    inside, outside = _split_window(png)
    assert (outside == 0).all(), "no data (0) outside the evaluation window"
    assert want.min() <= np.median(inside) <= want.max() and inside.max() <= want.max()


def test_segmentation_pairs_train_evaluate_export_and_serve_from_the_wheel(served):
    seg = served["seg"]
    assert len(seg["steps"]) == 4
    last = seg["eval"][-1]
    assert {"miou", "pixel_accuracy"} <= set(last) and 0 <= last["pixel_accuracy"] <= 1 and 0 <= last["miou"] <= 1

    out = kserve_image_outputs(served["url"], "seg", served["image"])
    datatype, scores = out["scores"]
    assert datatype == "FP32" and scores.shape == (1, CLASSES, SIZE[1], SIZE[0])
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    mask = _png(served["url"], "seg", served["image"])
    assert mask.dtype == np.uint8 and mask.shape == (HEIGHT, WIDTH), "an 8-bit mask at the input's size"
    inside, outside = _split_window(mask)
    assert (outside == SYNTH_IGNORE_ID).all(), "the ignore id outside the evaluation window"
    # Class ids inside, each one the model's argmax somewhere (resized up with nearest: every one is kept).
    assert set(np.unique(inside).tolist()) == set(np.unique(scores[0].argmax(axis=0)).tolist()) <= set(range(CLASSES))
