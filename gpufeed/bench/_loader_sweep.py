"""``gpufeed bench loader --vary``: the image loader under several settings, on the same files, in one run.

Which hardware-decoder share, how many DALI threads, how deep a queue: the answer depends on the
GPU, the CPU and the images, so it is measured, not guessed. Each ``--vary loader.KEY=V1,V2``
adds a dimension; every combination is a variant, the first (each key's first value) the
reference the others are compared with. No DataLoader runs: this compares gpufeed with itself.

Every variant keeps one loader, and so one pipeline, for the whole run, as training does. Rounds
are interleaved, each starting one variant later. A variant's round first takes the batches its
pipelines prepared while the others ran (``prefetch_queue_depth`` each, untimed: a deeper queue
would otherwise start each round with more done), then times one epoch's worth of batches, the
GPU synchronised at the end. Beside images/s: the CPU cores the process kept busy (its CPU time
over the wall time) and, on a GPU, how busy it was (the share of time a kernel ran), and its NVDEC and JPEG engines
(:class:`~gpufeed.bench._gpu_engines.EngineSampler`): a loader short of decoder has its engines
near 100 %, one held up elsewhere leaves them idle.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from gpufeed.bench._common import handed_over, machine_facts
from gpufeed.bench._gpu_engines import EngineSampler, nvml_uuids
from gpufeed.config import ConfigError, ImagePipelineConfig, parse_config
from gpufeed.core import SizePx, format_table
from gpufeed.device import resolve_device
from gpufeed.pipelines import ImageDataset, ImageLoader, default_num_threads

__all__ = ["MAX_VARIANTS", "parse_vary", "print_sweep_result", "run_loader_sweep"]

MAX_VARIANTS = 12
# Longest wait for a variant's runs in flight to end between rounds (a slow variant's are bounded by it).
_SETTLE_MAX_S = 5.0


def parse_vary(items: list[str]) -> list[dict[str, str]]:
    """The variants of ``--vary loader.KEY=V1,V2`` items: every combination, in order, as overrides
    (none without items).

    Raises:
        ConfigError: An item that is not ``loader.KEY=V1[,V2...]``, a key twice, a value the config
            refuses (naming the key), or more than :data:`MAX_VARIANTS` combinations.
    """
    if not items:  # no --vary: the comparison with the DataLoader, not a sweep of one variant
        return []
    dimensions: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key.startswith("loader.") or not values.strip():
            raise ConfigError(item, "--vary takes loader.KEY=V1,V2 (a key of the loader section and its values)")
        if key in dimensions:
            raise ConfigError(key, "given to --vary twice; list every value once: loader.KEY=V1,V2")
        dimensions[key] = [v.strip() for v in values.split(",")]
    variants = [dict(zip(dimensions, combo, strict=True)) for combo in itertools.product(*dimensions.values())]
    if len(variants) > MAX_VARIANTS:
        raise ConfigError("--vary", f"{len(variants)} combinations; at most {MAX_VARIANTS} in one run")
    for variant in variants:  # every value checked before any loader starts
        parse_config({}, overrides=[f"{k}={v}" for k, v in variant.items()])
    return variants


def _name(variant: dict[str, str]) -> str:
    return ", ".join(f"{key.removeprefix('loader.')}={value}" for key, value in variant.items())


def _endless(loader: ImageLoader) -> Iterator:
    """The loader's batches epoch after epoch, on its one pipeline."""
    while True:
        yield from loader


def run_loader_sweep(
    data: Path,
    variants: list[dict[str, str]],
    *,
    batch_size: int = 64,
    rounds: int = 3,
    size_px: SizePx = SizePx(224, 224),
    device: str = "auto",
    workers: int = 0,
    seed: int = 0,
) -> dict:
    """Time the image loader under each of ``variants`` (``--vary`` overrides) over ``data``; return the figures.

    Args:
        variants: Per variant, ``{"loader.KEY": "value"}`` (:func:`parse_vary`); the first is the reference.
        rounds: Timed rounds per variant (after one warm-up round each), interleaved.
        workers: DALI threads where ``loader.num_threads`` is not varied; 0 means one per core.
    """
    choice = resolve_device(device)
    dataset = ImageDataset.from_folder(data, progress=True)
    image_cfg = ImagePipelineConfig(size_px=size_px)
    loaders, streams = {}, {}
    for variant in variants:
        loader_cfg = parse_config({}, overrides=[f"{k}={v}" for k, v in variant.items()]).loader
        threads = loader_cfg.num_threads or workers or default_num_threads()
        loader_cfg = replace(loader_cfg, batch_size=batch_size, num_threads=threads, shuffle=False)
        loader = ImageLoader(dataset, train=True, image_cfg=image_cfg, loader_cfg=loader_cfg, device=choice, seed=seed)
        loaders[_name(variant)], streams[_name(variant)] = loader, _endless(loader)
    names = list(loaders)
    per_round = len(next(iter(loaders.values())))
    figures: dict[str, dict[str, list]] = {
        name: {"images_per_second": [], "cores_busy": [], "engines": []} for name in names
    }
    uuids = nvml_uuids(choice.device_id or 0) if choice.is_gpu else None
    try:
        for number in range(rounds + 1):  # round 0 warms every variant up, untimed
            shift = number % len(names)
            for name in names[shift:] + names[:shift]:
                loader, stream = loaders[name], streams[name]
                ahead = loader.cfg.prefetch_queue_depth * loader.parallel_pipelines
                # Prepared while the others ran: each of its pipelines' queues.
                for _ in range(ahead if number else 0):
                    next(stream)
                with EngineSampler(uuids) as engines:
                    wall, cpu = time.perf_counter(), time.process_time()
                    images, last = 0, None
                    for _ in range(per_round):  # each batch dropped as the next comes, as a training loop does
                        last = next(stream).images
                        images += int(last.shape[0])
                    handed_over(last)
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                _settle(choice, ahead * wall / per_round)
                if number:
                    figures[name]["images_per_second"].append(images / wall)
                    figures[name]["cores_busy"].append(cpu / wall)
                    figures[name]["engines"].append(engines.summary())
    finally:
        for loader in loaders.values():
            loader.close()
    reference = figures[names[0]]["images_per_second"]
    for name in names:
        ips = figures[name]["images_per_second"]
        figures[name]["paired"] = [a / b for a, b in zip(ips, reference, strict=True)]
    return {
        "benchmark": "loader sweep",
        "images": len(dataset.usable_ids),
        "batch_size": batch_size,
        "width_px": size_px.width_px,
        "height_px": size_px.height_px,
        "rounds": rounds,
        "batches_per_round": per_round,
        "variants": figures,
        "machine": machine_facts(choice),
    }


def _settle(choice, in_flight_s: float) -> None:
    """Let a variant's pipelines finish the runs its reads scheduled (``prefetch_queue_depth`` per
    pipeline) before another variant's round: they would run inside it, on the same cores and engines,
    favouring whichever variant follows one with fewer runs in flight."""
    time.sleep(min(_SETTLE_MAX_S, 1.5 * in_flight_s + 0.05))
    if choice.is_gpu:
        import torch

        torch.cuda.synchronize(choice.torch_device)


def _engine_cell(summaries: list[dict], name: str) -> str:
    values = [s[name] for s in summaries if isinstance(s.get(name), float | int)]
    return f"{statistics.median(values):.0f}" if values else "-"


def print_sweep_result(result: dict) -> None:
    """The variants' table: images/s, against the first variant, CPU cores busy, engines busy."""
    rows = []
    for name, fig in result["variants"].items():
        engines = fig["engines"]
        rows.append(
            [
                name,
                f"{statistics.median(fig['images_per_second']):,.0f}",
                ", ".join(f"{v:,.0f}" for v in fig["images_per_second"]),
                f"{statistics.median(fig['paired']):.2f}x",
                f"{statistics.median(fig['cores_busy']):.1f}",
                *(_engine_cell(engines, engine) for engine in ("kernels", "nvdec", "jpeg")),
            ]
        )
    print(
        f"loader sweep: {result['images']} images to {result['width_px']}x{result['height_px']}, batch "
        f"{result['batch_size']}, {result['batches_per_round']} batches a round, {result['rounds']} rounds, "
        f"{result['machine']['device']}"
    )
    header = [
        "variant",
        "images/s (median)",
        "rounds",
        "vs first (paired)",
        "CPU cores busy",
        "kernels %",
        "NVDEC %",
        "JPEG %",
    ]
    print(format_table(header, rows))
    first = next(iter(result["variants"].values()))["engines"]
    if first and "unavailable" in first[0]:
        print(f"engines: {first[0]['unavailable']}")
