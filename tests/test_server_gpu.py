"""The GPU serving path: nvJPEG decode into a CUDA batch, onnxruntime CUDA provider with IOBinding.

Needs CUDA and DALI's GPU operators (skipped otherwise; failing under GPUFEED_REQUIRE_GPU=1). The
tests that start a server are in the ``live`` tier, as the unit-tier guard requires of any server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from _serving import CLIP_MODEL, IMAGE_MODEL, exported_dense_repo, exported_repo

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ImageDataset
from gpufeed.server import ServerStartError, start_server
from gpufeed.server._runtime import RuntimeSetupError

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

GPU = DeviceChoice("gpu", 0, "test")
CPU = DeviceChoice("cpu", None, "test")


def _serve(device, provider="auto", workers=2):
    serve = {"max_delay_ms": 5, "warmup_batches": 1, "execution_provider": provider, "workers_per_model": workers}
    cfg = parse_config({"serve": serve})
    return start_server(repo=exported_repo(), cfg=cfg, port=0, device=device)


def _logits(server, model, tensor):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    return client.infer(model, [tensor]).as_numpy("logits")


def _images(synth_dir, count=6):
    val = ImageDataset.from_list(synth_dir / "images" / "val.txt")
    blobs = [Path(p).read_bytes() for p in val.paths[:count]]
    return triton.InferInput("image", [len(blobs)], "BYTES").set_data_from_numpy(np.array(blobs, dtype=object))


@pytest.mark.live
def test_gpu_server_decodes_on_the_device_and_agrees_with_the_cpu_server(synth_dir):
    gpu, cpu = _serve(GPU), _serve(CPU)
    try:
        where = gpu.state.models[IMAGE_MODEL].describe()
        assert where["providers"][0] == "CUDAExecutionProvider"
        assert where["decode"] == "DALI nvJPEG (mixed) on cuda:0"
        assert where["input_buffer"] == "cuda:0", "the batch stays on the device into onnxruntime (IOBinding)"
        images = _images(synth_dir)
        on_gpu, on_cpu = _logits(gpu, IMAGE_MODEL, images), _logits(cpu, IMAGE_MODEL, images)
        # nvJPEG and libjpeg-turbo may differ by a level or two per pixel; logits stay close.
        np.testing.assert_allclose(on_gpu, on_cpu, atol=5e-3)
        clips = np.random.default_rng(0).integers(0, 256, (3, 3, 4, 32, 32), dtype=np.uint8)
        tensor = triton.InferInput("pixels", list(clips.shape), "UINT8").set_data_from_numpy(clips)
        np.testing.assert_allclose(_logits(gpu, CLIP_MODEL, tensor), _logits(cpu, CLIP_MODEL, tensor), atol=1e-3)
    finally:
        gpu.stop()
        cpu.stop()


@pytest.mark.live
def test_tensorrt_provider_by_option_serves_or_says_why(synth_dir):
    try:
        server = _serve(GPU, "tensorrt")
    except ServerStartError as err:  # TensorRT libraries may be absent: the refusal must say so
        assert isinstance(err.__cause__, RuntimeSetupError) and "TensorrtExecutionProvider" in str(err)
        return
    try:
        assert server.state.models[IMAGE_MODEL].runner.providers[0] == "TensorrtExecutionProvider"
        assert _logits(server, IMAGE_MODEL, _images(synth_dir)).shape == (6, 4)
    finally:
        server.stop()


def test_cuda_runner_binds_every_batch_size_and_agrees_with_the_cpu_runner():
    """One CUDA session per batch size, fed the first n rows of one device buffer through IOBinding."""
    import torch

    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner

    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    gpu, cpu = OnnxRunner(model_dir, card, GPU), OnnxRunner(model_dir, card, CPU)
    assert gpu.on_gpu and sorted(gpu.sessions) == list(card.batch_sizes)
    assert {s.get_providers()[0] for s in gpu.sessions.values()} == {"CUDAExecutionProvider"}
    rows = np.random.default_rng(1).integers(0, 256, (card.batch_size, *card.sample_shape), dtype=np.uint8)
    batch = gpu.new_batch()
    assert batch.is_cuda and tuple(batch.shape) == card.input_shape
    for n in card.batch_sizes:
        batch[:n].copy_(torch.from_numpy(rows[:n]))
        got = gpu.run(batch[:n])
        assert got.shape == (n, card.spec.num_classes) and got.dtype == np.float32
        np.testing.assert_allclose(got, cpu.run(rows[:n].copy()), atol=1e-3, err_msg=f"batch size {n}")
    gpu._local.bound[1][1].fill_(float("nan"))  # its binding, reused: an output left unwritten shows
    np.testing.assert_allclose(gpu.run(batch[:1]), cpu.run(rows[:1].copy()), atol=1e-3)
    with pytest.raises(ValueError, match=r"a batch of 3 rows: this model runs batches of \[1, 2, 4\]"):
        gpu.run(batch[:3])


def test_a_cuda_run_waits_for_its_own_streams_only_and_returns_whole_outputs():
    """onnxruntime drains the streams a run used before ``Run`` returns; nothing waits for the device.

    ``IOBinding.synchronize_outputs`` was a ``cudaDeviceSynchronize`` holding Python's lock: each
    served batch waited for the other lane's decode and model. Without it the output must still be
    whole (onnxruntime's run-end flush of its own streams), and the run must not wait for a second
    of work queued on another stream.
    """
    import torch

    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner

    model_dir = exported_repo() / IMAGE_MODEL
    card = read_model_card(model_dir)
    gpu = OnnxRunner(model_dir, card, GPU)
    n = card.batch_sizes[-1]
    rows = np.random.default_rng(3).integers(0, 256, (n, *card.sample_shape), dtype=np.uint8)
    batch = gpu.new_batch()
    batch[:n].copy_(torch.from_numpy(rows))
    torch.cuda.synchronize()
    want = gpu.run(batch[:n])  # also the binding's first use
    # The output buffer is the thread's, reused: NaN in it now, so that an output read before the
    # run wrote it cannot pass for whole.
    gpu._local.bound[n][1].fill_(float("nan"))
    torch.cuda.synchronize()
    other, lane = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(other):  # another lane's work
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on an H100 (cycles)
        busy = torch.cuda.Event()
        busy.record(other)
    with torch.cuda.stream(lane):
        got = gpu.run(batch[:n])
    held = busy.query()
    other.synchronize()
    assert not held, "the run waited for another stream's work (a device-wide synchronize)"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # unfinished, it would hold NaN


@pytest.mark.parametrize("model", ["depth", "seg"])
def test_cuda_runner_serves_a_dense_models_maps_like_the_cpu_runner(model):
    """A dense graph's (n, C, H, W) maps, bound on the device at every batch size (a (n, C) buffer is refused)."""
    import torch

    from gpufeed.models import read_model_card
    from gpufeed.server._runtime import OnnxRunner

    model_dir = exported_dense_repo() / model
    card = read_model_card(model_dir)
    gpu, cpu = OnnxRunner(model_dir, card, GPU), OnnxRunner(model_dir, card, CPU)
    assert gpu.on_gpu
    rows = np.random.default_rng(2).integers(0, 256, (card.batch_size, *card.sample_shape), dtype=np.uint8)
    batch = gpu.new_batch()
    for n in card.batch_sizes:
        batch[:n].copy_(torch.from_numpy(rows[:n]))
        got = gpu.run(batch[:n])
        assert got.shape == card.spec.output_shape(n) and got.dtype == np.float32
        np.testing.assert_allclose(got, cpu.run(rows[:n].copy()), rtol=1e-3, atol=1e-3, err_msg=f"batch size {n}")


@pytest.mark.live
def test_parallel_requests_run_on_separate_lane_streams_with_tf32_off(synth_dir):
    """Each lane has its own CUDA stream (not torch's legacy default one); parallel requests agree with serial ones."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    server = _serve(GPU, workers=2)
    try:
        model = server.state.models[IMAGE_MODEL]
        lanes = [model._lanes.get() for _ in range(model.workers)]
        for lane in lanes:
            model._lanes.put(lane)
        streams = {lane.stream.cuda_stream for lane in lanes}
        assert len(streams) == 2 and torch.cuda.default_stream().cuda_stream not in streams
        options = model.runner.sessions[model.batch_sizes[-1]].get_provider_options()["CUDAExecutionProvider"]
        assert options["use_tf32"] == "0", "TF32 off, as export's parity check runs"
        images = _images(synth_dir)
        serial = _logits(server, IMAGE_MODEL, images)
        with ThreadPoolExecutor(8) as pool:
            parallel = list(pool.map(lambda _: _logits(server, IMAGE_MODEL, images), range(16)))
        for got in parallel:
            np.testing.assert_allclose(got, serial, atol=1e-5)
    finally:
        server.stop()
