"""A training step reads nothing back to the host: the segmentation masks' check rides with the loss.

On the CPU every read-back still shows as a dispatched op: ``aten._local_scalar_dense`` for a
scalar read (``.item()``, ``int()``, ``bool()``), and the ops whose output shape depends on the
data (a boolean index, ``nonzero``, ``masked_select``, ``unique``), which on a GPU wait for the
device. The optimizer's own step counters are the one exception: AdamW keeps them on the host.
The ``gpu`` twin runs the step under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gpufeed.config import AugmentConfig, TrainConfig
from gpufeed.models import create_model
from gpufeed.train._augment import build_augmenter
from gpufeed.train._dense import SegmentationTask
from gpufeed.train._optim import build_optimizer, build_scheduler
from gpufeed.train._step import Stepper

pytestmark = pytest.mark.timeout(120)

aten = torch.ops.aten
_DATA_SHAPED = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default}
CLASSES, SIZE = 4, 32


@dataclass(frozen=True)
class DenseBatch:
    """The DenseBatch contract's fields a step reads (what DenseLoader yields)."""

    images: torch.Tensor  # uint8 (N, 3, H, W)
    maps: dict[str, torch.Tensor]  # "mask": uint8 (N, H, W) class ids
    sample_ids: torch.Tensor  # int64 (N,)
    valid: torch.Tensor  # bool (N,)


class _HostReads(TorchDispatchMode):
    """The dispatched ops that read tensor values back to the host, except reads of ``allowed`` tensors."""

    def __init__(self, allowed: list[torch.Tensor]) -> None:
        super().__init__()
        self.allowed = {t.data_ptr() for t in allowed}
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is aten._local_scalar_dense.default and args[0].data_ptr() not in self.allowed:
            self.reads.append(f"{func} of a {tuple(args[0].shape)} {args[0].dtype}")
        elif func in _DATA_SHAPED or (
            func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1])
        ):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def _batch(masks: torch.Tensor, device: str = "cpu") -> DenseBatch:
    n = masks.shape[0]
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, SIZE, SIZE), dtype=torch.uint8, generator=generator)
    return DenseBatch(
        images=images.to(device),
        maps={"mask": masks.to(device)},
        sample_ids=torch.arange(10, 10 + n, device=device),
        valid=torch.ones(n, dtype=torch.bool, device=device),
    )


def _masks(largest_id: int) -> torch.Tensor:
    masks = torch.randint(0, CLASSES, (2, SIZE, SIZE), generator=torch.Generator().manual_seed(1)).to(torch.uint8)
    masks[0, :4] = 255  # the ignore id
    masks[1, 5, 7] = largest_id
    return masks


def _stepper(device: str = "cpu") -> Stepper:
    torch.manual_seed(0)
    model = create_model("unet_resnet18", task="segmentation", num_classes=CLASSES, size_px=(SIZE, SIZE)).to(device)
    optimizer = build_optimizer(model, TrainConfig())
    return Stepper(
        model,
        SegmentationTask(CLASSES),
        optimizer,
        build_scheduler(optimizer, 10, TrainConfig()),
        build_augmenter(AugmentConfig(ops=[])),
        torch.amp.GradScaler(device, enabled=False),
        amp_dtype=torch.bfloat16 if device == "cuda" else None,
        on_gpu=device == "cuda",
    )


def _optimizer_counters(stepper: Stepper) -> list[torch.Tensor]:
    return [s["step"] for s in stepper.optimizer.state.values() if "step" in s]


def test_a_segmentation_step_reads_nothing_back_until_it_is_read():
    stepper = _stepper()
    stepper(_batch(_masks(CLASSES - 1)))  # the optimizer's state exists from here on
    with _HostReads(_optimizer_counters(stepper)) as seen:
        pending = stepper.launch(_batch(_masks(CLASSES - 1)))
    assert seen.reads == [], f"host read-backs inside the step: {seen.reads}"
    assert pending.result().loss > 0


def test_a_mask_id_past_the_classes_is_named_when_the_step_is_read_and_trained_around():
    stepper = _stepper()
    stepper(_batch(_masks(CLASSES - 1)))
    with _HostReads(_optimizer_counters(stepper)) as seen:
        pending = stepper.launch(_batch(_masks(7)))
    assert seen.reads == [], "a bad id is found without reading anything back inside the step"
    with pytest.raises(ValueError, match=r"^mask id 7 in the masks of samples \[11\] is outside the 4 classes"):
        pending.result()
    weights = [p for p in stepper.model.parameters() if p.requires_grad]
    assert all(torch.isfinite(p).all() for p in weights), "the id was left out of the loss, not trained on"


def test_segmentation_targets_leave_out_ids_past_the_classes():
    task = SegmentationTask(CLASSES, ignore_id=255)
    batch = _batch(_masks(9))
    targets = task.targets(batch)
    assert targets.dtype == torch.int64
    assert int(targets[1, 5, 7]) == 255 and int(task.target_fault(batch)) == 9
    expected = batch.maps["mask"].long()
    expected[1, 5, 7] = 255
    assert torch.equal(targets, expected), "every other pixel keeps its id"
    assert int(task.target_fault(_batch(_masks(CLASSES - 1)))) == -1


@pytest.mark.gpu
def test_a_segmentation_step_never_synchronises_on_a_gpu():
    stepper = _stepper("cuda")
    stepper(_batch(_masks(CLASSES - 1), "cuda"))  # first step: lazy set-up (optimizer state, events) may sync
    # The batches arrive on the device as the loader hands them over: copying them there is not the step's.
    good_batch, bad_batch = _batch(_masks(CLASSES - 1), "cuda"), _batch(_masks(7), "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        good = stepper.launch(good_batch)
        bad = stepper.launch(bad_batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert good.result().loss > 0
    with pytest.raises(ValueError, match=r"^mask id 7 in the masks of samples \[11\]"):
        bad.result()
