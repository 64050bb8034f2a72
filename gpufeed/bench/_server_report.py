"""What ``gpufeed bench server`` adds to its table: the batch sizes gpufeed ran at, and verdicts on the targets.

**Batch sizes.** Before and after each gpufeed point the benchmark reads the server's own
``gpufeed_server_batch_size`` histogram (real rows per executed batch, buckets 1..N) from
``/metrics``; the difference says how many batches of each row count that point ran, and so at
which of the model's batch sizes (the smallest that holds the rows).

**Targets.** Throughput ratios against the plain FastAPI + PIL + onnxruntime server, measured in the
same run; some also ask for a lower p99 than the plain server's. A verdict is MET or MISSED per
target whose concurrency was measured on the target's kind of device; the others are listed as not
measured. Timings are never asserted in tests: these verdicts are figures to read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from gpufeed.core import format_table

__all__ = ["TARGETS", "Target", "batch_usage", "print_batch_usage", "print_verdicts", "scrape_batch_rows", "verdicts"]


@dataclass(frozen=True)
class Target:
    """``gpufeed`` at ``clients`` answers at least ``min_ratio`` times the plain server's requests/s."""

    device: str  # "cpu" or "gpu"
    architecture: str
    clients: int
    min_ratio: float
    lower_p99: bool = False  # also a lower p99 latency than the plain server's
    p50_no_worse: bool = False  # also a p50 latency no higher than the plain server's


# Issue #22's targets: at one client as fast as a plain onnxruntime server (the lone request gets
# every core), under load faster with a lower tail.
TARGETS = (
    Target("cpu", "resnet18", 1, 1.0, p50_no_worse=True),
    Target("cpu", "resnet18", 32, 1.1, lower_p99=True),
    Target("cpu", "smallcnn", 1, 1.0),
    Target("cpu", "smallcnn", 32, 1.5),
    Target("gpu", "resnet18", 32, 5.0),
)


def scrape_batch_rows(port: int, model: str, host: str = "127.0.0.1") -> dict[float, float]:
    """Cumulative batch counts by row bound (``le``) of ``gpufeed_server_batch_size`` for ``model``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://{host}:{port}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpufeed_server_batch_size_bucket" and sample.labels.get("model") == model:
                out[float(sample.labels["le"])] = sample.value
    return out


def batch_usage(before: dict[float, float], after: dict[float, float], batch_sizes: tuple[int, ...]) -> dict:
    """Batches run between two scrapes: how many at each batch size, and their mean real rows.

    Returns:
        ``{"batches": int, "mean_rows": float, "by_size": {"n": batches}}``.
    """
    bounds = sorted(b for b in after if b != float("inf"))
    per_rows, previous = {}, 0.0
    for bound in bounds:  # from cumulative counts to batches holding exactly `bound` rows
        cumulative = after[bound] - before.get(bound, 0.0)
        per_rows[int(bound)] = cumulative - previous
        previous = cumulative
    by_size = {str(n): 0 for n in batch_sizes}
    for rows, count in per_rows.items():
        if count and 1 <= rows <= batch_sizes[-1]:
            by_size[str(batch_sizes[bisect.bisect_left(batch_sizes, rows)])] += int(count)
    total = sum(per_rows.values())
    mean = sum(rows * count for rows, count in per_rows.items()) / total if total else float("nan")
    return {"batches": int(total), "mean_rows": mean, "by_size": by_size}


def print_batch_usage(result: dict) -> None:
    """One row per concurrency: gpufeed's batches and the share run at each batch size."""
    points = result["results"].get("gpufeed", {})
    sizes = result.get("batch_sizes") or []
    if not points or not sizes or not all("batch_usage" in p for p in points.values()):
        return
    rows = []
    for c in result["concurrency"]:
        usage = points[str(c)]["batch_usage"]
        total = max(1, usage["batches"])
        shares = [f"{100 * usage['by_size'][str(n)] / total:.0f}%" for n in sizes]
        rows.append([c, usage["batches"], usage["mean_rows"], *shares])
    print(f"\ngpufeed's batches by the batch size they ran at (its /metrics; sizes {', '.join(map(str, sizes))}):")
    print(format_table(["clients", "batches", "mean rows", *(f"at {n}" for n in sizes)], rows))


def verdicts(result: dict) -> list[dict]:
    """The targets for this run's model and device, each with its figures and MET / MISSED / not measured."""
    device = "gpu" if result["machine"].get("gpu") else "cpu"
    results = result["results"]
    out = []
    for target in TARGETS:
        if target.architecture != result["architecture"]:
            continue
        entry = {"target": target.__dict__.copy(), "verdict": "not measured", "ratio": None}
        point, base = (
            results.get("gpufeed", {}).get(str(target.clients)),
            results.get("plain", {}).get(str(target.clients)),
        )
        if target.device == device and point and base and base["throughput_rps"] > 0:
            ratio = point["throughput_rps"] / base["throughput_rps"]
            met = (
                ratio >= target.min_ratio
                and (not target.lower_p99 or point["p99_ms"] < base["p99_ms"])
                and (not target.p50_no_worse or point["p50_ms"] <= base["p50_ms"])
            )
            entry.update(
                ratio=ratio,
                gpufeed_p50_ms=point["p50_ms"],
                plain_p50_ms=base["p50_ms"],
                gpufeed_p99_ms=point["p99_ms"],
                plain_p99_ms=base["p99_ms"],
                verdict="MET" if met else "MISSED",
            )
        out.append(entry)
    return out


def print_verdicts(result: dict) -> None:
    entries = verdicts(result)
    if not entries:
        return
    print(f"\ntargets for {result['architecture']} (ratios against the plain server, this run):")
    for e in entries:
        t = e["target"]
        want = f">= {t['min_ratio']:g}x" + (" with a lower p99" if t["lower_p99"] else "")
        want += " and a p50 no higher" if t["p50_no_worse"] else ""
        where = f"{t['device'].upper()}, {t['clients']} client{'s' if t['clients'] > 1 else ''}"
        if e["ratio"] is None:
            print(f"  {where}: {want}: not measured in this run")
            continue
        p99 = f", p99 {e['gpufeed_p99_ms']:,.0f} vs {e['plain_p99_ms']:,.0f} ms" if t["lower_p99"] else ""
        p99 += f", p50 {e['gpufeed_p50_ms']:,.1f} vs {e['plain_p50_ms']:,.1f} ms" if t["p50_no_worse"] else ""
        print(f"  {where}: {e['ratio']:.2f}x{p99} ({want}): {e['verdict']}")
