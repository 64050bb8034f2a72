"""``gpufeed doctor --model``: where onnxruntime runs each node of a user's model, read from its own profile.

onnxruntime runs a node its CUDA provider cannot take on the CPU, inside a CUDA session, without a
word; the doctor reads every node's provider from onnxruntime's profiler. On this machine the
sessions run on the CPU provider; the ``gpu`` test runs an exported model on CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _serving import IMAGE_MODEL, exported_repo

from gpufeed.doctor._placement import model_file, probe_placement


def _resizing_model(path) -> None:
    """Conv, then Resize to sizes computed in the graph from its shape (a symbolic batch: not folded away)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    constants = [
        numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"),
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array([2], np.int64), "end"),
        numpy_helper.from_array(np.array([16, 16], np.int64), "hw"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("Shape", ["c"], ["s"], name="shape"),
        helper.make_node("Slice", ["s", "start", "end"], ["nc"], name="slice"),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0, name="concat"),
        helper.make_node("Resize", ["c", "", "", "sizes"], ["y"], mode="nearest", name="resize"),
    ]
    graph = helper.make_graph(
        nodes,
        "resizing",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 16, 16])],
        initializer=constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_every_node_and_its_provider_come_from_the_profile_and_shape_arithmetic_is_told_apart(tmp_path):
    _resizing_model(tmp_path / "model.onnx")
    (result,) = probe_placement(str(tmp_path), None)  # a model folder
    assert result.name == "model-placement" and result.status == "pass", result.summary
    nodes = {n["node"]: n for n in result.details["nodes"]}
    assert {n["provider"] for n in nodes.values()} == {"CPUExecutionProvider"}
    ops = {n["op"] for n in nodes.values()}
    assert {"Conv", "Shape", "Resize"} <= ops, ops
    shape_only = {n["op"] for n in nodes.values() if n["shape_only"]}
    assert {"Shape", "Concat"} <= shape_only and not {"Conv", "Resize"} & shape_only, shape_only
    assert f"{len(nodes)} nodes ran on the CPU provider" in result.summary


def test_a_model_that_does_not_load_is_a_failure_naming_it_and_a_missing_one_an_error(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"not an onnx graph")
    (result,) = probe_placement(str(tmp_path / "model.onnx"), None)
    assert result.status == "fail" and result.summary.startswith("model.onnx did not load: ")
    assert "\n" not in result.summary
    with pytest.raises(FileNotFoundError, match=r"--model .*nowhere.*model\.onnx"):
        model_file(tmp_path / "nowhere")


def _graph(path, nodes, shape) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def test_node_names_with_quotes_and_backslashes_are_read_from_the_profile(tmp_path):
    """onnxruntime writes names into its profile unescaped: the file is not JSON as a whole."""
    from onnx import helper

    names = ['sin "a"', "cos\\b"]
    _graph(tmp_path / "q.onnx", [helper.make_node("Sin", ["x"], ["s"], name=names[0]),
                                 helper.make_node("Cos", ["s"], ["c"], name=names[1])], [1, 3, 8, 8])  # fmt: skip
    (result,) = probe_placement(str(tmp_path / "q.onnx"), None)
    assert result.status == "pass", result.summary
    assert [n["node"] for n in result.details["nodes"]] == names


def test_a_bare_graph_with_symbolic_height_and_width_is_skipped_in_one_line_not_failed(tmp_path):
    """Ones for H and W failed a valid Conv ("Invalid input shape"); the model folder's card names the sizes."""
    from onnx import helper

    _graph(tmp_path / "dyn.onnx", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], ["N", 3, "H", "W"])
    (result,) = probe_placement(str(tmp_path / "dyn.onnx"), None)
    assert result.status == "skip", result.summary
    assert result.summary == (
        "dyn.onnx: input 'x' has symbolic sizes H, W besides its batch; give the model folder, whose card names them"
    )


@pytest.mark.process
def test_the_cli_reports_the_models_placement_and_refuses_a_missing_model(tmp_path):
    model = exported_repo() / IMAGE_MODEL
    done = subprocess.run(  # a relative path, as typed: the probe's process runs in a folder of its own
        [sys.executable, "-m", "gpufeed", "doctor", "--model", IMAGE_MODEL, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=model.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = {r["name"]: r for r in json.loads(done.stdout)["results"]}
    assert results["model-placement"]["status"] == "pass" and results["model-placement"]["details"]["nodes"]
    missing = subprocess.run(
        [sys.executable, "-m", "gpufeed", "doctor", "--model", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode != 0 and "--model" in missing.stderr and str(tmp_path / "none") in missing.stderr


@pytest.mark.gpu
def test_an_exported_model_runs_every_node_on_cuda():
    (result,) = probe_placement(str(exported_repo() / IMAGE_MODEL), 0)
    assert result.status == "pass", result.summary
    assert result.details["providers"][0] == "CUDAExecutionProvider"
    assert all(n["provider"] == "CUDAExecutionProvider" or n["shape_only"] for n in result.details["nodes"])
