"""Pixel bombs and large answers (issue #32): every frame and map refused by its header, answers bounded.

A frame of a frame folder or HDF5 store whose header declares 30000 x 30000 pixels is refused by
the clip feed before any decoder sees it (the files here are header-only, 80 bytes, with every
chunk whole, so only the declared size refuses them); a 16-bit depth map declaring as much is a bad
pair even with ``data.scale_maps``; the served depth codes never write a prediction as the no-data
value; a JSON map answer past ``serve.max_json_map_pixels`` is refused before inference.
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
from hostilehelp import header_png
from PIL import Image
from videohelp import write_tagged_store

from gpufeed.config import LoaderConfig, VideoConfig
from gpufeed.device import DeviceChoice
from gpufeed.models._dense_heads import depth_codes
from gpufeed.models._spec import ModelSpec
from gpufeed.pipelines import BadSampleError, ClipLoader, PairedDataset, VideoDataset
from gpufeed.pipelines._frame_limit import frame_refusal, header_size
from gpufeed.pipelines._store_feed import ScaledJpegClips, StoreFrameFeed, StoreRef
from gpufeed.pipelines._video_check import check_dataset
from gpufeed.server._dense import check_json_map_pixels, dense_json, dense_map, dense_png
from gpufeed.server._errors import RequestError
from gpufeed.server._map_json import int_map_json

CPU = DeviceChoice("cpu", None, "test")
BOMB = "too many pixels: the header declares 30000x30000 = 900,000,000 pixels; the limit is 40,000,000"


def _encoded(fmt: str, size=(96, 64), **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((size[1], size[0], 3), np.uint8)).save(out, format=fmt, **save)
    return out.getvalue()


def test_header_sizes_of_png_and_jpeg_frames():
    assert header_size(_encoded("PNG")) == (96, 64)
    assert header_size(np.frombuffer(_encoded("JPEG", progressive=True), np.uint8)) == (96, 64)
    jpeg = _encoded("JPEG")
    stray = jpeg[:2] + b"\x00\x17junk" + jpeg[2:]  # libjpeg skips stray bytes before a marker; so does the reader
    assert header_size(stray) == (96, 64)
    assert header_size(np.frombuffer(stray, np.uint8)) == (96, 64)  # walked in place until a stray byte
    assert header_size(header_png(30000, 30000)) == (30000, 30000)
    assert (
        frame_refusal(header_png(30000, 30000), 40_000_000)
        == f"{BOMB} (data.max_image_pixels); refused without decoding"
    )
    assert frame_refusal(jpeg, 40_000_000) is None and header_size(b"GIF89a....") is None


@pytest.fixture(params=["folder", "hdf5"])
def bomb_store(request, tmp_path):
    """Three 12-frame stores of one kind; frame 5 of the second declares 30000 x 30000."""
    for video in range(3):
        name = f"v{video}" + (".h5" if request.param == "hdf5" else "")
        write_tagged_store(tmp_path / name, video, 12, by="hand")
    if request.param == "folder":
        (tmp_path / "v1" / "000000005.png").write_bytes(header_png(30000, 30000))
        return tmp_path, "000000005.png"
    with h5py.File(tmp_path / "v1.h5", "a") as fh:
        fh["frame"][5] = np.frombuffer(header_png(30000, 30000), np.uint8)
    return tmp_path, "frame 5"


def _one_clip(k):  # frames 3..6 of video 1
    return np.array([1]), np.array([3])


def test_the_feed_refuses_a_bomb_frame_before_any_decoder(bomb_store):
    folder, where = bomb_store
    dataset = VideoDataset.from_folder(folder)
    stores = [StoreRef.from_info(info) for info in dataset.infos]
    feed = StoreFrameFeed(_one_clip, stores, mode="rgb", clip_length_frames=4, stride_frames=1, batch_size=1)
    with pytest.raises(RuntimeError) as info:
        feed(SimpleNamespace(iteration=0, idx_in_batch=0))
    assert str(info.value) == (
        f"{dataset.paths[1]}: {where} is refused: {BOMB} (data.max_image_pixels); refused without decoding"
    )
    feed.close()


@pytest.mark.parametrize("kind", ["folder", "hdf5"])
def test_the_cpu_jpeg_feed_refuses_a_frame_over_the_limit_before_decoding(tmp_path, kind):
    for video in range(2):
        write_tagged_store(
            tmp_path / (f"v{video}" + (".h5" if kind == "hdf5" else "")), video, 8, ext=".jpg", by="hand"
        )
    dataset = VideoDataset.from_folder(tmp_path)
    stores = [StoreRef.from_info(info) for info in dataset.infos]
    shape = {"clip_length_frames": 4, "stride_frames": 1, "batch_size": 1}
    feed = ScaledJpegClips(_one_clip, stores, np.array([[96, 64]] * 2), max_pixels=1000, **shape)
    with pytest.raises(RuntimeError) as info:  # 96 x 64 frames decode fine: only the limit refuses them
        feed(SimpleNamespace(iteration=0, idx_in_batch=0))
    where = "000000003.jpg" if kind == "folder" else "frame 3"
    assert str(info.value) == (
        f"{dataset.paths[1]}: {where} is refused: too many pixels: the header declares 96x64 = 6,144 pixels; the "
        "limit is 1,000 (data.max_image_pixels); refused without decoding"
    )
    feed.close()


def _loader(dataset, **loader):
    return ClipLoader(
        dataset,
        train=False,
        video_cfg=VideoConfig(clip_length_frames=4, size_px=[32, 24]),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=1, last_batch="partial", **loader),
        device=CPU,
    )


@pytest.mark.process  # frame stores are read in DALI's worker processes
def test_a_bomb_frame_met_while_loading_is_named_or_skipped(bomb_store):
    folder, where = bomb_store
    dataset = VideoDataset.from_folder(folder)
    with pytest.raises(BadSampleError) as info:
        list(_loader(dataset))
    (path, why), *_ = info.value.problems
    assert path == dataset.paths[1] and f"{where} is refused: {BOMB}" in why
    skipping = _loader(dataset, on_bad_sample="skip")
    list(skipping)
    assert BOMB in skipping.skipped[1]


@pytest.mark.process  # frame stores are read in DALI's worker processes
def test_the_frame_limit_is_the_datasets(tmp_path):
    write_tagged_store(tmp_path / "v0", 0, 12, by="hand")
    dataset = VideoDataset.from_folder(tmp_path, max_pixels=1000)  # 96 x 64 frames: 6,144 pixels each
    report = check_dataset(dataset, "test", progress=False)
    assert [f.reason for f in report.findings if f.kind == "video"] == [
        "000000000.png is refused: too many pixels: the header declares 96x64 = 6,144 pixels; the limit is "
        "1,000 (data.max_image_pixels); refused without decoding"
    ]
    with pytest.raises(BadSampleError, match=r"000000000\.png is refused: too many pixels: .* the limit is 1,000"):
        list(_loader(dataset))


def test_a_16_bit_depth_map_bomb_is_a_bad_pair_even_when_maps_are_scaled(tmp_path):
    for kind in ("rgb", "depth"):
        (tmp_path / kind).mkdir()
    for i in range(2):
        Image.fromarray(np.zeros((48, 64, 3), np.uint8)).save(tmp_path / "rgb" / f"{i}.jpg")
        Image.fromarray(np.ones((24, 32), np.uint16)).save(tmp_path / "depth" / f"{i}.png")
    (tmp_path / "depth" / "1.png").write_bytes(header_png(30000, 30000, bits=16, colour=0))
    dataset = PairedDataset.from_root(tmp_path, scale_maps=True)
    assert dataset.problems == {
        1: f"depth map {tmp_path / 'depth' / '1.png'} (of {tmp_path / 'rgb' / '1.jpg'}): {BOMB} "
        "(data.max_image_pixels); refused without decoding"
    }


# -- served maps -------------------------------------------------------------------------------------


def _spec(task="depth", **kw) -> ModelSpec:
    common = {"name": "unet_resnet18", "size_px": 16, "eval_crop_fraction": 1.0}
    if task == "depth":
        return ModelSpec(task="depth", num_classes=1, depth_scale=0.001, map_fill=0, **common, **kw)
    return ModelSpec(task="segmentation", num_classes=3, map_fill=255, labels=("a", "b", "c"), **common, **kw)


def test_depth_codes_never_write_a_prediction_as_no_data():
    units = np.array([-5.0, 0.0, 0.4, 0.6, 1.6, np.nan, 70000.0, np.inf, -np.inf])
    assert depth_codes(units, 0).tolist() == [1, 1, 1, 1, 2, 0, 65535, 65535, 1]
    assert depth_codes(np.array([65535.0, 90000.0, 3.0]), 65535).tolist() == [65534, 65534, 3]
    assert depth_codes(np.array([99.8, 100.2, 100.0, 7.0]), 100).tolist() == [99, 101, 101, 7]


def test_negative_depth_is_written_as_the_smallest_code_at_both_sizes():
    spec = _spec()
    row = np.full((1, 16, 16), -0.25, np.float32)  # the model says "closer than anything"
    at_model = dense_map(row, spec, (40, 16), "model")
    assert at_model.dtype == np.uint16 and (at_model == 1).all()
    at_input = np.asarray(Image.open(io.BytesIO(dense_png(row, spec, (40, 16), "input"))))
    assert at_input.shape == (16, 40) and (at_input[:, 12:28] == 1).all(), "the window: predictions"
    assert (at_input[:, :12] == 0).all() and (at_input[:, 28:] == 0).all(), "outside it: no data"


def test_map_json_is_exactly_what_json_dumps_writes():
    rng = np.random.default_rng(0)
    for shape, dtype, high in [((3, 4), np.uint16, 65536), ((300, 7), np.uint16, 65536), ((513, 2), np.uint8, 256)]:
        values = rng.integers(0, high, shape).astype(dtype)
        values.flat[0] = high - 1
        assert int_map_json(values) == json.dumps(values.tolist(), separators=(",", ":")).encode()
    assert int_map_json(np.zeros((0, 3), np.uint8)) == b"[]" and int_map_json(np.zeros((2, 0), np.uint8)) == b"[[],[]]"
    assert int_map_json(np.array([[10**12, 0]], np.int64)) == b"[[1000000000000,0]]"
    with pytest.raises(ValueError, match="non-negative"):
        int_map_json(np.array([[-1]]))


@pytest.mark.parametrize("task", ["depth", "segmentation"])
def test_the_json_answer_holds_the_maps_at_the_asked_size(task):
    spec = _spec(task)
    logits = np.random.default_rng(1).normal(0, 1, (2, spec.num_classes, 16, 16)).astype(np.float32)
    sizes = [(40, 16), (16, 30)]
    document = json.loads(dense_json("m", logits, spec, sizes, "input"))
    key = "depth" if task == "depth" else "mask"
    assert [(p["image"], p["width"], p["height"]) for p in document["predictions"]] == [(0, 40, 16), (1, 16, 30)]
    for row, size, prediction in zip(logits, sizes, document["predictions"], strict=True):
        assert prediction[key] == dense_map(row, spec, size, "input").tolist()
    assert document["model"] == "m" and document["task"] == task and document["size"] == "input"


def test_a_json_map_answer_past_the_cap_is_refused_naming_the_ways_out():
    spec = _spec()
    check_json_map_pixels(spec, [(2048, 2048)], "input", 4_194_304)  # at the limit: answered
    with pytest.raises(RequestError, match=r"a JSON answer of 4,194,305 map values \(4194305x1 at"):
        check_json_map_pixels(spec, [(4_194_305, 1)], "input", 4_194_304)  # one past it
    with pytest.raises(RequestError, match=r"4,194,560 map values \(2048x2048 and 1 more at \?size=input\)"):
        check_json_map_pixels(spec, [(2048, 2048), (16, 16)], "input", 4_194_304)  # summed over the images
    check_json_map_pixels(spec, [(7900, 5000)], "model", 4_194_304)  # the model's 16 x 16 maps
    with pytest.raises(RequestError) as info:
        check_json_map_pixels(spec, [(7900, 5000)], "input", 4_194_304)
    assert info.value.status == 400 and info.value.reason == "too_many_pixels"
    assert info.value.message == (
        "a JSON answer of 39,500,000 map values (7900x5000 at ?size=input) is above the limit of 4,194,304 "
        "(serve.max_json_map_pixels); ask for 'Accept: image/png' (a compact PNG map per request) or ?size=model"
    )
