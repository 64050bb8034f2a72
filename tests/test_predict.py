"""``gpufeed predict``'s library: every frame of every video, in every storage form, written atomically, resumed.

The model is tests/predicthelp.py's tag reader, so each output row is known exactly from the rule.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from predicthelp import CPU, TAG_CLASSES, expected_frames, tag_predictor
from videohelp import encode_tagged_video, make_deepethogram_project, write_tagged_store

from gpufeed.models import WindowPlan, create_model
from gpufeed.pipelines import DatasetError
from gpufeed.predict import Predictor, predict_images, predict_videos
from gpufeed.predict._inputs import find_videos
from gpufeed.predict._outputs import read_predictions_csv
from gpufeed.synth import render_frame

pytestmark = pytest.mark.timeout(300)

# video id -> frames: an mp4 with B-frames at an odd size, a PNG frame folder, an HDF5 store of JPEGs.
FRAMES = {1: 37, 2: 23, 3: 19}


@pytest.fixture
def videos(tmp_path) -> Path:
    root = tmp_path / "videos"
    encode_tagged_video(
        root / "cam" / "mouse1.mp4", 1, FRAMES[1], width=98, height=66, options={"bf": "3", "g": "9"}, labels=False
    )
    write_tagged_store(root / "mouse2", 2, FRAMES[2], by="hand", labels=False)
    write_tagged_store(root / "mouse3.h5", 3, FRAMES[3], ext=".jpg", by="hand", labels=False)
    return root


def _check_rows(path: Path, plan: WindowPlan, frames: int) -> None:
    names, values = read_predictions_csv(path)
    assert names == TAG_CLASSES
    np.testing.assert_array_equal(values, expected_frames(plan, frames))


def test_every_frame_of_every_storage_form(videos, tmp_path):
    predictor = tag_predictor(FRAMES, clip_length_frames=5, batch_size=3)
    report = predict_videos(videos, predictor, out=tmp_path / "out", progress=False)
    assert [r.name for r in report.results] == ["mouse2", "mouse3.h5", "cam/mouse1.mp4"]
    assert [r.status for r in report.results] == ["scored"] * 3, report.results
    plan = WindowPlan(5)
    _check_rows(tmp_path / "out" / "cam" / "mouse1_predictions.csv", plan, FRAMES[1])
    _check_rows(tmp_path / "out" / "mouse2_predictions.csv", plan, FRAMES[2])
    _check_rows(tmp_path / "out" / "mouse3_predictions.csv", plan, FRAMES[3])
    assert report.frames == sum(FRAMES.values())
    assert not list(videos.rglob("*_predictions.csv")), "nothing written beside the videos"


def test_outputs_go_beside_the_videos_and_a_second_run_skips_them(videos):
    predictor = tag_predictor(FRAMES)
    first = predict_videos(videos, predictor, hop_frames=2, progress=False)
    assert [r.status for r in first.results] == ["scored"] * 3
    seen = len(predictor._module.windows_seen)
    assert (videos / "cam" / "mouse1_predictions.csv").is_file() and (videos / "mouse2_predictions.csv").is_file()
    again = predict_videos(videos, predictor, hop_frames=2, progress=False)
    assert [r.status for r in again.results] == ["skipped"] * 3
    assert len(predictor._module.windows_seen) == seen, "a skipped video is not read"
    (videos / "mouse2_predictions.csv").unlink()
    third = predict_videos(videos, predictor, hop_frames=2, progress=False)
    assert {r.name: r.status for r in third.results} == {
        "mouse2": "scored",
        "mouse3.h5": "skipped",
        "cam/mouse1.mp4": "skipped",
    }
    _check_rows(videos / "mouse2_predictions.csv", WindowPlan(5, 1, 2), FRAMES[2])


def test_a_video_stopped_mid_way_leaves_no_output_and_is_scored_next_time(videos, tmp_path):
    out = tmp_path / "out"
    broken = tag_predictor(FRAMES, batch_size=2, fail_after=10)
    report = predict_videos(videos / "cam", broken, out=out, progress=False)
    (result,) = report.results
    assert result.status == "failed" and "the model broke down mid-video" in result.error
    assert result.error.startswith("mouse1.mp4: ") and "\n" not in result.error
    assert not list(out.rglob("*")) or not [p for p in out.rglob("*") if p.is_file()], "no output, no temporary file"
    # A crash that left its hidden temporary file behind: the video is still not done.
    out.mkdir(exist_ok=True)
    (out / ".mouse1_predictions.csv.tmp-99999").write_text("frame,background\n0,0.5\n")
    fixed = predict_videos(videos / "cam", tag_predictor(FRAMES), out=out, progress=False)
    assert [r.status for r in fixed.results] == ["scored"]
    _check_rows(out / "mouse1_predictions.csv", WindowPlan(5), FRAMES[1])


def test_a_video_that_cannot_be_read_is_named_and_the_others_are_scored(videos, tmp_path):
    (videos / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 100)
    store = videos / "mouse2"
    frame = store / "000000011.png"
    frame.write_bytes(frame.read_bytes()[:60] + b"\0" * 200)  # a damaged frame in the middle of a store
    report = predict_videos(videos, tag_predictor(FRAMES), out=tmp_path / "out", progress=False)
    by_name = {r.name: r for r in report.results}
    assert by_name["broken.mp4"].status == "failed" and by_name["broken.mp4"].error.startswith("broken.mp4: ")
    assert by_name["mouse2"].status == "failed"
    assert (
        "mouse2: decoding stopped" in by_name["mouse2"].error and "000000011.png is damaged" in by_name["mouse2"].error
    )
    assert all("\n" not in r.error for r in report.failed)
    assert by_name["cam/mouse1.mp4"].status == by_name["mouse3.h5"].status == "scored"
    assert not (tmp_path / "out" / "mouse2_predictions.csv").exists()
    _check_rows(tmp_path / "out" / "mouse3_predictions.csv", WindowPlan(5), FRAMES[3])


def test_an_object_storage_source_is_refused_in_one_line_naming_it(tmp_path):
    for source in ("s3://bucket/videos", "s3://bucket/one.mp4"):
        with pytest.raises(DatasetError, match=r"^s3://bucket/\S+: gpufeed predict reads local videos") as refused:
            predict_videos(source, tag_predictor(FRAMES), out=tmp_path / "out", progress=False)
        assert "s3:/b" not in str(refused.value).replace("s3://", "")  # not Path's "s3:/bucket"
        with pytest.raises(DatasetError, match=r"^s3://bucket/\S+: gpufeed predict reads local"):
            predict_images(source, tag_predictor(FRAMES), out=tmp_path / "out", progress=False)


def test_indexing_the_videos_shows_progress(videos, tmp_path, monkeypatch, capsys):
    shutil.copytree(videos / "cam", tmp_path / "cam")  # not indexed yet: the index is cached beside the data
    monkeypatch.setenv("GPUFEED_PROGRESS", "lines")
    monkeypatch.setenv("GPUFEED_PROGRESS_INTERVAL_S", "0.000001")  # a line however short the task
    predict_videos(tmp_path / "cam", tag_predictor(FRAMES), out=tmp_path / "out", progress=True)
    assert "indexing videos: 1/1 video" in capsys.readouterr().err


def test_a_deepethogram_project_gets_its_outputs_in_each_record(tmp_path):
    project = make_deepethogram_project(tmp_path / "proj", "mp4", (21, 30))
    record = project / "DATA" / "mouse01"
    # DeepEthogram's own output file for that record, with a feature extractor's group: kept.
    with h5py.File(record / "mouse01_outputs.h5", "w") as handle:
        handle.create_group("resnet18").create_dataset("P", data=np.zeros((30, 5), np.float32))
    predictor = tag_predictor({0: 21, 1: 30}, clip_length_frames=4)
    report = predict_videos(project, predictor, fmt="hdf5", progress=False)
    assert [r.name for r in report.results] == ["record mouse00 (mouse00.mp4)", "record mouse01 (mouse01.mp4)"]
    assert [r.status for r in report.results] == ["scored", "scored"]
    for key, frames in (("mouse00", 21), ("mouse01", 30)):
        with h5py.File(project / "DATA" / key / f"{key}_outputs.h5", "r") as handle:
            group = handle["r3d_small"]  # the model's architecture is the latent name
            np.testing.assert_array_equal(group["P"][:], expected_frames(WindowPlan(4), frames))
            assert group["P"].dtype == np.float32 and group["logits"].shape == (frames, 3)
            assert [n.decode() for n in group["class_names"][:]] == list(TAG_CLASSES)
            np.testing.assert_array_equal(group["thresholds"][:], np.full(3, 0.5, np.float32))
            if key == "mouse01":
                assert "resnet18" in handle, "DeepEthogram's own group stays"
    again = predict_videos(project, predictor, fmt="hdf5", progress=False)
    assert [r.status for r in again.results] == ["skipped", "skipped"]


def test_a_project_record_naming_a_file_outside_is_named_and_the_others_are_scored(tmp_path):
    project = make_deepethogram_project(tmp_path / "proj", "mp4", (21, 12))
    record = project / "DATA" / "mouse01" / "record.yaml"
    record.write_text(record.read_text().replace("default: mouse01.mp4", "default: ../../../secret.mp4"))
    report = predict_videos(project, tag_predictor({0: 21, 1: 12}, clip_length_frames=4), progress=False)
    assert [r.status for r in report.results] == ["scored", "failed"]
    assert "record mouse01" in report.failed[0].error and "'..' steps lead outside" in report.failed[0].error


def test_sources_that_hold_no_video_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"no videos .* in .*empty"):
        find_videos(tmp_path / "empty")
    with pytest.raises(DatasetError, match=r"missing does not exist"):
        find_videos(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DatasetError, match=r"notes\.txt is not a video"):
        find_videos(tmp_path / "notes.txt")


def test_own_hdf5_outputs_are_not_taken_for_videos(videos, tmp_path):
    predict_videos(videos, tag_predictor(FRAMES), fmt="hdf5", progress=False)
    assert (videos / "mouse3_outputs.h5").is_file()
    assert [t.name for t in find_videos(videos)] == ["mouse2", "mouse3.h5", "cam/mouse1.mp4"]


def test_an_image_model_writes_one_row_per_image(tmp_path):
    from gpufeed.synth._photos import encode_image

    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    pixels = {}
    for i, name in enumerate(["a.jpg", "sub/b.png", "c.jpeg"]):
        rgb = render_frame(i, 0, np.zeros(5, np.uint8), 80 + 10 * i, 60)
        pixels[name] = rgb
        (folder / name).write_bytes(encode_image(rgb, "PNG" if name.endswith(".png") else "JPEG"))
    (folder / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    torch.manual_seed(0)
    model = create_model("smallcnn", num_classes=4, size_px=48, labels=("w", "x", "y", "z")).eval()
    from gpufeed.models._clip_sampling import ClipSampling

    predictor = Predictor(Path("m"), "checkpoint", model.spec, model.spec.labels, ClipSampling(), 2, CPU, _module=model)
    report = predict_images(folder, predictor, progress=False)
    assert {r.name: r.status for r in report.results} == {
        "a.jpg": "scored",
        "bad.jpg": "failed",
        "c.jpeg": "scored",
        "sub/b.png": "scored",
    }
    assert report.failed[0].error.startswith("bad.jpg")
    assert re.search(r"; 3 images in [\d.]+ s \([\d,.]+ images/s while scoring\)$", report.summary())
    lines = (folder / "predictions.csv").read_text().splitlines()
    assert lines[0] == "image,w,x,y,z"
    assert [line.split(",")[0] for line in lines[1:]] == ["a.jpg", "c.jpeg", "sub/b.png"]
    values = np.array([[float(v) for v in line.split(",")[1:]] for line in lines[1:]])
    np.testing.assert_allclose(values.sum(1), 1.0, atol=1e-6)

    # A file name that is not UTF-8 (a camera's or an old archive's): before, writing the CSV failed
    # after every image had been scored. Its row names it by its bytes on disk.
    odd = "bad\udcffname.jpg"  # the name b"bad\xffname.jpg" as Python reads it from the file system
    (folder / odd).write_bytes((folder / "a.jpg").read_bytes())
    (folder / "predictions.csv").unlink()  # else the folder counts as done
    report = predict_images(folder, predictor, progress=False)
    assert sum(r.status == "scored" for r in report.results) == 4
    rows = (folder / "predictions.csv").read_bytes().splitlines()
    assert [row.split(b",")[0] for row in rows[1:]] == [b"a.jpg", b"bad\xffname.jpg", b"c.jpeg", b"sub/b.png"]


def test_a_jpeg_cut_short_with_a_new_end_marker_is_named_and_its_neighbour_scored(tmp_path):
    """libjpeg decodes such a JPEG with its missing half grey and only warns; predict decodes it
    strictly, as ``gpufeed check`` does, so it gets no row (before, it was scored)."""
    import io

    from PIL import Image

    from gpufeed.models._clip_sampling import ClipSampling
    from gpufeed.pipelines import read_image_facts

    folder = tmp_path / "images"
    folder.mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(noise).save(encoded, "JPEG", quality=90)  # no restart markers, as PIL writes by default
    whole = encoded.getvalue()
    (folder / "good.jpg").write_bytes(whole)
    (folder / "cut.jpg").write_bytes(whole[: len(whole) // 2] + b"\xff\xd9")
    assert read_image_facts(folder / "cut.jpg").problem is None, "the structure walk alone cannot see it"
    torch.manual_seed(0)
    model = create_model("smallcnn", num_classes=2, size_px=32, labels=("x", "y")).eval()
    predictor = Predictor(Path("m"), "checkpoint", model.spec, model.spec.labels, ClipSampling(), 2, CPU, _module=model)
    report = predict_images(folder, predictor, progress=False)
    assert {r.name: r.status for r in report.results} == {"cut.jpg": "failed", "good.jpg": "scored"}
    assert [r.error for r in report.failed] == [
        "cut.jpg: cannot be decoded: damaged JPEG data (Corrupt JPEG data: premature end of data segment)"
    ]
    lines = (folder / "predictions.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ["image", "good.jpg"]


def test_the_rule_needs_a_clip_model():
    model = create_model("smallcnn", num_classes=2, size_px=32)
    from gpufeed.models._clip_sampling import ClipSampling
    from gpufeed.predict._run import window_plan

    predictor = Predictor(Path("m"), "checkpoint", model.spec, ("a", "b"), ClipSampling(), 2, CPU, _module=model)
    with pytest.raises(ValueError, match="smallcnn is a classification model; windows are for clip models"):
        window_plan(predictor, None)


def test_a_checkpoint_keeps_its_training_sampling(tmp_path):
    """The frame gap and fit come from the checkpoint's training config (and export writes them to the card)."""
    from gpufeed.models import checkpoint_path, export_model, model_state, read_model_card
    from gpufeed.predict import load_predictor

    model = create_model("r3d_small", num_classes=3, size_px=32, clip_length_frames=4)
    path = checkpoint_path(tmp_path / "run", 1)
    path.parent.mkdir(parents=True)
    config = {"video": {"stride_frames": 2, "fit": "centre_crop"}}
    torch.save({**model_state(model), "step": 1, "config": config}, path)
    loaded = load_predictor(tmp_path / "run", CPU)
    assert (loaded.sampling.stride_frames, loaded.sampling.fit) == (2, "centre_crop")
    export_model(path, tmp_path / "exported", batch_size=2)
    assert read_model_card(tmp_path / "exported").extra["clip_sampling"] == {"stride_frames": 2, "fit": "centre_crop"}
    exported = load_predictor(tmp_path / "exported", CPU)
    assert (exported.sampling.stride_frames, exported.sampling.fit) == (2, "centre_crop")
    clips = torch.randint(0, 256, (3, 3, 4, 32, 32), dtype=torch.uint8)
    with torch.no_grad():
        want = model.eval()(clips).numpy()
    np.testing.assert_allclose(loaded.logits(clips), want, atol=1e-6)
    np.testing.assert_allclose(exported.logits(clips), want, atol=1e-4)
    shutil.rmtree(tmp_path / "exported")


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_bytes(b""), "the file is empty (0 bytes)"),
        (
            lambda p: p.write_text("frame,walk\n0,1\n"),
            "torch.load cannot read it as a PyTorch file (UnpicklingError: Unsupported operand 102)",
        ),
        (
            lambda p: torch.save(torch.nn.Linear(2, 2), p),
            "it holds a pickled object (torch.nn.modules.linear.Linear), not tensors and plain values; gpufeed reads "
            "checkpoints with torch.load(weights_only=True), which runs no code from a file",
        ),
        (lambda p: torch.save(torch.zeros(3), p), "it holds a Tensor, not the dict gpufeed train saves"),
    ],
    ids=["empty", "csv", "pickled-module", "tensor"],
)
def test_a_file_that_is_no_checkpoint_is_one_line_naming_it(tmp_path, make, why):
    """predict and export say what the file is, not torch's paragraphs advising weights_only=False."""
    from gpufeed.models import ExportError, export_model
    from gpufeed.predict import load_predictor

    path = tmp_path / "model.pt"
    make(path)
    with pytest.raises(DatasetError) as info:
        load_predictor(path, CPU)
    assert str(info.value) == f"{path} is not a gpufeed checkpoint: {why}"
    with pytest.raises(ExportError) as exported:
        export_model(path, tmp_path / "exported", batch_size=1)
    assert str(exported.value) == str(info.value) and "weights_only` set to `False" not in str(exported.value)
    assert not (tmp_path / "exported").exists()


def test_a_camera_like_video_of_an_odd_size(tmp_path):
    """97 x 61 (odd both ways, so 4:4:4), B-frames, short irregular GOPs, a variable frame rate: every frame exact."""
    path = tmp_path / "odd" / "camera.mp4"
    options = {"bf": "3", "g": "13", "keyint_min": "3", "sc_threshold": "40", "crf": "12"}
    encode_tagged_video(
        path, 5, 40, width=97, height=61, pix_fmt="yuv444p", options=options, durations_ms=(33, 34, 41), labels=False
    )
    report = predict_videos(path, tag_predictor({5: 40}, clip_length_frames=4), out=tmp_path / "out", progress=False)
    assert [r.status for r in report.results] == ["scored"], report.results
    _check_rows(tmp_path / "out" / "camera_predictions.csv", WindowPlan(4), 40)


def test_a_checkpoint_decodes_with_its_evaluation_decoder_share(tmp_path, monkeypatch):
    """``loader.hw_decoder_load`` of the training config reaches predict's image and frame decoders
    (on a GPU 0 means nvJPEG's CUDA path, as evaluation decoded); an exported model takes the default."""
    from gpufeed.config import LoaderConfig
    from gpufeed.models import checkpoint_path, export_model, model_state
    from gpufeed.pipelines import eval_decoder_options
    from gpufeed.predict import _images, _run, load_predictor
    from gpufeed.synth._photos import encode_image

    model = create_model("smallcnn", num_classes=2, size_px=32)
    path = checkpoint_path(tmp_path / "run", 1)
    path.parent.mkdir(parents=True)
    torch.save({**model_state(model), "step": 1, "config": {"loader": {"hw_decoder_load": 0}}}, path)
    loaded = load_predictor(path, CPU, runtime="torch")
    assert loaded.hw_decoder_load == 0.0
    seen: list[dict] = []

    class _Recorded(_images.ImageDecoder):
        def __init__(self, *args, **kwargs):
            seen.append(args[5] if len(args) > 5 else kwargs["gpu_options"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_images, "ImageDecoder", _Recorded)
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.jpg").write_bytes(encode_image(render_frame(0, 0, np.zeros(5, np.uint8), 40, 30), "JPEG"))
    report = predict_images(tmp_path / "img", loaded, progress=False)
    assert [r.status for r in report.results] == ["scored"]
    assert seen == [eval_decoder_options(0.0)]
    readers: list[float] = []
    real_reader = _run.VideoFrameReader
    monkeypatch.setattr(
        _run, "VideoFrameReader", lambda *a, **k: readers.append(k["hw_decoder_load"]) or real_reader(*a, **k)
    )
    clip_model = create_model("r3d_small", num_classes=3, size_px=32, clip_length_frames=4)
    clip_path = checkpoint_path(tmp_path / "clips", 1)
    clip_path.parent.mkdir(parents=True)
    torch.save({**model_state(clip_model), "step": 1, "config": {"loader": {"hw_decoder_load": 0.25}}}, clip_path)
    encode_tagged_video(tmp_path / "v.mp4", 0, 12, width=48, height=32)
    clips = load_predictor(clip_path, CPU, runtime="torch")
    report = predict_videos(tmp_path / "v.mp4", clips, out=tmp_path / "out", progress=False)
    assert [r.status for r in report.results] == ["scored"] and readers == [0.25]
    export_model(path, tmp_path / "exported", batch_size=2)
    assert load_predictor(tmp_path / "exported", CPU).hw_decoder_load == LoaderConfig().hw_decoder_load


def test_the_images_csv_goes_where_out_names_it(tmp_path):
    """``--out scores.csv`` made a folder named scores.csv holding predictions.csv."""
    from gpufeed.predict._inputs import find_images

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(b"")
    assert find_images(tmp_path / "imgs", tmp_path / "scores.csv")[1] == tmp_path / "scores.csv"
    assert find_images(tmp_path / "imgs", tmp_path / "out")[1] == tmp_path / "out" / "predictions.csv"
    assert find_images(tmp_path / "imgs")[1] == tmp_path / "imgs" / "predictions.csv"
    assert find_images(tmp_path / "imgs" / "a.jpg")[1] == tmp_path / "imgs" / "a_predictions.csv"
    (tmp_path / "old.csv").mkdir()  # a folder that happens to be named so stays a folder
    assert find_images(tmp_path / "imgs", tmp_path / "old.csv")[1] == tmp_path / "old.csv" / "predictions.csv"


def test_one_videos_output_goes_where_out_names_it(tmp_path):
    """``--out single.csv`` for one video made a folder named single.csv holding its CSV."""
    encode_tagged_video(tmp_path / "mouse.mp4", 0, 20, width=96, height=64)
    report = predict_videos(tmp_path / "mouse.mp4", tag_predictor({0: 20}), out=tmp_path / "single.csv", progress=False)
    assert [r.status for r in report.results] == ["scored"] and (tmp_path / "single.csv").is_file()
    assert (tmp_path / "single.csv").read_text().splitlines()[0].startswith("frame,")
    with pytest.raises(ValueError, match=r"single\.csv: a hdf5 output is a \.h5 file"):
        predict_videos(tmp_path / "mouse.mp4", tag_predictor({0: 20}), out=tmp_path / "single.csv", fmt="hdf5")
