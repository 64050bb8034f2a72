"""Task heads: one class per task, registered in one place, and what export, the server and the metadata ask of them.

The structural tests read the code with ``ast``: no task is compared as a string outside the heads
registry (the count is printed; the exceptions are listed with their reason), only the data plane
turns logits into output tensors, one class keeps the request accounting, and the gRPC front is
started by the model server beside HTTP, not by the HTTP app. The others use the heads, and a toy
head registered for the test (a new task is one class).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from _sources import parsed_file

from gpufeed.config import parse_config
from gpufeed.models import (
    ClassifierHead,
    DenseHead,
    ModelCard,
    ModelSpec,
    OutputTensor,
    TaskHead,
    create_model,
    head_for,
    list_models,
    list_tasks,
    register_head,
)
from gpufeed.models import _heads as heads_registry

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "server"
SCANNED = ("gpufeed", "pipelines", "models", "server")

# file -> why it may compare task names: the one place besides the heads registry.
TASK_SWITCH_EXCEPTIONS = {
    "gpufeed/train/_data.py": (
        "training's own task factory (build_data, _dense_data): it picks the loaders, loss and metric of "
        "the task a model and its data name; training is a layer above the heads and keeps its tasks"
    ),
    "gpufeed/bench/train.py": (
        "bench train's workload (--task images|clips|depth, the benchmark's own command-line choice of "
        "dataset, loader and peer), not a model's task"
    ),
    "gpufeed/bench/_train_report.py": "bench train's workload name in its report's labels (as above)",
}


def _named_task(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return "task" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "task" in node.attr.lower()
    key = node.slice if isinstance(node, ast.Subscript) else None  # doc["task"]
    return isinstance(key, ast.Constant) and isinstance(key.value, str) and "task" in key.value.lower()


def _mentions_task(node: ast.AST) -> bool:
    return any(_named_task(n) for n in ast.walk(node))


def _is_text(node: ast.AST) -> bool:
    """A string, a literal collection of strings, or a constant of task names (``DENSE_TASKS``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    return isinstance(node, ast.Name) and node.id.isupper() and "TASK" in node.id


def task_switches(source: str, tree: ast.AST | None = None) -> list[tuple[int, str]]:
    """(line, code) of every place a task is switched on by its name in a module's ``source`` (``tree``: parsed).

    A comparison of something named ``*task*`` with a string (``task == "clip"``, ``spec.task in
    ("depth", ...)``, ``task_kind in DENSE_TASKS``), a ``match`` on it, or a table keyed by two or
    more task names (``{"depth": ..., "segmentation": ...}``).
    """
    names, found = set(list_tasks()), []
    for node in ast.walk(tree if tree is not None else ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_mentions_task(s) for s in sides) and any(_is_text(s) for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Match) and _mentions_task(node.subject):
            found.append((node.lineno, f"match {ast.unparse(node.subject)}"))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            if len(keys & names) >= 2:
                found.append((node.lineno, f"a table keyed by tasks {sorted(keys & names)}"))
    return sorted(found)


def _all_task_switches() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ("models/_heads.py",):  # the registry and factory: where a task's name belongs
                continue
            found = task_switches(path.read_text(), parsed_file(path))
            if found:
                out[rel] = found
    return out


def test_no_task_is_switched_on_by_name_outside_the_heads():
    every = _all_task_switches()
    outside = {f: s for f, s in every.items() if f not in TASK_SWITCH_EXCEPTIONS}
    excepted = sum(len(s) for f, s in every.items() if f in TASK_SWITCH_EXCEPTIONS)
    print(f"task string comparisons outside the heads registry: {sum(len(s) for s in outside.values())}")
    print(f"in the listed exceptions: {excepted}")
    for file, why in TASK_SWITCH_EXCEPTIONS.items():
        print(f"  exception {file} ({len(every.get(file, []))}): {why}")
    assert not outside, "task compared by name outside the heads:\n" + "\n".join(
        f"  {f}:{line}: {code}" for f, found in outside.items() for line, code in found
    )
    stale = [f for f in TASK_SWITCH_EXCEPTIONS if f not in every]
    assert not stale, f"exceptions that switch on no task any more, to remove from the list: {stale}"


@pytest.mark.parametrize(
    "source",
    [
        'if spec.task == "clip": pass',
        'x = card.spec.task != "clip"',
        'ok = task_kind in ("depth", "segmentation")',
        'ok = result["task"] == "clips"',
        "ok = task_kind in DENSE_TASKS",
        'match spec.task:\n    case "depth": pass',
        'SCORES = {"depth": 1, "segmentation": 2}',
    ],
)
def test_a_task_switch_is_caught(source):
    assert len(task_switches(source)) == 1


def test_a_head_fact_is_not_a_task_switch():
    assert task_switches("ok = spec.head.accepts_encoded and not head.dense\nname = spec.task") == []


# -- the heads ---------------------------------------------------------------------------------------


def _spec(task: str, **kw) -> ModelSpec:
    common = {"name": "t", "num_classes": 3, "size_px": (20, 16)}
    return ModelSpec(task=task, **{**common, **kw})


@pytest.mark.parametrize(
    ("spec", "kind", "accepts", "layout", "outputs"),
    [
        (_spec("image"), "classification", True, "NCHW", [("logits", (3,)), ("scores", (3,))]),
        (_spec("image", multilabel=True), "multi-label", True, "NCHW", [("logits", (3,)), ("scores", (3,))]),
        (_spec("clip", clip_length_frames=5), "clip", False, "NCTHW", [("logits", (3,)), ("scores", (3,))]),
        (_spec("depth", num_classes=1), "depth", True, "NCHW", [("depth", (16, 20))]),
        (_spec("segmentation"), "segmentation", True, "NCHW", [("scores", (3, 16, 20)), ("logits", (3, 16, 20))]),
    ],
)
def test_each_task_has_a_head_that_says_what_it_takes_and_gives(spec, kind, accepts, layout, outputs):
    head = spec.head
    assert (head.kind, head.accepts_encoded, head.input_layout) == (kind, accepts, layout)
    assert [(t.name, t.shape) for t in head.outputs()] == outputs
    assert spec.input_layout == layout and spec.input_shape(2)[0] == 2
    assert isinstance(head, DenseHead) == head.dense and isinstance(head, ClassifierHead) == head.classifies
    logits = np.random.default_rng(0).normal(0, 2, spec.output_shape(2)).astype(np.float32)
    tensors = head.output_tensors(logits)
    assert list(tensors) == [name for name, _ in outputs]
    for name, shape in outputs:
        assert tensors[name].shape == (2, *shape) and tensors[name].dtype == np.float32


def test_every_registered_network_has_a_head():
    for name in list_models():
        spec = create_model(name, num_classes=2).spec
        assert spec.head.task == spec.task, name


def test_classifier_scores_follow_multilabel():
    logits = np.array([[0.0, 1.0, -1.0]], np.float32)
    softmax = np.exp(logits) / np.exp(logits).sum()
    sigmoid = 1 / (1 + np.exp(-logits))
    np.testing.assert_allclose(_spec("image").head.output_tensors(logits)["scores"], softmax, rtol=1e-6)
    np.testing.assert_allclose(_spec("image", multilabel=True).head.output_tensors(logits)["scores"], sigmoid)
    clip = _spec("clip", clip_length_frames=3)
    np.testing.assert_allclose(clip.head.output_tensors(logits)["scores"], softmax, rtol=1e-6)
    np.testing.assert_allclose(clip.with_updates(multilabel=True).head.output_tensors(logits)["scores"], sigmoid)


def test_an_output_tensor_is_made_only_when_read(monkeypatch):
    head = _spec("segmentation").head
    made = []
    tensor = head.tensor
    monkeypatch.setattr(head, "tensor", lambda name, logits: made.append(name) or tensor(name, logits))
    outputs = head.output_tensors(np.zeros((1, 3, 16, 20), np.float32))
    assert "scores" in outputs and len(outputs) == 2 and made == []
    outputs["logits"]
    outputs["logits"]
    assert made == ["logits"], "a REST map answer reads the logits only: no softmax over the map"
    with pytest.raises(KeyError):
        outputs["depth"]


def test_a_spec_names_a_known_task_and_what_its_head_needs():
    with pytest.raises(ValueError, match=r"task 'boxes' is not known; known tasks: clip, depth, image, segmentation"):
        _spec("boxes")
    with pytest.raises(ValueError, match="a clip model needs clip_length_frames"):
        _spec("clip")
    with pytest.raises(ValueError, match="already has head ClassificationHead"):
        register_head(type("Another", (ClassifierHead,), {"task": "image", "kind": "again", "multilabel": False}))


class _ScoreHead(TaskHead):
    """A task of the test's own: one quality score per image."""

    task: ClassVar[str] = "quality"
    kind: ClassVar[str] = "quality"

    @property
    def scores(self) -> str:
        return "a quality score per image"

    def output_shape(self, batch_size: int) -> tuple[int, ...]:
        return (batch_size, 1)

    def outputs(self) -> tuple[OutputTensor, ...]:
        return (OutputTensor("quality", (1,)),)

    def tensor(self, name: str, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, np.float32)


def test_a_new_task_is_one_head_class_the_server_and_the_card_ask(monkeypatch):
    from gpufeed.server._requests import kserve_inputs
    from gpufeed.server._triton import model_config

    monkeypatch.setattr(heads_registry, "_HEADS", {k: list(v) for k, v in heads_registry._HEADS.items()})
    register_head(_ScoreHead)
    spec = _spec("quality", num_classes=1)
    assert isinstance(spec.head, _ScoreHead) and head_for(spec).kind == "quality"
    card = ModelCard(name="q", spec=spec, batch_size=2)
    assert card.to_dict()["scores"] == "a quality score per image"
    assert card.to_dict()["output"]["shape"] == [2, 1]
    assert [i["name"] for i in kserve_inputs(card)] == ["image", "pixels"]
    config = model_config("q", card, parse_config(None).serve, on_gpu=False, device_id=None, workers=2)
    assert [(o["name"], o["dims"], o["data_type"]) for o in config["output"]] == [("quality", [1], "TYPE_FP32")]
    assert config["parameters"]["task"] == {"string_value": "quality"}


def test_triton_config_outputs_are_the_heads_as_the_metadata_lists_them():
    """A dense model's Triton outputs are its maps (they were a classifier's logits and scores)."""
    from gpufeed.server._triton import model_config

    serve = parse_config(None).serve
    for spec in (_spec("depth", num_classes=1), _spec("segmentation"), _spec("image")):
        config = model_config(
            "m", ModelCard(name="m", spec=spec, batch_size=2), serve, on_gpu=False, device_id=None, workers=2
        )
        metadata = [t.kserve() for t in spec.head.outputs()]
        assert [(o["name"], [-1, *o["dims"]]) for o in config["output"]] == [(m["name"], m["shape"]) for m in metadata]


# -- the server's structure ------------------------------------------------------------------------


def _calls(name: str) -> set[str]:
    """Server modules calling ``name(...)`` or ``<...>.name(...)``."""
    found = set()
    for path in sorted(SERVER.glob("*.py")):
        for node in ast.walk(parsed_file(path)):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    found.add(path.name)
    return found


def test_the_data_plane_makes_the_output_tensors_and_the_fronts_only_encode_them():
    assert _calls("output_tensors") == {"_dataplane.py"}
    for front in ("_app.py", "_grpc.py"):
        source = (SERVER / front).read_text()
        assert "scores_from_logits" not in source and ".task" not in source, front
