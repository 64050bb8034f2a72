"""``gpufeed reliability soak``: many clients for a long time against a real ``gpufeed serve``.

One ``gpufeed serve`` child process (:class:`~gpufeed.reliability._serve_proc.ServeProcess`), driven by
the closed-loop client of ``bench server`` (:mod:`gpufeed.bench._loadgen`): ``clients`` keep-alive
connections, each sending its next multipart JPEG as soon as the previous answer arrives. The
server's resident memory (VmRSS) is sampled every 0.5 s; growth is measured from the end of the
warm-up (allocator pools, onnxruntime arenas and DALI buffers have reached their working size by
then) to the end of the run, each end the median of its 2 s of samples. Afterwards the server must still be ready and exit 0 on SIGTERM.

What it checks (:class:`SoakReport`): zero errors, no request without an answer, RSS growth
under ``max_growth``, a clean exit. The figures (throughput, p50/p99, RSS) are printed, and drawn
by ``--plot``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.bench import run_load
from gpufeed.core import Check, progress_bar
from gpufeed.models import read_model_card
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.reliability._server_runs import ServerRunReport, exit_check

__all__ = ["SoakReport", "run_soak"]

MIB = 1024 * 1024


def _sample_rss(server, samples: list, stop: threading.Event, t0: float, every_s: float, bar) -> None:
    while not stop.is_set():
        try:
            samples.append((time.perf_counter() - t0, server.rss_bytes()))
        except (OSError, RuntimeError):  # the process is gone: the run reports it
            return
        if bar is not None:
            bar.n = min(bar.total, int(time.perf_counter() - t0))
            bar.refresh()
        stop.wait(every_s)


def run_soak(
    model_dir: Path,
    images: list[bytes],
    *,
    clients: int = 64,
    seconds: float = 60.0,
    warmup_s: float = 10.0,
    overrides: tuple[str, ...] = (),
    device: str = "cpu",
    sample_every_s: float = 0.5,
    progress: bool = True,
    max_growth: float = 0.10,
) -> SoakReport:
    """Serve ``model_dir``, drive it with ``clients`` connections for ``warmup_s + seconds``.

    Returns:
        The figures, judged with ``max_growth`` as the largest RSS growth that passes.
    """
    import httpx

    card = read_model_card(model_dir)
    path = f"/v1/models/{card.name}/predict"
    samples: list[tuple[float, int]] = []
    with ServeProcess(model_dir, overrides, device=device) as server:
        rss_start = server.rss_bytes()
        stop = threading.Event()
        total = round(warmup_s + seconds)
        bar = progress_bar(total=total, desc=f"soak: {clients} clients", unit="s", leave=False) if progress else None
        t0 = time.perf_counter()
        sampler = threading.Thread(
            target=_sample_rss, args=(server, samples, stop, t0, sample_every_s, bar), daemon=True
        )
        sampler.start()
        try:
            result = run_load(
                server.host, server.port, path, images, concurrency=clients, seconds=seconds, warmup_s=warmup_s
            )
        finally:
            stop.set()
            sampler.join(10)
            if bar is not None:
                bar.close()
        samples.append((time.perf_counter() - t0, server.rss_bytes()))
        ready_after = httpx.get(server.url + "/v2/health/ready", timeout=10).status_code
    exit_status = server.exit_status
    # Medians over 2 s at each end, so one sample taken mid-batch does not decide the growth.
    warm = int(np.median([rss for t, rss in samples if warmup_s <= t <= warmup_s + 2.0] or [samples[-1][1]]))
    end = int(np.median([rss for t, rss in samples if t >= samples[-1][0] - 2.0]))
    per_second = np.bincount(np.floor(result.done_s).astype(int), minlength=int(seconds))[: int(seconds)]
    figures = {
        "benchmark": "soak",
        "model": {
            "name": card.name,
            "architecture": card.spec.name,
            "size_px": card.spec.size_px.label,
            "batch_size": card.batch_size,
        },
        "image_bytes_median": int(np.median([len(b) for b in images])),
        "clients": clients,
        "seconds": seconds,
        "warmup_seconds": warmup_s,
        "device": device,
        "load": result.to_dict(),
        "max_latency_ms": max(result.latencies_s, default=float("nan")) * 1000,
        "rss_mib": {
            "at_start": rss_start / MIB,
            "after_warmup": warm / MIB,
            "at_end": end / MIB,
            "peak": max(r for _, r in samples) / MIB,
        },
        "rss_growth": end / warm - 1.0,
        "ready_after": ready_after,
        "exit_status": exit_status,
        "rss_samples": [(round(t, 2), r / MIB) for t, r in samples],
        "throughput_per_second": per_second.tolist(),
    }
    return SoakReport(figures, max_growth)


@dataclass
class SoakReport(ServerRunReport):
    """A soak run's figures; it passes with no error, every request answered, RSS growth under
    ``max_growth``, the server ready afterwards and exiting 0 on SIGTERM."""

    max_growth: float = 0.10

    def checks(self) -> list[Check]:
        result, load, rss = self.figures, self.figures["load"], self.figures["rss_mib"]
        growth = result["rss_growth"]
        return [
            Check("a request succeeded", load["ok"] > 0, "no request succeeded"),
            Check(
                "no errors",
                not load["errors"],
                f"{load['errors']} error(s): statuses {load['statuses']}, reasons {load['reasons']}",
            ),
            Check("every request answered", not load["no_answer"], f"{load['no_answer']} request(s) got no answer"),
            Check(
                "RSS growth under max_growth",
                growth < self.max_growth,
                f"RSS grew {growth:.1%} (>= {self.max_growth:.0%}): {rss['after_warmup']:.0f} -> {rss['at_end']:.0f} MiB",
            ),
            Check(
                "ready after the run",
                result["ready_after"] == 200,
                f"not ready after the run ({result['ready_after']})",
            ),
            exit_check(result["exit_status"]),
        ]

    def lines(self) -> list[str]:
        result = self.figures
        load, rss, model = result["load"], result["rss_mib"], result["model"]
        return [
            f"\nsoak: {result['clients']} clients x {result['seconds']:g} s (after {result['warmup_seconds']:g} s "
            f"warm-up) against gpufeed serve, {model['architecture']} {model['size_px']} px batch "
            f"{model['batch_size']} on {result['device']}, multipart JPEGs (median "
            f"{result['image_bytes_median'] / 1024:.0f} KiB)",
            f"  requests: {load['ok']:,} ok, {load['errors']} errors, {load['no_answer']} unanswered; "
            f"throughput {load['throughput_rps']:,.1f} req/s; latency p50 {load['p50_ms']:,.1f} ms, "
            f"p99 {load['p99_ms']:,.1f} ms, max {result['max_latency_ms']:,.1f} ms",
            f"  server RSS: {rss['at_start']:.0f} MiB at start, {rss['after_warmup']:.0f} MiB after warm-up, "
            f"{rss['at_end']:.0f} MiB at the end (growth {result['rss_growth']:+.1%}), peak {rss['peak']:.0f} MiB",
            f"  after: ready {result['ready_after']}, exit status on SIGTERM {result['exit_status']}",
        ]


def plot_soak(result: dict, path: Path) -> Path:
    """Throughput per second and server RSS over the run, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    warm = result["warmup_seconds"]
    per_second = result["throughput_per_second"]
    top.plot([warm + k + 0.5 for k in range(len(per_second))], per_second, marker=".")
    top.set_ylabel("answers / s")
    top.set_title(f"gpufeed serve, {result['clients']} clients: throughput and memory")
    t, rss = zip(*result["rss_samples"], strict=True)
    bottom.plot(t, rss)
    bottom.set_ylabel("server RSS (MiB)")
    bottom.set_xlabel("seconds since the load started")
    for ax in (top, bottom):
        ax.axvspan(0, warm, color="grey", alpha=0.15, label="warm-up")
        ax.grid(alpha=0.3)
    bottom.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
