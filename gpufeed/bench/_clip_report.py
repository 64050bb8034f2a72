"""The figures of ``gpufeed bench clips``: per set and reader, the paired ratios, the targets.

Clips/s is over the whole round, each reader's start-up included (processes, pipelines,
decoders, index scans: see :mod:`gpufeed.bench._clip_rounds`); ``steady`` leaves the first wave of
batches out (one per worker process), and ``start-up`` is the time to the first batch. Ratios are medians of per-round ratios.
``CPU ms/clip`` is the CPU time a round's processes used per clip (the reader's workers and this
process, start-up included): on a machine others share, the load moves clips/s from round to round
far more than it moves the CPU a reader spends on a clip.
"""

from __future__ import annotations

from typing import Any

from gpufeed.bench._clip_names import STORE_SETS
from gpufeed.bench._clip_rounds import RoundTime, paired_ratio
from gpufeed.bench._common import median
from gpufeed.core import format_table

__all__ = ["DEEPETHOGRAM_FRAMES_PER_SECOND", "print_clip_result", "summarise"]

DEEPETHOGRAM_FRAMES_PER_SECOND = 1200  # the loading rate DeepEthogram's authors say training needs
_SEEK_MODES = ("torchcodec_exact", "torchcodec_approximate")
_VS_TORCHCODEC = 1.2  # target: gpufeed >= 1.2x torchcodec's best seek mode
_STORES_VS_LONG_GOP = 2.0  # target: frame stores >= 2x the long-GOP clips/s


def _finite_median(values: list[float]) -> float:
    return median([v for v in values if v == v])


def _set_figures(bench_set, times: dict[str, list[RoundTime]], exact: dict, clip_length: int) -> dict:
    cps = {c: median([t.clips_per_second for t in ts]) for c, ts in times.items()}
    return {
        "videos": len(bench_set.dataset.paths),
        "frames_per_video": int(bench_set.dataset.infos[0].num_frames),
        "gop_frames": float(bench_set.dataset.infos[0].gop_frames),
        "disk_bytes_per_frame": bench_set.disk_bytes_per_frame(),
        "decoder": f"{bench_set.loader.source} ({bench_set.loader.decoder_reason})",
        "clips_per_second": cps,
        "steady_clips_per_second": {
            c: _finite_median([t.steady_clips_per_second for t in ts]) for c, ts in times.items()
        },
        "startup_s": {c: median([t.first_batch_s for t in ts]) for c, ts in times.items()},
        "cpu_ms_per_clip": {c: _finite_median([t.cpu_ms_per_clip for t in ts]) for c, ts in times.items()},
        "frames_per_second": {c: v * clip_length for c, v in cps.items()},
        "clips_per_second_rounds": {c: [t.clips_per_second for t in ts] for c, ts in times.items()},
        "exact_share": exact,
    }


def _ratios(times: dict[str, dict[str, list[RoundTime]]]) -> dict[str, float]:
    ratios = {}
    for name, by_reader in times.items():
        if "gpufeed" not in by_reader:
            continue
        ours = [t.clips_per_second for t in by_reader["gpufeed"]]
        ours_steady = [t.steady_clips_per_second for t in by_reader["gpufeed"]]
        for other, theirs in by_reader.items():
            if other != "gpufeed":
                ratios[f"gpufeed / {other} ({name})"] = paired_ratio(ours, [t.clips_per_second for t in theirs])
                steady = [t.steady_clips_per_second for t in theirs]
                ratios[f"gpufeed / {other} ({name}, steady)"] = paired_ratio(ours_steady, steady)
                cpu = paired_ratio(
                    [t.cpu_ms_per_clip for t in theirs], [t.cpu_ms_per_clip for t in by_reader["gpufeed"]]
                )
                if cpu == cpu:  # measured
                    ratios[f"{other} / gpufeed, CPU per clip ({name})"] = cpu
    long_gop = times.get("long_gop", {}).get("gpufeed")
    for name in ("prepared", "frame_folder", "hdf5"):
        if long_gop and "gpufeed" in times.get(name, {}):
            ratios[f"gpufeed {name} / long_gop"] = paired_ratio(
                [t.clips_per_second for t in times[name]["gpufeed"]], [t.clips_per_second for t in long_gop]
            )
    return ratios


def _versus(result: dict, name: str, other: str, target: float) -> str:
    """``round Rx, steady Sx, target >= T: met`` (met when both are)."""
    ratio = result["ratios"][f"gpufeed / {other} ({name})"]
    steady = result["ratios"][f"gpufeed / {other} ({name}, steady)"]
    met = ratio >= target and steady >= target
    return f"round {ratio:.2f}x, steady {steady:.2f}x, target >= {target:g}x: {'met' if met else 'NOT met'}"


def _targets(result: dict) -> list[str]:
    """One line per target of issue #36 that this run's sets can answer: the figures, met or not."""
    lines = []
    for name, figures in result["sets"].items():
        cps = figures["clips_per_second"]
        modes = [m for m in _SEEK_MODES if m in cps]
        exact = figures["exact_share"]
        if "gpufeed" in cps and modes:
            best = max(modes, key=lambda m: cps[m])
            both = f"exact clips {_share(exact.get('gpufeed'))} / {_share(exact.get(best))}"
            lines.append(
                f"{name}: gpufeed / torchcodec's best seek mode ({best}): {_versus(result, name, best, _VS_TORCHCODEC)}; {both}"
            )
        if "gpufeed" in cps and "torchcodec_sampler" in cps:
            lines.append(
                f"{name}: gpufeed / torchcodec's sampler per clip: {_versus(result, name, 'torchcodec_sampler', 1.0)}"
            )
        if name in STORE_SETS and "gpufeed" in cps:
            ratio = result["ratios"].get(f"gpufeed {name} / long_gop")
            if ratio is not None:
                met = "met" if ratio >= _STORES_VS_LONG_GOP else "NOT met"
                lines.append(f"{name}: {ratio:.2f}x the long-GOP clips/s, target >= {_STORES_VS_LONG_GOP}x: {met}")
            fps = figures["frames_per_second"]["gpufeed"]
            met = "met" if fps >= DEEPETHOGRAM_FRAMES_PER_SECOND else "NOT met"
            lines.append(f"{name}: {fps:,.0f} frames/s, target >= {DEEPETHOGRAM_FRAMES_PER_SECOND:,}: {met}")
    return lines


def summarise(settings: dict, bench_sets: list, times: dict, exact: dict, stores: dict) -> dict:
    """The result dict of ``run_clip_bench``: settings, per-set figures, ratios, targets."""
    result: dict[str, Any] = {"benchmark": "clips", **settings, "sets": {}}
    for bench_set in bench_sets:
        figures = _set_figures(
            bench_set, times.get(bench_set.name, {}), exact[bench_set.name], settings["clip_length_frames"]
        )
        if bench_set.name in stores:
            figures["store"] = stores[bench_set.name]
        result["sets"][bench_set.name] = figures
    result["ratios"] = _ratios(times)
    result["frames_per_second_vs_deepethogram_need"] = {
        name: figures["frames_per_second"]["gpufeed"] / DEEPETHOGRAM_FRAMES_PER_SECOND
        for name, figures in result["sets"].items()
        if "gpufeed" in figures["frames_per_second"]
    }
    result["targets"] = _targets(result)
    return result


def _number(value: float) -> str | float:
    return "n/a" if value != value else value


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def print_clip_result(result: dict) -> None:
    """The run as text: settings and machine, the table, store figures, ratios, targets."""
    loads = ", ".join(f"{v:.1f}" for v in result["machine"]["load_average_1min"])
    print(
        f"clip benchmark ({result['data']}): {result['clip_length_frames']}-frame clips (stride {result['stride_frames']}) "
        f"resized to {result['width_px']}x{result['height_px']}px, batch {result['batch_size']}, {result['workers']} "
        f"processes each, {result['rounds']} rounds of {result['clips_per_round']} clips, {result['machine']['device']}, "
        f"{result['machine']['cpu_cores']} cores, load average (1 min) before and after each round: {loads}"
    )
    rows = []
    for name, figures in result["sets"].items():
        for reader, cps in figures["clips_per_second"].items():
            rows.append([
                name, f"{figures['gop_frames']:.0f}", f"{figures['disk_bytes_per_frame'] / 1000:.1f}", reader, cps,
                _number(figures["steady_clips_per_second"][reader]), f"{figures['startup_s'][reader]:.2f}",
                _number(figures.get("cpu_ms_per_clip", {}).get(reader, float("nan"))),
                figures["frames_per_second"][reader], _share(figures["exact_share"].get(reader)),
            ])  # fmt: skip
    headers = [
        "set",
        "GOP",
        "kB/frame on disk",
        "reader",
        "clips/s",
        "steady clips/s",
        "start-up s",
        "CPU ms/clip",
        "frames/s",
        "exact clips",
    ]
    print(format_table(headers, rows))
    print("torchcodec_sampler reads its own random clips (clips_at_random_indices, "
          f"{result['sampler_clips_per_call']} per call on one video); every other reader the same clips.")  # fmt: skip
    for name, figures in result["sets"].items():
        store = figures.get("store")
        if store:
            print(
                f"{name}: {store['bytes_read_per_frame'] / 1000:.1f} kB read per frame, {store['decode_ms_per_frame']:.2f} ms "
                f"decode per frame (one core, {store['decode']}); fast IDCT (video.jpeg_idct: fast) would be "
                f"{store['fast_idct_ms_per_frame']:.2f} ms, off by mean {store['fast_idct_mean_levels']:.2f} / max "
                f"{store['fast_idct_max_levels']} levels from the exact decode"
            )
    for name, why in {**result["unavailable"], **result["left_out"]}.items():
        print(f"{name}: {why}")
    print("ratios (median of per-round ratios; rounds interleave every reader and set):")
    for name, value in result["ratios"].items():
        print(f"  {name}: {value:.2f}x")
    for name, share in result["frames_per_second_vs_deepethogram_need"].items():
        fps = result["sets"][name]["frames_per_second"]["gpufeed"]
        print(
            f"gpufeed on {name}: {fps:,.0f} frames/s, {share:.2f}x DeepEthogram's stated need of {DEEPETHOGRAM_FRAMES_PER_SECOND:,}"
        )
    for line in result["targets"]:
        print(f"target: {line}")
