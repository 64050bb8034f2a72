"""``gpufeed predict --plot``: each video's probabilities as a picture beside its output.

The bins are checked against the rule's own per-frame values (a model that reads the frames' tags,
so every frame's probabilities are known without running anything under test); the pictures are
real PNGs drawn by matplotlib for each storage form; a picture that cannot be written is a warning
and leaves the predictions in place.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image
from predicthelp import TAG_CLASSES, expected_frames, tag_predictor
from videohelp import encode_tagged_video, write_tagged_store

from gpufeed.cli import main
from gpufeed.models import WindowPlan
from gpufeed.predict import predict_videos
from gpufeed.predict._plot import EthogramBins, plot_path

pytestmark = pytest.mark.timeout(300)

FRAMES = {1: 37, 2: 23}


def test_bins_hold_the_mean_of_their_frames_in_any_block_order():
    probabilities = np.random.default_rng(0).random((10, 2)).astype(np.float32)
    bins = EthogramBins(10, 2, max_columns=4)  # frame i in bin i * 4 // 10: 0 0 0 1 1 2 2 2 3 3
    bins.add(6, probabilities[6:])
    assert np.isnan(bins.means()[:2]).all(), "bins no frame reached are NaN, not 0"
    bins.add(0, probabilities[:6])
    groups = [[0, 1, 2], [3, 4], [5, 6, 7], [8, 9]]
    want = np.stack([probabilities[g].astype(np.float64).mean(axis=0) for g in groups]).astype(np.float32)
    np.testing.assert_allclose(bins.means(), want, rtol=1e-6)
    assert EthogramBins(3, 2).columns == 3, "a short video gets a bin per frame"
    with pytest.raises(ValueError, match=r"frames 9\.\.10 are outside 0\.\.9"):
        bins.add(9, probabilities[:2])


def test_plot_paths_sit_beside_the_outputs(tmp_path):
    assert plot_path(tmp_path / "a" / "m1_predictions.csv") == tmp_path / "a" / "m1_predictions.png"
    assert plot_path(tmp_path / "rec" / "m1_outputs.h5") == tmp_path / "rec" / "m1_predictions.png"


def test_every_scored_video_gets_its_picture(tmp_path, caplog):
    root = tmp_path / "videos"
    encode_tagged_video(root / "mouse1.mp4", 1, FRAMES[1], width=96, height=64, labels=False)
    write_tagged_store(root / "mouse2.h5", 2, FRAMES[2], ext=".jpg", by="hand", labels=False)
    out = tmp_path / "out"
    # A folder where mouse2's picture would go: its picture cannot be written, its predictions can.
    (out / "mouse2_predictions.png").mkdir(parents=True)
    caplog.set_level(logging.WARNING, "gpufeed.predict")
    report = predict_videos(root, tag_predictor(FRAMES, clip_length_frames=5), out=out, progress=False, plot=True)
    assert [r.status for r in report.results] == ["scored", "scored"], report.results
    with Image.open(out / "mouse1_predictions.png") as image:
        assert image.format == "PNG" and image.width == 1000 and image.height > 150
    assert "mouse2.h5: no picture:" in caplog.text
    assert (out / "mouse2_predictions.csv").is_file() and not list(out.glob(".*.tmp-*"))


def test_the_picture_is_drawn_from_every_frames_probabilities(tmp_path, monkeypatch):
    drawn = {}

    def record(self, path, labels, title, fps=0.0):
        drawn[title] = (self.means(), labels, self.labels, self.labels_name)
        return path

    monkeypatch.setattr(EthogramBins, "draw", record)  # the picture's data, not its pixels
    video = tmp_path / "mouse1.mp4"
    # Its label file (mouse1.csv: background, groom, rear, walk) labels the model's three classes.
    rows = encode_tagged_video(video, 1, FRAMES[1], width=96, height=64, labels=True)
    predictor = tag_predictor(FRAMES, clip_length_frames=5, batch_size=3)
    predict_videos(video, predictor, out=tmp_path / "out", progress=False, plot=True)
    means, labels, truth, source = drawn["mouse1.mp4"]
    assert labels == TAG_CLASSES and source == "mouse1.csv"
    np.testing.assert_allclose(means, expected_frames(WindowPlan(5), FRAMES[1]), rtol=1e-6)
    np.testing.assert_array_equal(truth, rows[:, :3].astype(np.float32))


def test_labels_are_binned_under_the_models_classes_by_name():
    labels = np.array([[1, 0], [1, 1], [0, 1], [0, 0], [1, 1]], dtype=np.uint8)  # columns: rear, groom
    bins = EthogramBins(5, 3, max_columns=2)  # frames 0 0 0 1 1
    assert bins.set_labels(("rear", "groom"), labels, ("groom", "walk", "rear"), "m.csv") == 2
    want = np.array([[2 / 3, np.nan, 2 / 3], [0.5, np.nan, 0.5]], dtype=np.float32)
    np.testing.assert_allclose(bins.labels, want, rtol=1e-6)
    assert bins.set_labels(("sleep",), labels[:, :1], ("groom", "walk", "rear"), "other.csv") == 0
    assert bins.labels_name == "m.csv", "a file labelling none of the classes leaves the labels drawn as they were"
    with pytest.raises(ValueError, match=r"m\.csv has 4 rows for 5 frames"):
        bins.set_labels(("rear", "groom"), labels[:4], ("groom", "walk", "rear"), "m.csv")


def test_plot_is_for_clip_models(tmp_path, capsys):
    from _serving import write_checkpoint

    checkpoint = write_checkpoint(tmp_path / "run", "smallcnn", num_classes=2, size_px=32)
    (tmp_path / "images").mkdir()
    assert main(["predict", str(checkpoint), str(tmp_path / "images"), "--plot", "--quiet"]) == 2
    assert "--plot are for clip models" in capsys.readouterr().err


def test_a_project_records_picture_holds_its_own_label_file(tmp_path, monkeypatch):
    from videohelp import make_deepethogram_project

    from gpufeed.synth import behaviour_labels

    drawn = {}

    def record(self, path, labels, title, fps=0.0):
        drawn[title] = (path, self.labels, self.labels_name)
        return path

    monkeypatch.setattr(EthogramBins, "draw", record)
    project = make_deepethogram_project(tmp_path / "proj", "mp4", (21, 30))
    predictor = tag_predictor({0: 21, 1: 30}, clip_length_frames=4)
    predict_videos(project, predictor, fmt="hdf5", progress=False, plot=True)
    path, truth, source = drawn["record mouse00 (mouse00.mp4)"]
    assert path == project / "DATA" / "mouse00" / "mouse00_predictions.png" and source == "mouse00_labels.csv"
    np.testing.assert_array_equal(truth, behaviour_labels(21, seed=0)[:, :3].astype(np.float32))


def test_a_label_file_that_cannot_be_used_is_one_warning_and_the_picture_stays(tmp_path, caplog):
    video = tmp_path / "mouse1.mp4"
    encode_tagged_video(video, 1, FRAMES[1], width=96, height=64, labels=True)
    csv = video.with_suffix(".csv")
    csv.write_text("\n".join(csv.read_text().splitlines()[:-7]) + "\n")  # 30 rows for 37 frames
    caplog.set_level(logging.WARNING, "gpufeed.predict")
    report = predict_videos(
        video, tag_predictor(FRAMES, clip_length_frames=5), out=tmp_path / "out", progress=False, plot=True
    )
    assert [r.status for r in report.results] == ["scored"]
    assert (tmp_path / "out" / "mouse1_predictions.png").is_file()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        "predict: mouse1.mp4: picture without its label strip: label file mouse1.csv has 30 rows but the video "
        "has 37 frames"
    )


def test_a_name_the_font_cannot_draw_is_no_warning(tmp_path):
    """matplotlib's "Glyph 12511 missing from font" reached the terminal for a Japanese file name."""
    import warnings

    from gpufeed.predict._plot import EthogramBins

    bins = EthogramBins(num_frames=8, classes=2)
    bins.add(0, np.full((8, 2), 0.5, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bins.draw(tmp_path / "マウス_predictions.png", ("walk", "rear"), "マウス.mp4", fps=30.0)
    assert (tmp_path / "マウス_predictions.png").is_file()
