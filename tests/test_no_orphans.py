"""No orphans: ``kill -9`` of ``gpufeed serve`` or ``gpufeed train`` leaves none of their processes behind.

Each test starts the real command, makes it start its worker processes (the server's JSON parsing
worker and multiprocessing's resource tracker; DALI's PyAV workers, forked or spawned), reads its
process tree from ``/proc``, sends SIGKILL to the command's own process only (not its process
group, which would take the children with it and hide the fault), and checks that every process
it had started is gone within :data:`GRACE_S`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import yaml
from _serving import IMAGE_MODEL, exported_repo
from train_support import gpufeed_cmd

from gpufeed.core._procs import descendants, module_argv, process_alive
from gpufeed.models import read_model_card
from gpufeed.reliability._common import step_records
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.server._offload import INLINE_JSON_BYTES

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

GRACE_S = 5.0


def _left_after(pids: list[int]) -> list[str]:
    """The processes of ``pids`` still running after GRACE_S, with their command lines."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.05)
    left = [f"{pid}: {_command(pid)}" for pid in pids if process_alive(pid)]
    for pid in pids:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)  # this test's own leftovers: do not leave them to the next test
    return left


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _large_json_request() -> bytes:
    """A valid request padded past INLINE_JSON_BYTES, so the server parses it in its worker process."""
    card = read_model_card(exported_repo() / IMAGE_MODEL)
    count = int(np.prod(card.sample_shape))
    tensor = {"name": "pixels", "datatype": "UINT8", "shape": [1, *card.sample_shape], "data": [0] * count}
    doc = json.dumps({"inputs": [tensor]})
    return doc.replace('"data": [', '"data": ' + " " * (2 * INLINE_JSON_BYTES) + "[", 1).encode()


def test_kill_9_of_the_server_takes_its_worker_and_resource_tracker_with_it():
    with ServeProcess(exported_repo() / IMAGE_MODEL, ["serve.warmup_batches=1"]) as server:
        answer = httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", content=_large_json_request(), timeout=60)
        assert answer.status_code == 200, answer.text
        children = descendants(server.pid)
        commands = [_command(pid) for pid in children]
        assert any("resource_tracker" in c for c in commands) and any("spawn_main" in c for c in commands), commands
        os.kill(server.pid, signal.SIGKILL)  # the server alone, as the OOM killer or `kill -9 PID` would
        assert server.wait(timeout=30) == -signal.SIGKILL
        assert _left_after(children) == [], "processes of the killed server still run"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_kill_9_of_training_takes_its_pyav_workers_with_it(synth_dir, tmp_path, start_method):
    config = {
        "device": "cpu",
        "seed": 0,
        "video": {"train": str(synth_dir / "videos"), "decoder": "pyav", "size_px": [48, 32]},
        "loader": {"batch_size": 4, "num_threads": 2, "worker_start_method": start_method},
        "model": {"name": "r3d_small"},
        "train": {"epochs": 1, "progress": False},
        "telemetry": {"metrics_port": 0},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    run = tmp_path / "run"
    with open(tmp_path / "train.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(gpufeed_cmd("train", "--config", str(path), "--out", str(run)), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 240
        while not step_records(run) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and step_records(run), (tmp_path / "train.log").read_text()[-3000:]
        children = descendants(proc.pid)
        assert len(children) >= 2, f"the PyAV workers ({start_method}) are running: {children}"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _left_after(children) == [], f"processes of the killed training run ({start_method}) still run"


PARENT = """
import multiprocessing, sys, threading, time
from gpufeed.core._procs import forked_children_die_with_me

def start():
    with forked_children_die_with_me():
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
        child.start()
    time.sleep(1.0)  # the worker has armed itself before this thread exits
    print(child.pid, flush=True)

thread = threading.Thread(target=start)
thread.start()
thread.join()  # the thread that started the worker is gone; the process lives on
time.sleep(600)
"""


def test_a_worker_started_from_a_short_lived_thread_outlives_the_thread_not_the_process():
    """Linux's parent-death signal fires when the starting *thread* exits: such a worker relies on its watchdog."""
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        time.sleep(1.5)  # three watchdog looks after the starting thread exited
        assert process_alive(child), "the worker died with the thread that started it"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _left_after([child]) == [], "the worker outlived its parent"


@pytest.mark.process
def test_a_module_child_ignores_a_gpufeed_folder_in_the_working_directory(tmp_path):
    # `gpufeed serve` and the bench's servers are started as `python -m ...` children; from a
    # checkout, its gpufeed/ folder (the core alone) would shadow the installed package.
    shadow = tmp_path / "gpufeed"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('the working directory shadowed the installed gpufeed')\n")
    proc = subprocess.run(module_argv("gpufeed", "--help"), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0 and "usage: gpufeed" in proc.stdout, proc.stderr[-2000:]
    shadowed = subprocess.run([sys.executable, "-m", "gpufeed", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert "shadowed the installed gpufeed" in shadowed.stderr  # what the plain command line does
