"""``gpufeed bench augment``: what each augmentation op costs, where it can run, beside the model step.

In one run, on one device:

* the **model step** (forward + backward + AdamW of the model at the batch size, size and
  precision given, channels_last, through :class:`gpufeed.train._step.Stepper` as training runs
  it) on a fixed uint8 batch: the time everything else is compared with;
* every op on the **training device**: Kornia in float32, Kornia in the step's precision (when the
  step uses autocast), and gpufeed's fused torch op for colour jitter, grayscale and flips, each
  timed per call (CUDA events on a GPU), with the host synchronisations one call makes (counted
  with ``torch.cuda.set_sync_debug_mode``; GPU only);
* every op the **loader's DALI graph** can run, as the marginal cost per batch of the fragment in
  a graph that holds one resized batch on the loader's device (``_augment_graph``), and DALI's
  ``fn.color_twist`` beside gpufeed's colour matrix;
* the **default augmentation** (``augment.ops: [color_jitter]``, p = 0.8) as it ran before (Kornia
  ``ColorJitter``, random order, float32, on the device) and as it runs now (inside the DALI
  graph, nothing left on the device), as shares of the model step; the target is <= 20%.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gpufeed.bench._augment_graph import GraphTimer, graph_variants
from gpufeed.bench._common import machine_facts, median
from gpufeed.config import AUGMENT_OPS, LOADER_AUGMENT_OPS, AugmentConfig, TrainConfig
from gpufeed.core import SizePx, format_table, progress_bar
from gpufeed.device import resolve_device
from gpufeed.models import create_model
from gpufeed.pipelines import default_num_threads
from gpufeed.train import (
    Augmenter,
    ImageTask,
    KorniaStage,
    Stepper,
    build_augmenter,
    build_optimizer,
    build_scheduler,
    plan_augmentation,
    resolve_amp,
    to_channels_last,
)

__all__ = ["print_augment_result", "run_augment_bench"]


class StepDefaults(NamedTuple):
    """The model step a run measures against when its arguments say None."""

    model: str
    size_px: SizePx
    batch_size: int


GPU_DEFAULTS = StepDefaults(model="resnet18", size_px=SizePx(224, 224), batch_size=256)
CPU_DEFAULTS = StepDefaults(model="resnet18", size_px=SizePx(64, 64), batch_size=16)
TARGET_SHARE = 0.20


@dataclass
class _Batch:
    images: object
    labels: object
    valid: object = None


class _Clock:
    """Seconds per call: CUDA events around the call on a GPU, ``perf_counter`` on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def measure(self, fn, calls: int) -> list[float]:
        import torch

        if not self.cuda:
            out = []
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
            return out
        pairs = []
        for _ in range(calls):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            pairs.append((begin, end))
        torch.cuda.synchronize()
        return [b.elapsed_time(e) / 1000.0 for b, e in pairs]

    def syncs(self, fn) -> int | None:
        """Host synchronisations one call makes (``None`` on the CPU, where there are none to count)."""
        import torch

        if not self.cuda:
            return None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)


def _stepper(model_name: str, size_px: SizePx, torch_device, amp_dtype, on_gpu: bool):
    import torch

    model = to_channels_last(create_model(model_name, num_classes=1000, size_px=size_px).to(torch_device))
    task = ImageTask(1000)
    cfg = TrainConfig()
    optimizer = build_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(torch_device.type, enabled=amp_dtype == torch.float16)
    return Stepper(
        model,
        task,
        optimizer,
        build_scheduler(optimizer, 10**6, cfg),
        Augmenter([], clips=False),
        scaler,
        amp_dtype=amp_dtype,
        memory_format=task.input_format(model),
        on_gpu=on_gpu,
    )


def _device_variants(amp_dtype):
    """(op, place, precision label, AugmentConfig, dtype or None) for every device variant."""
    import torch

    precisions = [("float32", torch.float32)]
    if amp_dtype is not None:
        precisions.append((str(amp_dtype).replace("torch.", ""), amp_dtype))
    out = []
    for op in AUGMENT_OPS:
        for label, dtype in precisions:
            cfg = AugmentConfig(ops=(op,), **{op: dataclasses.replace(getattr(AugmentConfig(), op), where="kornia")})
            out.append((op, "kornia", label, cfg, dtype))
        if op in LOADER_AUGMENT_OPS:
            cfg = AugmentConfig(ops=(op,), **{op: dataclasses.replace(getattr(AugmentConfig(), op), where="torch")})
            out.append((op, "torch (fused)", "uint8/float32", cfg, None))
    return out


def _previous_default(dtype):
    """The default as it ran before: Kornia ColorJitter, random order, float32 on the device."""
    import kornia.augmentation as K

    c = AugmentConfig().color_jitter
    op = K.ColorJitter(c.brightness, c.contrast, c.saturation, c.hue, p=c.p)
    return Augmenter([KorniaStage([op], clips=False, dtype=dtype)], clips=False, names=["color_jitter"])


def _row(op: str, place: str, precision: str, seconds: float, step_s: float, syncs) -> dict:
    return {
        "op": op,
        "place": place,
        "precision": precision,
        "ms": seconds * 1e3,
        "share_of_step": seconds / step_s,
        "host_syncs": syncs,
    }


class _Subjects(NamedTuple):
    """What a run times on the device: the model step on a fixed batch, and every augmentation variant."""

    pixels: Any
    batch: _Batch
    stepper: Stepper
    plan: Any  # the default augmentation's AugmentPlan: its loader share and its device share ("now")
    # (op, where, precision) for each op on the device; "before" and "now" for the default augmentation.
    device_variants: dict[tuple[str, str, str] | str, Augmenter]


def _subjects(choice, model: str, batch_size: int, size_px: SizePx, amp_dtype, seed: int) -> _Subjects:
    """The fixed uint8 batch (drawn from ``seed``), the model step and the augmentations on the device."""
    import torch

    torch_device = choice.torch_device
    torch.manual_seed(seed)
    height, width = size_px.hw
    pixels = torch.randint(0, 256, (batch_size, 3, height, width), dtype=torch.uint8, device=torch_device)
    pixels = pixels.contiguous(memory_format=torch.channels_last)
    batch = _Batch(pixels, torch.randint(0, 1000, (batch_size,), device=torch_device))
    stepper = _stepper(model, size_px, torch_device, amp_dtype, choice.is_gpu)
    defaults_cfg = AugmentConfig()
    plan = plan_augmentation(defaults_cfg, dtype=amp_dtype)
    if plan.loader is None:
        raise RuntimeError(f"the default augmentation {defaults_cfg.ops} runs nothing in the loader's graph")
    device_variants: dict[tuple[str, str, str] | str, Augmenter] = {
        (op, place, precision): build_augmenter(cfg, dtype=dtype).to(torch_device)
        for op, place, precision, cfg, dtype in _device_variants(amp_dtype)
    }
    device_variants["before"] = _previous_default(torch.float32).to(torch_device)
    device_variants["now"] = plan.augmenter.to(torch_device)
    return _Subjects(pixels, batch, stepper, plan, device_variants)


def _timed_rounds(subjects: _Subjects, graph: GraphTimer, variants: dict, clock: _Clock, rounds: int):
    """Seconds of the model step, of each device variant and of each graph variant, one of each per round."""
    pixels, device_variants = subjects.pixels, subjects.device_variants
    for _ in range(3):  # warm-up: kernels chosen, caches and allocator filled
        subjects.stepper(subjects.batch)
        for augmenter in device_variants.values():
            augmenter(pixels)
    step_times: list[float] = []
    device_times: dict = {key: [] for key in device_variants}
    graph_times: dict = {name: [] for name in variants}
    for _ in progress_bar(range(rounds), desc="rounds (step, device ops, graph ops)", leave=False):
        step_times.append(subjects.stepper(subjects.batch).compute_s)
        for key, augmenter in device_variants.items():
            device_times[key].extend(clock.measure(lambda a=augmenter: a(pixels), 1))
        for name, seconds in graph.round().items():
            graph_times[name].append(seconds)
    return step_times, device_times, graph_times


def _op_rows(subjects: _Subjects, variants: dict, step_s: float, device_s: dict, graph_s: dict, syncs: dict):
    """One row per op and place: the previous default first, then the device variants, then the graph's."""
    before = ("color_jitter", "kornia, random order (previous default)", "float32")
    rows = [_row(*before, device_s["before"], step_s, syncs["before"])]
    keys = [key for key in subjects.device_variants if isinstance(key, tuple)]
    rows += [_row(*key, device_s[key], step_s, syncs[key]) for key in keys]
    for name, spec in variants.items():
        if spec is not None:
            marginal = max(0.0, graph_s[name] - graph_s["none"])
            rows.append(_row(spec[0], f"loader: {spec[1]}", "uint8/float32", marginal, step_s, None))
    return rows


def _default_figures(plan, step_s: float, device_s: dict, graph_s: dict, syncs: dict) -> dict:
    """The default augmentation before (Kornia on the device) and now (the loader's graph plus the device)."""
    loader_now_s = max(0.0, graph_s["color_jitter"] - graph_s["none"])
    now_s = loader_now_s + device_s["now"]
    return {
        "ops": list(AugmentConfig().ops),
        "placement_now": plan.placement,
        "before_ms": device_s["before"] * 1e3,
        "before_share": device_s["before"] / step_s,
        "before_host_syncs": syncs["before"],
        "now_loader_ms": loader_now_s * 1e3,
        "now_device_ms": device_s["now"] * 1e3,
        "now_ms": now_s * 1e3,
        "now_share": now_s / step_s,
        "target_share": TARGET_SHARE,
    }


def run_augment_bench(
    *,
    device: str = "auto",
    model: str | None = None,
    batch_size: int | None = None,
    size_px: SizePx | None = None,
    amp: str = "auto",
    rounds: int = 20,
    graph_iterations: int = 10,
    num_threads: int = 0,
    seed: int = 0,
) -> dict:
    """Time every op at every place it can run, and the model step, on one device; return the figures.

    Each round runs one model step, one call of every device variant and ``graph_iterations``
    batches of every graph variant, so a busy moment of a shared machine hits all of them alike;
    the figures are medians over ``rounds``. ``None`` for ``model``, ``batch_size`` or
    ``size_px`` takes the device's default (GPU: ResNet-18, 224 px, batch 256; CPU: ResNet-18,
    64 px, batch 16).
    """
    choice = resolve_device(device)
    defaults = GPU_DEFAULTS if choice.is_gpu else CPU_DEFAULTS
    model = model or defaults.model
    batch_size, size_px = batch_size or defaults.batch_size, size_px or defaults.size_px
    amp_dtype = resolve_amp(amp, choice)
    clock = _Clock(choice.is_gpu)
    subjects = _subjects(choice, model, batch_size, size_px, amp_dtype, seed)
    loader_augment = subjects.plan.loader
    threads = num_threads or default_num_threads()
    variants = graph_variants(
        loader_augment, AugmentConfig().grayscale.p, batch_size * (rounds * (graph_iterations + 1) + 4), seed
    )
    graph = GraphTimer(
        variants,
        batch_size=batch_size,
        size_px=size_px,
        device_id=choice.device_id,
        num_threads=threads,
        iterations=graph_iterations,
        seed=seed,
    )
    step_times, device_times, graph_times = _timed_rounds(subjects, graph, variants, clock, rounds)
    del graph

    step_s = median(step_times)
    device_s = {key: median(values) for key, values in device_times.items()}
    graph_s = {name: median(values) for name, values in graph_times.items()}
    syncs = {
        key: clock.syncs(lambda a=augmenter: a(subjects.pixels)) for key, augmenter in subjects.device_variants.items()
    }
    params_s = median(clock_host(lambda: loader_augment.rows(seed, 0, np.arange(batch_size)), rounds))
    return {
        "benchmark": "augment",
        "model": model,
        "batch_size": batch_size,
        "size_px": size_px,
        "amp": str(amp_dtype).replace("torch.", "") if amp_dtype else "off",
        "loader_threads": threads,
        "rounds": rounds,
        "model_step_ms": step_s * 1e3,
        "ops": _op_rows(subjects, variants, step_s, device_s, graph_s, syncs),
        "graph_ms_per_batch": {k: v * 1e3 for k, v in graph_s.items()},
        "loader_params_ms_per_batch": params_s * 1e3,
        "default": _default_figures(subjects.plan, step_s, device_s, graph_s, syncs),
        "machine": machine_facts(choice),
    }


def clock_host(fn, calls: int) -> list[float]:
    """Seconds per call of host-only work."""
    return _Clock(False).measure(fn, calls)


def print_augment_result(result: dict) -> None:
    print(
        f"augmentation benchmark: {result['model']}, {result['size_px'].label} px, batch {result['batch_size']}, "
        f"amp {result['amp']}, {result['machine']['device']}"
    )
    print(f"model step (forward + backward + AdamW): {result['model_step_ms']:.2f} ms")
    table = [
        [
            r["op"],
            r["place"],
            r["precision"],
            f"{r['ms']:.3f}",
            f"{100 * r['share_of_step']:.1f}%",
            "-" if r["host_syncs"] is None else str(r["host_syncs"]),
        ]
        for r in result["ops"]
    ]
    print(format_table(["op", "where", "precision", "ms per batch", "of model step", "host syncs"], table))
    print("(flips on images cost nothing in the loader: they are folded into the resize ROI)")
    print(f"loader parameters on the host: {result['loader_params_ms_per_batch']:.3f} ms per batch")
    d = result["default"]
    print(
        f"default augmentation {d['ops']}: before {d['before_ms']:.2f} ms = {100 * d['before_share']:.1f}% of the step; "
        f"now {d['now_ms']:.2f} ms = {100 * d['now_share']:.1f}% (loader {d['now_loader_ms']:.2f} ms + device "
        f"{d['now_device_ms']:.2f} ms); target <= {100 * d['target_share']:.0f}%"
    )
