"""A live trainer and server on the synthetic data, scraped by a real Prometheus (test helper).

Started through the public CLI, exactly as the contracts describe:
``gpufeed train --config CFG --out RUN`` with ``telemetry.metrics_port: 0`` (its address read
from ``RUN/metrics-rank0.addr``), ``gpufeed export`` of a checkpoint, ``gpufeed serve
--model-repo REPO --port P``, and Prometheus with the stack's rules and job names. A traffic
thread keeps sending good and bad requests (REST and KServe v2 through tritonclient) so every
serving series, error counters included, exists and moves.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpufeed.obs import LocalPrometheus
from gpufeed.obs._prometheus import free_port
from gpufeed.obs._watch import stack_prometheus

MODEL_NAME = "smallcnn"
SIZE_PX = 32
# Names a request may put in the URL that must never become label values.
FOREIGN_MODEL = "no-such-model-7f3a"
# Set to a dcgm-exporter's host:port on a GPU host to require data from the GPU panels too.
DCGM_ENV = "GPUFEED_DCGM_ADDRESS"


def missing_commands() -> list[str]:
    """The CLI commands the live stack needs that this gpufeed does not have."""
    from gpufeed.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return [name for name in ("train", "export", "serve") if name not in action.choices]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def train_config(synth_dir: Path) -> dict:
    """A trainer config for the synthetic data with the metrics endpoint on a free port.

    Keys of the trainer's own sections are set only where its schema has them (``gpufeed
    config --describe``): a tiny model, and enough steps that it is still training while
    Prometheus scrapes; ``linger_seconds`` keeps the endpoint up if it finishes first.
    """
    from gpufeed.config import describe_config

    known = {row[0] for row in describe_config()}
    cfg = {
        "device": "auto",
        "data": {
            "train": {"list_file": str(synth_dir / "images" / "train.txt")},
            "val": {"list_file": str(synth_dir / "images" / "val.txt")},
        },
        "image": {"size_px": SIZE_PX},
        "loader": {"batch_size": 8},
        "telemetry": {"metrics_host": "127.0.0.1", "metrics_port": 0, "linger_seconds": 600},
    }
    optional = {"model.name": MODEL_NAME, "model.size_px": SIZE_PX, "train.epochs": 1000, "train.max_steps": 1_000_000}
    for key, value in optional.items():
        if key in known:
            section, name = key.split(".")
            cfg.setdefault(section, {})[name] = value
    return cfg


@dataclass
class Traffic:
    """Requests sent by the traffic thread: ``(kind, HTTP status)`` counts."""

    counts: collections.Counter = field(default_factory=collections.Counter)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


def _post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()
            return response.status
    except urllib.error.HTTPError as err:
        err.read()
        return err.code


def _kserve_infer(client, image: bytes) -> int:
    import numpy as np
    from tritonclient.http import InferInput
    from tritonclient.utils import InferenceServerException

    meta = client.get_model_metadata(MODEL_NAME)
    tensor = InferInput(meta["inputs"][0]["name"], [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
    try:
        client.infer(MODEL_NAME, [tensor])
        return 200
    except InferenceServerException as err:
        return int(err.status() or 0) if str(err.status() or "").isdigit() else 0


def run_traffic(base: str, images: dict[str, bytes], traffic: Traffic) -> None:
    """Send rounds of good and bad requests until ``traffic.stop`` is set."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=base.removeprefix("http://"), network_timeout=60)
    predict = f"{base}/v1/models/{MODEL_NAME}/predict"
    jpeg, png = images["jpeg"], images["png"]
    requests = [
        ("rest_jpeg", lambda: _post(predict, jpeg, "image/jpeg")),
        ("rest_png", lambda: _post(predict, png, "image/png")),
        ("kserve_bytes", lambda: _kserve_infer(client, jpeg)),
        ("corrupt_image", lambda: _post(predict, jpeg[: len(jpeg) // 3] + b"\x00" * 64, "image/jpeg")),
        ("unsupported_media_type", lambda: _post(predict, b"hello", "text/plain")),
        ("unknown_model", lambda: _post(f"{base}/v1/models/{FOREIGN_MODEL}/predict", jpeg, "image/jpeg")),
        ("malformed_request", lambda: _post(f"{base}/v2/models/{MODEL_NAME}/infer", b"{not json", "application/json")),
    ]
    while not traffic.stop.is_set():
        for kind, send in requests:
            try:
                traffic.counts[(kind, send())] += 1
            except Exception as err:  # keep the load going; the tests report what failed
                traffic.errors.append(f"{kind}: {type(err).__name__}: {err}")
        traffic.stop.wait(0.1)


@dataclass
class LiveStack:
    """Handles on the running stack; :meth:`logs` for failure messages."""

    work: Path
    run_dir: Path
    server_url: str
    prometheus: LocalPrometheus
    traffic: Traffic
    started: float
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    thread: threading.Thread | None = None

    @property
    def api(self):
        return self.prometheus.api

    def logs(self) -> str:
        parts = [f"--- {name} log tail ---\n{_tail(self.work / f'{name}.log')}" for name in self.processes]
        parts.append(f"--- prometheus log tail ---\n{self.prometheus.log_tail()}")
        parts.append(f"--- traffic --- {dict(self.traffic.counts)} errors: {self.traffic.errors[:5]}")
        return "\n".join(parts)


def _spawn(work: Path, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(work / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "gpufeed", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )


def _wait(what: str, ready, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with status {proc.returncode}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout_s:.0f}s:\n{_tail(log)}")
        time.sleep(0.5)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_live_stack(work: Path, synth_dir: Path, stack_dir: Path) -> LiveStack:
    """Start trainer, server, Prometheus and traffic; the caller must call :func:`stop_live_stack`."""
    import torch

    from gpufeed.models import checkpoint_path, create_model, model_state

    work.mkdir(parents=True, exist_ok=True)
    processes: dict[str, subprocess.Popen] = {}
    stack = None
    try:
        config = work / "train.yaml"
        config.write_text(yaml.safe_dump(train_config(synth_dir), sort_keys=False))
        run_dir = work / "train-run"
        # The trainer is the module's background load, beside two test workers on a 2-core CI machine.
        # With two intra-op threads its CPU backward spun forever there twice (before step 40, inside
        # oneDNN's avx512 backward-weights kernel of smallcnn's channels-last first convolution, seen
        # with py-spy) and starved every other test into timeouts; alone it ran 1,980 steps a minute.
        processes["train"] = _spawn(
            work, "train", "train", "--config", str(config), "--out", str(run_dir), env={"OMP_NUM_THREADS": "1"}
        )

        # While the trainer starts: a checkpoint exactly as training writes one, exported and served.
        classes = (synth_dir / "images" / "classes.txt").read_text().split()
        model = create_model(MODEL_NAME, num_classes=len(classes), size_px=SIZE_PX, labels=tuple(classes))
        ckpt = checkpoint_path(work / "ckpt-run", 0)
        ckpt.parent.mkdir(parents=True)
        torch.save({**model_state(model), "step": 0}, ckpt)
        repo = work / "models"
        export = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufeed",
                "export",
                str(ckpt),
                "--out",
                str(repo / MODEL_NAME),
                "--batch-size",
                "4",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if export.returncode != 0:
            raise RuntimeError(f"gpufeed export failed:\n{export.stdout[-2000:]}\n{export.stderr[-3000:]}")
        port = free_port()
        server_url = f"http://127.0.0.1:{port}"
        processes["serve"] = _spawn(work, "serve", "serve", "--model-repo", str(repo), "--port", str(port))
        _wait(
            "gpufeed serve",
            lambda: _http_ok(f"{server_url}/v2/health/ready"),
            processes["serve"],
            work / "serve.log",
            300,
        )
        _wait(
            "gpufeed train metrics endpoint",
            lambda: (run_dir / "metrics-rank0.addr").is_file(),
            processes["train"],
            work / "train.log",
            300,
        )

        dcgm = [os.environ[DCGM_ENV]] if os.environ.get(DCGM_ENV) else []
        prom = stack_prometheus(
            work / "prometheus", train_runs=[run_dir], servers=[f"127.0.0.1:{port}"], dcgm=dcgm, stack_dir=stack_dir
        )
        stack = LiveStack(work, run_dir, server_url, prom, Traffic(), time.time(), processes)
        prom.start()
        prom.api.wait_for_targets(["gpufeed-train", "gpufeed-server", *(["dcgm"] if dcgm else [])], timeout_s=90)

        images = {
            "jpeg": next((synth_dir / "images" / "val").rglob("*.jpg")).read_bytes(),
            "png": next((synth_dir / "images" / "val").rglob("*.png")).read_bytes(),
        }
        stack.thread = threading.Thread(target=run_traffic, args=(server_url, images, stack.traffic), daemon=True)
        stack.thread.start()
        return stack
    except BaseException:
        if stack is not None:
            stop_live_stack(stack)
        else:
            for proc in processes.values():
                _stop(proc)
        raise


def stop_live_stack(stack: LiveStack) -> None:
    stack.traffic.stop.set()
    if stack.thread is not None:
        stack.thread.join(timeout=90)
    for proc in stack.processes.values():
        _stop(proc)
    stack.prometheus.stop()
