"""Figures, table, verdicts and plot of ``gpufeed bench train`` (see :mod:`gpufeed.bench.train`)."""

from __future__ import annotations

import math

import numpy as np

from gpufeed.bench._common import machine_facts
from gpufeed.core import finite, format_table
from gpufeed.train import HOST_LAUNCH, STAGES, summarize

__all__ = ["SIDES", "figures", "pair_figures", "percent_text", "print_train_result", "rate_text"]

SIDES = ("gpufeed", "dataloader")
_GPU_TARGET_SHARE = 0.05


def side_label(side: str, task: str) -> str:
    if side == "gpufeed":
        return "gpufeed"
    return "DataLoader+PyAV" if task == "clips" else "DataLoader+PIL"


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else float("nan")


# The phases of next(loader) the table shows: DALI's outputs and scheduling, the handover, the loader's own;
# then the training thread's CPU time in the call, and its time off the CPU outside DALI's output wait.
_PHASES = ("dali_outputs", "dali_schedule", "copies", "loader_own")
_CPU_PHASES = ("loader_cpu", "held_off")


def _side_figures(blocks: list[dict]) -> dict:
    steps = [s for block in blocks for s in block["steps"]]
    summary = summarize(steps)
    waits = np.array([s["loader_wait_s"] for s in steps])
    median_wait = float(np.median(waits)) if len(waits) else float("nan")
    epochs = max((s["epoch"] for s in steps), default=-1) + 1
    first = []
    for epoch in range(epochs):
        values = [s["loader_wait_s"] for s in steps if s["epoch"] == epoch and s["batch"] == 0]
        first.append(float(np.median(values)) if values else float("nan"))
    wall_s = sum(block["wall_s"] for block in blocks)
    # Data time on the step's critical path: the wait for the batch plus the augmentation the
    # training device runs on it (zero for ops placed in gpufeed's loader), per sample.
    data = np.array([(s["loader_wait_s"] + s["augment_s"]) / max(s["samples"], 1) for s in steps])
    steps_s = np.array([s["step_s"] for s in steps])
    phased = [s["next_phases_s"] for s in steps if "next_phases_s" in s]
    stages = summary["stages"]
    return {
        **summary,
        "median_data_s_per_sample": float(np.median(data)) if len(data) else float("nan"),
        # The median step's share spent on data: what a loader costing nothing could save at most.
        "median_data_share": float(np.median(data * np.array([s["samples"] for s in steps]) / steps_s))
        if len(data)
        else float("nan"),
        "wall_s": wall_s,
        "samples_per_s_wall": summary["samples"] / wall_s if wall_s > 0 else float("nan"),
        "median_wait_s": median_wait,
        # Where gpufeed's next(loader) spends its time (pipelines/_next_phases.py), median per phase.
        "next_phases_p50_s": {
            phase: float(np.median([p.get(phase, 0.0) for p in phased])) for phase in _PHASES + _CPU_PHASES if phased
        },
        # The training thread's CPU time queueing a step: below launch_s where it waited for Python's lock.
        "launch_cpu_p50_s": float(np.median([s["launch_cpu_s"] for s in steps])) if "launch_s" in stages else None,
        # The training device's own share of the time (its stream's work: on a GPU, CUDA event
        # times); the rest of the time it idled, whatever the host was doing meanwhile.
        "device_busy_share": stages["augment_s"]["share"] + stages["compute_s"]["share"] if stages else float("nan"),
        # Per step, the host's time (its wait, then queueing the step) against the device's: where
        # the host's is the longer, the host sets the pace (a GPU only, where launch_s is timed).
        "host_vs_device_p50_s": [
            float(np.median([s["loader_wait_s"] + s["launch_s"] for s in steps])),
            float(np.median([s["augment_s"] + s["compute_s"] for s in steps])),
        ]
        if "launch_s" in stages
        else None,
        "first_batch_wait_s": first,
        "first_batch_wait_vs_median": [_ratio(f, median_wait) for f in first],
        "samples_per_epoch": [block["samples_per_epoch"] for block in blocks],
        "per_step": steps,
    }


def pair_figures(pairs: list[dict]) -> dict:
    """Median and quartiles of the chunk pairs' gpufeed / DataLoader samples/s ratios."""
    ratios = np.array([p["ratio"] for p in pairs], dtype=np.float64)
    if not len(ratios):
        nan = float("nan")
        return {"pairs": 0, "median": nan, "p25": nan, "p75": nan}
    p25, median, p75 = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
    return {"pairs": len(ratios), "median": median, "p25": p25, "p75": p75}


_CPU_TARGETS = {
    "cpu_wait_no_higher": "gpufeed's data time on the step's critical path (loader wait + augment, per sample, "
    "median step) no higher than the DataLoader's in the same run",
    "cpu_samples_per_s_1_2x": "gpufeed >= 1.2x the DataLoader's samples/s (median of the chunk pairs, or of the rounds)",
    "cpu_epoch2_first_batch": "gpufeed's first batch of epoch 2 waits no longer than a median batch",
}


def _targets(loaders: dict, on_gpu: bool, paired: dict) -> list[dict]:
    g = loaders["gpufeed"]
    if "dataloader" not in loaders:  # gpufeed's side alone: the comparisons have nothing to compare with
        return [_gpu_target(g, on_gpu, "no DataLoader in this run")] + [
            {"name": name, "machine": "2-core CPU", "target": text, "applies": False, "holds": None,
             "measured": "no DataLoader in this run (--no-baseline)"}
            for name, text in _CPU_TARGETS.items()
        ]  # fmt: skip
    d = loaders["dataloader"]
    first = g["first_batch_wait_s"]
    epoch2 = first[1] if len(first) > 1 else float("nan")
    ceiling = _ratio(1.0, 1.0 - d["median_data_share"])
    return [
        {
            "name": "cpu_wait_no_higher",
            "machine": "2-core CPU",
            "target": _CPU_TARGETS["cpu_wait_no_higher"],
            "applies": not on_gpu,
            "holds": bool(g["median_data_s_per_sample"] <= d["median_data_s_per_sample"]),
            "measured": f"{g['median_data_s_per_sample'] * 1e3:.2f} vs {d['median_data_s_per_sample'] * 1e3:.2f} ms "
            f"per sample; loader wait {g['loader_wait_share']:.1%} vs {d['loader_wait_share']:.1%} of step time",
        },
        {
            "name": "cpu_samples_per_s_1_2x",
            "machine": "2-core CPU",
            "target": _CPU_TARGETS["cpu_samples_per_s_1_2x"],
            "applies": not on_gpu,
            "holds": bool(paired["median"] >= 1.2),
            "measured": f"{paired['median']:.2f}x (quartiles {paired['p25']:.2f}x to {paired['p75']:.2f}x over "
            f"{paired['pairs']} pairs); the DataLoader's data time is {d['median_data_share']:.1%} of its median step, "
            f"so a loader costing nothing would reach about {ceiling:.2f}x",
        },
        {
            "name": "cpu_epoch2_first_batch",
            "machine": "2-core CPU",
            "target": _CPU_TARGETS["cpu_epoch2_first_batch"],
            "applies": not on_gpu and len(first) > 1,
            "holds": bool(epoch2 <= g["median_wait_s"]) if len(first) > 1 else None,
            "measured": f"{epoch2 * 1e3:.1f} ms vs median {g['median_wait_s'] * 1e3:.1f} ms "
            f"(DataLoader: {d['first_batch_wait_s'][1] * 1e3 if len(first) > 1 else float('nan'):.1f} ms vs "
            f"{d['median_wait_s'] * 1e3:.1f} ms)",
        },
        _gpu_target(g, on_gpu, f"DataLoader: {d['loader_wait_share']:.1%}"),
    ]


def _gpu_target(g: dict, on_gpu: bool, beside: str) -> dict:
    return {
        "name": "gpu_wait_under_5pct",
        "machine": "GPU",
        "target": "gpufeed's loader wait < 5% of step time over the whole run, epoch boundaries included",
        "applies": on_gpu,
        "holds": bool(g["loader_wait_share"] < _GPU_TARGET_SHARE),
        "measured": f"{g['loader_wait_share']:.1%} over {g['steps']} steps ({beside})",
    }


def _measured_text(device, settings: dict, cores: int) -> str:
    timing = (
        "augment and compute with CUDA events, each step read once the next is queued (as gpufeed train does); "
        "host launch: host time queueing a step, which with the wait sets the pace when it exceeds the device's"
        if device.is_gpu
        else "augment and compute with time.perf_counter (the CPU runs synchronously)"
    )
    alone = len(settings["sides"]) == 1
    copy = (
        "; the DataLoader's includes its copy to the GPU (asynchronous, from pinned memory, on a stream of its own)"
        if device.is_gpu and not alone
        else ""
    )
    orders = ", ".join(" then ".join(order) for order in settings["order"])
    chunk = settings["chunk_steps"]
    rounds = (
        "Each round trains every epoch with gpufeed's loader alone (--no-baseline; a fresh loader and model each round)"
        if alone
        else f"Each round trains every epoch with both loaders (fresh loader and model each), alternating every {chunk} "
        "steps, one side stepping at a time; each round's first chunks in order"
        if chunk
        else "Each round trains every epoch with one loader, then with the other (fresh loader and model each; one "
        "loader works at a time), rounds in order"
    )
    return (
        f"everything on {device.describe()} with {cores} CPU cores. Loader wait: host time blocked waiting for the "
        f"next batch, loader start-up and epoch ends included{copy}. {timing[0].upper()}{timing[1:]}; step: from the "
        f"end of the previous step's record (a chunk's first step: the start of its wait) to the end of its own, so "
        f"the steps add up to the time trained. {rounds}: {orders}."
    )


def figures(
    device, settings: dict, blocks: dict[str, list[dict]], same_samples: bool | None, pairs: list[dict]
) -> dict:
    """The result document: settings, each side's figures, ratios and target verdicts.

    Args:
        pairs: The interleaved chunk pairs' samples/s (see :func:`gpufeed.bench._train_rounds.run_rounds`).
    """
    loaders = {side: _side_figures(blocks[side]) for side in settings["sides"]}
    g = loaders["gpufeed"]
    nan = float("nan")  # gpufeed's side alone: every ratio is null in the JSON, n/a in the table
    d = loaders.get("dataloader") or {
        **{k: nan for k in g},
        "stages": {k: {"p50_s": nan, "p95_s": nan} for k in g["stages"]},
    }
    paired = pair_figures(pairs)
    ratios = {
        "paired_samples_per_s": paired["median"],
        "median_data_s_per_sample": _ratio(g["median_data_s_per_sample"], d["median_data_s_per_sample"]),
        "samples_per_s": _ratio(g["samples_per_s"], d["samples_per_s"]),
        "samples_per_s_wall": _ratio(g["samples_per_s_wall"], d["samples_per_s_wall"]),
        "loader_wait_share": _ratio(g["loader_wait_share"], d["loader_wait_share"]),
        "steady_loader_wait_share": _ratio(g["steady_loader_wait_share"], d["steady_loader_wait_share"]),
    }
    for key in [key for key, _ in (*STAGES, HOST_LAUNCH) if key in g["stages"] and key in d["stages"]]:
        for q in ("p50", "p95"):
            ratios[f"{key.removesuffix('_s')}_{q}"] = _ratio(g["stages"][key][f"{q}_s"], d["stages"][key][f"{q}_s"])
    machine = machine_facts(device)
    return finite(
        {
            "benchmark": "train",
            **settings,
            "labels": {side: side_label(side, settings["task"]) for side in settings["sides"]},
            "machine": machine,
            "measured": _measured_text(device, settings, machine["cpu_cores"]),
            "same_samples_per_epoch": None if same_samples is None else bool(same_samples),
            "loaders": loaders,
            "pairs": {**paired, "each": pairs},
            "ratios": ratios,
            "targets": _targets(loaders, device.is_gpu, paired),
        }
    )


def _ms(value) -> str:
    return "n/a" if value is None else f"{value * 1e3:,.1f}"


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def rate_text(value) -> str:
    return "n/a" if value is None else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def percent_text(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def print_train_result(result: dict) -> None:
    """The comparison table (gpufeed's column alone with ``--no-baseline``), what was measured where, and the verdicts."""
    sides = list(result["loaders"])
    stats = [result["loaders"][side] for side in sides]
    both = len(sides) == len(SIDES)
    clip = f", {result['clip_length_frames']}-frame clips" if result["task"] == "clips" else ""
    print(
        f"train benchmark ({result['task']}): {result['model']}, {result['size_px'].label} px{clip}, batch "
        f"{result['batch_size']}, amp {result['amp']}, channels_last {result['channels_last']}, compile {result.get('compile', 'off')}; {result['data']}"
    )
    for side in sides:
        placement = result.get("augment_placement", {}).get(side, {})
        where = ", ".join(f"{op} ({place})" for op, place in placement.items()) or "none"
        print(f"augment, {'gpufeed' if side == 'gpufeed' else 'DataLoader'}: {where}")
    chunk = result["chunk_steps"]
    order = (
        f"{f'interleaved every {chunk} steps' if chunk else 'one side after the other'}"
        if both
        else "gpufeed's side alone (--no-baseline)"
    )
    print(
        f"{result['rounds']} round(s) x {result['epochs']} epochs x {result['steps_per_epoch']} steps per loader, "
        f"{order}; {result['workers']} DALI threads"
        + (
            f" / DataLoader workers (persistent, prefetch_factor {result['prefetch_factor']}, pin_memory "
            f"{result['pin_memory']}; DALI prefetch_queue_depth {result['dali_prefetch_queue_depth']})"
            if both
            else f" (DALI prefetch_queue_depth {result['dali_prefetch_queue_depth']})"
        )
    )

    labels = result["labels"]
    head = ["", *(labels[side] for side in sides)] + (["gpufeed / DataLoader"] if both else [])
    print(format_table(head, _table_rows(result, stats, both)))
    if both:
        print(f"same samples in every epoch on both sides: {'yes' if result['same_samples_per_epoch'] else 'NO'}")
    print(f"measured: {result['measured']}")
    print("targets (measured verdicts, not test assertions):")
    for t in result["targets"]:
        if t["applies"]:
            verdict = "yes" if t["holds"] else "NO"
            print(f"  [{t['machine']}] {t['target']}: {verdict} ({t['measured']})")
        else:
            print(f"  [{t['machine']}] {t['target']}: not this machine's target ({t['measured']})")


def _table_rows(result: dict, stats: list[dict], both: bool) -> list[list[str]]:
    """The table's rows: a figure, its value for each side run, and the ratio when both ran."""
    r = result["ratios"]

    def row(name: str, cells: list[str], ratio: str) -> list[str]:
        return [name, *cells, ratio] if both else [name, *cells]

    p = result["pairs"]
    rows = (
        [
            row(
                "samples/s, median of chunk pairs (or rounds)",
                ["" for _ in stats],
                f"{_x(p['median'])} ({_x(p['p25'])}-{_x(p['p75'])}, {p['pairs']} pairs)",
            )
        ]
        if both
        else []
    )
    rows += [
        row("data time on the critical path (ms/sample)", [_ms(s["median_data_s_per_sample"]) for s in stats],
            _x(r["median_data_s_per_sample"])),
        row("samples/s (over step time)", [f"{s['samples_per_s']:,.1f}" for s in stats], _x(r["samples_per_s"])),
        row("samples/s (wall clock)", [f"{s['samples_per_s_wall']:,.1f}" for s in stats], _x(r["samples_per_s_wall"])),
        row("loader wait, share of step time", [percent_text(s["loader_wait_share"]) for s in stats],
            _x(r["loader_wait_share"])),
        row("  without each epoch's first batch", [percent_text(s["steady_loader_wait_share"]) for s in stats],
            _x(r["steady_loader_wait_share"])),
        row("augment + compute (the device busy), share", [percent_text(s.get("device_busy_share")) for s in stats],
            ""),
    ]  # fmt: skip
    for key, name in (("step_s", "step"), ("compute_s", "compute"), ("augment_s", "augment"),
                      ("loader_wait_s", "loader wait"), HOST_LAUNCH):  # fmt: skip
        if any(key not in s["stages"] for s in stats):  # host launch: timed on a GPU only
            continue
        cells = [f"{_ms(s['stages'][key]['p50_s'])} / {_ms(s['stages'][key]['p95_s'])}" for s in stats]
        base = key.removesuffix("_s")
        rows.append(row(f"{name} p50 / p95 (ms)", cells, f"{_x(r[f'{base}_p50'])} / {_x(r[f'{base}_p95'])}"))
    if all(s.get("host_vs_device_p50_s") for s in stats):
        cells = [" vs ".join(_ms(v) for v in s["host_vs_device_p50_s"]) for s in stats]
        rows.append(row("host (wait + launch) vs device (augment + compute) p50 (ms)", cells, ""))
        rows.append(row("host launch on the CPU p50 (ms)", [_ms(s["launch_cpu_p50_s"]) for s in stats], ""))
    for epoch, waits in enumerate(zip(*(s["first_batch_wait_s"] for s in stats), strict=True)):
        cells = [
            f"{_ms(w)} ({_x(s['first_batch_wait_vs_median'][epoch])} median)" for w, s in zip(waits, stats, strict=True)
        ]
        ratio = _x(waits[0] / waits[1] if both and waits[0] and waits[1] else None)
        rows.append(row(f"epoch {epoch + 1}, first batch's wait (ms)", cells, ratio))
    rows.append(row("median wait (ms)", [_ms(s["median_wait_s"]) for s in stats], ""))
    phases = [s.get("next_phases_p50_s", {}) for s in stats]
    if any(phases):
        cells = [" / ".join(f"{p[k] * 1e3:.2f}" for k in _PHASES) if p else "" for p in phases]
        rows.append(row("next(): DALI outputs / schedule / copies / loader p50 (ms)", cells, ""))
        cells = [" / ".join(f"{p[k] * 1e3:.2f}" for k in _CPU_PHASES) if p else "" for p in phases]
        rows.append(row("next(): on the CPU / held off (off the CPU, not in DALI's wait) p50 (ms)", cells, ""))
    per_epoch = [" | ".join(" ".join(map(str, e)) for e in s["samples_per_epoch"]) for s in stats]
    rows.append(row("samples per epoch (each round)", per_epoch, ""))
    return rows
