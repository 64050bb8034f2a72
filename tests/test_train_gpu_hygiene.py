"""Evaluation without host waits, and the clip stem fed in its weights' layout.

Evaluation used to wait for the GPU two or three times per batch: boolean-mask indexing (its
output's size is the number of real rows), ``bincount`` (it reads its input's min and max back),
a count built from a host value (``torch.tensor(float(n), device=...)``, a blocking copy), the
metric's host zeros copied over on the first batch, and the segmentation masks' check read per
batch (``int(fault)``). The metrics now weigh padding rows out on the device, and the masks' check
is kept there and read once, after the last batch.

On the CPU, the ``meta`` device stands in for a GPU: an op that would read the device back
(``aten._local_scalar_dense``, a data-shaped op) or copy host data onto it (a CPU tensor in, a meta
tensor out; ``torch.tensor(..., device=...)``) shows up as a dispatched call. The metrics' values
on padded batches are checked in ``test_train_eval_padding.py``. The ``gpu`` twin runs an
evaluation batch under ``torch.cuda.set_sync_debug_mode("error")``.

``clip_resnet18`` stacks a clip's frames as channels; under ``train.channels_last`` its stem's
weight is channels_last and the stacked input now is too (cuDNN transposed an NCHW one every
forward), with the same outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from gpufeed.core import SizePx
from gpufeed.models import create_model
from gpufeed.train._dense import DepthMetrics, DepthTask, SegmentationMetrics, SegmentationTask
from gpufeed.train._loop import _TargetFaults
from gpufeed.train._tasks import Accuracy, ImageTask, MultiLabelF1, to_channels_last

pytestmark = pytest.mark.timeout(120)

aten = torch.ops.aten
_DATA_SHAPED = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.bincount.default,
}
_FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}
META = torch.device("meta")


@dataclass(frozen=True)
class DenseBatch:
    """The DenseBatch fields evaluation reads."""

    images: torch.Tensor
    maps: dict[str, torch.Tensor]
    sample_ids: torch.Tensor
    valid: torch.Tensor


class _DeviceWaits(TorchDispatchMode):
    """Ops on ``meta`` tensors that would make the host wait for a GPU.

    A read back or a data-shaped op fails at once; host-to-device copies are collected in ``waits``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        on_device = any(t.device.type == "meta" for t in tensors)
        # Stopped here, not run: meta cannot give a value or a data-dependent shape anyway.
        if func is aten._local_scalar_dense.default and on_device:
            raise AssertionError(f"a read back to the host: {func}")
        if func in _DATA_SHAPED or (
            func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        ):
            raise AssertionError(f"an op whose output's shape depends on the data: {func}")
        out = func(*args, **kwargs)
        # A 0-d host tensor beside device ones is a kernel argument (a wrapped scalar), not a copy.
        host_in = any(t.device.type == "cpu" and t.dim() > 0 for t in tensors)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if host_in and any(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in outs):
            self.waits.append(f"host-to-device copy: {func}")
        return out


class _HostData(TorchFunctionMode):
    """Device tensors made from host data (``torch.tensor(x, device=...)``: on CUDA a blocking copy)."""

    def __init__(self, waits: list[str]) -> None:
        super().__init__()
        self.waits = waits

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _FROM_HOST_DATA and isinstance(out, torch.Tensor) and out.device.type == "meta":
            self.waits.append(f"made from host data: {getattr(func, '__name__', func)}")
        return out


def _device_waits(fn) -> list[str]:
    waits = _DeviceWaits()
    with waits, _HostData(waits.waits):
        fn()
    return waits.waits


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- no host waits ----------------------------------------------------------------------------------


def _meta(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


def _dense_batch(n: int, device=META) -> DenseBatch:
    return DenseBatch(
        images=torch.empty(n, 3, 8, 8, dtype=torch.uint8, device=device),
        maps={"mask": torch.empty(n, 8, 8, dtype=torch.uint8, device=device)},
        sample_ids=torch.empty(n, dtype=torch.int64, device=device),
        valid=torch.empty(n, dtype=torch.bool, device=device),
    )


def _evaluation_updates() -> dict:
    """Per evaluation step, (its state, one batch's update of it) on meta tensors."""
    n, valid = 6, _meta(6, dtype=torch.bool)
    segmentation = SegmentationTask(4)
    return {
        "image accuracy": (Accuracy(), lambda m: m.update(_meta(n, 10), _meta(n, dtype=torch.int64), valid)),
        "clip F1": (MultiLabelF1(5), lambda m: m.update(_meta(n, 5), _meta(n, 5), valid)),
        "segmentation": (
            SegmentationMetrics(segmentation),
            lambda m: m.update(_meta(n, 4, 8, 8), segmentation.targets(_dense_batch(n)), valid),
        ),
        "depth": (
            DepthMetrics(DepthTask()),
            lambda m: m.update(_meta(n, 1, 8, 8), _meta(n, 8, 8, dtype=torch.int64), valid),
        ),
        "masks' check": (_TargetFaults(segmentation), lambda faults: faults.add(_dense_batch(n))),
    }


@pytest.mark.parametrize("name", list(_evaluation_updates()))
def test_an_evaluation_batch_makes_no_host_wait(name):
    state, update = _evaluation_updates()[name]
    # The first batch too: a metric's sums start on the host.
    for batch in range(2):
        assert _device_waits(lambda: update(state)) == [], f"batch {batch}"


# -- the masks' check, read after the last batch ------------------------------------------------------


def _mask_batch(first_id: int, bad: dict[int, int]) -> DenseBatch:
    masks = torch.randint(0, 4, (3, 8, 8), generator=_generator(first_id)).to(torch.uint8)
    masks[:, 0, 0] = 255  # the ignore id is no fault
    for row, mask_id in bad.items():
        masks[row, 2, 3] = mask_id
    return DenseBatch(
        images=torch.zeros(3, 3, 8, 8, dtype=torch.uint8),
        maps={"mask": masks},
        sample_ids=torch.arange(first_id, first_id + 3),
        valid=torch.ones(3, dtype=torch.bool),
    )


def test_the_first_batch_with_a_mask_id_past_the_classes_is_named_after_the_last_batch():
    faults = _TargetFaults(SegmentationTask(4))
    faults.add(_mask_batch(10, {}))
    faults.add(_mask_batch(20, {0: 7, 2: 9}))  # the batch's largest such id, its two rows
    faults.add(_mask_batch(30, {1: 12}))
    faults.add(_mask_batch(40, {}))
    with pytest.raises(ValueError, match=r"^mask id 9 in the masks of samples \[20, 22\] is outside the 4 classes"):
        faults.check()


def test_batches_without_a_fault_pass_the_check():
    faults = _TargetFaults(SegmentationTask(4))
    for first in (10, 20):
        faults.add(_mask_batch(first, {}))
    faults.check()
    image = _TargetFaults(ImageTask(3))
    image.add(_mask_batch(10, {}))  # a task whose targets can always be used keeps nothing
    image.check()


class _RefusingTask(ImageTask):
    """A task whose batch-level check refuses a label of 9 (no per-row check of its own)."""

    def targets(self, batch) -> torch.Tensor:
        return batch.labels

    def target_fault(self, batch) -> torch.Tensor:
        return torch.where((batch.labels == 9).any(), 9, -1)


@dataclass(frozen=True)
class _LabelBatch:
    labels: torch.Tensor
    sample_ids: torch.Tensor


def test_a_task_with_a_batch_check_only_is_named_by_its_whole_batch():
    faults = _TargetFaults(_RefusingTask(10))
    faults.add(_LabelBatch(torch.tensor([1, 2]), torch.tensor([0, 1])))
    faults.add(_LabelBatch(torch.tensor([9, 2, 3]), torch.tensor([2, 3, 4])))
    with pytest.raises(ValueError, match=r"^the targets of the batch of samples \[2, 3, 4\] cannot be trained on"):
        faults.check()


@pytest.mark.process
def test_a_validation_mask_past_the_classes_stops_the_run_naming_its_file(tmp_path):
    """The whole run (its metrics endpoint listens): the error names the validation split's mask file."""
    import numpy as np
    from PIL import Image

    from gpufeed.config import parse_config
    from gpufeed.synth import write_paired_split
    from gpufeed.train import train
    from gpufeed.train._errors import TrainError

    split = write_paired_split(tmp_path / "train", 4, 48, 32, seed=0, kinds=("mask",))
    val = write_paired_split(tmp_path / "val", 4, 48, 32, seed=1, kinds=("mask",))
    path = val / "mask" / "000002.png"
    mask = np.array(Image.open(path))
    mask[14:18, 22:26] = 9  # the centre: evaluation's centre crop keeps it
    Image.fromarray(mask).save(path)
    cfg = parse_config(
        {
            "device": "cpu",
            "data": {"train": {"root": str(split)}, "val": {"root": str(val)}},
            "image": {"size_px": 32, "crop_area": [1.0, 1.0]},
            "loader": {"batch_size": 2, "num_threads": 2},
            "model": {"name": "unet_resnet18", "num_classes": 8},
            "train": {"epochs": 1, "progress": False},
            "augment": {"ops": []},
            "telemetry": {"metrics_port": 0},
        }
    )
    with pytest.raises(TrainError) as err:
        train(cfg, tmp_path / "run")
    assert str(err.value).startswith(f"mask id 9 in {path} (the validation split) is outside the 8 classes 0..7")


# -- the clip stem's layout ---------------------------------------------------------------------------


def _clip_model(channels_last: bool):
    torch.manual_seed(0)
    model = create_model("clip_resnet18", num_classes=5, clip_length_frames=4, size_px=SizePx(32, 32)).eval()
    return to_channels_last(model) if channels_last else model


def _stem_input_layout(model, clip: torch.Tensor) -> tuple[torch.Tensor, torch.memory_format]:
    """(the model's output on ``clip``, the memory format its stem convolution was fed)."""
    seen: list[torch.Tensor] = []
    stem = model.backbone.trunk.stem[0]
    handle = stem.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0]))
    try:
        with torch.no_grad():
            out = model(clip)
    finally:
        handle.remove()
    fed = seen[0]
    layout = torch.channels_last if not fed.is_contiguous() else torch.contiguous_format
    assert fed.is_contiguous(memory_format=layout)
    return out, layout


@pytest.mark.parametrize("clip_layout", [torch.channels_last_3d, torch.contiguous_format])
@pytest.mark.parametrize("channels_last", [True, False])
def test_the_clip_stem_is_fed_its_weights_layout_with_the_same_outputs(channels_last, clip_layout):
    model = _clip_model(channels_last)
    clip = torch.randint(0, 256, (2, 3, 4, 32, 32), dtype=torch.uint8, generator=_generator(8))
    clip = clip.contiguous(memory_format=clip_layout)  # the loader's clips are channels_last_3d
    out, fed = _stem_input_layout(model, clip)
    weight = model.backbone.trunk.stem[0].weight
    assert weight.is_contiguous(memory_format=fed) and weight.is_contiguous() != channels_last
    # What the stem was fed before: frames stacked by reshape, an NCHW tensor whatever the weights.
    with torch.no_grad():
        stacked = model.normalize(clip).reshape(2, 12, 32, 32)
        before = model.backbone.trunk(stacked)
    torch.testing.assert_close(out, before, rtol=1e-5, atol=1e-5)


def test_a_channels_last_clip_model_trains_through_the_stacking():
    model = _clip_model(True).train()
    clip = torch.randint(0, 256, (2, 3, 4, 32, 32), dtype=torch.uint8).contiguous(memory_format=torch.channels_last_3d)
    F.binary_cross_entropy_with_logits(model(clip), torch.ones(2, 5)).backward()
    stem = model.backbone.trunk.stem[0].weight
    assert stem.grad is not None and torch.isfinite(stem.grad).all()


# -- gpu ----------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_an_evaluation_batch_never_synchronises_on_a_gpu():
    from gpufeed.config import AugmentConfig, TrainConfig
    from gpufeed.train._augment import build_augmenter
    from gpufeed.train._optim import build_optimizer, build_scheduler
    from gpufeed.train._step import Stepper

    torch.manual_seed(0)
    task = SegmentationTask(4)
    model = create_model("unet_resnet18", task="segmentation", num_classes=4, size_px=(32, 32)).cuda().eval()
    optimizer = build_optimizer(model, TrainConfig())
    stepper = Stepper(
        model,
        task,
        optimizer,
        build_scheduler(optimizer, 10, TrainConfig()),
        build_augmenter(AugmentConfig(ops=[])),
        torch.amp.GradScaler("cuda", enabled=False),
        amp_dtype=torch.bfloat16,
        memory_format=torch.channels_last,
        on_gpu=True,
    )
    masks = torch.randint(0, 4, (4, 32, 32), dtype=torch.uint8)
    masks[3, 0, 0] = 7  # a mask id past the classes: found after the last batch, not per batch
    batch = DenseBatch(
        images=torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8).cuda(),
        maps={"mask": masks.cuda()},
        sample_ids=torch.arange(10, 14).cuda(),
        valid=torch.tensor([True, True, True, False]).cuda(),
    )
    with torch.inference_mode():
        stepper.predict(model, batch)  # first forward: cuDNN's and the allocator's set-up
    torch.cuda.synchronize()
    n = 4
    other = {
        "image": (Accuracy(), torch.randn(n, 10).cuda(), torch.randint(0, 10, (n,)).cuda()),
        "clip": (MultiLabelF1(5), torch.randn(n, 5).cuda(), torch.rand(n, 5).cuda()),
        "depth": (DepthMetrics(DepthTask()), torch.rand(n, 1, 8, 8).cuda(), torch.randint(1, 9, (n, 8, 8)).cuda()),
    }
    metric, faults = task.new_metric(), _TargetFaults(task)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():  # as Loop.evaluate runs it
            faults.add(batch)
            logits = stepper.predict(model, batch)
            metric.update(logits, task.targets(batch), task.valid(batch))
            for m, other_logits, targets in other.values():
                m.update(other_logits, targets, batch.valid)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert metric.compute()["samples"] == 3
    assert [m.compute()["samples"] for m, _, _ in other.values()] == [3, 3, 3]
    with pytest.raises(ValueError, match=r"^mask id 7 in the masks of samples \[13\]"):
        faults.check()
