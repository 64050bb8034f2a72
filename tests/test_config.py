"""Config: YAML via safe_load into frozen dataclasses; every bad key or value is named."""

from __future__ import annotations

import dataclasses

import pytest

from gpufeed.config import Config, ConfigError, DatasetConfig, SizePx, load_config, parse_config, save_config
from gpufeed.core import ObjectPath


def test_defaults_are_valid_and_frozen():
    cfg = parse_config(None)
    assert cfg.device == "auto" and cfg.loader.batch_size == 64 and cfg.image.size_px == SizePx(224, 224)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.loader.batch_size = 3


def test_round_trip_through_yaml(tmp_path):
    cfg = parse_config({"data": {"train": {"root": "imgs"}}, "loader": {"batch_size": 8}}, base_dir=tmp_path)
    saved = save_config(cfg, tmp_path / "out" / "config.yaml")
    again = load_config(saved)
    assert again == cfg
    assert again.data.train.root == (tmp_path / "imgs").resolve()


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"loader": {"batchsize": 3}}, "loader.batchsize", "unknown key; allowed keys here: batch_size"),
        ({"nonsense": 1}, "nonsense", "unknown key"),
        ({"loader": {"batch_size": "big"}}, "loader.batch_size", "expected an integer, got 'big'"),
        ({"loader": {"batch_size": True}}, "loader.batch_size", "expected an integer, got True"),
        ({"loader": {"batch_size": 0}}, "loader.batch_size", "value 0 is out of range: must be >= 1"),
        ({"data": {"classes": ["amber", "birch", "amber"]}}, "data.classes", "class 'amber' is named twice"),
        # YAML's .inf passed `lr > 0` and trained to NaN weights with exit 0.
        ({"train": {"lr": float("inf")}}, "train.lr", "expected a finite number, got inf"),
        ({"train": {"weight_decay": float("nan")}}, "train.weight_decay", "expected a finite number, got nan"),
        # torch.manual_seed takes 64 signed bits: a larger seed failed with a traceback at the start of training.
        ({"seed": 2**64 - 1}, "seed", "out of range: must be <= 9223372036854775807"),
        ({"device": "tpu"}, "device", "value 'tpu' is not allowed; allowed: auto, gpu (or cuda), cpu"),
        # cuda:N would pin every rank to one GPU: the rank's own comes from CUDA_VISIBLE_DEVICES and LOCAL_RANK.
        ({"device": "cuda:1"}, "device", "write gpu, and CUDA_VISIBLE_DEVICES=1 to choose that GPU"),
        ({"loader": {"last_batch": "keep"}}, "loader.last_batch", "allowed: drop, partial, pad"),
        ({"image": {"crop_area": [0.5]}}, "image.crop_area", "got 1 items"),
        ({"image": {"crop_area": [0.9, 0.1]}}, "image.crop_area", "range [0.9, 0.1] is empty"),
        (
            {"augment": {"gaussian_blur": {"sigma": [2.0, 1.0]}}},
            "augment.gaussian_blur.sigma",
            "range [2.0, 1.0] is empty",
        ),
        ({"augment": {"erasing": {"ratio": [3.0, 0.5]}}}, "augment.erasing.ratio", "range [3.0, 0.5] is empty"),
        ({"image": {"crop_area": [0.0, 1.0]}}, "image.crop_area", "must be > 0.0"),
        ({"image": {"flip": "yes"}}, "image.flip", "expected true or false"),
        ({"data": {"train": {}}}, "data.train", "give exactly one of 'root'"),
        ({"data": {"train": {"root": "a", "list_file": "b"}}}, "data.train", "give exactly one of 'root'"),
        ({"loader": [1, 2]}, "loader", "expected a mapping"),
        ({"loader": {"hw_decoder_load": 1.5}}, "loader.hw_decoder_load", "must be <= 1.0"),
        ({"loader": {"worker_start_method": "thread"}}, "loader.worker_start_method", "allowed: auto, fork, spawn"),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(data, key, words):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.key_path == key
    assert words in str(info.value)
    assert f"'{key}'" in str(info.value)


def test_a_word_yaml_reads_as_a_boolean_is_the_allowed_word_it_was_written_as(tmp_path):
    """YAML 1.1 reads ``off`` as false: ``train.amp: off``, as the docs write it, is the word ``off``;
    ``compile: true`` is its first mode that is on."""
    cfg = parse_config(None, ["train.amp=off", "train.compile=off"])
    assert cfg.train.amp == "off" and cfg.train.compile == "off"
    path = tmp_path / "train.yaml"
    path.write_text("train:\n  amp: off\n", encoding="utf-8")
    assert load_config(path).train.amp == "off"
    # No allowed word reads as true: true turns on the first mode that is not off (refused before).
    cfg = parse_config(None, ["train.amp=on", "train.compile=true"])
    assert cfg.train.amp == "auto" and cfg.train.compile == "default"
    path.write_text("train:\n  amp: yes\n  compile: True\n", encoding="utf-8")
    assert (load_config(path).train.amp, load_config(path).train.compile) == ("auto", "default")
    with pytest.raises(ConfigError, match=r"'loader\.worker_start_method': value False is not allowed"):
        parse_config({"loader": {"worker_start_method": False}})


def test_a_number_with_an_exponent_is_a_float_in_files_and_overrides(tmp_path):
    """``lr: 3e-4`` is how people write a rate: YAML 1.1 (PyYAML) read it as the string '3e-4' and it was refused."""
    path = tmp_path / "train.yaml"
    path.write_text("train:\n  lr: 3e-4\n  weight_decay: 5E-2\n  grad_clip_norm: 1.5e1\n", encoding="utf-8")
    cfg = load_config(path, ["serve.request_timeout_seconds=1e2"])
    assert (cfg.train.lr, cfg.train.weight_decay, cfg.train.grad_clip_norm) == (3e-4, 5e-2, 15.0)
    assert cfg.serve.request_timeout_seconds == 100.0
    with pytest.raises(ConfigError, match=r"'train\.lr': expected a number, got '3e-4x'"):
        parse_config(None, ["train.lr=3e-4x"])  # not a number: still the string, named


def test_cuda_is_read_as_gpu():
    """torch's name for the device, as people write it: refused before."""
    assert parse_config({"device": "cuda"}).device == "gpu"
    assert parse_config(None, ["device=CUDA"]).device == "gpu"


def test_paths_expand_home_and_resolve_against_the_file_or_the_command_line(tmp_path, monkeypatch):
    """``~/data`` became ``<config folder>/~/data``, and a path typed with --set resolved against the
    config file's folder, not the folder the command ran in."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFEED_TEST_DATA", str(tmp_path / "bucket"))
    (tmp_path / "cfgdir").mkdir()
    (tmp_path / "work").mkdir()
    path = tmp_path / "cfgdir" / "train.yaml"
    path.write_text(
        "data:\n  train: {root: imgs}\n  val: {root: ~/val}\nloader:\n  quarantine_file: $GPUFEED_TEST_DATA/q.txt\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path / "work")
    cfg = load_config(path, ["data.train.list_file=lists/train.txt", "data.train.root=null"])
    assert cfg.data.train.list_file == tmp_path / "work" / "lists" / "train.txt"  # typed here: relative to here
    assert cfg.data.val.root == tmp_path / "home" / "val"
    assert cfg.loader.quarantine_file == tmp_path / "bucket" / "q.txt"
    assert load_config(path).data.train.root == tmp_path / "cfgdir" / "imgs"  # written in the file: beside it
    assert load_config(path, ["data.train={root: imgs}"]).data.train.root == tmp_path / "work" / "imgs"


@pytest.mark.parametrize(
    ("root", "words"),
    [
        ("s3://b/ds", "'s3://b/ds': 'b' is not a bucket name (3-63 lowercase letters"),
        ("gs://bucket/ds", "'gs://bucket/ds' is not an object-store URL; supported: s3://bucket/prefix"),
    ],
)
def test_a_bad_bucket_url_says_what_is_wrong_with_it(root, words):
    """It said only "value 's3://b/ds' is not a path | s3:// URL | null"."""
    for split in (root, {"root": root}):
        with pytest.raises(ConfigError) as info:
            parse_config({"data": {"train": split}})
        assert info.value.key_path == "data.train.root" and words in str(info.value)
    assert parse_config({"data": {"train": "s3://bkt/ds"}}).data.train.root == ObjectPath("s3://bkt/ds")


def test_a_bare_folder_is_a_splits_root(tmp_path, monkeypatch):
    """``data: {train: imgs}``, as ImageFolder and Ultralytics take it, was "expected a mapping"."""
    (tmp_path / "work").mkdir()
    path = tmp_path / "train.yaml"
    path.write_text("data:\n  train: imgs\n  val: ~/val\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    cfg = load_config(path)
    assert cfg.data.train == DatasetConfig(root=tmp_path / "imgs") and cfg.data.val.root == tmp_path / "home" / "val"
    assert load_config(path, ["data.train=other"]).data.train.root == tmp_path / "work" / "other"
    assert parse_config({"data": {"train": None}}).data.train is None
    with pytest.raises(ConfigError, match=r"^config key 'data\.train': expected a mapping of keys to values, got 3$"):
        parse_config({"data": {"train": 3}})
    with pytest.raises(ConfigError, match=r"^config key 'data\.val': give exactly one of 'root'"):
        parse_config({"data": {"val": {"root": "a", "list_file": "b"}}})


def test_a_key_in_the_wrong_section_names_the_one_that_has_it():
    """``train.batch_size`` (the batch is the loader's) listed only train's keys."""
    with pytest.raises(ConfigError, match=r"allowed keys here: amp, .*; did you mean loader\.batch_size\?$"):
        parse_config(None, ["train.batch_size=32"])
    with pytest.raises(ConfigError, match=r"did you mean image\.size_px or video\.size_px\?$"):
        parse_config({"size_px": 224})
    with pytest.raises(ConfigError) as info:
        parse_config(None, ["train.nonsense=1"])
    assert "did you mean" not in str(info.value)


def test_overrides_are_parsed_as_yaml_and_validated():
    cfg = parse_config(None, ["loader.batch_size=32", "image.crop_area=[0.2, 0.9]", "loader.shuffle=false"])
    assert cfg.loader.batch_size == 32 and cfg.image.crop_area == (0.2, 0.9) and cfg.loader.shuffle is False
    with pytest.raises(ConfigError, match=r"loader\.batch_size"):
        parse_config(None, ["loader.batch_size=-1"])
    with pytest.raises(ConfigError, match="must look like"):
        parse_config(None, ["loader.batch_size"])


def test_yaml_is_read_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("device: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(evil)


def test_missing_and_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(bad)


def test_every_key_is_described():
    from gpufeed.config import describe_config

    keys = {row[0] for row in describe_config()}
    assert {"device", "loader.batch_size", "image.size_px", "data.train", "loader.on_bad_sample"} <= keys
    assert {"data.train.root", "data.train.list_file", "data.val.root"} <= keys  # an optional section's own keys
    assert all(row[3] for row in describe_config()), "every key needs a one-line meaning"


def test_config_is_the_single_schema():
    # Sections are reachable from Config; nothing is read from elsewhere.
    assert {f.name for f in dataclasses.fields(Config)} >= {"device", "seed", "data", "image", "loader"}
