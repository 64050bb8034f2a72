"""nvJPEG's options: buffers sized for a true percentile image, and one set of options for evaluation and serving.

The buffer size follows the image at the 99th percentile of pixel count: the order statistic
``floor(p (n - 1))``, so a small set's outlier never sizes every thread's buffers (a nearest-rank
``ceil(p n)`` picks the largest image of any set of up to 100).

Evaluation and serving take their ``mixed`` decoder's options from one function,
``eval_decoder_options``; the graphs are read here on the CPU, defined for ``device_id=0`` but not
built (``tests/dali_graph.py``), and their image decoders compared argument for argument. The
``gpu`` twin decodes on the GPU and checks that a served image equals evaluation's bit for bit
whatever its place in a batch; the server's decoder primes the hardware decoder's quota wherever
DALI would use that decoder (read on the CPU with a stand-in pipeline).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _serving import IMAGE_MODEL, exported_repo
from dali_graph import image_decoders

from gpufeed.config import ImagePipelineConfig, LoaderConfig, SizePx, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.pipelines._dense_loader import DenseLoader
from gpufeed.pipelines._image_pipeline import eval_decoder_options, gpu_decoder_options, percentile_pick
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._sampler import PlanStream
from gpufeed.server._preprocess import serve_pipeline
from gpufeed.server._repo import load_repository
from gpufeed.server._state import ServingState
from gpufeed.synth._pairs import write_paired_split

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")


@pytest.mark.parametrize("count", [2, 5, 41, 100])
def test_one_outlier_never_sizes_the_buffers_of_a_small_set(count):
    pixels = np.array([320 * 240] * (count - 1) + [7296 * 5472])
    assert pixels[percentile_pick(pixels)] == 320 * 240, f"{count} images, one of them 40 MP"
    rolled = np.roll(pixels, 1)  # wherever the outlier sits
    assert rolled[percentile_pick(rolled)] == 320 * 240


def test_the_pick_is_numpys_lower_percentile_of_the_data():
    rng = np.random.default_rng(0)
    for count in (1, 2, 3, 7, 99, 100, 101, 250, 1000):
        pixels = rng.integers(1, 10_000, count)
        for q in (0.0, 50.0, 95.0, 99.0, 100.0):
            got = pixels[percentile_pick(pixels, q)]
            assert got == np.percentile(pixels, q, method="lower"), (count, q)
    assert percentile_pick([5]) == 0, "one image: that one"
    assert percentile_pick([1, 9, 2], 100.0) == 1, "the 100th percentile is the largest"
    with pytest.raises(ValueError, match="no images"):
        percentile_pick([])
    with pytest.raises(ValueError, match=r"percentile 101 is outside \[0, 100\]"):
        percentile_pick([1], 101)


def test_buffers_of_a_41_image_set_follow_its_small_images():
    """The GPU test's set (40 small JPEGs and a 40 MP one): sized for the small ones."""
    sizes = np.array([(320, 240)] * 40 + [(7296, 5472)])
    options, reserved = gpu_decoder_options(sizes, 0.9, train=True, num_threads=16)
    assert (options["preallocate_width_hint"], options["preallocate_height_hint"]) == (320, 240)
    assert options["device_memory_padding"] == 16 << 20, "DALI's default: the small image needs less"
    assert "sized for the 99th-percentile image, 320x240 (largest: 39.9 MP)" in reserved


@pytest.mark.parametrize(("share", "routed"), [(0.9, 1.0), (0.5, 1.0), (1.0, 1.0), (0.0, 0.0)])
def test_evaluation_routes_every_jpeg_one_way(share, routed):
    """A share between 0 and 1 sends an image to either decoder by its place in the batch: all or nothing."""
    assert eval_decoder_options(share) == {"hw_decoder_load": routed, "affine": False}
    options, reserved = gpu_decoder_options(np.ones((3, 2)), share, train=False)
    assert options == eval_decoder_options(share) and "DALI's defaults (evaluation)" in reserved
    train, _ = gpu_decoder_options(np.full((3, 2), 64), share, train=True)
    assert train["hw_decoder_load"] == share, "training keeps the share it is given"


def _eval_loader(synth_dir, share, device=GPU):
    return ImageLoader(
        ImageDataset.from_list(synth_dir / "images" / "val.txt"),
        train=False,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=4, num_threads=2, hw_decoder_load=share),
        device=device,
    )


@pytest.mark.parametrize("share", [0.9, 0.0])
def test_the_server_and_the_eval_loader_build_one_decoder_with_the_same_options(synth_dir, share):
    """Both GPU graphs, traced on the CPU: one nvJPEG decoder each, argument for argument the same."""
    cfg = parse_config({"loader": {"hw_decoder_load": share}})
    state = ServingState.from_config(load_repository(exported_repo()), cfg, GPU)
    assert state.decoder_options == eval_decoder_options(share)
    loader = _eval_loader(synth_dir, share)
    assert loader._decoder_options() == state.decoder_options, "the same function's answer"
    loader_pipe, _ = loader._pipeline(PlanStream(loader._spec(), 0, 0), build=False)
    serve_pipe = serve_pipeline(SizePx(48, 48), 4, 0, 2, state.decoder_options)
    (evaluation,) = image_decoders(loader_pipe)
    (serving,) = image_decoders(serve_pipe)
    assert evaluation.schema == serving.schema == "decoders__ImageSlice"
    assert evaluation.device == serving.device == "mixed"
    assert evaluation.args == serving.args
    assert serving.args["hw_decoder_load"] == (1.0 if share else 0.0) and serving.args["affine"] is False


@pytest.mark.parametrize("train", [True, False])
def test_the_dense_loader_decodes_its_rgb_as_the_image_loader_does(tmp_path, train):
    """The dense GPU graph, traced on the CPU: the configured share in training, the server's all or
    nothing in evaluation, unpinned threads and nvJPEG's buffers sized for the data (DALI's 0.65 and
    pinned threads before)."""
    dataset = PairedDataset.from_root(write_paired_split(tmp_path / "train", 6, 96, 72, seed=3))
    share = 0.7
    loader = DenseLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=2, num_threads=2, hw_decoder_load=share),
        device=GPU,
    )
    pipe, _ = loader._pipeline(PlanStream(loader._spec(), 0, 0), build=False)
    # The RGB's decoder; the maps' PNGs decode on the CPU, where these arguments do not exist.
    (decoder,) = [op for op in image_decoders(pipe) if op.device == "mixed"]
    want, _ = gpu_decoder_options(np.asarray(dataset.sizes), share, train=train, num_threads=2)
    assert decoder.args == {**decoder.args, **want}
    assert decoder.args["hw_decoder_load"] == (share if train else 1.0) and decoder.args["affine"] is False


def test_the_served_models_decoders_take_the_configs_options():
    """A real server state on the CPU: every decoder of every lane holds the evaluation options."""
    cfg = parse_config({"device": "cpu", "loader": {"hw_decoder_load": 0.0}, "serve": {"warmup_batches": 1}})
    state = ServingState.from_config(load_repository(exported_repo()), cfg, CPU)
    state.load()
    try:
        assert state.load_error is None
        model = state.models[IMAGE_MODEL]
        lanes = [model._lanes.get() for _ in range(model.workers)]
        for lane in lanes:
            model._lanes.put(lane)
        decoders = [lane.decoder for lane in lanes] + [d for d in [model._decoder_alone] if d is not None]
        assert decoders and all(d.gpu_options == eval_decoder_options(0.0) for d in decoders)
    finally:
        state.close(drain=False)


def _evaluation_batch_and_serving_options(synth_dir):
    """(the validation set, evaluation's first batch of 16 on the GPU at 48 px, the server's decoder options)."""
    dataset = ImageDataset.from_list(synth_dir / "images" / "val.txt")
    loader = ImageLoader(
        dataset,
        train=False,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(batch_size=16, num_threads=2, hw_decoder_load=0.9),
        device=GPU,
    )
    batch = next(iter(loader))
    state = ServingState.from_config(load_repository(exported_repo()), parse_config({}), GPU)
    return loader.dataset, batch, state.decoder_options


@pytest.mark.gpu
def test_a_served_image_equals_evaluation_bit_for_bit_wherever_it_sits_in_a_batch(synth_dir):
    """Evaluation decodes batches of 16, the server one image at a time: the same pixels on an A100/H100.

    With a hardware-decoder share between 0 and 1, the last images of an evaluation batch went to
    nvJPEG's CUDA decoder and the same images alone to the hardware decoder.
    """
    import torch

    from gpufeed.server._preprocess import ImageDecoder

    dataset, batch, options = _evaluation_batch_and_serving_options(synth_dir)
    decoder = ImageDecoder(SizePx(48, 48), 0.875, 1, 0, 2, options)
    for k, path in enumerate(dataset.paths[:16]):
        blob = Path(path).read_bytes()
        out = torch.zeros((1, 3, 48, 48), dtype=torch.uint8, device="cuda")
        assert decoder.decode_into([blob], np.array([dataset.sizes[k]]), out) == [None]
        # exact: one decoder for every JPEG (eval_decoder_options), one device
        assert torch.equal(out[0].cpu(), batch.images[k].cpu()), f"image {k} of the evaluation batch"


# A served batch well above nvImageCodec's hardware mini-batch (engines x cores per engine, to which it
# rounds the quota up; an H100 or H200 has 7 engines): unprimed, the quota a first batch of one sets
# would take at most that many of them, so the rest would show nvJPEG's CUDA decoder's pixels.
_SERVED_ROWS = 256


@pytest.mark.gpu
def test_a_served_batch_takes_the_hardware_decoder_for_every_image_after_a_small_first_batch(synth_dir):
    """nvImageCodec fixes the hardware decoder's quota at its first batch; the server's is a warm-up of one.

    Without the decoder's priming full batch (server/_preprocess.py), images past the quota went to
    nvJPEG's CUDA decoder and differed from evaluation by a level. The quota is rounded up to the
    hardware mini-batch, which may reach 16 or more, so a batch of 16 passed unprimed too: the
    served batch is the 16 images 16 times over, 256 rows.
    """
    import torch

    from gpufeed.server._preprocess import ImageDecoder

    dataset, batch, options = _evaluation_batch_and_serving_options(synth_dir)
    decoder = ImageDecoder(SizePx(48, 48), 0.875, _SERVED_ROWS, 0, 2, options)
    blobs = [Path(p).read_bytes() for p in dataset.paths[:16]]
    sizes = np.array(dataset.sizes[:16])
    first = torch.zeros((1, 3, 48, 48), dtype=torch.uint8, device="cuda")
    assert decoder.decode_into(blobs[:1], sizes[:1], first) == [None]  # as the server's warm-up starts
    images = [row % 16 for row in range(_SERVED_ROWS)]  # row r holds image r mod 16 of the evaluation batch
    out = torch.zeros((_SERVED_ROWS, 3, 48, 48), dtype=torch.uint8, device="cuda")
    assert decoder.decode_into([blobs[k] for k in images], sizes[images], out) == [None] * _SERVED_ROWS
    for row, k in enumerate(images):
        # exact: one decoder for every JPEG in both (eval_decoder_options and the priming batch), one device
        assert torch.equal(out[row].cpu(), batch.images[k].cpu()), f"row {row} (image {k}) of {_SERVED_ROWS}"


class _Unbuilt:
    """A pipeline that builds, and is never run: the priming is recorded instead."""

    def build(self) -> None:
        pass


@pytest.mark.parametrize(
    ("device_id", "options", "primed"),
    [
        (0, {"affine": False}, True),  # no share given: DALI's own, 0.9, takes the hardware decoder
        (0, {"hw_decoder_load": 1.0, "affine": False}, True),
        (0, {"hw_decoder_load": 0.0, "affine": False}, False),
        (None, {"affine": False}, False),  # the CPU: no hardware decoder
    ],
)
def test_a_decoder_is_primed_wherever_dali_would_use_the_hardware_decoder(monkeypatch, device_id, options, primed):
    """The priming batch (see the GPU test above) runs for options without ``hw_decoder_load`` too."""
    from gpufeed.server import _preprocess

    warmups: list[int] = []
    monkeypatch.setattr(_preprocess, "serve_pipeline", lambda *args: _Unbuilt())
    monkeypatch.setattr(_preprocess.ImageDecoder, "_decode_warmup", lambda self, n, pipe=None: warmups.append(n))
    _preprocess.ImageDecoder(SizePx(48, 48), 0.875, 8, device_id, 2, options)
    assert warmups == ([8] if primed else [])
