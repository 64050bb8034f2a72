"""``loader.executor``: the DALI executor of the loaders' pipelines, and the readers of each.

``auto`` keeps the static executor on a GPU and the dynamic one on a CPU; ``static`` and ``dynamic``
force one, for an A/B of a GPU run's host time per batch (``pipelines/_executor.py``). On a CPU every
choice runs and gives the same batches (DALI's static executor runs CPU-only pipelines; its outputs
are copied out before DALI reuses their buffers). On a GPU, ``dynamic`` is read by
``StreamOutputs`` (``pipelines/_stream_outputs.py``), whose batches the ``gpu`` tests compare with
the static executor's.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch
from videohelp import write_tagged_store

from gpufeed.config import ConfigError, ImagePipelineConfig, LoaderConfig, VideoConfig, describe_config, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.pipelines import ClipLoader, DenseLoader, ImageLoader, VideoDataset, _stream_outputs
from gpufeed.pipelines._executor import executor_args
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._pipeline_session import HostOutputs
from gpufeed.pipelines._stream_outputs import StreamOutputs, _HeldBatches, host_tensor

pytestmark = pytest.mark.timeout(300)  # a pipeline that hangs fails instead of blocking CI

CPU = DeviceChoice("cpu", None, "test")
GPU = DeviceChoice("gpu", 0, "test")
EXECUTORS = ("auto", "static", "dynamic")


def _images(dataset, device, executor, *, train=True, batch=8, pipelines=1):
    return ImageLoader(
        dataset,
        train=train,
        image_cfg=ImagePipelineConfig(size_px=48),
        loader_cfg=LoaderConfig(
            batch_size=batch, num_threads=2, last_batch="partial", executor=executor, pipelines=pipelines
        ),
        device=device,
        seed=5,
    )


def _tensors(batch) -> dict[str, torch.Tensor]:
    """The batch's tensors, copied to the CPU (the loader's own may be DALI's buffers)."""
    fields = {name: getattr(batch, name) for name in batch.__dataclass_fields__}
    maps = fields.pop("maps", {})
    out = {name: value for name, value in fields.items() if isinstance(value, torch.Tensor)}
    out.update({f"map_{kind}": value for kind, value in maps.items()})
    return {name: value.cpu().clone() for name, value in out.items()}


def _epochs(loader, epochs: int = 1) -> list[dict[str, torch.Tensor]]:
    return [_tensors(batch) for _ in range(epochs) for batch in loader]


def _same(first: list[dict], second: list[dict]) -> bool:
    # exact: the same graph and decoder on one device; only the executor differs
    return len(first) == len(second) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(first, second, strict=True)
    )


def _pipes(loader) -> list:
    """The DALI pipelines of the loader's open session, whichever reader holds them."""
    readers = [loader._session.iterator]
    readers = getattr(readers[0], "iterators", readers)  # loader.pipelines: several in turn
    return [r.pipe if hasattr(r, "pipe") else getattr(r, "iterator", r)._pipes[0] for r in readers]


# -- the option -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", EXECUTORS)
def test_the_option_takes_auto_static_and_dynamic(value):
    assert parse_config(None, [f"loader.executor={value}"]).loader.executor == value
    assert LoaderConfig().executor == "auto", "the default keeps today's choice"
    assert "loader.executor" in {row[0] for row in describe_config()}


def test_a_wrong_value_names_the_key_and_the_allowed_values():
    with pytest.raises(ConfigError) as info:
        parse_config({"loader": {"executor": "fast"}})
    assert info.value.key_path == "loader.executor"
    assert "'loader.executor'" in str(info.value) and "allowed: auto, static, dynamic" in str(info.value)
    with pytest.raises(ValueError, match=r"loader\.executor 'fast' is not allowed; allowed: auto, static, dynamic"):
        executor_args(True, "fast")  # a LoaderConfig made in Python is not parsed


def test_auto_is_static_on_a_gpu_and_dynamic_on_a_cpu():
    assert executor_args(True) == executor_args(True, "auto") == {"exec_dynamic": False}
    assert executor_args(False) == executor_args(False, "auto") == {"exec_dynamic": True}
    for on_gpu in (True, False):
        assert executor_args(on_gpu, "static") == {"exec_dynamic": False}
        assert executor_args(on_gpu, "dynamic") == {"exec_dynamic": True}


def test_a_wrong_choice_is_refused_where_a_pipeline_is_built():
    """A ``LoaderConfig`` made in Python is not parsed: the build names the key."""
    with pytest.raises(ValueError, match=r"loader\.executor 'legacy' is not allowed; allowed: auto, static, dynamic"):
        executor_args(True, "legacy")


# -- the CPU: every executor, the same batches ----------------------------------------------------


def _counting_pipeline(executor: str):
    """A CPU pipeline whose batch k holds rows ``10 k + i`` (and twice that)."""
    from nvidia.dali import fn, pipeline_def, types

    count = iter(range(1, 1000))

    def feed():
        k = next(count)
        return [np.full(3, 10 * k + i, dtype=np.int64) for i in range(4)]

    @pipeline_def(enable_conditionals=False)
    def graph():
        rows = fn.external_source(source=feed, batch=True, dtype=types.INT64, ndim=1)
        return rows, rows * 2

    pipe = graph(batch_size=4, num_threads=2, device_id=None, prefetch_queue_depth=2, **executor_args(False, executor))
    pipe.build()
    return pipe


@pytest.mark.parametrize("executor", ["static", "dynamic"])
def test_the_static_executor_runs_a_cpu_pipeline_and_its_outputs_outlive_the_next_batch(executor):
    pipe = _counting_pipeline(executor)
    assert pipe.exec_dynamic is (executor == "dynamic")
    reader = HostOutputs(pipe, ["rows", "double"])
    batches = [next(reader)[0] for _ in range(5)]  # the static executor reuses its 2 buffers meanwhile
    for k, batch in enumerate(batches, start=1):
        expected = torch.as_tensor([[10 * k + i] * 3 for i in range(4)])
        assert torch.equal(batch["rows"], expected) and torch.equal(batch["double"], expected * 2)


@pytest.mark.parametrize("pipelines", [1, 2])
def test_the_image_loader_gives_the_same_batches_under_every_executor_on_a_cpu(train_set, pipelines):
    runs = {}
    for executor in EXECUTORS:
        loader = _images(train_set, CPU, executor, pipelines=pipelines)
        runs[executor] = _epochs(loader, epochs=2)
        assert {pipe.exec_dynamic for pipe in _pipes(loader)} == {executor != "static"}
    assert len(runs["auto"]) == 2 * len(loader) > 2
    assert _same(runs["static"], runs["auto"]) and _same(runs["dynamic"], runs["auto"]), "exact pixels, ids, labels"


def test_the_dense_loader_gives_the_same_batches_under_every_executor_on_a_cpu(synth_dir):
    pairs = PairedDataset.from_root(synth_dir / "dense" / "train")
    runs = {}
    for executor in EXECUTORS:
        loader_cfg = LoaderConfig(batch_size=4, num_threads=2, last_batch="partial", executor=executor)
        loader = DenseLoader(pairs, train=True, size_px=48, loader_cfg=loader_cfg, device=CPU, seed=2)
        runs[executor] = _epochs(loader)
        assert [pipe.exec_dynamic for pipe in _pipes(loader)] == [executor != "static"]
    assert _same(runs["static"], runs["auto"]) and _same(runs["dynamic"], runs["auto"])


@pytest.fixture(scope="module")
def clip_folders(synth_dir, tmp_path_factory):
    """Videos each clip source reads on a CPU: frame stores, h264 (PyAV), VP9 (DALI's reader)."""
    from gpufeed.pipelines import PrepareOptions, prepare_videos

    root = tmp_path_factory.mktemp("executor_clips")
    for video, frames in enumerate((30, 24)):
        write_tagged_store(root / "stores" / f"mouse_{video}", video, frames, by="hand")
    options = PrepareOptions(codec="vp9", gop_frames=30, probe_clips=0)
    assert prepare_videos(synth_dir / "videos", root / "vp9", options, False).ok
    return {"stores": (root / "stores", "auto"), "h264": (synth_dir / "videos", "pyav"), "vp9": (root / "vp9", "dali")}


@pytest.mark.process  # frame stores and PyAV are read in worker processes, VP9 is prepared by FFmpeg
@pytest.mark.parametrize("source", ["stores", "h264", "vp9"])
def test_the_clip_loaders_source_builds_on_the_loaders_executor(clip_folders, source):
    folder, decoder = clip_folders[source]
    dataset = VideoDataset.from_folder(folder)
    runs = {}
    for executor in EXECUTORS:
        loader = ClipLoader(
            dataset,
            train=True,
            video_cfg=VideoConfig(clip_length_frames=5, size_px=32, decoder=decoder),
            loader_cfg=LoaderConfig(batch_size=4, num_threads=2, last_batch="partial", executor=executor),
            device=CPU,
            seed=3,
        )
        runs[executor] = [_tensors(batch) for batch in itertools.islice(itertools.chain(loader, loader), 6)]
        assert isinstance(loader._session.iterator, HostOutputs)
        assert [pipe.exec_dynamic for pipe in _pipes(loader)] == [executor != "static"]
        loader.close()
    assert len(runs["auto"]) == 6
    assert _same(runs["static"], runs["auto"]) and _same(runs["dynamic"], runs["auto"])


# -- the dynamic reader's parts that run without a GPU --------------------------------------------


def test_a_plain_host_output_reaches_torch_without_a_copy():
    from nvidia.dali.tensors import TensorCPU

    values = np.arange(12, dtype=np.int64).reshape(3, 4)
    dali = TensorCPU(values)
    tensor, copied = host_tensor(dali)
    assert not copied and tensor.data_ptr() == dali.data_ptr() and torch.equal(tensor, torch.as_tensor(values))


class _RefusedPinned:
    """A pinned host tensor whose DALI would not hand it over as plain host memory."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __dlpack_device__(self):
        from nvidia.dali.backend import DLDeviceType

        return (DLDeviceType.kDLCUDAHost, 0)

    def __dlpack__(self, **_kw):
        raise RuntimeError("A CPU DLPack tensor was not handed over")

    def __array__(self, dtype=None, copy=None):
        return self.values


def test_a_pinned_host_output_dali_will_not_hand_over_is_copied():
    values = np.arange(6, dtype=np.int64)
    tensor, copied = host_tensor(_RefusedPinned(values))
    assert copied and torch.equal(tensor, torch.as_tensor(values))
    values[0] = 99
    assert int(tensor[0]) == 0, "a copy, not DALI's buffer"


def test_the_dynamic_reader_refuses_a_cpu_pipeline():
    with pytest.raises(ValueError, match="GPU pipelines of the dynamic executor only"):
        StreamOutputs(_counting_pipeline("dynamic"), ["rows", "double"], torch.device("cpu"))


_WAITED: list = []  # the stand-in events the host waited for


class _Event:
    """A CUDA event stand-in: done once ``done`` is set; ``synchronize`` (a host wait) sets it."""

    def __init__(self, blocking: bool = False) -> None:
        self.done, self.blocking = False, blocking

    def record(self, stream) -> None:
        self.stream = stream

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        _WAITED.append(self)
        self.done = True


def test_handed_over_batches_are_held_until_the_training_stream_is_done_with_them(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    _WAITED.clear()
    held = _HeldBatches()
    held.keep(["batch 0"], "stream A")
    held.mark()  # batch 0's step is queued: held to an event recorded now, on the stream it went out on
    ((event, tensors),) = held.done
    assert tensors == ["batch 0"] and held.last is None
    assert event.stream == "stream A" and event.blocking, "a host wait on it sleeps instead of spinning"
    event.done = True
    held.keep(["batch 1"], "stream B")  # a caller that changed streams between batches
    held.mark()
    assert [tensors for _, tensors in held.done] == [["batch 1"]], "batch 0's step ended: let go, without a wait"
    assert held.done[0][0].stream == "stream B"
    for k in range(2, 2 + _stream_outputs._HELD_BATCHES):
        held.keep([f"batch {k}"], "stream B")
        held.mark()
    assert len(held.done) == _stream_outputs._HELD_BATCHES and len(_WAITED) == 1, "the oldest was waited for"
    held.keep(["last"], "stream B")
    held.drain()
    assert not held.done and held.last is None and len(_WAITED) == 2 + _stream_outputs._HELD_BATCHES


# -- the GPU: dynamic against static ---------------------------------------------------------------


def _stream_readers(loader) -> list:
    inner = loader._session.iterator
    return [r for r in getattr(inner, "iterators", [inner]) if isinstance(r, StreamOutputs)]


@pytest.mark.gpu
@pytest.mark.parametrize(("train", "pipelines"), [(False, 1), (True, 1), (True, 2)])
def test_dynamic_gives_the_static_executors_batches_on_a_gpu(train_set, train, pipelines):
    static = _images(train_set, GPU, "static", train=train, pipelines=pipelines)
    dynamic = _images(train_set, GPU, "dynamic", train=train, pipelines=pipelines)
    first, second = _epochs(static, epochs=2), _epochs(dynamic, epochs=2)
    assert len(_stream_readers(dynamic)) == pipelines and not _stream_readers(static)
    # exact: the same graph and nvJPEG decoder on the same GPU; only the executor reading it differs
    assert _same(first, second)


def _dense_or_clips(kind: str, synth_dir, executor: str):
    loader_cfg = LoaderConfig(batch_size=4, num_threads=2, last_batch="partial", executor=executor)
    if kind == "dense":
        pairs = PairedDataset.from_root(synth_dir / "dense" / "train")
        return DenseLoader(pairs, train=True, size_px=48, loader_cfg=loader_cfg, device=GPU, seed=2)
    videos = VideoDataset.from_folder(synth_dir / "videos")  # h264: NVDEC, DALI's reader
    video_cfg = VideoConfig(clip_length_frames=5, size_px=32, decoder="dali")
    return ClipLoader(videos, train=True, video_cfg=video_cfg, loader_cfg=loader_cfg, device=GPU, seed=3)


@pytest.mark.gpu
@pytest.mark.process  # as tests/test_clip_loader.py: a clip source may read in worker processes
@pytest.mark.parametrize("kind", ["dense", "clips"])
def test_the_dense_and_clip_loaders_give_the_static_executors_batches_under_dynamic(synth_dir, kind):
    runs = {}
    for executor in ("static", "dynamic"):
        loader = _dense_or_clips(kind, synth_dir, executor)
        runs[executor] = [_tensors(batch) for batch in itertools.islice(itertools.chain(loader, loader), 6)]
        assert bool(_stream_readers(loader)) is (executor == "dynamic")
        loader.close()
    # exact: the same graph and decoders (nvJPEG and the maps' CPU decode, or NVDEC) on the same GPU
    assert _same(runs["dynamic"], runs["static"])


@pytest.mark.gpu
def test_dynamic_hands_a_pinned_host_output_over_without_a_copy():
    """torch refuses DALI's pinned host outputs as DLPack ``kDLCUDAHost``; asked for ``kDLCPU``, DALI
    hands the same memory over (``host_tensor``). The loaders' GPU graphs have no host output (see
    ``tests/test_row_checks.py``): this graph has one, pinned because a GPU operator reads it too."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.backend import DLDeviceType

    count = iter(range(1, 1000))

    @pipeline_def(enable_conditionals=False)
    def graph():
        rows = fn.external_source(source=lambda: [np.full(3, next(count), np.int64)] * 4, batch=True,
                                  dtype=types.INT64, ndim=1)  # fmt: skip
        return rows, rows.gpu()

    pipe = graph(batch_size=4, num_threads=2, device_id=0, prefetch_queue_depth=2, **executor_args(True, "dynamic"))
    pipe.build()
    reader = StreamOutputs(pipe, ["rows", "rows_gpu"], torch.device("cuda", 0))
    arrived = []
    plain = reader._tensor

    def recorded(name, tensor):
        arrived.append((name, tensor.__dlpack_device__()[0]))
        return plain(name, tensor)

    reader._tensor = recorded
    batches = [next(reader)[0] for _ in range(3)]
    assert ("rows", DLDeviceType.kDLCUDAHost) in arrived, f"the host output was not pinned: {arrived}"
    assert not reader.copied, f"DALI's host outputs {sorted(reader.copied)} were copied (no kDLCPU DLPack)"
    for k, batch in enumerate(batches, start=1):
        assert not batch["rows"].is_cuda and batch["rows_gpu"].is_cuda
        # exact: integer rows fed in, copied to the GPU unchanged; no decoder involved
        assert torch.equal(batch["rows"], torch.full((4, 3), k)) and torch.equal(batch["rows_gpu"].cpu(), batch["rows"])


@pytest.mark.gpu
def test_dynamic_next_asks_torch_for_no_host_sync(train_set):
    """``set_sync_debug_mode`` sees torch's syncs only: DALI's own host waits (for an iteration's
    operators to be launched, for a pinned output's ready event) are not torch calls and do not trip
    it, so this checks the reader and the loader's batch assembly, not DALI."""
    loader = _images(train_set, GPU, "dynamic", train=True, batch=8)
    batches = iter(loader)
    next(batches)  # built, its queue full
    torch.cuda.set_sync_debug_mode("error")
    try:
        held = [next(batches) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert all(batch.images.is_cuda and batch.images.shape == (8, 3, 48, 48) for batch in held)


@pytest.mark.gpu
@pytest.mark.parametrize("executor", ["static", "dynamic"])
def test_a_step_queued_on_the_training_stream_does_not_hold_the_loader(train_set, executor):
    """The training stream waits for DALI, never the reverse. Static: DALI's copies into torch tensors
    go to a stream of their own (on torch's current stream, behind the step the loop queues ahead,
    they made DALI's decode and resize streams wait for that step). Dynamic: nothing is copied, and
    ``share_outputs(cuda_stream=...)`` makes the training stream wait for DALI's work."""
    loader = _images(train_set, GPU, executor, train=True, batch=8)
    batches = iter(loader)
    for _ in range(4):  # built, its queue full
        next(batches)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9))  # about a second of GPU time on the training stream: a long step
    waits = []
    # Past the batches in the queue (DALI decodes these after the sleep was queued), and no further:
    # past _HELD_BATCHES the dynamic reader waits for the oldest step, as it should.
    for _ in range(_stream_outputs._HELD_BATCHES):
        start = time.perf_counter()
        batch = next(batches)
        waits.append(time.perf_counter() - start)
    assert max(waits) < 0.3, f"a batch waited for the step on the training stream: {waits}"
    torch.cuda.synchronize()
    assert batch.images.is_cuda and batch.images.shape[0] == 8


@pytest.mark.gpu
def test_a_batch_read_after_later_batches_were_taken_still_holds_its_pixels(val_set):
    """DALI frees a batch's buffer on its own stream when the last reference goes: the reader holds it
    until the training stream has read it, however far the host has run ahead."""
    reference = [int(b["images"].sum(dtype=torch.int64)) for b in _epochs(_images(val_set, GPU, "static", train=False))]
    loader = _images(val_set, GPU, "dynamic", train=False, batch=8)
    batches = iter(loader)
    next(batches)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(1e9))  # the sums below run after DALI has decoded the batches that follow
    sums = [next(batches).images.sum(dtype=torch.int64) for _ in range(len(reference) - 1)]
    torch.cuda.synchronize()
    # exact: integer sums of the same nvJPEG decoder's pixels, the static executor's and the dynamic's
    assert torch.equal(torch.stack(sums).cpu(), torch.as_tensor(reference[1:]))
