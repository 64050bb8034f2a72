"""ONNX export: uint8 in, normalisation inside, batch sizes (static per session), checker, parity, model card."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from _serving import CLASSES, CLIP_BATCH, CLIP_MODEL, IMAGE_BATCH, IMAGE_MODEL, exported_repo, write_checkpoint

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import DeviceChoice
from gpufeed.models import ExportError, ModelCard, ModelCardError, export_model, load_model, read_model_card
from gpufeed.models._card import BATCH_DIM, default_batch_sizes
from gpufeed.pipelines import ImageDataset, ImageLoader

pytestmark = pytest.mark.timeout(300)


def _session(model_dir, batch_size: int | None = None):
    """A session as the server makes one: a symbolic batch dimension fixed at ``batch_size``."""
    options = ort.SessionOptions()
    if batch_size is not None:
        options.add_free_dimension_override_by_name(BATCH_DIM, batch_size)
    return ort.InferenceSession(str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_default_batch_sizes_are_powers_of_two_up_to_n():
    assert default_batch_sizes(8) == (1, 2, 4, 8)
    assert default_batch_sizes(12) == (1, 2, 4, 8, 12)
    assert default_batch_sizes(1) == (1,) and default_batch_sizes(2) == (1, 2) and default_batch_sizes(3) == (1, 2, 3)


def test_image_export_runs_at_every_batch_size_and_matches_pytorch_on_eval_pipeline_images(synth_dir):
    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    assert card.batch_sizes == (1, 2, IMAGE_BATCH) and card.batch_size == IMAGE_BATCH
    graph = onnx.load(str(model_dir / "model.onnx"))
    onnx.checker.check_model(graph, full_check=True)
    (inp,), (out,) = graph.graph.input, graph.graph.output
    assert inp.name == "pixels" and _dims(inp) == [BATCH_DIM, 3, 48, 48], "one graph, symbolic batch dimension"
    assert _dims(out) == [BATCH_DIM, len(CLASSES)]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    # Normalisation is inside: the first op casts the uint8 pixels.
    assert graph.graph.node[0].op_type == "Cast"
    assert card.labels == CLASSES and card.spec.input_layout == "NCHW"
    assert card.parity["max_abs_diff"] <= card.parity["tolerance"]
    per_size = card.parity["per_batch_size"]
    assert sorted(per_size, key=int) == ["1", "2", str(IMAGE_BATCH)], "parity was checked at every size"
    assert all(p["max_abs_diff"] <= card.parity["tolerance"] for p in per_size.values())
    written = json.loads((model_dir / "model_card.json").read_text())
    for key in (
        "input",
        "size_px",
        "eval_crop_fraction",
        "normalization",
        "labels",
        "batch_size",
        "batch_sizes",
        "precision",
        "opset",
    ):
        assert key in written, key
    assert written["normalization"]["mean"] == list(card.spec.mean)
    assert written["batch_sizes"] == [1, 2, IMAGE_BATCH] and written["input"]["shape"] == [IMAGE_BATCH, 3, 48, 48]

    # Real inputs: the evaluation pipeline's uint8 batches; ONNX equals the checkpoint's PyTorch model.
    val = ImageDataset.from_list(synth_dir / "images" / "val.txt")
    loader = ImageLoader(
        val,
        train=False,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=IMAGE_BATCH, last_batch="pad", num_threads=2),
        device=DeviceChoice("cpu", None, "test"),
    )
    batch = next(iter(loader)).images.contiguous()
    model = load_model(card.source_checkpoint).eval()
    with torch.no_grad():
        expected = model(batch).numpy()
    for n in card.batch_sizes:
        session = _session(model_dir, n)
        assert session.get_inputs()[0].shape == [n, 3, 48, 48], "each session sees static shapes"
        got = np.concatenate([session.run(None, {"pixels": batch.numpy()[k : k + n]})[0] for k in range(0, 4, n)])
        np.testing.assert_allclose(got, expected, atol=1e-4)
        with pytest.raises(Exception, match=r"(?i)(shape|dimension)"):
            session.run(None, {"pixels": np.concatenate([batch.numpy()] * 2)[: n + 1]})  # its own size only


def test_clip_export_takes_ncthw_uint8():
    model_dir = exported_repo() / CLIP_MODEL
    card = read_model_card(model_dir)
    assert card.spec.task == "clip" and card.input_shape == (CLIP_BATCH, 3, 4, 32, 32)
    assert card.spec.input_layout == "NCTHW" and card.spec.multilabel and card.batch_sizes == (1, CLIP_BATCH)
    clips = np.random.default_rng(0).integers(0, 256, card.input_shape, dtype=np.uint8)
    with torch.no_grad():
        expected = load_model(card.source_checkpoint).eval()(torch.from_numpy(clips)).numpy()
    np.testing.assert_allclose(_session(model_dir, CLIP_BATCH).run(None, {"pixels": clips})[0], expected, atol=1e-4)
    np.testing.assert_allclose(_session(model_dir, 1).run(None, {"pixels": clips[1:]})[0], expected[1:], atol=1e-4)


def test_one_batch_size_fixes_the_graph_at_it_as_cards_without_batch_sizes_did(tmp_path):
    write_checkpoint(tmp_path / "run", "smallcnn", num_classes=3, size_px=32)
    card = export_model(tmp_path / "run", tmp_path / "fixed", batch_sizes=[3])
    assert card.batch_sizes == (3,) and card.batch_size == 3
    graph = onnx.load(str(tmp_path / "fixed" / "model.onnx"))
    assert _dims(graph.graph.input[0]) == [3, 3, 32, 32] and _dims(graph.graph.output[0]) == [3, 3]
    assert list(card.parity["per_batch_size"]) == ["3"]

    # A card written before batch sizes came in holds batch_size alone: it reads as that one size.
    data = json.loads((tmp_path / "fixed" / "model_card.json").read_text())
    del data["batch_sizes"]
    (tmp_path / "fixed" / "model_card.json").write_text(json.dumps(data))
    old = read_model_card(tmp_path / "fixed")
    assert old.batch_sizes == (3,) and old.batch_size == 3 and old.input_shape == (3, 3, 32, 32)


def test_batch_sizes_are_checked_in_the_api_and_in_cards(tmp_path):
    write_checkpoint(tmp_path / "run", "smallcnn", num_classes=3, size_px=32)
    for bad, words in (
        ([4, 2], r"batch_sizes \[4, 2\] must be strictly ascending"),
        ([], "at least one batch size"),
        ([0, 2], "0 is not an integer >= 1"),
        ([1, 4097], "batch size 4097 is above 4096, the largest export takes"),
    ):
        with pytest.raises(ValueError, match=words):
            export_model(tmp_path / "run", tmp_path / "out", batch_sizes=bad)
    with pytest.raises(ValueError, match=r"batch_sizes \[1, 2\] must end with batch_size 4"):
        export_model(tmp_path / "run", tmp_path / "out", batch_size=4, batch_sizes=[1, 2])
    with pytest.raises(ValueError, match="batch size 100000 is above 4096"):  # it rendered 200,000 images
        export_model(tmp_path / "run", tmp_path / "out", batch_size=100_000)
    assert not (tmp_path / "out" / "model.onnx").exists()

    spec = read_model_card(exported_repo() / IMAGE_MODEL).spec
    with pytest.raises(ModelCardError, match=r"the largest of batch_sizes \[1, 2\] must equal batch_size 4"):
        ModelCard(name="m", spec=spec, batch_size=4, batch_sizes=(1, 2))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    data = json.loads((exported_repo() / IMAGE_MODEL / "model_card.json").read_text())
    for bad, words in (
        ([1, 2], r"field 'batch_sizes' \[1, 2\] must end with batch_size 4"),
        ([2, 1, 4], r"field 'batch_sizes' \[2, 1, 4\] must be strictly ascending"),
        ("1,2,4", "field 'batch_sizes' must be a list of integers"),
    ):
        (folder / "model_card.json").write_text(json.dumps({**data, "batch_sizes": bad}))
        with pytest.raises(ModelCardError, match=words):
            read_model_card(folder)


def test_fp16_export_is_half_inside_and_within_fp16_tolerance(tmp_path):
    ckpt = write_checkpoint(tmp_path / "run", "smallcnn", num_classes=3, size_px=32)
    card = export_model(tmp_path / "run", tmp_path / "half", batch_sizes=[1, 2], precision="fp16")
    graph = onnx.load(str(tmp_path / "half" / "model.onnx"))
    inits = {init.name: init.data_type for init in graph.graph.initializer}
    assert {t for name, t in inits.items() if name.startswith("backbone.")} == {onnx.TensorProto.FLOAT16}
    assert inits["normalize.scale"] == onnx.TensorProto.FLOAT, "normalisation stays in float32"
    assert graph.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert graph.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert card.precision == "fp16" and 0 < card.parity["max_abs_diff"] <= card.parity["tolerance"]
    assert all(0 < p["max_abs_diff"] <= card.parity["tolerance"] for p in card.parity["per_batch_size"].values())
    assert card.source_checkpoint == str(ckpt)


def test_a_model_that_produces_nan_fails_parity_and_leaves_nothing(tmp_path):
    write_checkpoint(tmp_path / "run", "smallcnn", num_classes=3, size_px=32)
    state = torch.load(tmp_path / "run" / "checkpoints" / "ckpt-000000007.pt", weights_only=True)
    key = next(k for k in state["model"] if k.endswith("running_var"))
    state["model"][key] = -torch.ones_like(state["model"][key])  # sqrt of a negative variance: NaN
    torch.save(state, tmp_path / "run" / "checkpoints" / "ckpt-000000007.pt")
    with pytest.raises(ExportError, match=r"at batch size\(s\) \[1, 2\]: max \|diff\| nan"):
        export_model(tmp_path / "run", tmp_path / "out", batch_size=2)
    assert not (tmp_path / "out" / "model.onnx").exists() and not (tmp_path / "out" / "model_card.json").exists()
    assert not list((tmp_path / "out").iterdir()), "no partial files are left"


def test_bad_sources_and_cards_are_named(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ExportError, match=r"junk\.pt"):
        export_model(tmp_path / "junk.pt", tmp_path / "out")
    with pytest.raises(ValueError, match="precision 'fp8' is not allowed; allowed: fp32, fp16"):
        export_model(tmp_path / "junk.pt", tmp_path / "out", precision="fp8")
    with pytest.raises(ModelCardError, match=r"model_card\.json is missing"):
        read_model_card(tmp_path)
    # A checkpoint or a training run where a model folder goes (gpufeed serve --model runs/a): how to make one.
    with pytest.raises(
        ModelCardError, match=r"junk\.pt is a checkpoint, not an exported model folder: export it first"
    ):
        read_model_card(tmp_path / "junk.pt")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(
        ModelCardError, match=r"run is a training run folder, .*: gpufeed export \S+run --out MODEL_DIR"
    ):
        read_model_card(tmp_path / "run")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"")
    card = json.loads((exported_repo() / IMAGE_MODEL / "model_card.json").read_text())
    card["batch_size"] = "eight"
    (folder / "model_card.json").write_text(json.dumps(card))
    with pytest.raises(ModelCardError, match="field 'batch_size' must be an integer"):
        read_model_card(folder)


@pytest.mark.process
def test_export_cli_writes_a_model_folder(tmp_path):
    write_checkpoint(tmp_path / "run", "smallcnn", num_classes=2, size_px=32)
    out = tmp_path / "repo" / "tiny"
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "export", str(tmp_path / "run"), "--out", str(out), "--batch-size", "3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert "max |diff|" in proc.stdout and "batch 1: " in proc.stdout and "batch 3: " in proc.stdout
    assert "at batch sizes 1, 2, 3" in proc.stdout
    card = read_model_card(out)
    assert card.name == "tiny" and card.batch_size == 3 and card.batch_sizes == (1, 2, 3)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufeed",
            "export",
            str(tmp_path / "run"),
            "--out",
            str(out),
            "--batch-sizes",
            "4",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "--batch-sizes: batch_sizes [4, 2] must be strictly ascending" in bad.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "gpufeed", "export", str(tmp_path / "missing"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_the_cards_preprocessing_line_says_how_each_kind_of_model_reads_its_pixels():
    """A clip model is scored with its training's fit (stretch here), not the image models' scale and crop."""
    cards = {
        name: json.loads((exported_repo() / name / "model_card.json").read_text()) for name in (CLIP_MODEL, IMAGE_MODEL)
    }
    clip = cards[CLIP_MODEL]
    assert clip["preprocessing"].startswith("decode every frame RGB in order, resize each frame to 32x32")
    assert f"windows of {clip['clip_length_frames']} frames 1 apart" in clip["preprocessing"]
    assert "centre-crop width_px x height_px" in cards[IMAGE_MODEL]["preprocessing"]


def test_the_card_records_the_opset_the_graph_has_and_an_opset_the_exporter_did_not_write_is_refused(tmp_path):
    """Before, ``--opset 13`` wrote an opset-18 graph (the exporter's down-conversion gave up without a
    word) and a card saying 13; ``--opset 1`` and ``99999`` "succeeded" too."""
    ckpt = write_checkpoint(tmp_path / "run", "smallcnn", num_classes=2, size_px=32)
    card = export_model(ckpt, tmp_path / "m20", batch_sizes=[2], opset=20)
    graph = onnx.load(str(tmp_path / "m20" / "model.onnx"))
    assert card.opset == 20 == next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    with pytest.raises(ExportError, match="opset 13: torch's exporter wrote opset 18 for this model, not 13"):
        export_model(ckpt, tmp_path / "m13", batch_sizes=[2], opset=13)
    assert not (tmp_path / "m13" / "model.onnx").exists()
    with pytest.raises(ExportError, match=r"opset 99999 is not one this exporter writes: 7 to \d+"):
        export_model(ckpt, tmp_path / "m99999", batch_sizes=[2], opset=99999)
