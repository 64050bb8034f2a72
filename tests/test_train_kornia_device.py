"""Kornia's random parameters are drawn, and stay, on the device of the pixels they augment.

On a CPU-only machine the training device is the CPU, the same as the process's default device, so
a parameter that lands on the default device instead of the training device goes unseen. These
tests make the two differ: they run the augmentation with the default device set to ``meta`` (a
device without data). Any tensor Kornia puts on the default device rather than the pixels' then
shows up in the dispatched ops (and a copy out of it fails). On a GPU the ``gpu`` twins check
what that stands for: no copy between host and device and no synchronisation, per op, per step.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpufeed.config import AUGMENT_OPS, parse_config
from gpufeed.train._augment import build_augmenter

pytestmark = pytest.mark.timeout(120)


class _Devices(TorchDispatchMode):
    """The dispatched ops that make a tensor on a device other than ``device``, or copy between devices.

    With ``inputs``, also the ops that read a tensor from another device (here: from ``meta``,
    where nothing should be).
    """

    def __init__(self, device: torch.device, inputs: bool = True) -> None:
        super().__init__()
        self.device, self.inputs, self.elsewhere = torch.device(device), inputs, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        read = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {t.device for t in made + read}
        off_device = any(t.device != self.device for t in made + (read if self.inputs else []))
        if off_device or ("copy" in str(func) and len(devices) > 1):
            self.elsewhere.append(f"{func} on {', '.join(sorted(str(d) for d in devices))}")
        return out


def _augmenter(ops, clips: bool, p: float = 0.5):
    mapping = {"augment": {"ops": list(ops), **{op: {"where": "kornia", "p": p} for op in ops}}}
    return build_augmenter(parse_config(mapping).augment, clips=clips)


def _pixels(clips: bool, device="cpu") -> torch.Tensor:
    shape = (4, 3, 3, 24, 24) if clips else (4, 3, 24, 24)
    return torch.randint(0, 256, shape, dtype=torch.uint8, device=device)


@pytest.mark.parametrize("clips", [False, True], ids=["images", "clips"])
@pytest.mark.parametrize("ops", [[op] for op in AUGMENT_OPS] + [list(AUGMENT_OPS)], ids=[*AUGMENT_OPS, "all"])
def test_kornia_draws_where_the_pixels_are_not_on_the_default_device(ops, clips):
    augment = _augmenter(ops, clips)
    pixels = _pixels(clips)
    with torch.device("meta"), _Devices(pixels.device) as seen:
        out = augment(pixels)
        out = augment(pixels)  # the second step too: nothing set up once and left behind
    assert out.device == pixels.device and out.shape == pixels.shape
    assert seen.elsewhere == [], f"{ops}: parameters off the pixels' device: {seen.elsewhere}"


@pytest.mark.gpu
@pytest.mark.parametrize("clips", [False, True], ids=["images", "clips"])
def test_kornia_steps_copy_nothing_between_host_and_device(clips):
    """Built on the CPU and never moved by hand: the first step moves the generators, later steps copy nothing."""
    augment = _augmenter(list(AUGMENT_OPS), clips)
    pixels = _pixels(clips, device="cuda")
    augment(pixels)  # the first step moves the generators and may set things up
    torch.cuda.synchronize()
    generators = [m for m in augment.modules() if hasattr(m, "set_rng_device_and_dtype")]
    assert generators and all(torch.device(m.device).type == "cuda" for m in generators)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with _Devices(pixels.device, inputs=False) as seen:
            for _ in range(3):
                augment(pixels)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert seen.elsewhere == [], f"host tensors in a step: {seen.elsewhere}"
