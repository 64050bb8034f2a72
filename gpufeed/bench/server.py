"""``gpufeed bench server``: gpufeed's server against the servers people write instead.

Contenders, each its own process on a loopback port, all serving the same checkpoint:

* ``gpufeed``: ``gpufeed serve`` (validation, dynamic batching at the export's batch sizes 1, 2,
  4, .. N, DALI decode, onnxruntime), REST ``POST /v1/models/{name}/predict``; with ``protocol
  "grpc"`` (``--protocol grpc``), KServe v2 ``ModelInfer`` over gRPC instead (the other
  contenders have no gRPC and stay on HTTP);
* ``plain``: FastAPI + PIL + onnxruntime, one inference per request (batch-1 export);
* ``litserve``: LitServe with dynamic batching (``max_batch_size`` N, the same max delay, the
  symbolic-batch export run at whatever batch forms).

One closed-loop client (:mod:`gpufeed.bench._loadgen`) sends the same photo-like JPEGs as
multipart uploads at each concurrency of the sweep; contenders take turns point by point (order
rotated each round), so a noisy neighbour hits all of them alike. Reported per point: throughput
(answers/s), p50 and p99 latency, the server's CPU time per answered request (its processes' user +
system time: the figure a noisy, shared machine disturbs least), errors, and throughput ratios against
``plain``; then the batch sizes gpufeed ran at per concurrency, read from its own metrics, and
verdicts on the speed targets (:mod:`gpufeed.bench._server_report`).
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.bench._common import machine_facts, median
from gpufeed.bench._loadgen import run_load
from gpufeed.bench._loadgen_grpc import run_grpc_load
from gpufeed.bench._perf_analyzer import perf_analyzer_points
from gpufeed.bench._server_report import batch_usage, print_batch_usage, print_verdicts, scrape_batch_rows, verdicts
from gpufeed.core import SizePx, format_table, module_argv, progress_bar
from gpufeed.device import resolve_device
from gpufeed.models import default_batch_sizes, export_model, read_model_card, untrained_checkpoint

__all__ = [
    "CONTENDERS",
    "LOADGENS",
    "export_bench_models",
    "plot_server_results",
    "print_server_result",
    "run_server_bench",
]

CONTENDERS = ("gpufeed", "plain", "litserve")
LOADGENS = ("gpufeed", "perf_analyzer")
_MODEL_NAME = "bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, name: str, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with status {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{name} was not ready at {url} within {timeout:g} s")


def _start(name: str, models: dict[str, Path], port: int, max_delay_ms: float, device: str, grpc_port=None):
    """Start one contender; return (process, request path)."""
    if name == "gpufeed":
        cmd = [
            *module_argv("gpufeed"), "serve", "--model", str(models["batched"]), "--port", str(port),
            "--set", f"device={device}", "--set", f"serve.max_delay_ms={max_delay_ms}",
            "--set", "serve.queue_capacity=1024",
        ]  # fmt: skip
        if grpc_port is not None:
            cmd += ["--grpc-port", str(grpc_port)]
        path, ready = f"/v1/models/{_MODEL_NAME}/predict", "/v2/health/ready"
    elif name == "plain":
        cmd = [
            *module_argv("gpufeed.bench.peers.plain"), "--model-dir", str(models["single"]), "--port", str(port),
            "--device", device,
        ]  # fmt: skip
        path, ready = "/predict", "/health"
    elif name == "litserve":
        cmd = [
            *module_argv("gpufeed.bench.peers.litserve_peer"), "--model-dir", str(models["batched"]),
            "--port", str(port), "--max-delay-ms", str(max_delay_ms), "--device", device,
        ]  # fmt: skip
        path, ready = "/predict", "/health"
    else:
        raise ValueError(f"contender {name!r} is not known; known: {', '.join(CONTENDERS)}")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}{ready}", name)
    except RuntimeError as err:
        proc.kill()
        _, stderr = proc.communicate(timeout=10)  # stderr is a pipe (Popen above): bytes
        raise RuntimeError(f"{err}: {stderr.decode(errors='replace')[-2000:]}") from None
    return proc, path


def session_cpu_seconds(session_id: int) -> float:
    """CPU time (user + system) of every live process in a session: a contender and its workers."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[3]) == session_id:  # fields after the name: state, ppid, pgrp, session, ...
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def export_bench_models(
    cache: Path,
    architecture: str,
    size_px: SizePx,
    batch_size: int,
    checkpoint: Path | None,
    batch_sizes: tuple[int, ...] | None = None,
) -> dict:
    """One checkpoint exported twice, cached: ``batched`` at ``batch_sizes`` (default: the powers of two
    up to ``batch_size``; gpufeed and LitServe) and ``single`` at 1 (the plain server)."""
    sizes = tuple(batch_sizes or default_batch_sizes(batch_size))
    source = (
        "untrained" if checkpoint is None else hashlib.sha256(str(Path(checkpoint).resolve()).encode()).hexdigest()[:12]
    )
    root = cache / "server-models" / f"{architecture}-{size_px.label}px-{source}"
    if checkpoint is None:
        classes = tuple(f"class_{i}" for i in range(10))
        checkpoint = untrained_checkpoint(root, classes, size_px, architecture)
    wanted = {"batched": sizes, "single": (1,)}
    models = {key: root / ("n" + "-".join(map(str, s))) / _MODEL_NAME for key, s in wanted.items()}
    for key, s in wanted.items():
        try:
            read_model_card(models[key])
        except ValueError:
            export_model(checkpoint, models[key], batch_sizes=s)
    return models


@dataclass(frozen=True)
class _Load:
    """How every point of the sweep is driven, and what is read around it."""

    images: list[bytes]
    seconds: float
    warmup_s: float
    grpc_port: int | None  # gpufeed driven over gRPC on this port; None: every contender over HTTP
    sizes: tuple[int, ...]  # the batch sizes gpufeed runs at, for its batch usage

    def point(self, name: str, proc: subprocess.Popen, port: int, path: str, concurrency: int) -> tuple:
        """One contender at one concurrency: (load result, server CPU ms per answer, gpufeed's batch usage)."""
        rows_before = scrape_batch_rows(port, _MODEL_NAME) if name == "gpufeed" else None
        cpu_before = session_cpu_seconds(proc.pid)
        timing: dict[str, Any] = {"concurrency": concurrency, "seconds": self.seconds, "warmup_s": self.warmup_s}
        if name == "gpufeed" and self.grpc_port is not None:
            result = run_grpc_load("127.0.0.1", self.grpc_port, _MODEL_NAME, self.images, **timing)
        else:
            result = run_load("127.0.0.1", port, path, self.images, **timing)
        cpu_ms = 1000 * (session_cpu_seconds(proc.pid) - cpu_before) / max(1, result.answered)
        usage = None
        if rows_before is not None:
            usage = batch_usage(rows_before, scrape_batch_rows(port, _MODEL_NAME), self.sizes)
        return result, cpu_ms, usage


def _sweep(
    load: _Load, running: dict, contenders: tuple[str, ...], concurrency: tuple[int, ...], rounds: int, desc: str
):
    """Every contender at every concurrency, ``rounds`` times; the order of the contenders rotates each round."""
    points: dict[str, dict[int, list]] = {n: {c: [] for c in concurrency} for n in contenders}
    steps = rounds * len(concurrency) * len(contenders)
    with progress_bar(total=steps, desc=desc, unit="point", leave=False) as bar:
        for r in range(rounds):
            for c in concurrency:
                for name in list(contenders[r % len(contenders) :] + contenders[: r % len(contenders)]):
                    proc, port, path = running[name]
                    points[name][c].append(load.point(name, proc, port, path, c))
                    bar.update(1)
    return points


def _point_figures(point_runs: list[tuple], sizes: tuple[int, ...]) -> dict[str, Any]:
    """One contender's figures at one concurrency, over its rounds (see the module docs)."""
    runs = [run for run, _, _ in point_runs]
    latencies = [x for run in runs for x in run.latencies_s]
    figures: dict[str, Any] = {
        "throughput_rps": median([run.throughput for run in runs]),
        "server_cpu_ms_per_request": median([cpu for _, cpu, _ in point_runs]),
        "p50_ms": float(np.percentile(latencies, 50) * 1000) if latencies else float("nan"),
        "p99_ms": float(np.percentile(latencies, 99) * 1000) if latencies else float("nan"),
        "errors": sum(run.errors for run in runs),
        "rounds": [run.to_dict() for run in runs],
    }
    usages = [u for _, _, u in point_runs if u is not None]
    if usages:  # every round together: batches at each size, mean real rows per batch
        batches = sum(u["batches"] for u in usages)
        figures["batch_usage"] = {
            "batches": batches,
            "mean_rows": sum(u["mean_rows"] * u["batches"] for u in usages if u["batches"]) / max(1, batches),
            "by_size": {str(n): sum(u["by_size"][str(n)] for u in usages) for n in sizes},
        }
    return figures


def run_server_bench(
    *,
    architecture: str,
    images: list[bytes],
    cache: Path,
    size_px: SizePx = SizePx(224, 224),
    batch_size: int = 8,
    concurrency: tuple[int, ...] = (1, 8, 32, 64),
    seconds: float = 8.0,
    warmup_s: float = 2.0,
    rounds: int = 1,
    max_delay_ms: float = 5.0,
    contenders: tuple[str, ...] = CONTENDERS,
    device: str = "auto",
    checkpoint: Path | None = None,
    protocol: str = "rest",
    loadgen: str = "gpufeed",
) -> dict:
    """Measure every contender at every concurrency; return the figures (see module docs).

    ``protocol``: how the ``gpufeed`` contender is driven, ``"rest"`` (multipart uploads to the
    REST endpoint) or ``"grpc"`` (KServe v2 ``ModelInfer`` with raw bytes, on its ``--grpc-port``).
    ``loadgen``: ``"perf_analyzer"`` also drives the ``gpufeed`` contender with Triton's
    perf_analyzer (KServe v2 over HTTP, or gRPC with ``protocol="grpc"``) at every concurrency,
    with the same JPEGs, after the sweep: figures comparable with anyone's Triton numbers.
    """
    if protocol not in ("rest", "grpc"):
        raise ValueError(f"protocol {protocol!r} is not known; known: rest, grpc")
    if loadgen not in LOADGENS:
        raise ValueError(f"loadgen {loadgen!r} is not known; known: {', '.join(LOADGENS)}")

    choice = resolve_device(device)
    models = export_bench_models(cache, architecture, size_px, batch_size, checkpoint)
    sizes = read_model_card(models["batched"]).batch_sizes
    running = {}
    try:
        grpc_port = _free_port() if protocol == "grpc" else None
        for name in contenders:
            port = _free_port()
            extra = grpc_port if name == "gpufeed" else None
            proc, path = _start(name, models, port, max_delay_ms, "gpu" if choice.is_gpu else "cpu", extra)
            running[name] = (proc, port, path)
        load = _Load(images, seconds, warmup_s, grpc_port, sizes)
        points = _sweep(load, running, contenders, concurrency, rounds, f"bench server {architecture}")
        analyzer = None
        if loadgen == "perf_analyzer" and "gpufeed" in running:
            port = running["gpufeed"][1]
            url = f"127.0.0.1:{grpc_port}" if grpc_port is not None else f"127.0.0.1:{port}"
            analyzer = perf_analyzer_points(
                cache, url, "grpc" if grpc_port is not None else "http", _MODEL_NAME, images, concurrency
            )
    finally:
        for proc, _, _ in running.values():
            _stop(proc)
    document: dict[str, Any] = {
        "benchmark": "server",
        "architecture": architecture,
        "size_px": size_px,
        "batch_size": batch_size,
        "batch_sizes": list(sizes),
        "max_delay_ms": max_delay_ms,
        "images": len(images),
        "seconds_per_point": seconds,
        "warmup_seconds": warmup_s,
        "rounds": rounds,
        "concurrency": list(concurrency),
        "contenders": list(contenders),
        "protocol": protocol,
        "loadgen": loadgen,
        "perf_analyzer": analyzer,
        "results": {n: {str(c): _point_figures(points[n][c], sizes) for c in concurrency} for n in contenders},
        "machine": machine_facts(choice),
    }
    document["targets"] = verdicts(document)
    return document


def print_server_result(result: dict) -> None:
    contenders, results = result["contenders"], result["results"]
    print(
        f"\nserver benchmark: {result['architecture']} at {result['size_px'].label} px, batch sizes "
        f"{', '.join(map(str, result.get('batch_sizes') or [result['batch_size']]))}, "
        f"max delay {result['max_delay_ms']:g} ms, {result['images']} JPEGs, {result['seconds_per_point']:g} s per point "
        f"x {result['rounds']} round(s), {result['machine']['device']}"
    )
    rows = []
    for c in result["concurrency"]:
        base = results.get("plain", {}).get(str(c), {}).get("throughput_rps")
        for name in contenders:
            point = results[name][str(c)]
            ratio = f"{point['throughput_rps'] / base:.2f}x" if base else "-"
            cpu = f"{point['server_cpu_ms_per_request']:.2f}"
            rows.append(
                [c, name, point["throughput_rps"], point["p50_ms"], point["p99_ms"], cpu, point["errors"], ratio]
            )
    headers = ["clients", "server", "req/s", "p50 ms", "p99 ms", "server CPU ms/req", "errors", "req/s vs plain"]
    print(format_table(headers, rows))
    print(
        "server CPU ms/req: CPU time of the server's processes per answered request, the figure that shared or "
        "noisy machines disturb least (cores / CPU per request bounds a CPU-bound server's throughput)"
    )
    print_batch_usage(result)
    print_verdicts(result)


def plot_server_results(results: list[dict], path: Path) -> Path:
    """Throughput, p99 and server CPU per request against concurrency, one column per model, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(results), figsize=(5.5 * len(results), 10), squeeze=False)
    for col, result in enumerate(results):
        xs = result["concurrency"]
        for name in result["contenders"]:
            points = [result["results"][name][str(c)] for c in xs]
            axes[0, col].plot(xs, [p["throughput_rps"] for p in points], marker="o", label=name)
            axes[1, col].plot(xs, [p["p99_ms"] for p in points], marker="o", label=name)
            axes[2, col].plot(xs, [p["server_cpu_ms_per_request"] for p in points], marker="o", label=name)
        axes[0, col].set_title(f"{result['architecture']} {result['size_px'].label}px, N={result['batch_size']}")
        axes[0, col].set_ylabel("requests/s")
        axes[1, col].set_ylabel("p99 latency (ms)")
        axes[1, col].set_yscale("log")
        axes[2, col].set_ylabel("server CPU ms per request")
        axes[2, col].set_yscale("log")
        for row in range(3):
            axes[row, col].set_xscale("log", base=2)
            axes[row, col].set_xlabel("concurrent clients")
            axes[row, col].grid(alpha=0.3)
            axes[row, col].legend()
    fig.suptitle(f"gpufeed bench server on {results[0]['machine']['device']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
