"""DeepEthogram projects as input: records, labels, the seeded split, check, and training from the CLI.

Projects are laid out as DeepEthogram's GUI leaves them, their videos written with its own ``vidio``
writers (frame folders, HDF5) or encoded as mp4; every frame carries (frame index, video id), so
clips are checked frame by frame.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from train_support import run_gpufeed
from videohelp import frame_tags, make_deepethogram_project

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, DatasetError, check_path
from gpufeed.pipelines._deepethogram import project_dataset, split_records
from gpufeed.synth import BEHAVIOURS

pytestmark = [pytest.mark.process, pytest.mark.timeout(600)]

FRAMES = (40, 33, 36, 30, 45)
FORMS = ("mp4", "folder", "hdf5")


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    root = tmp_path_factory.mktemp("deg")
    made = {form: make_deepethogram_project(root / f"{form}_deepethogram", form, FRAMES) for form in FORMS}
    for form in ("folder", "hdf5"):  # the same layouts written by hand (Pillow, h5py) instead of vidio
        made[f"{form}_hand"] = make_deepethogram_project(root / f"{form}_hand_deepethogram", form, FRAMES, by="hand")
    return made


def test_the_split_is_seeded_disjoint_and_complete():
    train, val = split_records(10, 0.3, seed=4)
    assert len(val) == 3 and not set(train) & set(val) and sorted([*train, *val]) == list(range(10))
    again = split_records(10, 0.3, seed=4)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], val)
    assert not np.array_equal(split_records(10, 0.3, seed=5)[1], val), "another seed, another split"
    assert len(split_records(2, 0.1, seed=0)[1]) == 1, "a non-zero fraction validates at least one record"
    assert len(split_records(1, 0.5, seed=0)[0]) == 1, "at least one record trains"


@pytest.mark.parametrize("form", [*FORMS, "folder_hand", "hdf5_hand"])
def test_each_form_gives_the_same_records_split_and_exact_clips(projects, form):
    datasets = {s: project_dataset(projects[form], split=s, val_fraction=0.4, seed=2) for s in ("train", "val")}
    keys = {s: [p.split("/DATA/")[1].split("/")[0] for p in d.paths] for s, d in datasets.items()}
    train_ids, val_ids = split_records(len(FRAMES), 0.4, seed=2)
    assert keys == {"train": [f"mouse{i:02d}" for i in train_ids], "val": [f"mouse{i:02d}" for i in val_ids]}
    assert len(keys["val"]) == 2, "round(5 * 0.4) records validate"
    for split, dataset in datasets.items():
        assert not dataset.problems and dataset.behaviours == BEHAVIOURS
        loader = ClipLoader(
            dataset,
            train=split == "train",
            video_cfg=VideoConfig(size_px=[48, 32]),
            loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial"),
            device=DeviceChoice("cpu", None, "test"),
            seed=2,
        )
        for batch in loader:
            for k in range(len(batch)):
                video, start = int(batch.video_ids[k]), int(batch.start_frames[k])
                tagged_id = int(keys[split][video][-2:])
                assert frame_tags(batch.clips[k], "CTHW") == [(start + t, tagged_id) for t in range(11)]
                assert np.array_equal(batch.frame_labels[k].numpy(), dataset.labels[video][start : start + 11])


def _break(project):
    data = project / "DATA"
    record = yaml.safe_load((data / "mouse00" / "record.yaml").read_text())
    record["rgb"]["default"] = "gone.h5"  # a missing video
    (data / "mouse00" / "record.yaml").write_text(yaml.safe_dump(record))
    lines = (data / "mouse01" / "mouse01_labels.csv").read_text().splitlines()
    (data / "mouse01" / "mouse01_labels.csv").write_text("\n".join(lines[:-1]) + "\n")  # label rows != frames
    lines = (data / "mouse02" / "mouse02_labels.csv").read_text().splitlines()
    lines[0] = lines[0].replace("rear", "sniff")  # a class the project does not list
    (data / "mouse02" / "mouse02_labels.csv").write_text("\n".join(lines) + "\n")
    (data / "mouse03" / "record.yaml").unlink()


def test_check_names_the_record_and_key_of_each_problem(projects, tmp_path):
    import shutil

    project = tmp_path / "broken"
    shutil.copytree(projects["hdf5"], project)
    _break(project)
    report = check_path(project, progress=False)
    found = {f.path.split("/DATA/")[1].split("/")[0]: f.reason for f in report.findings}
    assert "record mouse00" in found["mouse00"] and "'rgb.default' names gone.h5" in found["mouse00"]
    assert "record mouse01: key 'label.default'" in found["mouse01"]
    assert "has 32 rows but the video has 33 frames" in found["mouse01"]
    assert (
        "record mouse02: key 'label.default'" in found["mouse02"] and "unknown class(es) ['sniff']" in found["mouse02"]
    )
    assert "record mouse03" in found["mouse03"] and "no record.yaml" in found["mouse03"]
    assert "mouse04" not in found and report.checked == 5
    with pytest.raises(DatasetError, match=r"cannot be used: .*record mouse"):
        ClipLoader(
            project_dataset(project, split="all", val_fraction=0.0, seed=0),
            train=True,
            video_cfg=VideoConfig(size_px=32),
            loader_cfg=LoaderConfig(batch_size=2, num_threads=1),
            device=DeviceChoice("cpu", None, "test"),
        )


def test_a_folder_that_is_not_a_project_is_refused_by_name(tmp_path):
    with pytest.raises(DatasetError, match=r"has no project_config\.yaml"):
        project_dataset(tmp_path, split="train", val_fraction=0.2, seed=0)
    (tmp_path / "project_config.yaml").write_text("project: {class_names: [background]}\n")
    (tmp_path / "DATA").mkdir()
    with pytest.raises(DatasetError, match=r"'project.class_names' must list at least two"):
        project_dataset(tmp_path, split="train", val_fraction=0.2, seed=0)


def test_a_project_and_a_video_folder_together_are_refused_by_key(projects, tmp_path):
    from train_support import train_config

    from gpufeed.config import ConfigError
    from gpufeed.train import train

    overrides = ["model.name=clip_resnet18", f"video.deepethogram={projects['mp4']}", f"video.train={tmp_path}"]
    with pytest.raises(ConfigError) as info:
        train(train_config(tmp_path, overrides), tmp_path / "run")
    assert info.value.key_path == "video.deepethogram" and "not both" in str(info.value)


@pytest.mark.parametrize("form", FORMS)
def test_gpufeed_train_trains_a_clip_model_on_a_project(projects, form, tmp_path):
    run = tmp_path / "run"
    config = {
        "device": "cpu",
        "seed": 0,
        "model": {"name": "clip_resnet18"},
        "video": {"deepethogram": str(projects[form]), "val_fraction": 0.4, "size_px": [48, 32]},
        "loader": {"batch_size": 4, "num_threads": 2},
        "train": {"epochs": 1, "max_steps": 3, "progress": False},
        "augment": {"ops": []},
        "telemetry": {"metrics_port": 0},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    done = run_gpufeed("train", "--config", str(path), "--out", str(run), timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    assert len(steps) == 3
    assert any(run.rglob("*.pt")), "a checkpoint"
