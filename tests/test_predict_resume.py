"""A resumed ``gpufeed predict`` keeps only what the same model wrote (the manifest beside the outputs).

Real checkpoints (tiny ``smallcnn`` and ``r3d_small`` models, written as training writes them), real
images and videos, PyTorch: a rerun scores a new image and keeps the rest, a failed image is tried
again (and fails again: exit status 1), another model (or other settings) scores everything again,
an output with no record of its model is scored again, and the same model over the same inputs
scores and rewrites nothing. Before the manifest, each of these reruns kept the first run's output.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from _serving import write_checkpoint
from predicthelp import CPU, tag_predictor
from videohelp import encode_tagged_video

from gpufeed.cli import main
from gpufeed.models import export_model
from gpufeed.predict import load_predictor, predict_images, predict_videos
from gpufeed.predict._manifest import MANIFEST_FILE
from gpufeed.synth import render_frame
from gpufeed.synth._photos import encode_image

pytestmark = pytest.mark.timeout(300)

LABELS = ("amber", "birch", "cedar")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Image checkpoints ``a`` and ``b`` (other weights), ``c`` (other class names), clip checkpoints ``clip-a``/``-b``."""
    root = tmp_path_factory.mktemp("models")
    image = {"num_classes": 3, "size_px": 32}
    clip = {"num_classes": 3, "size_px": 32, "clip_length_frames": 4}
    return {
        "a": write_checkpoint(root / "a", "smallcnn", seed=0, labels=LABELS, **image),
        "b": write_checkpoint(root / "b", "smallcnn", seed=1, labels=LABELS, **image),
        "c": write_checkpoint(root / "c", "smallcnn", seed=0, labels=("x", "y", "z"), **image),
        "clip-a": write_checkpoint(root / "clip-a", "r3d_small", seed=0, **clip),
        "clip-b": write_checkpoint(root / "clip-b", "r3d_small", seed=1, **clip),
    }


def _image(folder: Path, name: str, index: int) -> None:
    rgb = render_frame(index, 0, np.zeros(5, np.uint8), 64 + 8 * index, 48)
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(encode_image(rgb, "PNG" if name.endswith(".png") else "JPEG"))


@pytest.fixture
def images(tmp_path) -> Path:
    folder = tmp_path / "images"
    for i, name in enumerate(["a.jpg", "sub/b.png", "c.jpg"]):
        _image(folder, name, i)
    return folder


def _statuses(report) -> dict[str, str]:
    return {r.name: r.status for r in report.results}


def _score_images(model: Path, folder: Path, **kwargs):
    return predict_images(folder, load_predictor(model, CPU, runtime="torch"), progress=False, **kwargs)


def _same_rows(one: Path, other: Path) -> None:
    """The same header and image names, and the same numbers (within a batch's float32 rounding)."""
    rows = [[line.split(",") for line in p.read_text().splitlines()] for p in (one, other)]
    assert rows[0][0] == rows[1][0] and [r[0] for r in rows[0]] == [r[0] for r in rows[1]]
    values = [np.array([[float(v) for v in r[1:]] for r in found[1:]]) for found in rows]
    np.testing.assert_allclose(values[0], values[1], atol=1e-6)


def test_an_image_rerun_scores_only_the_new_image(models, images, tmp_path):
    first = _score_images(models["a"], images)
    assert set(_statuses(first).values()) == {"scored"}
    before = (images / "predictions.csv").read_text().splitlines()
    _image(images, "b2.jpg", 7)
    again = _score_images(models["a"], images)
    assert _statuses(again) == {"a.jpg": "skipped", "b2.jpg": "scored", "c.jpg": "skipped", "sub/b.png": "skipped"}
    assert again.summary().startswith("1 scored, 3 kept (already done by this model; --overwrite scores them again)")
    lines = (images / "predictions.csv").read_text().splitlines()
    assert [line for line in lines if not line.startswith("b2.jpg,")] == before, "the kept rows are as they were"
    fresh = _score_images(models["a"], images, out=tmp_path / "fresh")
    _same_rows(tmp_path / "fresh" / "predictions.csv", images / "predictions.csv")  # as one run over all four
    assert [r.name for r in fresh.results] == [r.name for r in again.results], "results in the CSV's order"
    # An image no longer in the folder loses its row: the CSV answers for the folder as it is.
    (images / "c.jpg").unlink()
    third = _score_images(models["a"], images)
    assert _statuses(third) == {"a.jpg": "skipped", "b2.jpg": "skipped", "sub/b.png": "skipped"}
    assert [line.split(",")[0] for line in (images / "predictions.csv").read_text().splitlines()] == [
        "image",
        "a.jpg",
        "b2.jpg",
        "sub/b.png",
    ]


def test_another_model_scores_every_image_again(models, images, tmp_path, caplog):
    _score_images(models["a"], images)
    for other in ("b", "c", "a"):  # other weights, other class names, and back to the first model
        with caplog.at_level(logging.WARNING, logger="gpufeed.predict"):
            report = _score_images(models[other], images)
        assert set(_statuses(report).values()) == {"scored"}, other
        assert "predictions.csv: written by another model" in caplog.text
        caplog.clear()
        _score_images(models[other], images, out=tmp_path / other)
        _same_rows(images / "predictions.csv", tmp_path / other / "predictions.csv")
    assert (images / "predictions.csv").read_text().startswith("image,amber,birch,cedar\n")
    # --overwrite scores every image with the same model too.
    assert set(_statuses(_score_images(models["a"], images, overwrite=True)).values()) == {"scored"}


def test_a_failed_image_is_tried_again_and_fails_again(models, images, capsys):
    whole = (images / "a.jpg").read_bytes()
    (images / "bad.jpg").write_bytes(whole[:300])
    argv = ["predict", str(models["a"]), str(images), "--runtime", "torch", "--quiet"]
    statuses, outs = [], []
    for _ in range(2):
        statuses.append(main(argv))
        outs.append(capsys.readouterr())
    assert statuses == [1, 1], "the failure is not hidden by the rerun"
    assert "3 scored, 0 kept (already done by this model), 1 failed" in outs[0].out
    assert "0 scored, 3 kept (already done by this model; --overwrite scores them again), 1 failed" in outs[1].out
    assert "gpufeed predict: error: bad.jpg: " in outs[1].err
    (images / "bad.jpg").write_bytes(whole)  # repaired: scored now, the others still kept
    assert main(argv) == 0
    assert "1 scored, 3 kept" in capsys.readouterr().out
    assert "bad.jpg," in (images / "predictions.csv").read_text()


@pytest.fixture
def videos(tmp_path) -> Path:
    folder = tmp_path / "videos"
    encode_tagged_video(folder / "m1.mp4", 1, 20, width=64, height=48, labels=False)
    encode_tagged_video(folder / "m2.mp4", 2, 14, width=64, height=48, labels=False)
    return folder


def _score_videos(model: Path, folder: Path, **kwargs):
    return predict_videos(folder, load_predictor(model, CPU, runtime="torch"), progress=False, **kwargs)


def test_a_video_output_written_by_another_model_is_scored_again(models, videos, tmp_path, caplog):
    assert set(_statuses(_score_videos(models["clip-a"], videos)).values()) == {"scored"}
    with caplog.at_level(logging.WARNING, logger="gpufeed.predict"):
        report = _score_videos(models["clip-b"], videos)
    assert _statuses(report) == {"m1.mp4": "scored", "m2.mp4": "scored"}
    assert "the output of 2 videos: written by another model" in caplog.text and "m1.mp4, m2.mp4" in caplog.text
    _score_videos(models["clip-b"], videos, out=tmp_path / "fresh")
    for name in ("m1", "m2"):
        got = (videos / f"{name}_predictions.csv").read_bytes()
        assert got == (tmp_path / "fresh" / f"{name}_predictions.csv").read_bytes(), "model b's numbers"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpufeed.predict"):  # the same model, another hop
        report = _score_videos(models["clip-b"], videos, hop_frames=2)
    assert set(_statuses(report).values()) == {"scored"} and "hop_frames 1, now 2" in caplog.text
    assert set(_statuses(_score_videos(models["clip-b"], videos, hop_frames=2)).values()) == {"skipped"}


def test_an_hdf5_output_keeps_one_record_per_group(models, videos):
    _score_videos(models["clip-a"], videos, fmt="hdf5", latent_name="a")
    _score_videos(models["clip-b"], videos, fmt="hdf5", latent_name="b")
    assert set(_statuses(_score_videos(models["clip-a"], videos, fmt="hdf5", latent_name="a")).values()) == {"skipped"}
    report = _score_videos(models["clip-b"], videos, fmt="hdf5", latent_name="a")
    assert set(_statuses(report).values()) == {"scored"}, "group a holds model a's numbers"
    outputs = json.loads((videos / MANIFEST_FILE).read_text())["outputs"]
    assert sorted(outputs) == ["m1_outputs.h5/a", "m1_outputs.h5/b", "m2_outputs.h5/a", "m2_outputs.h5/b"]


def test_an_output_with_no_record_of_its_model_is_scored_again_once(models, videos, caplog):
    _score_videos(models["clip-a"], videos)
    (videos / MANIFEST_FILE).unlink()  # as gpufeed wrote outputs before it kept the manifest
    with caplog.at_level(logging.WARNING, logger="gpufeed.predict"):
        report = _score_videos(models["clip-a"], videos)
    assert set(_statuses(report).values()) == {"scored"}
    lines = [r.getMessage() for r in caplog.records if "no record of the model that wrote it" in r.getMessage()]
    assert len(lines) == 1 and "the output of 2 videos" in lines[0], caplog.text
    assert set(_statuses(_score_videos(models["clip-a"], videos)).values()) == {"skipped"}


def test_a_video_another_model_failed_on_keeps_no_record_of_the_old_model(models, videos, tmp_path):
    """The old model's entry goes before the video is scored, so whatever happens next no wrong record stays."""
    _score_videos(models["clip-a"], videos)
    shutil.copy(videos / "m2.mp4", tmp_path / "m2.mp4")
    (videos / "m2.mp4").write_bytes((videos / "m2.mp4").read_bytes()[:2000])
    assert _statuses(_score_videos(models["clip-b"], videos)) == {"m1.mp4": "scored", "m2.mp4": "failed"}
    assert "m2_predictions.csv" not in json.loads((videos / MANIFEST_FILE).read_text())["outputs"]
    shutil.copy(tmp_path / "m2.mp4", videos / "m2.mp4")
    assert _statuses(_score_videos(models["clip-a"], videos)) == {"m1.mp4": "scored", "m2.mp4": "scored"}


def test_the_same_model_over_the_same_inputs_scores_and_writes_nothing(models, videos, images):
    _score_videos(models["clip-a"], videos)
    _score_images(models["a"], images)
    written = {p: p.stat().st_mtime_ns for folder in (videos, images) for p in folder.iterdir() if p.is_file()}
    assert videos / MANIFEST_FILE in written and images / MANIFEST_FILE in written
    assert set(_statuses(_score_videos(models["clip-a"], videos)).values()) == {"skipped"}
    again = _score_images(models["a"], images)
    assert set(_statuses(again).values()) == {"skipped"} and again.frames == 0
    assert {p: p.stat().st_mtime_ns for p in written} == written, "no output nor manifest rewritten"
    # An exported model folder is identified by its model.onnx: the same folder keeps its outputs too.
    export_model(models["clip-a"], videos.parent / "exported", batch_size=2)
    exported = load_predictor(videos.parent / "exported", CPU)
    assert set(_statuses(predict_videos(videos, exported, progress=False)).values()) == {"scored"}
    assert set(_statuses(predict_videos(videos, exported, progress=False)).values()) == {"skipped"}


def test_an_interrupted_run_says_what_it_kept_and_the_same_call_goes_on(tmp_path, monkeypatch):
    import gpufeed.predict._run as run

    root = tmp_path / "videos"
    encode_tagged_video(root / "mouse1.mp4", 1, 20, width=64, height=48, labels=False)
    encode_tagged_video(root / "mouse2.mp4", 2, 14, width=64, height=48, labels=False)
    out = tmp_path / "out"
    scored = run.score_frames

    def ctrl_c_in_the_second_video(chunks, num_frames, *args, **kwargs):
        blocks = scored(chunks, num_frames, *args, **kwargs)
        if num_frames == 14:
            next(blocks)  # mid-video: its first windows are scored, its output is not complete
            raise KeyboardInterrupt
        return blocks

    monkeypatch.setattr(run, "score_frames", ctrl_c_in_the_second_video)
    with pytest.raises(KeyboardInterrupt) as info:
        predict_videos(root, tag_predictor({1: 20, 2: 14}, clip_length_frames=5), out=out, progress=False)
    assert (
        str(info.value) == "1 of 2 video(s) have their output; the same command again keeps them and scores the other 1"
    )
    assert sorted(p.name for p in out.glob("*.csv")) == ["mouse1_predictions.csv"]
    monkeypatch.setattr(run, "score_frames", scored)
    report = predict_videos(root, tag_predictor({1: 20, 2: 14}, clip_length_frames=5), out=out, progress=False)
    assert [(r.name, r.status) for r in report.results] == [("mouse1.mp4", "skipped"), ("mouse2.mp4", "scored")]


def test_the_interrupted_line_carries_what_the_command_says_it_kept(monkeypatch, capsys):
    import gpufeed.cli as cli

    def stopped(args):
        raise KeyboardInterrupt("1 of 2 video(s) have their output")

    monkeypatch.setattr(cli, "resolve_handler", lambda name: stopped)
    monkeypatch.setattr(cli, "require_stack", lambda command: None)
    assert main(["predict", "model.pt", "videos"]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "gpufeed predict: interrupted: 1 of 2 video(s) have their output"
