"""``gpufeed predict`` with a checkpoint on onnxruntime: its export made once and cached, checked, and the runtime flag.

Real checkpoints, real exports (``gpufeed export``'s own), real video files: a second load finds the
export and makes none, a damaged cache entry is exported again, an export that disagrees with
PyTorch on the first batch is caught (PyTorch takes over under ``auto``, the run stops under
``onnx``), and the output equals PyTorch's within the export's tolerance.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from _serving import write_checkpoint
from predicthelp import CPU
from videohelp import encode_tagged_video

from gpufeed.cli import build_parser
from gpufeed.models import ONNX_FILE, export_model
from gpufeed.pipelines import DatasetError
from gpufeed.predict import load_predictor, predict_videos
from gpufeed.predict._export_cache import KEY_FILE, cached_export, export_key, file_sha256
from gpufeed.predict._model import ParityError
from gpufeed.predict._outputs import read_predictions_csv

pytestmark = pytest.mark.timeout(600)

SPEC = {"num_classes": 3, "size_px": 32, "clip_length_frames": 4}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Two checkpoints of one clip model (different weights), a video, and PyTorch's predictions for each."""
    root = tmp_path_factory.mktemp("runtime")
    video = root / "videos" / "mouse.mp4"
    encode_tagged_video(video, 1, 30, width=64, height=48, options={"bf": "2", "g": "7"}, labels=False)
    found = {"video": video}
    for name, seed in (("a", 0), ("b", 1)):
        found[name] = write_checkpoint(root / f"run-{name}", "r3d_small", seed=seed, **SPEC)
        torch_out = root / f"torch-{name}"
        report = predict_videos(video, load_predictor(found[name], CPU, runtime="torch"), out=torch_out, progress=False)
        assert [r.status for r in report.results] == ["scored"]
        found[f"torch-{name}"] = torch_out / "mouse_predictions.csv"
    return found


def _predict(predictor, files, out: Path) -> np.ndarray:
    report = predict_videos(files["video"], predictor, out=out, hop_frames=1, progress=False)
    assert [r.status for r in report.results] == ["scored"], report.results
    return read_predictions_csv(out / "mouse_predictions.csv")[1]


def _entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def test_a_checkpoint_runs_on_its_export_made_once_and_found_again(files, tmp_path, caplog):
    caplog.set_level(logging.INFO, "gpufeed.predict")
    cache = tmp_path / "cache"
    first = load_predictor(files["a"], CPU, export_cache=cache)
    assert (
        first.runtime == "onnx"
        and first.kind == "checkpoint"
        and "onnxruntime CPUExecutionProvider" in first.describe()
    )
    assert first.export is not None and first.export.export_s > 0 and first.export.rebuilt is None
    (entry,) = _entries(cache)
    assert first.export.folder == entry and json.loads((entry / KEY_FILE).read_text())["checkpoint_sha256"] == (
        file_sha256(files["a"])
    )
    before = (entry / ONNX_FILE).stat()
    probabilities = _predict(first, files, tmp_path / "out1")
    torch_probabilities = read_predictions_csv(files["torch-a"])[1]
    assert first.first_batch_max_diff is not None and first.first_batch_max_diff < 1e-4
    assert np.abs(probabilities - torch_probabilities).max() < 1e-5, "onnxruntime's numbers are PyTorch's"

    # The same bytes under another name (a copied run folder): found by content, nothing exported.
    copy = tmp_path / "elsewhere" / "model.pt"
    copy.parent.mkdir()
    shutil.copyfile(files["a"], copy)
    caplog.clear()
    second = load_predictor(copy, CPU, export_cache=cache)
    assert second.export is not None and second.export.folder == entry and second.export.export_s == 0.0
    after = (entry / ONNX_FILE).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "the cached graph is not rewritten"
    assert "is in the cache" in caplog.text and "exporting" not in caplog.text
    np.testing.assert_array_equal(_predict(second, files, tmp_path / "out2"), probabilities)

    # gpufeed export's folder of the same checkpoint: the same graph on the same runner, the same numbers
    # (which the server answers for the same video).
    export_model(files["a"], tmp_path / "exported", batch_size=8)
    by_export = _predict(load_predictor(tmp_path / "exported", CPU), files, tmp_path / "out-exported")
    np.testing.assert_array_equal(probabilities, by_export)

    # Other weights, or another batch size: other exports, each in its own entry.
    other = load_predictor(files["b"], CPU, export_cache=cache)
    smaller = load_predictor(files["a"], CPU, batch_size=4, export_cache=cache)
    assert other.export.export_s > 0 and smaller.export.export_s > 0 and smaller.card.batch_sizes == (1, 2, 4)
    assert len(_entries(cache)) == 3
    assert np.abs(_predict(other, files, tmp_path / "out3") - read_predictions_csv(files["torch-b"])[1]).max() < 1e-5


def _truncate_graph(entry: Path) -> None:
    graph = entry / ONNX_FILE
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])


def _garble_card(entry: Path) -> None:
    (entry / "model_card.json").write_text('{"format": "gpufeed-model-card", "spec": ')


def _drop_key(entry: Path) -> None:
    (entry / KEY_FILE).unlink()


@pytest.mark.parametrize("damage", [_truncate_graph, _garble_card, _drop_key], ids=["truncated-graph", "card", "key"])
def test_a_damaged_cache_entry_is_exported_again(files, tmp_path, caplog, damage):
    cache = tmp_path / "cache"
    made = cached_export(files["a"], 2, cache)
    damage(made.folder)
    # A killed export's hidden build folder: its process is gone and it lay untouched for an hour.
    stale = cache / f".{made.folder.name}.tmp-999999"
    stale.mkdir()
    (stale / ONNX_FILE).write_bytes(b"half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    caplog.set_level(logging.INFO, "gpufeed.predict")
    predictor = load_predictor(files["a"], CPU, batch_size=2, export_cache=cache)
    assert predictor.export is not None and predictor.export.folder == made.folder
    assert predictor.export.export_s > 0 and predictor.export.rebuilt, "exported again, saying why"
    assert f"the cached export {made.folder} cannot be used" in caplog.text
    assert file_sha256(made.folder / ONNX_FILE) == predictor.card.onnx_sha256
    assert not stale.exists() and _entries(cache) == [made.folder]
    probabilities = _predict(predictor, files, tmp_path / "out")
    assert np.abs(probabilities - read_predictions_csv(files["torch-a"])[1]).max() < 1e-5


def _entry_holding_another_models_graph(files, cache: Path) -> Path:
    """A cache entry for checkpoint b whose files are consistent (key, card, digest) but hold a's graph."""
    a = cached_export(files["a"], 8, cache)
    key = export_key(file_sha256(files["b"]), a.card.batch_sizes)
    b_entry = cache / "b-entry"
    shutil.copytree(a.folder, b_entry)
    (b_entry / KEY_FILE).write_text(json.dumps(key))
    from gpufeed.predict._export_cache import _entry_name

    return b_entry.rename(cache / _entry_name(key))


def test_an_export_that_disagrees_on_the_first_batch_gives_way_to_pytorch(files, tmp_path, caplog):
    cache = tmp_path / "cache"
    _entry_holding_another_models_graph(files, cache)
    predictor = load_predictor(files["b"], CPU, export_cache=cache)
    assert predictor.runtime == "onnx" and predictor.export.export_s == 0.0, "the entry looked sound"
    caplog.set_level(logging.WARNING, "gpufeed.predict")
    probabilities = _predict(predictor, files, tmp_path / "out")
    (line,) = [r.getMessage() for r in caplog.records if "disagrees" in r.getMessage()]
    assert (
        str(files["b"]) in line
        and "on the first batch (max |diff|" in line
        and "over 2 windows" in line
        and line.endswith("scoring it in PyTorch")
    )
    assert predictor.runtime == "torch" and predictor.first_batch_max_diff > 1e-3
    np.testing.assert_array_equal(probabilities, read_predictions_csv(files["torch-b"])[1])


def test_runtime_onnx_stops_the_run_when_the_export_disagrees(files, tmp_path):
    cache = tmp_path / "cache"
    _entry_holding_another_models_graph(files, cache)
    predictor = load_predictor(files["b"], CPU, runtime="onnx", export_cache=cache)
    out = tmp_path / "out"
    with pytest.raises(ParityError) as info:
        predict_videos(files["video"], predictor, out=out, progress=False)
    message = str(info.value)
    assert message.startswith(f"{files['b']}: its onnxruntime export disagrees with PyTorch on the first batch")
    assert "\n" not in message and message.endswith("--runtime torch scores it in PyTorch")
    assert not [p for p in out.rglob("*") if p.is_file()], "no output, no temporary file"


def test_the_runtime_flag(files, tmp_path, capsys):
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"^runtime 'tensorrt' is not allowed; allowed: auto, torch, onnx$"):
        load_predictor(files["a"], CPU, runtime="tensorrt", export_cache=cache)
    torch_predictor = load_predictor(files["a"], CPU, runtime="torch", export_cache=cache)
    assert (
        torch_predictor.runtime == "torch"
        and torch_predictor.export is None
        and "PyTorch" in torch_predictor.describe()
    )
    assert not cache.exists(), "runtime torch exports nothing"
    args = build_parser().parse_args(["predict", str(files["a"]), "v", "--runtime", "onnx", "--export-cache", "d"])
    assert (args.runtime, args.export_cache) == ("onnx", Path("d"))
    assert build_parser().parse_args(["predict", "m", "v"]).runtime == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["predict", "m", "v", "--runtime", "jit"])
    err = capsys.readouterr().err
    assert "argument --runtime: invalid choice: 'jit'" in err and all(
        f"'{n}'" in err for n in ("auto", "torch", "onnx")
    )
    exported = tmp_path / "exported"
    export_model(files["a"], exported, batch_size=2)
    with pytest.raises(DatasetError, match=r"exported model folder, which runs on onnxruntime; runtime torch needs"):
        load_predictor(exported, CPU, runtime="torch")


def test_an_export_that_cannot_be_made_is_pytorch_under_auto_and_an_error_under_onnx(files, tmp_path, caplog):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be")
    caplog.set_level(logging.WARNING, "gpufeed.predict")
    predictor = load_predictor(files["a"], CPU, export_cache=blocked)
    assert predictor.runtime == "torch" and predictor.export is None
    assert f"{files['a']} cannot run on onnxruntime" in caplog.text
    np.testing.assert_array_equal(
        _predict(predictor, files, tmp_path / "out"), read_predictions_csv(files["torch-a"])[1]
    )
    with pytest.raises(DatasetError, match=r"runtime onnx: no usable export: "):
        load_predictor(files["a"], CPU, runtime="onnx", export_cache=blocked)


@pytest.mark.gpu
def test_on_a_gpu_auto_keeps_pytorch_and_onnx_runs_the_export_on_cuda(files, tmp_path):
    """On a GPU ``auto`` is PyTorch as before; ``onnx`` runs the cached export on onnxruntime's CUDA provider,
    checked against PyTorch on the first batch, and gives PyTorch's numbers."""
    from gpufeed.device import DeviceChoice

    gpu = DeviceChoice("gpu", 0, "test")
    cache = tmp_path / "cache"
    auto = load_predictor(files["a"], gpu, export_cache=cache)
    assert auto.runtime == "torch" and auto.export is None and not cache.exists()
    torch_probabilities = _predict(auto, files, tmp_path / "torch")
    onnx = load_predictor(files["a"], gpu, runtime="onnx", export_cache=cache)
    assert onnx.runtime == "onnx" and "CUDAExecutionProvider" in onnx.describe()
    probabilities = _predict(onnx, files, tmp_path / "onnx")
    assert onnx.runtime == "onnx" and onnx.first_batch_max_diff is not None and onnx.first_batch_max_diff < 1e-4
    # PyTorch's cuDNN convolutions run in TF32 by default (the check above turns it off), onnxruntime in fp32.
    assert np.abs(probabilities - torch_probabilities).max() < 2e-3
