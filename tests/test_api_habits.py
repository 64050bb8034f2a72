"""The Python API as a new user reaches for it: torch habits and first mistakes answered in one line.

* A validation folder with another class set: ``classes=`` indexes it with the training classes
  (it used to be labelled by its own folders, silently); a dataset whose classes differ is refused.
* ``torch.save(model.state_dict())`` handed to export is named a bare state_dict, with the call
  that works; ``create_model(..., labels=...)`` takes the class count from the labels.
* One image file given as the dataset is named an image (by extension or by its magic bytes).
* torch ``DataLoader`` arguments (``num_workers``, ``drop_last``, ``pin_memory``) name gpufeed's
  equivalent; torch's device names are read as gpu/cpu; ``size_px`` as text is refused.
* A batch larger than the dataset names the config key and the Python spelling.
* A folder of split folders given to the loader warns, once, as ``gpufeed train`` does.
* A loader state without its position (``load_state_dict({...})``) says what it lacks; a model
  name with a typo gets the likely one.

Real JPEGs from PIL in tmp folders; loaders on DALI's CPU mode, built but not iterated.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gpufeed.config import LoaderConfig
from gpufeed.device import DeviceChoice, DeviceUnavailableError
from gpufeed.models import create_model, load_model, model_state, read_checkpoint
from gpufeed.pipelines import ClipLoader, DatasetError, DenseLoader, ImageDataset, ImageLoader
from gpufeed.pipelines._loader_args import resolve_loader_device

pytestmark = pytest.mark.timeout(120)

CPU = DeviceChoice("cpu", None, "test")


def _classes(root: Path, names: tuple[str, ...], count: int = 2) -> Path:
    """``root/<name>/<i>.jpg`` for each name: ``count`` small real JPEGs each."""
    rng = np.random.default_rng(len(names))
    for name in names:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(root / name / f"{i}.jpg")
    return root


# -- 1. classes= --------------------------------------------------------------------------------


def test_a_val_folder_with_another_class_set_is_labelled_with_the_training_classes(tmp_path):
    train = ImageLoader(_classes(tmp_path / "train", ("amber", "birch", "cedar")), batch_size=2, device=CPU)
    val_root = _classes(tmp_path / "val", ("amber", "cedar", "dandelion"))
    # A class training lacks cannot be scored: its folder is named (as by gpufeed train's data.classes) ...
    with pytest.raises(DatasetError, match="folder 'dandelion' is not one of the classes"):
        ImageLoader(val_root, batch_size=2, train=False, device=CPU, classes=train.dataset.classes)
    # ... and left out when the loader skips bad samples.
    skip = LoaderConfig(batch_size=2, on_bad_sample="skip")
    val = ImageLoader(val_root, train=False, device=CPU, classes=train.dataset.classes, loader_cfg=skip)
    data = val.dataset
    assert data.classes == ("amber", "birch", "cedar")
    cedar = [i for i, p in enumerate(data.paths) if "/cedar/" in p]
    assert cedar and all(data.labels[i] == 2 for i in cedar), "cedar is label 2, as in training"
    dandelion = [i for i, p in enumerate(data.paths) if "/dandelion/" in p]
    assert dandelion and all(i in val.skipped for i in dandelion)
    # A list file is indexed with them too (they take the place of a classes.txt).
    (tmp_path / "val.txt").write_text("val/cedar/0.jpg cedar\nval/amber/0.jpg amber\n", encoding="utf-8")
    listed = ImageLoader(
        tmp_path / "val.txt", batch_size=2, train=False, device=CPU, classes=["amber", "birch", "cedar"]
    )
    assert listed.dataset.labels.tolist() == [2, 0]


def test_classes_that_differ_from_an_indexed_dataset_name_both(tmp_path):
    indexed = ImageDataset.from_folder(_classes(tmp_path / "val", ("amber", "cedar")))
    with pytest.raises(ValueError) as info:
        ImageLoader(indexed, batch_size=2, train=False, device=CPU, classes=("amber", "birch", "cedar"))
    assert str(info.value).startswith(
        "ImageLoader: argument classes=['amber', 'birch', 'cedar'] differ from the dataset's classes "
        "['amber', 'cedar'] (class folders under "
    )
    assert ImageLoader(indexed, batch_size=2, train=False, device=CPU, classes=["amber", "cedar"]).dataset is indexed


@pytest.mark.parametrize("classes", ["amber", (), ("amber", "amber"), ("amber", 3)])
def test_classes_that_are_not_a_list_of_distinct_names_are_refused(tmp_path, classes):
    with pytest.raises(ValueError, match=r"ImageLoader: argument classes=.*: expected a list of distinct class names"):
        ImageLoader(tmp_path, classes=classes)


# -- 2. checkpoints and labels ------------------------------------------------------------------


def test_a_bare_state_dict_is_named_with_the_call_that_works(tmp_path):
    model = create_model("smallcnn", num_classes=2, size_px=32)
    torch.save(model.state_dict(), tmp_path / "p.pt")
    with pytest.raises(ValueError) as info:
        load_model(read_checkpoint(tmp_path / "p.pt"))  # as export and predict read it
    words = str(info.value)
    assert words.startswith("checkpoint dict is not a gpufeed checkpoint: it is a bare state_dict (")
    assert "torch.save(gpufeed.models.model_state(model), path)" in words and "\n" not in words
    torch.save(model_state(model), tmp_path / "ok.pt")
    assert load_model(tmp_path / "ok.pt").spec == model.spec


def test_labels_without_num_classes_give_one_output_per_label():
    model = create_model("smallcnn", labels=("amber", "birch"), size_px=32)
    assert model.spec.num_classes == 2 and model.spec.labels == ("amber", "birch")
    assert tuple(model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8)).shape) == (1, 2)
    with pytest.raises(ValueError, match="2 labels for 3 classes"):
        create_model("smallcnn", labels=("amber", "birch"), num_classes=3)


# -- 3. one image given as the dataset ----------------------------------------------------------


def test_one_image_file_given_as_the_dataset_is_named_an_image(tmp_path):
    _classes(tmp_path / "photos", ("amber",), 1)
    photo = tmp_path / "photos" / "amber" / "0.jpg"
    with pytest.raises(DatasetError) as info:
        ImageLoader(photo, device=CPU)
    assert str(info.value) == (
        f"list file {photo} is a .jpg image, not a text file: a dataset is a folder of class folders "
        "(<root>/<class>/<image>) or a list file of 'path label' lines"
    )
    # No image extension: the magic bytes say what it is.
    unnamed = tmp_path / "IMG_0001"
    unnamed.write_bytes(photo.read_bytes())
    with pytest.raises(DatasetError, match=f"list file {unnamed} is a JPEG image, not a text file"):
        ImageLoader(unnamed, device=CPU)
    # A text list that starts with "BM" (BMP's magic) is still told its byte.
    odd = tmp_path / "cars.txt"
    odd.write_bytes(b"BMW/a.jpg car\n\xff\n")
    with pytest.raises(DatasetError, match="is not UTF-8 text"):
        ImageLoader(odd, device=CPU)
    # A bucket key is judged by its name before anything is read.
    with pytest.raises(DatasetError, match=r"list file s3://bucket/photos/a\.JPG is a \.jpg image"):
        ImageDataset.from_list("s3://bucket/photos/a.JPG")


# -- 4. torch habits ----------------------------------------------------------------------------

DATALOADER_ARGUMENTS = [
    ({"num_workers": 4}, "argument num_workers=4 is torch DataLoader's, not gpufeed's: DALI's threads decode here: "),
    (
        {"drop_last": True},
        "argument drop_last=True is torch DataLoader's, not gpufeed's: give loader_cfg=LoaderConfig(",
    ),
    ({"pin_memory": True}, "argument pin_memory=True is torch DataLoader's, not gpufeed's: not needed: batches arrive"),
]


@pytest.mark.parametrize("loader", [ImageLoader, ClipLoader, DenseLoader])
@pytest.mark.parametrize(("kwargs", "words"), DATALOADER_ARGUMENTS)
def test_torch_dataloader_arguments_name_the_equivalent(tmp_path, loader, kwargs, words):
    with pytest.raises(ValueError) as info:
        loader(tmp_path, **kwargs)
    assert str(info.value).startswith(f"{loader.__name__}: {words}") and "\n" not in str(info.value)


def test_torch_device_names_are_read_as_gpu_and_cpu(monkeypatch):
    asked = []
    monkeypatch.setattr(
        "gpufeed.pipelines._loader_args.resolve_device", lambda kind, **kw: asked.append((kind, kw)) or CPU
    )
    for device in ("cuda", torch.device("cuda"), "cuda:1", torch.device("cuda", 1), torch.device("cpu"), "gpu"):
        resolve_loader_device("ImageLoader", device)
    assert asked == [
        ("gpu", {}),
        ("gpu", {}),
        ("gpu", {"local_rank": 1}),
        ("gpu", {"local_rank": 1}),
        ("cpu", {}),
        ("gpu", {}),
    ]
    for bad in ("mps", "cuda:x", torch.device("meta")):
        with pytest.raises(
            ValueError, match=r"argument device=.* is not allowed; allowed: 'auto', 'gpu', 'cpu', 'cuda'"
        ):
            resolve_loader_device("ImageLoader", bad)


def test_device_cuda_asks_for_the_gpu(tmp_path):
    root = _classes(tmp_path / "train", ("amber", "birch"))
    if torch.cuda.is_available():
        assert ImageLoader(root, batch_size=2, device="cuda").device.is_gpu
    else:  # the GPU was asked for: its own error, not "not allowed"
        with pytest.raises(DeviceUnavailableError, match="device: gpu was requested but is not usable"):
            ImageLoader(root, batch_size=2, device="cuda")
    assert ImageLoader(root, batch_size=2, device=torch.device("cpu")).device.kind == "cpu"


def test_size_px_as_text_is_refused_like_batch_size(tmp_path):
    with pytest.raises(ValueError) as info:
        ImageLoader(tmp_path, size_px="64")
    assert str(info.value) == "ImageLoader: argument size_px='64': expected an integer or (width, height), not text"


# -- 5. a batch larger than the dataset -----------------------------------------------------------


def test_a_batch_larger_than_the_data_names_both_spellings_of_partial(tmp_path):
    root = _classes(tmp_path / "train", ("amber", "birch"))
    with pytest.raises(DatasetError) as info:
        ImageLoader(root, batch_size=8, device=CPU, loader_cfg=LoaderConfig(last_batch="drop"))
    assert str(info.value).endswith(
        "Use a smaller batch_size, or a partial last batch: loader.last_batch: partial in a config, "
        'LoaderConfig(last_batch="partial") as loader_cfg in Python.'
    )


# -- 6. split folders ---------------------------------------------------------------------------


def test_a_folder_of_split_folders_warns_once(tmp_path, caplog):
    split = tmp_path / "split"
    _classes(split / "train", ("amber", "birch"))
    _classes(split / "val", ("amber", "birch"))
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        loader = ImageLoader(split, batch_size=2, train=False, device=CPU)
        ImageLoader(split, batch_size=2, train=False, device=CPU)
    said = [r.getMessage() for r in caplog.records if "split folders" in r.getMessage()]
    assert loader.dataset.classes == ("train", "val")
    assert said == [
        f"ImageLoader: {split} holds the split folders train/, val/, which train as its classes; give the "
        f"loader each split folder itself ({split / 'train'}, {split / 'val'})"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        ImageLoader(split / "train", batch_size=2, train=False, device=CPU)
    assert not [r for r in caplog.records if "split folders" in r.getMessage()]


def test_a_loader_state_without_its_position_is_named(tmp_path):
    loader = ImageLoader(_classes(tmp_path / "train", ("amber", "birch")), batch_size=2, device=CPU)
    with pytest.raises(ValueError, match=r"a loader state without epoch and batch \(its keys: foo\): give it what"):
        loader.load_state_dict({"foo": 1})  # was a bare KeyError: 'epoch'


def test_a_model_name_typo_gets_the_likely_name():
    with pytest.raises(
        ValueError, match=r"^model 'resnt18' is not known \(did you mean 'resnet18'\?\); known models: "
    ):
        create_model("resnt18")
    with pytest.raises(ValueError, match=r"^model 'zzz' is not known; known models: "):
        create_model("zzz")
