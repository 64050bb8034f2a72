"""``size_px: [width, height]`` end to end: train one short epoch, export with parity, serve a prediction.

The image model trains at 48x32 on the synthetic images (device augmentation included: torch and
Kornia ops see a non-square batch), exports with the card recording both sides and the ONNX input
fixed at (N, 3, 32, 48), and the server, given encoded JPEG/PNG files, resizes to the model's 48x32
and answers with exactly the logits onnxruntime gives on the evaluation pipeline's pixels. The clip
model does the same from the synthetic h264 videos, served from a decoded (N, 3, T, 32, 48) tensor.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from train_support import train_config

from gpufeed.config import LoaderConfig, SizePx, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.models import export_model, load_model, read_model_card
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.server import start_server
from gpufeed.train import train

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]

CPU = DeviceChoice("cpu", None, "test")
WIDTH, HEIGHT = 48, 32


def _serve(model_dir: Path):
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 5, "decode_threads": 2, "warmup_batches": 1}})
    return start_server(model=model_dir, cfg=cfg, port=0, device=CPU)


def _check_card(model_dir: Path, task_shape: tuple[int, ...]) -> None:
    card = json.loads((model_dir / "model_card.json").read_text())
    assert card["size_px"] == [WIDTH, HEIGHT] and (card["width_px"], card["height_px"]) == (WIDTH, HEIGHT)
    assert card["input"]["shape"] == [card["batch_size"], *task_shape]
    assert card["parity"]["max_abs_diff"] <= card["parity"]["tolerance"]
    session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == list(task_shape), "the graph's input is fixed at H x W"
    assert read_model_card(model_dir).spec.size_px == SizePx(WIDTH, HEIGHT)


def test_image_model_trains_exports_and_serves_at_48x32(synth_dir, tmp_path):
    cfg = train_config(
        synth_dir,
        [
            f"image.size_px=[{WIDTH}, {HEIGHT}]",
            "train.epochs=1",
            # Colour jitter in the loader's graph, the rest on the device (torch fused op, then Kornia).
            "augment.ops=[color_jitter, horizontal_flip, rotation, erasing]",
            "augment.horizontal_flip.where=torch",
        ],
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == 6 and result.evaluations, "one epoch of 96 images in batches of 16, then evaluation"
    model = load_model(result.run_dir)
    assert model.spec.size_px == (WIDTH, HEIGHT) and model.spec.input_shape(2) == (2, 3, HEIGHT, WIDTH)

    out = tmp_path / "models" / "wide"
    export_model(result.run_dir, out, batch_size=4)
    _check_card(out, (3, HEIGHT, WIDTH))

    val_set = ImageDataset.from_list(synth_dir / "images" / "val.txt")
    loader = ImageLoader(
        val_set, train=False, image_cfg=cfg.image, loader_cfg=LoaderConfig(batch_size=4, num_threads=2), device=CPU
    )
    batch = next(iter(loader))
    pixels = batch.images.contiguous().numpy()
    assert pixels.shape == (4, 3, HEIGHT, WIDTH)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"pixels": pixels})[0]

    server = _serve(out)
    try:
        meta = httpx.get(f"{server.url}/v2/models/wide").json()
        shapes = {i["name"]: i["shape"] for i in meta["inputs"]}
        assert shapes == {"image": [-1, 1], "pixels": [-1, 3, HEIGHT, WIDTH]}
        assert (meta["parameters"]["width_px"], meta["parameters"]["height_px"]) == (WIDTH, HEIGHT)
        for row, sample_id in enumerate(batch.sample_ids.tolist()):
            data = base64.b64encode(Path(val_set.paths[sample_id]).read_bytes()).decode()
            image = {"name": "image", "datatype": "BYTES", "shape": [1], "data": [data]}
            answer = httpx.post(
                f"{server.url}/v2/models/wide/infer",
                json={"inputs": [{**image, "parameters": {"content_type": "base64"}}], "outputs": [{"name": "logits"}]},
            )
            assert answer.status_code == 200, answer.text
            (logits,) = answer.json()["outputs"]
            assert logits["shape"] == [1, 4]
            # The server decoded, cropped and resized to 48x32 exactly as evaluation did.
            np.testing.assert_allclose(logits["data"], expected[row], atol=1e-5)
    finally:
        server.stop()


def test_clip_model_trains_exports_and_serves_at_48x32(synth_dir, tmp_path):
    videos = str(synth_dir / "videos")
    cfg = train_config(
        synth_dir,
        [
            "model.name=r3d_small",
            f"video.train={videos}",
            f"video.val={videos}",
            f"video.size_px=[{WIDTH}, {HEIGHT}]",
            "video.clip_length_frames=5",
            "loader.batch_size=8",
            "train.epochs=1",
            "train.max_steps=4",
            "augment.ops=[color_jitter, rotation]",
        ],
    )
    result = train(cfg, tmp_path / "run")
    assert result.step == 4 and result.checkpoint is not None
    model = load_model(result.checkpoint)
    assert model.spec.size_px == (WIDTH, HEIGHT) and model.spec.clip_length_frames == 5

    out = tmp_path / "models" / "clips"
    export_model(result.checkpoint, out, batch_size=2)
    _check_card(out, (3, 5, HEIGHT, WIDTH))

    clip = np.random.default_rng(0).integers(0, 256, (1, 3, 5, HEIGHT, WIDTH), dtype=np.uint8)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"pixels": np.concatenate([clip, clip])})[0][0]
    server = _serve(out)
    try:
        meta = httpx.get(f"{server.url}/v2/models/clips").json()
        # A clip model also takes one encoded video (served clip models, #34).
        assert {i["name"]: i["shape"] for i in meta["inputs"]} == {"video": [1], "pixels": [-1, 3, 5, HEIGHT, WIDTH]}
        tensor = {"name": "pixels", "datatype": "UINT8", "shape": list(clip.shape), "data": clip.ravel().tolist()}
        answer = httpx.post(
            f"{server.url}/v2/models/clips/infer", json={"inputs": [tensor], "outputs": [{"name": "logits"}]}
        )
        assert answer.status_code == 200, answer.text
        np.testing.assert_allclose(answer.json()["outputs"][0]["data"], expected, atol=1e-4)
        wrong = {**tensor, "shape": [1, 3, 5, WIDTH, HEIGHT]}
        refused = httpx.post(f"{server.url}/v2/models/clips/infer", json={"inputs": [wrong]})
        assert refused.status_code == 400 and f"{[-1, 3, 5, HEIGHT, WIDTH]}" in refused.text.replace("'", "")
    finally:
        server.stop()
